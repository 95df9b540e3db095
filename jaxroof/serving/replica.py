"""Build a simulator `Replica` from a model on an accelerator, or from raw numbers.

The iteration time is the lambdified iteration model
(`jaxroof.symbolic.iteration`) under a `StepModel` (bound or calibrated),
with the model's constants bound once. K/V memory is counted in pages sized
from the model's real layer schedule (`jaxroof.specs.kv_sizing`): a page
holds `block_size` positions of every block that keeps K/V, and the pages
that fit are the device memory less the workspace fraction and the resident
weights, divided by the bytes of one page.

On a parallel layout (`layout`, tp x pp x ep chips per replica) the iteration
takes one chip's N, N_act and k along a token's path through the pp stages
(`jaxroof.symbolic.parallel.path_inputs`), one chip's share of the attention
heads, and adds the communication of a pass of the iteration's tokens
(`jaxroof.symbolic.parallel.pass_comm_s`) serially; pages are one chip's
share of a page, counted on the busiest chip (`parallel.layout.chip_memory`)
and pooled over the ep groups. One simulated replica stands for each of dp.
"""

from __future__ import annotations

import numpy as np

from jaxroof.errors import InputError, require_positive, require_positive_int
from jaxroof.parallel import layout as layout_lib
from jaxroof.parallel.layout import Layout
from jaxroof.serving import multichip
from jaxroof.serving import requests
from jaxroof.serving.simulator import Replica
from jaxroof.specs import parameters as params
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
                 description: dict | None = None, comm_s=None) -> Replica:
  """A replica from raw step-model inputs (SI units) and a K/V memory budget.

  `comm_s`, if given, is `f(rows) -> seconds`: the communication of a pass of
  an iteration's tokens, added to each iteration (a multi-chip replica).
  """
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
  if comm_s is not None:
    floor = step

    def step(n_dec, S_dec, n_pre, S_pre_att, S_pre_kv):
      return floor(n_dec, S_dec, n_pre, S_pre_att, S_pre_kv) + comm_s(n_dec + n_pre)
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
               token_budget: int = 512, batch_window_s: float = 0.0,
               layout: Layout | None = None) -> Replica:
  """A replica of `spec` on `accelerator`; `context` sets the K/V bytes per token (k).

  `layout`: the replica's tensor/pipeline/expert degrees (dp replicas are
  alike; the simulator runs one). Raises InputError for a layout the model
  or device does not allow.
  """
  step_model = step_model or StepModel.bound()
  layout = layout or Layout()
  inputs = decode_step_inputs(spec, accelerator, context=context, batch_sizes=[1],
                              weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                              block_size=block_size, workspace_fraction=workspace_fraction)
  page = kv_sizing.size_kv(spec, context=block_size, kv_dtype=kv_dtype, block_size=block_size)
  L, H, d = attention_shape(spec)
  notes = ["N: weights read by a one-sequence step (an MoE step with more rows reads more)",
           "a page holds block_size positions of every block's K/V (sliding-window and "
           "recurrent blocks counted as at a block_size context)"]
  description = {"model": spec.name, "accelerator": accelerator.name, "context": context,
                 "weight_dtype": inputs.weight_dtype, "kv_dtype": kv_dtype, "notes": notes}
  common = dict(q=float(np.ravel(inputs.q)[0]), BW=inputs.BW, F=inputs.F, L=L, d=d, page_tokens=block_size,
                step_model=step_model, max_running=max_running,
                max_context=spec.max_position_embeddings, token_budget=token_budget,
                batch_window_s=batch_window_s)
  if layout.chips_per_replica == 1:
    if inputs.usable_memory_bytes <= 0:
      raise InputError(
          f"model={spec.name!r} does not fit on one {accelerator.name}: its weights "
          f"({inputs.resident_weight_bytes / 1e9:,.1f} GB) leave no memory for K/V; split it "
          "with --tp/--pp/--ep or choose a larger device.")
    return from_numbers(
        N=float(inputs.N[0]), k=inputs.k, H=H, N_act=inputs.N_act,
        kv_memory_bytes=inputs.usable_memory_bytes,
        page_bytes=page.allocated_bytes_per_sequence,
        description={**description, "layout": layout.as_dict()}, **common)
  layout_lib.validate(layout, spec, accelerator)
  link = layout_lib.links(layout, accelerator)
  memory = layout_lib.chip_memory(
      layout, spec, accelerator, resident_weight_bytes=inputs.resident_weight_bytes,
      expert_weight_bytes=(params.parameter_counts(spec).experts_routed
                           * inputs.expert_bytes_per_weight),
      kv_allocated_bytes_per_sequence=page.allocated_bytes_per_sequence,
      workspace_fraction=workspace_fraction)
  if memory.usable_bytes <= 0:
    raise InputError(f"--tp={layout.tp} --pp={layout.pp} --ep={layout.ep}: {spec.name}'s "
                     f"weights leave no memory for K/V on a {accelerator.name} chip "
                     f"({memory.resident_weight_bytes / 1e9:.4g} GB per chip).")
  n_x = float(layout_lib.expert_weights_read(spec, [1.0])[0])
  path = multichip.path_values(layout, spec, N=float(inputs.N[0]), N_x=n_x, k=inputs.k,
                               N_act=inputs.N_act)
  values = layout_lib.symbol_values(layout, spec, link)
  comm = {name: float(values[name]) for name in requests.COMM_SYMBOLS}
  return from_numbers(
      N=path["N"], k=path["k"], H=H / (layout.tp * layout.ep), N_act=path["N_act"],
      kv_memory_bytes=memory.usable_bytes * layout.ep,
      page_bytes=memory.kv_allocated_bytes_per_sequence,
      comm_s=lambda rows: requests.pass_comm_s(comm, rows),
      description={**description, "layout": layout.as_dict(), "network": link.network,
                   "link_note": link.note,
                   "resident_weight_bytes_per_chip": memory.resident_weight_bytes,
                   "notes": notes + [
                       "one chip's N, N_act, k along a token's path; attention heads over "
                       "tp*ep; communication of each iteration's tokens serial (no overlap); "
                       "K/V pages on the busiest chip, pooled over the ep groups"]},
      **common)
