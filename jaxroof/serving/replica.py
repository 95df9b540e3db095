"""Build a simulator `Replica` from a model on an accelerator, or from raw numbers.

The iteration time is the one cost model (`jaxroof.specs.iteration_model`
over `jaxroof.symbolic.cost_model`) under a `StepModel` (bound per_op or
fused, or calibrated): per layer kind (windows capped, MLA's forms, recurrent
state), the routed experts the iteration's tokens touch, the LM head at the
sampled rows. K/V memory is counted in pages sized
from the model's real layer schedule (`jaxroof.specs.kv_sizing`): a page
holds `block_size` positions of every block that keeps K/V, and the pages
that fit are the device memory less the workspace fraction and the resident
weights, divided by the bytes of one page.

On a parallel layout (`layout`, tp x pp x ep chips per replica) the iteration
takes one chip's share of the weights, experts, K/V and FLOPs along a token's
path through the pp stages (`jaxroof.symbolic.collectives.path_inputs`), and adds
the communication of a pass of the iteration's tokens
(`jaxroof.symbolic.collectives.pass_comm_s`), hidden by `comm_overlap`; pages are one chip's
share of a page, counted on the busiest chip (`parallel.layout.chip_memory`)
and pooled over the ep groups. One simulated replica stands for each of dp.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from jaxroof.errors import InputError, require_positive, require_positive_int
from jaxroof.parallel import engine_drive
from jaxroof.parallel import layout as layout_lib
from jaxroof.parallel.layout import Layout
from jaxroof.serving import multichip
from jaxroof.serving import requests
from jaxroof.serving.simulator import Replica
from jaxroof.specs import kv_sizing
from jaxroof.specs.accelerators import ATTENTION_DTYPE, Accelerator
from jaxroof.specs.iteration_model import IterationModel
from jaxroof.specs.model_spec import ModelSpec
from jaxroof.specs.step_inputs import DEFAULT_WORKSPACE_FRACTION, decode_step_inputs
from jaxroof.symbolic import prefill as prefill_formulas
from jaxroof.symbolic.step_model import StepModel


def from_numbers(*, N: float, q: float, k: float, BW: float, F: float, L: int, H: int, d: int,
                 kv_memory_bytes: float, page_bytes: float, page_tokens: int, step_model: StepModel,
                 N_act: float | None = None, max_running: int = 256, max_context: int | None = None,
                 token_budget: int = 512, batch_window_s: float = 0.0, padded_to=None,
                 description: dict | None = None, comm_s=None) -> Replica:
  """A replica from raw step-model inputs (SI units) and a K/V memory budget.

  `comm_s`, if given, is `f(rows) -> seconds`: the communication of a pass of
  an iteration's tokens, added to each iteration (a multi-chip replica).
  """
  for name, value in (("N", N), ("q", q), ("k", k), ("BW", BW),
                      ("kv_memory_bytes", kv_memory_bytes), ("page_bytes", page_bytes)):
    require_positive(name, value)
  require_positive_int("page_tokens", page_tokens)
  if batch_window_s < 0:
    raise InputError(f"batch_window_s={batch_window_s!r} is not allowed: it must be >= 0.",
                     field="batch_window_s")
  values = {
      "N": N, "q": q, "k": k, "BW": BW, "F": F, "N_act": N if N_act is None else N_act, "L": L,
      "H": H, "d": d
  }
  total_pages = int(kv_memory_bytes // page_bytes)
  if total_pages < 1:
    raise InputError(
        f"kv_memory_bytes={kv_memory_bytes:g} is not allowed: it holds no K/V "
        f"page of {page_bytes:g} bytes.", field="kv_memory_bytes")
  cost = IterationModel.from_numbers(
      N=N, q=q, k=k, BW=BW, F=F, N_act=N_act, L=L,
      pair_flops=L * float(prefill_formulas.full_attention_pair_flops(H, d)))
  if comm_s is not None:
    cost = dataclasses.replace(cost, comm=comm_s)
  return _replica(
      cost, step_model, total_pages=total_pages, page_tokens=page_tokens, max_running=max_running,
      max_context=max_context, token_budget=token_budget, batch_window_s=batch_window_s,
      padded_to=padded_to, description={
          **(description or {}),
          "inputs": {n: None if v is None else float(v) for n, v in values.items()}
      }, page_bytes=page_bytes)


def _replica(cost: IterationModel, step_model: StepModel, *, total_pages: int, page_tokens: int,
             max_running: int, max_context: int | None, token_budget: int, batch_window_s: float,
             padded_to, description: dict, page_bytes: float) -> Replica:
  return Replica(
      cost=cost, step_model=step_model, total_pages=total_pages, page_tokens=page_tokens,
      max_running=require_positive_int("max_running", max_running), max_context=max_context,
      token_budget=require_positive_int("token_budget", token_budget),
      batch_window_s=batch_window_s, padded_to=padded_to, description={
          **description, "step_model": step_model.kind,
          "bound": step_model.form if step_model.kind == "bound" else None,
          "factors": dict(step_model.factors or
                          {}), "cost_constants": {n: float(v) for n, v in cost.constants.items()},
          "comm_overlap": cost.comm_overlap, "kv_pages": total_pages, "page_tokens": page_tokens,
          "page_bytes": float(page_bytes)
      })


def from_model(spec: ModelSpec, accelerator: Accelerator, *, context: int,
               step_model: StepModel | None = None, weight_dtype: str = "bf16",
               kv_dtype: str = "bf16", block_size: int = kv_sizing.DEFAULT_BLOCK_SIZE,
               workspace_fraction: float = DEFAULT_WORKSPACE_FRACTION, max_running: int = 256,
               token_budget: int = 512, batch_window_s: float = 0.0, layout: Layout | None = None,
               mla_prefill: str = "mha", comm_overlap: float = 0.0,
               reservation: Mapping[str, float] | None = None) -> Replica:
  """A replica of `spec` on `accelerator` (`context`: the memory fit's reference length).

  `layout`: the replica's tensor/pipeline/expert degrees (dp replicas are
  alike; the simulator runs one). `reservation`: an engine's memory settings
  (`engine_drive.Drive.settings`): its K/V pages are what its rule leaves each chip
  (`engine_drive.kv_bytes`) instead of the memory less the workspace fraction. Raises
  InputError for a layout the model or device does not allow.
  """
  step_model = step_model or StepModel.bound()
  layout = layout or Layout()
  inputs = decode_step_inputs(spec, accelerator, context=context, batch_sizes=[1],
                              weight_dtype=weight_dtype, kv_dtype=kv_dtype, block_size=block_size,
                              workspace_fraction=workspace_fraction)
  page = kv_sizing.size_kv(spec, context=block_size, kv_dtype=kv_dtype, block_size=block_size)
  cost = IterationModel.from_spec(spec, BW=inputs.BW, F=inputs.F,
                                  F_attn=accelerator.flops(ATTENTION_DTYPE),
                                  weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                                  mla_prefill=mla_prefill)
  notes = [
      "a page holds block_size positions of every attention block's K/V (sliding-window "
      "blocks counted as at a block_size context); a hybrid model's recurrent state is "
      "reserved once for each of max_running slots", *cost.assumptions
  ]
  description = {
      "model": spec.name, "accelerator": accelerator.name, "context": context,
      "weight_dtype": inputs.weight_dtype, "kv_dtype": kv_dtype, "notes": notes
  }
  common = dict(page_tokens=block_size, max_running=max_running,
                max_context=spec.max_position_embeddings, token_budget=token_budget,
                batch_window_s=batch_window_s, padded_to=None)
  if layout.chips_per_replica == 1:
    if inputs.usable_memory_bytes <= 0:
      raise InputError(
          f"model={spec.name!r} does not fit on one {accelerator.name}: its weights "
          f"({inputs.resident_weight_bytes / 1e9:,.1f} GB) leave no memory for K/V; split it "
          "with more chips (tensor, pipeline or expert parallel) or choose a larger device.",
          field="model")
    page_bytes, state = _page_and_state(page, 1.0)
    usable = inputs.usable_memory_bytes if reservation is None else engine_drive.kv_bytes(
        reservation, capacity=accelerator.memory_capacity_bytes,
        chip_weights=inputs.resident_weight_bytes, width=float(spec.hidden_size))
    return _replica(cost.with_overlap(comm_overlap), step_model,
                    total_pages=_pages(usable - max_running * state, page_bytes),
                    description={**description,
                                 "layout": layout.as_dict()}, page_bytes=page_bytes, **common)
  layout_lib.validate(layout, spec, accelerator)
  link = layout_lib.links(layout, accelerator)
  memory = layout_lib.chip_memory(layout, spec, accelerator, weight_format=inputs.weight_format,
                                  kv_allocated_bytes_per_sequence=page.allocated_bytes_per_sequence,
                                  workspace_fraction=workspace_fraction)
  if memory.usable_bytes <= 0:
    raise InputError(
        f"tp={layout.tp} pp={layout.pp} ep={layout.ep}: {spec.name}'s "
        f"weights leave no memory for K/V on a {accelerator.name} chip "
        f"({memory.resident_weight_bytes / 1e9:.4g} GB per chip).", field="tp")
  values = layout_lib.symbol_values(layout, spec, link)
  comm = {name: float(values[name]) for name in requests.COMM_SYMBOLS}
  cost = cost.on_layout(**multichip.chip_shares(layout, spec), comm=_memoised_comm(comm),
                        comm_overlap=comm_overlap)
  page_bytes, state = _page_and_state(
      page, memory.kv_allocated_bytes_per_sequence / page.allocated_bytes_per_sequence)
  usable = memory.usable_bytes if reservation is None else engine_drive.kv_bytes(
      reservation, capacity=accelerator.memory_capacity_bytes,
      chip_weights=memory.resident_weight_bytes, width=float(spec.hidden_size))
  return _replica(
      cost, step_model, total_pages=_pages(usable * layout.ep - max_running * state, page_bytes),
      page_bytes=page_bytes, description={
          **description, "layout": layout.as_dict(), "network": link.network,
          "link_note": link.note, "resident_weight_bytes_per_chip": memory.resident_weight_bytes,
          "notes": notes + [
              "one chip's share of weights, experts, K/V and FLOPs along a token's "
              "path; communication of each iteration's tokens, hidden by the "
              "overlap fraction; K/V pages on the busiest chip, pooled over the ep "
              "groups"
          ]
      }, **common)


def _page_and_state(page: kv_sizing.KVSizing, share: float) -> tuple[float, float]:
  """(bytes of one K/V page, recurrent state bytes per running sequence), one chip's
  `share`: the pages hold the attention blocks' K/V; a hybrid model's fixed state is
  reserved once for every running slot, not once per page."""
  state = sum(kind.state_bytes for kind in page.kinds) * share
  kv = page.allocated_bytes_per_sequence * share - state
  return max(kv, 1.0), state  # A model without attention: pages are nominal.


def _pages(memory_bytes: float, page_bytes: float) -> int:
  pages = int(memory_bytes // page_bytes)
  if pages < 1:
    raise InputError(
        f"kv_memory_bytes={memory_bytes:g} is not allowed: it holds no K/V "
        f"page of {page_bytes:g} bytes.", field="kv_memory_bytes")
  return pages


def _memoised_comm(comm: dict[str, float]):
  """`requests.pass_comm_s` for this layout, remembered per row count: a simulation asks
  for the same few counts tens of thousands of times (its Piecewise costs ~60 us)."""
  seen: dict[float, float] = {}

  def comm_s(rows):
    if np.ndim(rows):
      return requests.pass_comm_s(comm, rows)
    key = float(rows)
    if key not in seen:
      seen[key] = float(requests.pass_comm_s(comm, key))
    return seen[key]

  return comm_s


def per_microbatch(r: Replica, microbatches: int) -> Replica:
  """One of a pipelined replica's `microbatches` virtual engines (vLLM's pipeline
  parallelism runs one per microbatch in flight): its share of the slots and K/V pages.

  The simulator costs an iteration as one pass of its rows through every stage
  (`collectives.path_inputs`); with m = pp microbatches interleaved, each microbatch's
  token gap is exactly that pass, `pp` stage times at B/m rows, which is the symbolic
  model's `Max(m, pp) x stage(B/m)`. So m virtual engines behind a router stand for one
  replica of m microbatches.
  """
  microbatches = require_positive_int("microbatches", microbatches)
  if microbatches == 1:
    return r
  if r.max_running < microbatches:
    raise InputError(
        f"max_running={r.max_running} is not allowed with microbatches={microbatches}: each "
        "microbatch needs at least one slot.", field="max_running")
  return dataclasses.replace(
      r, max_running=r.max_running // microbatches, total_pages=r.total_pages // microbatches,
      description={
          **r.description, "virtual_engine": f"1 of {microbatches} microbatches in flight",
          "kv_pages": r.total_pages // microbatches
      })
