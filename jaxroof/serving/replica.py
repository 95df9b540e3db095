"""Build a simulator `Replica` from a model on an accelerator, or from raw numbers.

The iteration time is the lambdified iteration model
(`jaxroof.symbolic.iteration`) under a `StepModel` (bound or calibrated),
with the model's constants bound once. K/V memory is counted in pages sized
from the model's real layer schedule (`jaxroof.specs.kv_sizing`): a page
holds `block_size` positions of every block that keeps K/V, and the pages
that fit are the device memory less the workspace fraction and the resident
weights, divided by the bytes of one page.
"""

from __future__ import annotations

from jaxroof.errors import InputError, require_positive, require_positive_int
from jaxroof.serving.simulator import Replica
from jaxroof.specs import kv_sizing
from jaxroof.specs.accelerators import Accelerator
from jaxroof.specs.model_spec import FULL, MLA, SLIDING, ModelSpec
from jaxroof.specs.workload import DEFAULT_WORKSPACE_FRACTION, decode_step_inputs
from jaxroof.symbolic import iteration
from jaxroof.symbolic.step_model import StepModel


def attention_shape(spec: ModelSpec) -> tuple[int, int, int]:
  """(attention blocks L, query heads H, coordinates per head d) for attention FLOPs."""
  layers = spec.layers_of(FULL) + spec.layers_of(SLIDING) + spec.layers_of(MLA)
  if spec.mla is not None:
    m = spec.mla
    return layers, m.num_heads, (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) // 2
  if spec.attention is not None:
    return layers, spec.attention.num_heads, spec.attention.head_dim
  return 0, 0, 0


def from_numbers(*, N: float, q: float, k: float, BW: float, F: float, L: int, H: int,
                 d: int, kv_memory_bytes: float, page_bytes: float, page_tokens: int,
                 step_model: StepModel, N_act: float | None = None, max_running: int = 256,
                 max_context: int | None = None, token_budget: int = 512,
                 batch_window_s: float = 0.0, padded_to=None,
                 description: dict | None = None) -> Replica:
  """A replica from raw step-model inputs (SI units) and a K/V memory budget."""
  for name, value in (("N", N), ("q", q), ("k", k), ("BW", BW), ("kv_memory_bytes",
                      kv_memory_bytes), ("page_bytes", page_bytes)):
    require_positive(name, value)
  require_positive_int("page_tokens", page_tokens)
  if batch_window_s < 0:
    raise InputError(f"batch_window_s={batch_window_s!r} is not allowed: it must be >= 0.")
  BW, F = step_model.scaled_ceilings(BW, F)
  values = {"N": N, "q": q, "k": k, "BW": BW, "F": F, "N_act": N if N_act is None else N_act,
            "L": L, "H": H, "d": d}
  total_pages = int(kv_memory_bytes // page_bytes)
  if total_pages < 1:
    raise InputError(f"kv_memory_bytes={kv_memory_bytes:g} is not allowed: it holds no K/V "
                     f"page of {page_bytes:g} bytes.")
  step = iteration.step_time_function(step_model.kind, values, step_model.factors)
  return Replica(
      step_s=step, chunk=iteration.chunk_model(), total_pages=total_pages,
      page_tokens=page_tokens, max_running=require_positive_int("max_running", max_running),
      max_context=max_context, token_budget=require_positive_int("token_budget", token_budget),
      batch_window_s=batch_window_s, padded_to=padded_to,
      description={**(description or {}), "step_model": step_model.kind,
                   "inputs": {n: float(v) for n, v in values.items()},
                   "factors": dict(step_model.factors or {}),
                   "kv_pages": total_pages, "page_tokens": page_tokens,
                   "page_bytes": float(page_bytes)})


def from_model(spec: ModelSpec, accelerator: Accelerator, *, context: int,
               step_model: StepModel | None = None, weight_dtype: str = "bf16",
               kv_dtype: str = "bf16", block_size: int = kv_sizing.DEFAULT_BLOCK_SIZE,
               workspace_fraction: float = DEFAULT_WORKSPACE_FRACTION, max_running: int = 256,
               token_budget: int = 512, batch_window_s: float = 0.0) -> Replica:
  """A replica of `spec` on `accelerator`; `context` sets the K/V bytes per token (k)."""
  step_model = step_model or StepModel.bound()
  inputs = decode_step_inputs(spec, accelerator, context=context, batch_sizes=[1],
                              weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                              block_size=block_size, workspace_fraction=workspace_fraction)
  page = kv_sizing.size_kv(spec, context=block_size, kv_dtype=kv_dtype, block_size=block_size)
  L, H, d = attention_shape(spec)
  notes = ["N: weights read by a one-sequence step (an MoE step with more rows reads more)",
           "a page holds block_size positions of every block's K/V (sliding-window and "
           "recurrent blocks counted as at a block_size context)"]
  return from_numbers(
      N=float(inputs.N[0]), q=inputs.q, k=inputs.k, BW=inputs.BW, F=inputs.F, L=L, H=H, d=d,
      N_act=inputs.N_act, kv_memory_bytes=inputs.usable_memory_bytes,
      page_bytes=page.allocated_bytes_per_sequence, page_tokens=block_size,
      step_model=step_model, max_running=max_running,
      max_context=spec.max_position_embeddings, token_budget=token_budget,
      batch_window_s=batch_window_s,
      description={"model": spec.name, "accelerator": accelerator.name, "context": context,
                   "weight_dtype": weight_dtype, "kv_dtype": kv_dtype, "notes": notes})
