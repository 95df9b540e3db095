"""The fewest chips (or the cheapest fleet) that serve a workload: a vectorised search.

`plan` searches accelerators x layout (tp, pp, ep, microbatches) x batch x
weight dtype x K/V dtype in one flat numpy evaluation of the lambdified
per-chip decode step and prefill (the one cost model, `jaxroof.symbolic.cost_model`),
keeps the configurations that fit per-chip memory, and gives each the
data-parallel replicas `dp` the workload needs with its prefill load: the
fewest replicas at which, per replica at `rate / dp`, (a) the requests fit
the batch's slots (`serving.shared_capacity_rate`: prefill plus the request's
share of decode steps), (b) the loaded token gap `t / (1 - lam*D)` meets the
gap target and (c) the mean TTFT, the M/D/1 prefill queue with the prompt's
iteration as the service after the wait for one of the batch's decode slots
(`symbolic.slot_queue`), meets the TTFT target (stable queues). Plans are ranked by cost per
hour where prices are given, else by chips within each accelerator (chips of
different kinds are never compared), then by headroom. Everything here is an
analytic bound; `experiments.plan` simulates the top plans.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxroof import errors
from jaxroof.parallel import layout as layout_lib
from jaxroof.parallel.layout import Layout
from jaxroof.specs import accelerators
from jaxroof.specs import parameters as params
from jaxroof.specs import step_inputs
from jaxroof.specs.accelerators import Accelerator
from jaxroof.specs.model_spec import ModelSpec
from jaxroof.symbolic import collectives
from jaxroof.symbolic import request_formulas
from jaxroof.symbolic import slot_queue
from jaxroof.symbolic import symbols as S
from jaxroof.symbolic import prefill as prefill_formulas
from jaxroof.symbolic.evaluate import lambdified

WEIGHT_DTYPES = ("bf16", "fp8", "int8", "int4")
KV_DTYPES = ("bf16", "fp8", "int8")
TP_CHOICES = (1, 2, 4, 8, 16, 32, 64)
PP_CHOICES = (1, 2, 4, 8)
EP_CHOICES = (1, 2, 4, 8, 16, 32, 64)
LINK_NAMES = tuple(str(s) for s in collectives.LINK_SYMBOLS)
BATCHES = tuple(int(b) for b in np.unique(np.round(np.geomspace(1, 4096, 200))))

DEFAULT_WEIGHT_DTYPES = ("published",)
DEFAULT_KV_DTYPES = ("bf16",)
DEFAULT_OUTPUT_TOKENS = 256
POOLS = ("both", "shared", "split")

ASSUMPTIONS = (
    "analytic bound from datasheet figures (memory bandwidth, dense FLOP/s, interconnect)",
    "decode: one token per sequence per step; every running sequence holds the full context "
    "(memory and step: conservative)",
    "step and prefill from the one cost model (per-operation rooflines by default: linear "
    "layers, then attention with its K/V; causal attention FLOPs per layer kind)",
    "prefill load: per replica, lam = fleet rate / dp; a prompt of P tokens costs D = its "
    "prefill on the layout; capacity 1/(D + (G - 1) t / B) (serving.shared_capacity_rate); "
    "token gap t / (1 - lam D) at the batch's slots (loaded_token_gap); mean TTFT M/D/1 "
    "with service D + t (the prompt's iteration), after the wait for one of the B decode "
    "slots (G/G/c, Sakasegawa; each slot held from prefill to last token, so a load near "
    "the slots' capacity waits without bound); dp is the fewest replicas meeting all of "
    "them",
    "communication serial unless an overlap is given",
    "microbatches 1 or pp; a batch splits evenly over microbatches and expert groups",
    "pools: shared (each replica prefills and decodes) and split (a prefill pool of one "
    "layout, a decode pool of another at its batch with no prefill interference, t <= gap; "
    "each prompt's K/V crosses the device's scale-out network per chip of the prefill "
    "replica, its time added to TTFT); split plans are not simulated (the simulator runs "
    "shared replicas)",
    "ranked by cost per hour where prices are given, else by chips within each accelerator "
    "(never across kinds), then headroom = min(token gap / loaded gap, TTFT target / TTFT); "
    "one plan (its best batch) per accelerator, layout and bytes; dtypes with identical bytes "
    "and rates merged",
)


@dataclasses.dataclass(frozen=True)
class Targets:
  """Service targets and the fleet's load: `aggregate_tokens_per_s` (output tokens/s)
  or `arrival_rate_per_s` (requests/s), one of them."""

  token_gap_s: float
  ttft_s: float
  aggregate_tokens_per_s: float | None = None
  arrival_rate_per_s: float | None = None

  def __post_init__(self):
    errors.require_positive("token_gap_ms", self.token_gap_s * 1e3)
    errors.require_positive("ttft_ms", self.ttft_s * 1e3)
    if (self.aggregate_tokens_per_s is None) == (self.arrival_rate_per_s is None):
      raise errors.InputError(
          "give the load once: aggregate_tokens_per_s or arrival_rate, "
          "not both and not neither.", field="aggregate_tokens_per_s")
    if self.aggregate_tokens_per_s is not None:
      errors.require_positive("aggregate_tokens_per_s", self.aggregate_tokens_per_s)
    else:
      errors.require_positive("arrival_rate", self.arrival_rate_per_s)

  def request_rate(self, output_tokens: int) -> float:
    """Fleet requests/s: the arrival rate, or the aggregate output rate / G."""
    if self.arrival_rate_per_s is not None:
      return float(self.arrival_rate_per_s)
    return float(self.aggregate_tokens_per_s) / output_tokens


@functools.cache
def _load_model():
  """Capacity, loaded gap and mean TTFT of one replica, and the largest rates the gap
  and TTFT targets allow (`jaxroof.symbolic.request_formulas`), lambdified once."""
  rate_ttft = request_formulas.max_arrival_rate_for_ttft()
  return lambdified(
      {
          "capacity": request_formulas.shared_capacity_rate(),
          "rate_gap": request_formulas.max_arrival_rate_for_gap(),
          "rate_ttft": rate_ttft,
      }, (S.t, S.D_pf, S.B, S.n_out, S.t_gap, S.t_ttft, S.t_window))


@functools.cache
def _at_rate_model():
  return lambdified(
      {
          "gap": request_formulas.loaded_token_gap(), "ttft": request_formulas.ttft(),
          "utilisation": request_formulas.utilisation()
      }, (S.t, S.lam, S.D_pf, S.t_window))


def parse_prices(text: str | None, known: Sequence[str]) -> dict[str, float]:
  """`h100-sxm=3.0,h200=3.8` -> {slug: $/chip-hour}; each slug known, each price > 0.

  Raises:
    InputError: a malformed entry, an unknown accelerator, a price <= 0 or repeated.
  """
  if text is None or not text.strip():
    return {}
  out: dict[str, float] = {}
  for entry in text.split(","):
    name, sep, value = entry.strip().partition("=")
    name = name.strip()
    if not sep or not name:
      raise errors.InputError(
          f"price_per_hour entry {entry.strip()!r} is not NAME=PRICE "
          "(e.g. h100-sxm=3.0).", field="price_per_hour")
    if name not in known:
      raise errors.InputError(
          f"price_per_hour names {name!r}, not a known accelerator: "
          f"allowed {', '.join(known)}.", field="price_per_hour")
    try:
      price = float(value)
    except ValueError:
      raise errors.InputError(f"price_per_hour for {name} is {value.strip()!r}, not a "
                              "number.", field="price_per_hour") from None
    if not math.isfinite(price) or price <= 0:
      raise errors.InputError(
          f"price_per_hour for {name} is {value.strip()}: a price must "
          "be a finite number > 0 ($ per chip-hour).", field="price_per_hour")
    if name in out:
      raise errors.InputError(f"price_per_hour names {name} twice.", field="price_per_hour")
    out[name] = price
  return out


def format_notes(spec: ModelSpec, devices: Sequence[Accelerator],
                 weight_dtypes: Sequence[str]) -> list[str]:
  """One line per (device, asked weight format) the device has no datapath for,
  naming the rate it falls back to."""
  notes = []
  for device in devices:
    for wdt in weight_dtypes:
      name = params.weight_format(spec, wdt).dtype if wdt == "published" else wdt
      try:
        note = device.compute_note(name)
      except errors.InputError:  # A mixed format: its parts are described elsewhere.
        continue
      if "(fallback)" in note:
        notes.append(f"{device.name}: {note}")
  return notes


@functools.cache
def _memory_model():
  """The busiest chip's bytes (`collectives.chip_memory_bytes`), lambdified once."""
  return lambdified({"chip_bytes": collectives.chip_memory_bytes()},
                    (S.B, S.W_res, S.W_x, S.W_e, S.W_h, S.x_tie, S.s, S.tp, S.pp, S.ep, S.u_kv))


