"""The decode model's symbols as numbers, for a real model on a real accelerator.

`crossovers` of a model on an accelerator at a context evaluates the closed forms of
`jaxroof.symbolic.catalogue` at these values: the weights read and multiplied,
their bytes, the K/V bytes per retained token, the datasheet bandwidth and
dense FLOP rate, the ridge point, all from `step_inputs.decode_step_inputs` (so
the same figures `batch_sweep` uses). An MoE model's weights read depend on
the batch: they are taken at `batch`, and the closed forms then treat them as
fixed (`step_inputs.crossover_batches` solves with them varying).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxroof.specs import kv_sizing
from jaxroof.specs import step_inputs
from jaxroof.specs.accelerators import Accelerator
from jaxroof.specs.model_spec import FULL, ModelSpec


def model_values(spec: ModelSpec, device: Accelerator, *, context: int, batch: int = 1,
                 weight_dtype: str = "published",
                 kv_dtype: str = "bf16") -> tuple[dict[str, float], list[str]]:
  """Symbol values (SI) and notes on how each was taken.

  Gives N, N_act, q, k, T (= context), P (= context: a prompt filling it),
  BW, F and R; L, H_kv, d and b too where every block is full attention (the
  per-position formula's case).
  """
  inputs = step_inputs.decode_step_inputs(spec, device, context=context, batch_sizes=[batch],
                                          weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                                          block_size=1)
  values = {
      "N": float(inputs.N[0]), "N_act": float(inputs.N_act), "q": float(np.ravel(inputs.q)[0]),
      "k": float(inputs.k), "T": float(context), "P": float(context), "BW": inputs.BW,
      "F": inputs.F, "R": inputs.F / inputs.BW
  }
  notes = [
      f"{spec.name} on {device.name}: {inputs.weight_format.label} weights "
      f"({inputs.weight_format.describe()}), {kv_dtype} K/V, context {context:,} "
      f"(T = P = {context:,}); {device.compute_note(inputs.weight_dtype)}"
  ]
  if spec.is_moe:
    notes.append(f"MoE: N = the weights a step reads at B = {batch} (uniform routing), held "
                 "fixed by the closed forms; batch_sweep solves with N varying")
  if set(spec.layer_kinds) == {FULL} and spec.attention is not None:
    a = spec.attention
    values.update(L=float(spec.num_layers), H_kv=float(a.num_kv_heads), d=float(a.head_dim),
                  b=kv_sizing.kv_bytes_per_element(kv_dtype))
  else:
    notes.append("L, H_kv, d, b not set: not every block is full attention (k is the "
                 "model's K/V bytes per token over all its blocks)")
  return values, notes


def describe(values: dict[str, Any]) -> str:
  """`NAME=VALUE` pairs, as `catalogue.parse_values` reads them."""
  return ",".join(f"{name}={value:.6g}" for name, value in values.items())
