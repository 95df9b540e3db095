"""The fewest chips that meet a target: a vectorised search over layouts.

`plan` searches accelerators x layout (tp, pp, ep, microbatches) x batch x
weight dtype x K/V dtype in one flat numpy evaluation of the lambdified
per-chip decode step and prefill (`jaxroof.symbolic.parallel`), keeps the
configurations that fit per-chip memory and meet the token gap and the
time to first token, gives each the data-parallel replicas `dp` it needs for
the aggregate rate (the fewest: ceil(target / replica rate)), and ranks them
by chips, then by headroom (the smaller of token-gap / step and TTFT target /
TTFT; higher is more slack). Everything is an analytic bound.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxroof import errors
from jaxroof.parallel import layout as layout_lib
from jaxroof.parallel.layout import Layout
from jaxroof.specs import parameters as params
from jaxroof.specs import workload
from jaxroof.specs.accelerators import Accelerator
from jaxroof.specs.model_spec import ModelSpec
from jaxroof.symbolic import parallel as sym
from jaxroof.symbolic import symbols as S
from jaxroof.symbolic import parallel as sym_parallel
from jaxroof.symbolic import prefill as prefill_formulas
from jaxroof.symbolic.evaluate import lambdified

WEIGHT_DTYPES = ("bf16", "fp8", "int8", "int4")
KV_DTYPES = ("bf16", "fp8", "int8")
TP_CHOICES = (1, 2, 4, 8, 16, 32, 64)
PP_CHOICES = (1, 2, 4, 8)
EP_CHOICES = (1, 2, 4, 8, 16, 32, 64)
LINK_NAMES = tuple(str(s) for s in sym_parallel.LINK_SYMBOLS)
BATCHES = tuple(int(b) for b in np.unique(np.round(np.geomspace(1, 4096, 200))))

ASSUMPTIONS = (
    "analytic bound from datasheet figures (memory bandwidth, dense FLOP/s, interconnect)",
    "decode: one token per sequence per step; all sequences hold the full context",
    "step and TTFT from the one cost model (per-operation rooflines by default: linear "
    "layers, then attention with its K/V; causal attention FLOPs per layer kind)",
    "TTFT: one prompt of the full context prefilled alone (no queue); communication serial "
    "unless an overlap is given",
    "dp: the fewest replicas whose summed aggregate rate meets the target",
    "microbatches 1 or pp; a batch splits evenly over microbatches and expert groups",
    "ranked by chips, then headroom = min(token gap / step, TTFT target / TTFT); one plan "
    "(its best batch) per accelerator, layout and dtypes",
)


@dataclasses.dataclass(frozen=True)
class Targets:
  token_gap_s: float
  ttft_s: float
  aggregate_tokens_per_s: float

  def __post_init__(self):
    errors.require_positive("token_gap_ms", self.token_gap_s * 1e3)
    errors.require_positive("ttft_ms", self.ttft_s * 1e3)
    errors.require_positive("aggregate_tokens_per_s", self.aggregate_tokens_per_s)


@functools.cache
def _memory_model():
  chip = (sym.per_chip_weights() * S.q
          + S.B / S.ep * S.s * sym.kv_share() / S.pp)
  return lambdified({"chip_bytes": chip},
                    (S.N, S.N_x, S.q, S.B, S.s, S.tp, S.pp, S.ep, S.u_kv))


def candidate_layouts(spec: ModelSpec, device: Accelerator
                      ) -> list[tuple[Layout, layout_lib.LinkChoice]]:
  """Every layout of the search grid this model and device accept, with its links."""
  eps = EP_CHOICES if spec.is_moe else (1,)
  out = []
  for tp in TP_CHOICES:
    for pp in PP_CHOICES:
      for ep in eps:
        for m in sorted({1, pp}):
          layout = Layout(tp=tp, pp=pp, ep=ep, microbatches=m)
          try:
            layout_lib.validate(layout, spec, device)
          except errors.InputError:
            continue
          out.append((layout, layout_lib.links(layout, device)))
  return out


def build_grid(spec: ModelSpec, devices: Sequence[Accelerator], context: int,
               weight_dtypes: Sequence[str], kv_dtypes: Sequence[str],
               batches: np.ndarray, workspace_fraction: float) -> dict[str, np.ndarray]:
  """Flat arrays, one entry per configuration, of every input the models take."""
  counts = params.parameter_counts(spec)
  terms = layout_lib.model_terms(spec)
  n_x = layout_lib.expert_weights_read(spec, batches)
  columns: dict[str, list[np.ndarray]] = {}

  def add(**values):
    for name, value in values.items():
      columns.setdefault(name, []).append(value)

  for di, device in enumerate(devices):
    layouts = candidate_layouts(spec, device)
    if not layouts:
      continue
    n_layouts, n_b = len(layouts), len(batches)
    per_layout = {name: np.repeat(np.array([getattr(lay, name) for lay, _ in layouts],
                                           dtype=float), n_b)
                  for name in ("tp", "pp", "ep", "microbatches")}
    link_columns = {name: np.repeat([layout_lib.link_values(link, lay.tp)[name]
                                     for lay, link in layouts], n_b)
                    for name in LINK_NAMES}
    b = np.tile(batches, n_layouts)
    for wi, wdt in enumerate(weight_dtypes):
      for ki, kdt in enumerate(kv_dtypes):
        inputs = workload.decode_step_inputs(
            spec, device, context=context, batch_sizes=list(batches), weight_dtype=wdt,
            kv_dtype=kdt, workspace_fraction=workspace_fraction)
        size = n_layouts * n_b
        add(device=np.full(size, di), wdt=np.full(size, wi), kdt=np.full(size, ki),
            B=b, N=np.tile(inputs.N, n_layouts), N_x=np.tile(n_x, n_layouts),
            q=np.tile(np.broadcast_to(inputs.q, (n_b,)), n_layouts), k=np.full(size, inputs.k),
            BW=np.full(size, inputs.BW), F=np.full(size, inputs.F),
            N_act=np.full(size, inputs.N_act), **link_columns,
            A_t=np.full(size, inputs.A_t),
            s=np.full(size, inputs.kv_allocated_bytes_per_sequence),
            capacity=np.full(size, inputs.memory_capacity_bytes * (1 - workspace_fraction)),
            **per_layout)
  grid = {name: np.concatenate(parts) for name, parts in columns.items()}
  grid.update(N_res=np.full_like(grid["B"], counts.total),
              N_xres=np.full_like(grid["B"], counts.experts_routed),
              u_kv=float(terms.kv_units), n_blk=float(terms.blocks),
              L_moe=float(terms.moe_blocks), K=float(max(terms.top_k, 1)),
              D=float(terms.width), V=float(terms.vocab),
              A_f=prefill_formulas.pair_flops_at(prefill_formulas.attention_terms(spec),
                                                 context))
  return grid


def evaluate_grid(grid: dict[str, Any], context: int,
                  activation_bytes: float = layout_lib.DEFAULT_ACTIVATION_BYTES,
                  bound: str = "per_op", comm_overlap: float = 0.0) -> dict[str, np.ndarray]:
  """Decode step, prefill and per-chip memory at every configuration (one call each):
  the one cost model's decode and prefill (`bound`), communication hidden by
  `comm_overlap`."""
  shared = dict(tp=grid["tp"], pp=grid["pp"], ep=grid["ep"], L_moe=grid["L_moe"],
                K=grid["K"], D=grid["D"], V=grid["V"], a_act=activation_bytes,
                **{name: grid[name] for name in LINK_NAMES}, o_ovl=comm_overlap,
                n_blk=grid["n_blk"],
                q=grid["q"], F=grid["F"], N_act=grid["N_act"], BW=grid["BW"])
  decode = layout_lib.decode_model(bound=bound)(B=grid["B"], T=float(context), N=grid["N"],
                                     N_x=grid["N_x"], k=grid["k"], m_mb=grid["microbatches"],
                                     u_kv=grid["u_kv"], A_t=grid["A_t"], **shared)
  prefill = layout_lib.prefill_model(bound=bound)(P=float(context), N=grid["N"], N_x=grid["N_x"],
                                       A_f=grid["A_f"], **shared)
  memory = _memory_model()(N=grid["N_res"], N_x=grid["N_xres"], q=grid["q"], B=grid["B"],
                           s=grid["s"], tp=grid["tp"], pp=grid["pp"], ep=grid["ep"],
                           u_kv=grid["u_kv"])
  return {**decode, **prefill, **memory}


def _binds(out: dict[str, np.ndarray]) -> np.ndarray:
  weights_s = out["memory_s"] * out["weight_bytes"] / (out["weight_bytes"] + out["kv_bytes"])
  kv_s = out["memory_s"] - weights_s
  terms = np.stack([weights_s, kv_s, out["compute_s"], out["comm_s"]])
  return np.array(["weights", "K/V", "compute", "communication"])[np.argmax(terms, axis=0)]


def plan(spec: ModelSpec, devices: Sequence[Accelerator], *, context: int, targets: Targets,
         weight_dtypes: Sequence[str] = WEIGHT_DTYPES, kv_dtypes: Sequence[str] = KV_DTYPES,
         batches: Sequence[int] = BATCHES, workspace_fraction: float = 0.1,
         top: int = 20, bound: str = "per_op", comm_overlap: float = 0.0) -> dict[str, Any]:
  """Configurations meeting `targets`, ranked by chips then headroom.

  Returns:
    `{"plans": [...], "searched", "wall_s", "meeting", "assumptions", "targets"}`;
    each plan has accelerator, chips, tp, pp, ep, dp, microbatches, batch,
    weight_dtype, kv_dtype, step_s, ttft_s, aggregate_tokens_per_s (fleet),
    per_sequence_tokens_per_s, comm_s, binds, headroom.
  """
  start = time.perf_counter()
  context = errors.require_positive_int("context", context)
  if not devices:
    raise errors.InputError("accelerators is empty: give at least one.")
  batch = np.asarray(errors.require_positive_ints("batch_sizes", batches), dtype=float)
  grid = build_grid(spec, devices, context, weight_dtypes, kv_dtypes, batch, workspace_fraction)
  if "B" not in grid:
    raise errors.InputError(f"no layout of {spec.name} fits any of "
                            f"{', '.join(d.name for d in devices)}'s interconnects.")
  out = evaluate_grid(grid, context, bound=bound, comm_overlap=comm_overlap)
  even = np.mod(grid["B"], grid["microbatches"] * grid["ep"]) == 0
  ok = (even & (out["chip_bytes"] <= grid["capacity"])
        & (out["step_s"] <= targets.token_gap_s) & (out["prefill_s"] <= targets.ttft_s))
  replicas = np.ceil(targets.aggregate_tokens_per_s / out["aggregate_tokens_per_s"])
  chips = replicas * grid["tp"] * grid["pp"] * grid["ep"]
  headroom = np.minimum(targets.token_gap_s / out["step_s"], targets.ttft_s / out["prefill_s"])
  idx = np.nonzero(ok)[0]
  ranked = idx[np.lexsort((-headroom[idx], chips[idx]))]
  order, seen = [], set()
  for i in ranked:  # The best batch of each (device, layout, dtypes): distinct plans.
    key = tuple(grid[n][i] for n in ("device", "tp", "pp", "ep", "microbatches", "wdt", "kdt"))
    if key not in seen:
      seen.add(key)
      order.append(i)
      if len(order) == top:
        break
  order = np.asarray(order, dtype=int)
  binds = _binds({n: out[n][order] for n in ("memory_s", "weight_bytes", "kv_bytes",
                                               "compute_s", "comm_s")})
  plans = []
  for rank, (i, bind) in enumerate(zip(order, binds), 1):
    dp = int(replicas[i])
    plans.append({
        "rank": rank, "accelerator": devices[int(grid["device"][i])].name,
        "chips": int(chips[i]), "tp": int(grid["tp"][i]), "pp": int(grid["pp"][i]),
        "ep": int(grid["ep"][i]), "dp": dp, "microbatches": int(grid["microbatches"][i]),
        "batch": int(grid["B"][i]), "weight_dtype": weight_dtypes[int(grid["wdt"][i])],
        "kv_dtype": kv_dtypes[int(grid["kdt"][i])], "step_s": float(out["step_s"][i]),
        "ttft_s": float(out["prefill_s"][i]), "comm_s": float(out["comm_s"][i]),
        "aggregate_tokens_per_s": float(out["aggregate_tokens_per_s"][i] * dp),
        "replica_tokens_per_s": float(out["aggregate_tokens_per_s"][i]),
        "per_sequence_tokens_per_s": float(out["per_sequence_tokens_per_s"][i]),
        "chip_memory_bytes": float(out["chip_bytes"][i]), "binds": str(bind),
        "headroom": float(headroom[i])})
  return {
      "kind": "bound", "model": spec.name, "context": context,
      "targets": dataclasses.asdict(targets),
      "searched": int(grid["B"].size), "meeting": int(idx.size),
      "wall_s": time.perf_counter() - start,
      "accelerators": [d.name for d in devices],
      "weight_dtypes": list(weight_dtypes), "kv_dtypes": list(kv_dtypes),
      "assumptions": list(ASSUMPTIONS), "plans": plans,
      "units": {"step_s": "s", "ttft_s": "s", "comm_s": "s", "chips": "chips",
                "aggregate_tokens_per_s": "tokens/s (fleet)", "chip_memory_bytes": "B",
                "wall_s": "s (wall-clock of the search, this CPU)"},
  }