def candidate_layouts(spec: ModelSpec,
                      device: Accelerator) -> list[tuple[Layout, layout_lib.LinkChoice]]:
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
               weight_dtypes: Sequence[str], kv_dtypes: Sequence[str], batches: np.ndarray,
               workspace_fraction: float,
               prompt_tokens: int | None = None) -> dict[str, np.ndarray]:
  """Flat arrays, one entry per configuration, of every input the models take
  (`prompt_tokens`, default the context: the prefill's attention FLOPs per pair)."""
  terms = layout_lib.model_terms(spec)
  n_x = layout_lib.expert_weights_read(spec, batches)
  columns: dict[str, list[np.ndarray]] = {}
  classes: dict[tuple, int] = {}  # Identical bytes and rates on one device: one class.
  members: dict[int, list[tuple[str, str]]] = {}

  def add(**values):
    for name, value in values.items():
      columns.setdefault(name, []).append(value)

  for di, device in enumerate(devices):
    layouts = candidate_layouts(spec, device)
    if not layouts:
      continue
    n_layouts, n_b = len(layouts), len(batches)
    per_layout = {
        name: np.repeat(np.array([getattr(lay, name) for lay, _ in layouts], dtype=float), n_b)
        for name in ("tp", "pp", "ep", "microbatches")
    }
    link_columns = {
        name: np.repeat([layout_lib.link_values(link, lay.tp)[name] for lay, link in layouts], n_b)
        for name in LINK_NAMES
    }
    b = np.tile(batches, n_layouts)
    for wi, wdt in enumerate(weight_dtypes):
      for ki, kdt in enumerate(kv_dtypes):
        inputs = step_inputs.decode_step_inputs(spec, device, context=context,
                                                batch_sizes=list(batches), weight_dtype=wdt,
                                                kv_dtype=kdt, workspace_fraction=workspace_fraction)
        size = n_layouts * n_b
        name = inputs.weight_dtype + (" (published)" if wdt == "published" else "")
        same = (di, tuple(np.round(np.broadcast_to(inputs.q, (n_b,)),
                                   12)), round(float(inputs.k), 9), float(inputs.F),
                float(inputs.kv_allocated_bytes_per_sequence), float(inputs.A_t))
        cls = classes.setdefault(same, len(classes))
        members.setdefault(cls, []).append((name, kdt))
        add(
            device=np.full(size, di), wdt=np.full(size, wi), kdt=np.full(size, ki),
            cls=np.full(size, cls), B=b, N=np.tile(inputs.N, n_layouts),
            N_x=np.tile(n_x, n_layouts), q=np.tile(np.broadcast_to(inputs.q, (n_b,)), n_layouts),
            k=np.full(size, inputs.k), BW=np.full(size, inputs.BW), F=np.full(size, inputs.F),
            N_act=np.full(size, inputs.N_act), **link_columns, A_t=np.full(size, inputs.A_t), **{
                name: np.full(size, value) for name, value in layout_lib.weight_byte_values(
                    spec, inputs.weight_format).items()
            }, s=np.full(size, inputs.kv_allocated_bytes_per_sequence),
            capacity=np.full(size,
                             inputs.memory_capacity_bytes * (1 - workspace_fraction)), **per_layout)
  grid = {name: np.concatenate(parts) for name, parts in columns.items()}
  grid.update(
      u_kv=float(terms.kv_units), n_blk=float(terms.blocks), L_moe=float(terms.moe_blocks),
      K=float(max(terms.top_k,
                  1)), D=float(terms.width), V=float(terms.vocab), class_members=members,
      A_f=prefill_formulas.pair_flops_at(prefill_formulas.attention_terms(spec), prompt_tokens or
                                         context))
  return grid


