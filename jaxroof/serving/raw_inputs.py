"""Serving inputs from raw numbers (the lesson's view): weight bytes, K/V bytes, a device.

A model and an accelerator go through `multichip.model_inputs`; this is the same
`ServingInputs` for a user who gives sizes instead. With a device memory, the memory fit
is the capacity formula (`specs.kv_sizing.sequences_fit`), the K/V of the
whole request reserved up front and a workspace kept free.
"""

from __future__ import annotations

from jaxroof import errors
from jaxroof.serving.requests import ServingInputs
from jaxroof.specs import kv_sizing
from jaxroof.specs import step_inputs

LESSON_KV_PER_SEQUENCE_BYTES = 0.25e9  # The lesson's fixed K/V per sequence.
WORKSPACE_FRACTION = step_inputs.DEFAULT_WORKSPACE_FRACTION


def serving_inputs(*, weight_bytes: float, bytes_per_weight: float, bandwidth_bytes_per_s: float,
                   flops_per_s: float | None, prompt_tokens: int, output_tokens: int,
                   kv_bytes_per_token: float | None = None,
                   kv_per_sequence_bytes: float | None = None,
                   memory_capacity_bytes: float | None = None,
                   layers: int | None = None) -> ServingInputs:
  """`ServingInputs` of raw numbers (SI units).

  K/V is either per retained token (the context grows by one per decode step) or fixed
  per sequence (default the lesson's 0.25 GB); give at most one. Without a memory
  capacity, memory does not bind (`max_batch_in_memory` None).
  """
  if kv_bytes_per_token is not None and kv_per_sequence_bytes is not None:
    raise errors.InputError("give kv_per_sequence_bytes or kv_bytes_per_token, not both.",
                            field="kv_per_sequence_bytes")
  n = weight_bytes / errors.require_positive("bytes_per_weight", bytes_per_weight)
  fixed = None
  if kv_bytes_per_token is None:
    fixed = LESSON_KV_PER_SEQUENCE_BYTES if kv_per_sequence_bytes is None else kv_per_sequence_bytes
  max_batch, memory = None, {}
  if memory_capacity_bytes is not None:
    per_sequence = fixed if fixed is not None else kv_bytes_per_token * (prompt_tokens +
                                                                         output_tokens)
    fit = dict(weight_bytes=weight_bytes, memory_capacity_bytes=memory_capacity_bytes,
               workspace_fraction=WORKSPACE_FRACTION)
    max_batch = kv_sizing.sequences_fit(per_sequence_bytes=per_sequence, **fit)
    memory = {
        "memory_capacity_bytes": memory_capacity_bytes, "workspace_fraction": WORKSPACE_FRACTION,
        "usable_memory_bytes": kv_sizing.usable_bytes(**fit),
        "kv_allocated_bytes_per_sequence": per_sequence
    }
  kv = (f"{fixed / 1e9:g} GB K/V per sequence"
        if fixed is not None else f"{kv_bytes_per_token:g} B K/V per token")
  compute = (f"{flops_per_s / 1e12:g} TFLOP/s" if flops_per_s is not None else "memory only")
  return ServingInputs(
      N=n, N_act=n, q=bytes_per_weight, k=kv_bytes_per_token or 0.0, BW=bandwidth_bytes_per_s,
      F=flops_per_s, kv_per_sequence_bytes=fixed, layers=layers, max_batch_in_memory=max_batch,
      label=(f"{weight_bytes / 1e9:g} GB weights ({bytes_per_weight:g} B/weight), {kv}, "
             f"{bandwidth_bytes_per_s / 1e12:g} TB/s, {compute}"), memory=memory)


def sweep_inputs(*, weight_bytes: float, bytes_per_weight: float, bandwidth_bytes_per_s: float,
                 flops_per_s: float | None, kv_bytes_per_token: float | None = None,
                 kv_per_sequence_bytes: float | None = None,
                 context: int | None = None) -> dict[str, float | None]:
  """A batch sweep's inputs of raw numbers (SI units: N, q, T, k, BW, F).

  K/V is per retained token at `context` tokens, or fixed per sequence (default the
  lesson's 0.25 GB), then folded into k with T = 1 (the sweep reads only T k).
  """
  if kv_bytes_per_token is not None and kv_per_sequence_bytes is not None:
    raise errors.InputError("give kv_per_sequence_bytes or kv_bytes_per_token, not both.",
                            field="kv_per_sequence_bytes")
  if kv_bytes_per_token is not None:
    if context is None:
      raise errors.InputError("kv_bytes_per_token needs a context (retained tokens).",
                              field="context")
    T, k = float(context), kv_bytes_per_token
  else:
    T, k = 1.0, (LESSON_KV_PER_SEQUENCE_BYTES
                 if kv_per_sequence_bytes is None else kv_per_sequence_bytes)
  return {
      "N": weight_bytes / errors.require_positive("bytes_per_weight", bytes_per_weight),
      "q": bytes_per_weight, "T": T, "k": k, "BW": bandwidth_bytes_per_s, "F": flops_per_s
  }