def evaluate_grid(grid: dict[str, Any], context: int,
                  activation_bytes: float = layout_lib.DEFAULT_ACTIVATION_BYTES,
                  bound: str = "per_op", comm_overlap: float = 0.0,
                  prompt_tokens: int | None = None) -> dict[str, np.ndarray]:
  """Decode step, prefill and per-chip memory at every configuration (one call each):
  the one cost model's decode and prefill (`bound`) of a `prompt_tokens` prompt
  (default the context), communication hidden by `comm_overlap`."""
  shared = dict(tp=grid["tp"], pp=grid["pp"], ep=grid["ep"], L_moe=grid["L_moe"], K=grid["K"],
                D=grid["D"], V=grid["V"], a_act=activation_bytes,
                **{name: grid[name] for name in LINK_NAMES}, o_ovl=comm_overlap, n_blk=grid["n_blk"],
                q=grid["q"], F=grid["F"], N_act=grid["N_act"], BW=grid["BW"])
  decode = layout_lib.decode_model(bound=bound)(B=grid["B"], T=float(context), N=grid["N"],
                                                N_x=grid["N_x"], k=grid["k"],
                                                m_mb=grid["microbatches"], u_kv=grid["u_kv"],
                                                A_t=grid["A_t"], **shared)
  prefill = layout_lib.prefill_model(bound=bound)(P=float(prompt_tokens or context), N=grid["N"],
                                                  N_x=grid["N_x"], A_f=grid["A_f"], **shared)
  memory = _memory_model()(B=grid["B"], W_res=grid["W_res"], W_x=grid["W_x"], W_e=grid["W_e"],
                           W_h=grid["W_h"], x_tie=grid["x_tie"], s=grid["s"], tp=grid["tp"],
                           pp=grid["pp"], ep=grid["ep"], u_kv=grid["u_kv"])
  return {**decode, **prefill, **memory}


def _binds(out: dict[str, np.ndarray]) -> np.ndarray:
  weights_s = out["memory_s"] * out["weight_bytes"] / (out["weight_bytes"] + out["kv_bytes"])
  kv_s = out["memory_s"] - weights_s
  terms = np.stack([weights_s, kv_s, out["compute_s"], out["comm_s"]])
  return np.array(["weights", "K/V", "compute", "communication"])[np.argmax(terms, axis=0)]


def _replicas(grid: Mapping[str, Any], out: Mapping[str, np.ndarray], targets: Targets,
              request_rate: float, output_tokens: int, hold_cv2: float) -> dict[str, np.ndarray]:
  """dp per configuration (the fewest replicas whose per-replica load meets the slots'
  capacity, the loaded gap and the mean TTFT with its wait for a slot) and the load at
  that dp."""
  step, prefill = out["step_s"], out["prefill_s"]
  service = prefill + step  # The prompt's iteration: its prefill beside one decode step.
  common = dict(B=grid["B"], n_out=float(output_tokens), t_gap=targets.token_gap_s,
                t_ttft=targets.ttft_s, t_window=0.0)
  with np.errstate(divide="ignore", invalid="ignore"):
    rates = _load_model()(t=step, D_pf=prefill, **common)
    ttft_rate = _load_model()(t=step, D_pf=service, **common)["rate_ttft"]
    capacity = np.asarray(rates["capacity"], dtype=float)
    gap_rate = np.where(step < targets.token_gap_s, rates["rate_gap"], 0.0)
    ttft_rate = np.where(service < targets.ttft_s, ttft_rate, 0.0)
    lam_max = np.minimum(np.minimum(capacity, gap_rate), ttft_rate)
    lam_max = np.where(np.isfinite(lam_max) & (lam_max > 0), lam_max, 0.0)
    slot_rate = slot_queue.shared_rate_for_ttft(step, prefill, grid["B"], output_tokens,
                                                targets.ttft_s, lam_max, hold_cv2)
    binding = np.array(["capacity", "token_gap", "ttft", "slots"])[np.argmin(
        np.stack([capacity, gap_rate, ttft_rate, slot_rate * (1 + 1e-9)]), axis=0)]
    lam_max = np.minimum(lam_max, slot_rate)
    dp = np.ceil(request_rate / np.where(lam_max > 0, lam_max, np.nan) * (1 - 1e-12))
    lam = request_rate / dp
    at = _at_rate_model()(t=step, lam=lam, D_pf=prefill, t_window=0.0)
    queue = slot_queue.shared_at(step, prefill, grid["B"], output_tokens, lam, hold_cv2)
  return {
      "dp": dp, "lam": lam, "lam_max": lam_max, "capacity": capacity, "loaded_gap": at["gap"],
      "ttft": queue["ttft_s"], "slot_wait": queue["slot_wait_s"],
      "slot_utilisation": queue["slot_utilisation"],
      "utilisation": _at_rate_model()(t=step, lam=lam, D_pf=service, t_window=0.0)
                     ["utilisation"], "load_binds": binding
  }


def plan(spec: ModelSpec, devices: Sequence[Accelerator], *, context: int, targets: Targets,
         prompt_tokens: int | None = None, output_tokens: int = DEFAULT_OUTPUT_TOKENS,
         weight_dtypes: Sequence[str] = DEFAULT_WEIGHT_DTYPES,
         kv_dtypes: Sequence[str] = DEFAULT_KV_DTYPES, batches: Sequence[int] = BATCHES,
         workspace_fraction: float = 0.1, top: int = 20, bound: str = "per_op",
         comm_overlap: float = 0.0, prices: Mapping[str, float] | None = None,
         max_chips: int | None = None, pools: str = "both",
         hold_cv2: float = 0.0) -> dict[str, Any]:
  """Configurations serving the workload within `targets`, ranked.

  `prompt_tokens` defaults to context - output_tokens; lengths are means, and
  `hold_cv2` (the squared coefficient of variation of the output lengths, 0 when
  fixed) is the spread of the time a request holds its decode slot. With `prices` ($ per
  chip-hour by accelerator slug, one for every device searched) plans rank by
  cost per hour; without, by chips within each accelerator, the accelerators'
  first plans first (rank 1 of each, then rank 2, ...).

  Returns:
    `{"plans": [...], "searched", "wall_s", "meeting", "assumptions", "targets", ...}`;
    each plan has accelerator, chips, tp, pp, ep, dp, microbatches, batch,
    weight_dtype, kv_dtype, merged (the dtypes of identical bytes and rates),
    step_s, loaded_token_gap_s, prefill_s, ttft_s (mean, queued),
    utilisation, arrival_rate_per_replica_per_s, capacity_per_replica_per_s,
    aggregate_tokens_per_s (the fleet's capacity), cost_per_hour,
    cost_per_million_tokens, pools, simulated (None here), binds,
    load_binds, headroom.
  """
  start = time.perf_counter()
  context = errors.require_positive_int("context", context)
  output_tokens = errors.require_positive_int("output_tokens", output_tokens)
  if prompt_tokens is None:
    if output_tokens >= context:
      raise errors.InputError(
          f"output_tokens={output_tokens} leaves no prompt within the "
          f"{context}-token context: give prompt_tokens or a larger "
          "context.", field="output_tokens")
    prompt_tokens = context - output_tokens
  prompt_tokens = errors.require_positive_int("prompt_tokens", prompt_tokens)
  if prompt_tokens + output_tokens > context:
    raise errors.InputError(
        f"prompt_tokens + output_tokens = {prompt_tokens + output_tokens} "
        f"exceeds the {context}-token context: allowed a sum <= {context}.", field="prompt_tokens")
  if not devices:
    raise errors.InputError("accelerators is empty: give at least one.", field="accelerators")
  if not weight_dtypes or not kv_dtypes:
    raise errors.InputError("the weight and K/V dtype lists need at least one entry each.",
                            field="weight_dtypes")
  errors.require_choice("pools", pools, POOLS)
  prices = dict(prices or {})
  if prices:
    missing = [d.name for d in devices if d.name not in prices]
    if missing:
      raise errors.InputError(
          f"no price per hour for {', '.join(missing)}: give one for "
          "every accelerator searched, or leave it out.", field="price_per_hour")
  if max_chips is not None:
    max_chips = errors.require_positive_int("max_chips", max_chips)
  batch = np.asarray(errors.require_positive_ints("batch_sizes", batches), dtype=float)
  notes = format_notes(spec, devices, weight_dtypes)
  grid = build_grid(spec, devices, context, weight_dtypes, kv_dtypes, batch, workspace_fraction,
                    prompt_tokens=prompt_tokens)
  if "B" not in grid:
    raise errors.InputError(
        f"no layout of {spec.name} fits any of "
        f"{', '.join(d.name for d in devices)}'s interconnects.", field="accelerators")
  out = evaluate_grid(grid, context, bound=bound, comm_overlap=comm_overlap,
                      prompt_tokens=prompt_tokens)
  rate = targets.request_rate(output_tokens)
  hold_cv2 = errors.require_non_negative("hold_cv2", hold_cv2)
  load = _replicas(grid, out, targets, rate, output_tokens, hold_cv2)
  even = np.mod(grid["B"], grid["microbatches"] * grid["ep"]) == 0
  per_replica = grid["tp"] * grid["pp"] * grid["ep"]
  chips = load["dp"] * per_replica
  ok = even & (out["chip_bytes"] <= grid["capacity"]) & (load["lam_max"] > 0)
  if max_chips is not None:
    ok &= chips <= max_chips
  with np.errstate(divide="ignore", invalid="ignore"):
    headroom = np.minimum(targets.token_gap_s / load["loaded_gap"], targets.ttft_s / load["ttft"])
  price = np.array([prices.get(d.name, np.nan) for d in devices])[grid["device"].astype(int)]
  cost = chips * price
  idx = np.nonzero(ok)[0]
  if prices:
    ranked = idx[np.lexsort((-headroom[idx], cost[idx]))]
  else:
    ranked = idx[np.lexsort((-headroom[idx], chips[idx], grid["device"][idx]))]
  chosen, seen, per_device = [], set(), {}
  for i in ranked:  # The best batch of each (device, layout, bytes): distinct plans.
    key = tuple(grid[n][i] for n in ("device", "tp", "pp", "ep", "microbatches", "cls"))
    if key in seen:
      continue
    seen.add(key)
    d = int(grid["device"][i])
    if prices and len(chosen) >= top:
      break
    if not prices and per_device.get(d, 0) >= top:
      continue
    per_device[d] = per_device.get(d, 0) + 1
    chosen.append((i, per_device[d]))
  if not prices:  # Rank 1 of each accelerator, then rank 2, ...: kinds never compared.
    chosen = sorted(chosen, key=lambda c: (c[1], int(grid["device"][c[0]])))[:top]
  order = np.asarray([c[0] for c in chosen], dtype=int)
  binds = _binds(
      {n: out[n][order] for n in ("memory_s", "weight_bytes", "kv_bytes", "compute_s", "comm_s")})
  served_tokens_per_s = rate * output_tokens
  plans = []
  for rank, ((i, in_device), bind) in enumerate(zip(chosen, binds), 1):
    dp, n_chips = int(load["dp"][i]), int(chips[i])
    members = grid["class_members"][int(grid["cls"][i])]
    wname, kname = members[0]
    per_hour = float(cost[i]) if prices else None
    plans.append({
        "rank": rank, "rank_within_accelerator": in_device,
        "accelerator": devices[int(grid["device"][i])].name, "chips": n_chips,
        "tp": int(grid["tp"][i]), "pp": int(grid["pp"][i]), "ep": int(grid["ep"][i]), "dp": dp,
        "microbatches": int(grid["microbatches"][i]
                           ), "batch": int(grid["B"][i]), "weight_dtype": wname, "kv_dtype": kname,
        "merged": [{"weight_dtype": w, "kv_dtype": k} for w, k in members[1:]],
        "step_s": float(out["step_s"][i]), "loaded_token_gap_s": float(load["loaded_gap"][i]),
        "prefill_s": float(out["prefill_s"][i]), "ttft_s": float(load["ttft"][i]),
        "utilisation": float(load["utilisation"][i]), "slot_wait_s": float(load["slot_wait"][i]),
        "slot_utilisation": float(load["slot_utilisation"][i]
                                 ), "arrival_rate_per_replica_per_s": float(load["lam"][i]),
        "capacity_per_replica_per_s": float(load["capacity"][i]), "load_binds": str(
            load["load_binds"][i]), "comm_s": float(out["comm_s"][i]), "aggregate_tokens_per_s":
                float(load["capacity"][i] * dp * output_tokens
                     ), "replica_tokens_per_s": float(out["aggregate_tokens_per_s"][i]),
        "per_sequence_tokens_per_s": float(out["per_sequence_tokens_per_s"][i]
                                          ), "chip_memory_bytes": float(out["chip_bytes"][i]
                                                                       ), "binds": str(bind),
        "headroom": float(headroom[i]), "cost_per_hour": per_hour, "cost_per_million_tokens":
            (None if per_hour is None else per_hour / (served_tokens_per_s * 3600 / 1e6)
            ), "pools": {
                "kind": "shared", "prefill_chips": n_chips, "decode_chips": n_chips,
                "note": "one pool: every replica prefills and decodes on its own chips"
            }, "simulated": None
    })
  if pools in ("both", "split"):
    plans += _split_plans(spec, devices, grid, out, targets, rate, output_tokens, prompt_tokens,
                          even, prices, max_chips, served_tokens_per_s, hold_cv2)
  if pools == "split":
    plans = [p for p in plans if p["pools"]["kind"] == "split"]
  plans = _order(plans, devices, bool(prices), top)
  return {
      "kind": "bound",
      "model": spec.name,
      "context": context,
      "pools_searched": pools,
      "workload": {
          "prompt_tokens": prompt_tokens, "output_tokens": output_tokens,
          "arrival_rate_per_s": rate, "output_tokens_per_s": served_tokens_per_s,
          "hold_cv2": hold_cv2
      },
      "targets": dataclasses.asdict(targets),
      "searched": int(grid["B"].size),
      "meeting": int(idx.size),
      "wall_s": time.perf_counter() - start,
      "accelerators": [d.name for d in devices],
      "prices_per_hour": prices or None,
      "ranked_by": ("cost per hour"
                    if prices else "chips within each accelerator (no prices: kinds not compared)"),
      "weight_dtypes": list(weight_dtypes),
      "kv_dtypes": list(kv_dtypes),
      "max_chips": max_chips,
      "notes": notes,
      "assumptions": list(ASSUMPTIONS),
      "plans": plans,
      "units": {
          "step_s": "s", "ttft_s": "s (mean: slot wait G/G/c + M/D/1 prefill queue)",
          "slot_wait_s": "s (mean wait for a decode slot)", "comm_s": "s", "chips": "chips",
          "aggregate_tokens_per_s": "tokens/s (fleet capacity at the plan's batch)",
          "chip_memory_bytes": "B", "cost_per_hour": "$ per hour (fleet)",
          "cost_per_million_tokens": "$ per million output tokens at the target load",
          "wall_s": "s (wall-clock of the search, this CPU)"
      },
  }


def _order(plans: list[dict[str, Any]], devices: Sequence[Accelerator], priced: bool,
           top: int) -> list[dict[str, Any]]:
  """By cost then headroom with prices; else by chips then headroom within each
  accelerator, rank 1 of each accelerator first."""
  if priced:
    plans = sorted(plans, key=lambda p: (p["cost_per_hour"], -p["headroom"]))[:top]
    seen: dict[str, int] = {}
    for p in plans:  # Shared and split plans alike, in the order of their cost.
      seen[p["accelerator"]] = p["rank_within_accelerator"] = seen.get(p["accelerator"], 0) + 1
  else:
    index = {d.name: k for k, d in enumerate(devices)}
    by_device: dict[str, list[dict[str, Any]]] = {}
    for p in sorted(plans, key=lambda p: (p["chips"], -p["headroom"])):
      by_device.setdefault(p["accelerator"], []).append(p)
    for rows in by_device.values():
      for k, p in enumerate(rows, 1):
        p["rank_within_accelerator"] = k
    plans = sorted((p for rows in by_device.values() for p in rows[:top]), key=lambda p:
                   (p["rank_within_accelerator"], index[p["accelerator"]]))[:top]
  for rank, p in enumerate(plans, 1):
    p["rank"] = rank
  return plans


def _kv_link(device: Accelerator) -> tuple[float, str]:
  """Per-chip bytes/s a prompt's K/V crosses between pools (inf: free), and its label."""
  rate, label = accelerators.kv_transfer_link(device)
  return (math.inf if rate is None else rate), label


def _group_argmin(key: np.ndarray):
  """A function giving, for values aligned with `key`, the index of the smallest value
  in each group of equal keys (groups in key order; ties: the first index), in a few
  vector passes rather than one masked pass per group."""
  order = np.argsort(key, kind="stable")
  starts = np.r_[0, np.flatnonzero(np.diff(key[order])) + 1]
  sizes = np.diff(np.r_[starts, key.size])

  def argmin(values: np.ndarray) -> np.ndarray:
    ranked = values[order]
    smallest = np.minimum.reduceat(ranked, starts)
    hits = np.flatnonzero(ranked == np.repeat(smallest, sizes))
    group = np.searchsorted(starts, hits, side="right") - 1
    return order[hits[np.unique(group, return_index=True)[1]]]

  return argmin


def _split_plans(spec: ModelSpec, devices: Sequence[Accelerator], grid: Mapping[str, Any],
                 out: Mapping[str, np.ndarray], targets: Targets, rate: float, output_tokens: int,
                 prompt_tokens: int, even: np.ndarray, prices: Mapping[str, float],
                 max_chips: int | None, served_tokens_per_s: float,
                 hold_cv2: float) -> list[dict[str, Any]]:
  """The fewest-chip split (prefill pool + decode pool) per accelerator and bytes class.

  A request's first token reaches the user from the decode pool (as engines' split
  deployments stream it), so its TTFT is the prefill pool's M/D/1 TTFT, the K/V
  transfer and the wait for a decode slot. The TTFT target is split between them:
  for each share s of `slot_queue.WAIT_SHARES`, decode replicas of a layout and batch with
  t <= gap carry at most B / ((G - 1) t) requests/s (`shared_capacity_rate` at
  D = 0), less where the slot wait passes s x target or, spread over the G - 1
  gaps, pushes the mean TPOT past the gap target
  (`slot_queue.decode_pool_rate`); prefill replicas of a layout carry the rate
  whose mean TTFT meets (1 - s) x target less the transfer
  (`max_arrival_rate_for_ttft`). Each share's pools are each their own minimum;
  the share with the fewest chips in all wins.
  """
  per_replica = grid["tp"] * grid["pp"] * grid["ep"]
  fits = (out["chip_bytes"] <= grid["capacity"]) & even
  link = np.array([_kv_link(d)[0] for d in devices])[grid["device"].astype(int)]
  transfer = prompt_tokens * grid["k"] / (per_replica * link)
  prefill_rows = fits & (grid["B"] == grid["B"].min())  # A prefill replica's batch is moot.
  with np.errstate(divide="ignore", invalid="ignore"):
    dec = _load_model()(t=out["step_s"], D_pf=np.zeros_like(out["step_s"]), B=grid["B"],
                        n_out=float(output_tokens), t_gap=targets.token_gap_s,
                        t_ttft=targets.ttft_s, t_window=0.0)
    decode_upper = np.where((out["step_s"] <= targets.token_gap_s) & fits, dec["capacity"], 0.0)
  group_argmin = _group_argmin(grid["device"].astype(np.int64) * (int(grid["cls"].max()) + 1) +
                               grid["cls"].astype(np.int64))
  best: dict[tuple[int, int], tuple] = {}
  for share in slot_queue.WAIT_SHARES:
    budget = (1 - share) * targets.ttft_s - transfer
    with np.errstate(divide="ignore", invalid="ignore"):
      pre = _load_model()(t=out["step_s"], D_pf=out["prefill_s"], B=grid["B"],
                          n_out=float(output_tokens), t_gap=targets.token_gap_s,
                          t_ttft=np.where(budget > 0, budget, np.nan), t_window=0.0)
      rate_p = np.where(prefill_rows & (budget > out["prefill_s"]) & np.isfinite(pre["rate_ttft"]),
                        pre["rate_ttft"], 0.0)
      n_p = np.ceil(rate / np.where(rate_p > 0, rate_p, np.nan) * (1 - 1e-12))
      rate_d = slot_queue.decode_pool_rate(out["step_s"], grid["B"], output_tokens,
                                           targets.token_gap_s, share * targets.ttft_s,
                                           decode_upper, hold_cv2)
      n_d = np.ceil(rate / np.where(rate_d > 0, rate_d, np.nan) * (1 - 1e-12))
    chips_p = np.where(rate_p > 0, n_p * per_replica, np.inf)
    chips_d = np.where(rate_d > 0, n_d * per_replica, np.inf)
    for ip, idec in zip(group_argmin(chips_p), group_argmin(chips_d)):
      c = (int(grid["device"][ip]), int(grid["cls"][ip]))
      total = chips_p[ip] + chips_d[idec]
      if np.isfinite(total) and (c not in best or total < best[c][0]):
        best[c] = (total, share, ip, idec, n_p[ip], n_d[idec], rate_d[idec])
  plans = []
  for (di, cls), (total, share, ip, idec, np_, nd_, rate_di) in sorted(best.items()):
    total = int(total)
    cp, cd = int(np_ * per_replica[ip]), int(nd_ * per_replica[idec])
    if max_chips is not None and total > max_chips:
      continue
    device = devices[di]
    lam_p = rate / np_
    queue = _at_rate_model()(t=0.0, lam=lam_p, D_pf=out["prefill_s"][ip], t_window=0.0)
    step = float(out["step_s"][idec])
    decode = slot_queue.decode_pool_at(step, grid["B"][idec], output_tokens, rate / nd_, hold_cv2)
    ttft = float(queue["ttft"] + transfer[ip] + decode["slot_wait_s"])
    tpot = float(decode["tpot_s"])
    per_hour = total * prices[device.name] if prices else None
    wname, kname = grid["class_members"][cls][0]
    plans.append({
        "rank": 0, "rank_within_accelerator": 0, "accelerator": device.name, "chips": total,
        "tp": int(grid["tp"][idec]), "pp": int(grid["pp"][idec]), "ep": int(grid["ep"][idec]),
        "dp": int(nd_), "microbatches": int(grid["microbatches"][idec]),
        "batch": int(grid["B"][idec]), "weight_dtype": wname, "kv_dtype": kname,
        "merged": [{"weight_dtype": w, "kv_dtype": k} for w, k in grid["class_members"][cls][1:]],
        "step_s": step, "loaded_token_gap_s": tpot, "prefill_s": float(out["prefill_s"][ip]),
        "ttft_s": ttft, "utilisation": float(queue["utilisation"]
                                            ), "slot_wait_s": float(decode["slot_wait_s"]),
        "slot_utilisation": float(decode["slot_utilisation"]
                                 ), "arrival_rate_per_replica_per_s": float(rate / nd_),
        "capacity_per_replica_per_s": float(rate_di), "load_binds": "split", "comm_s": float(
            out["comm_s"][idec]), "aggregate_tokens_per_s": float(rate_di * nd_ * output_tokens),
        "replica_tokens_per_s": float(out["aggregate_tokens_per_s"][idec]),
        "per_sequence_tokens_per_s": float(out["per_sequence_tokens_per_s"][idec]
                                          ), "chip_memory_bytes": float(out["chip_bytes"][idec]),
        "binds": "split pools", "headroom": float(
            min(targets.token_gap_s / tpot,
                targets.ttft_s / ttft)), "cost_per_hour": per_hour, "cost_per_million_tokens":
                    (None if per_hour is None else per_hour / (served_tokens_per_s * 3600 / 1e6)
                    ), "pools": {
                        "kind": "split", "prefill_chips": int(cp), "decode_chips": int(cd),
                        "slot_wait_share": share, "prefill": {
                            "tp": int(grid["tp"][ip]), "pp": int(grid["pp"][ip]),
                            "ep": int(grid["ep"][ip]), "replicas": int(np_),
                            "utilisation": float(queue["utilisation"])
                        }, "decode": {
                            "tp": int(grid["tp"][idec]), "pp": int(grid["pp"][idec]),
                            "ep": int(grid["ep"][idec]), "replicas": int(nd_),
                            "batch": int(grid["B"][idec]),
                            "slot_utilisation": float(decode["slot_utilisation"])
                        }, "kv_transfer_s": float(transfer[ip]), "kv_link": _kv_link(device)[1]
                    }, "simulated": None
    })
  return plans
