"""The fewest chips, the cheapest fleet, or the most load at a fixed fleet: a planned search.

`plan` searches accelerators x layout (tp, pp, ep, microbatches) x the weight and K/V
dtypes allowed (`plan_grid`); every group's replica is answered by the one load model
(`jaxroof.symbolic.load_model` over the cost model at each occupancy,
`replica_load.choose`), as `serving` answers it: the number of running sequences
(`max_running`) and the scheduling (whole prompts per iteration, or chunks of a token
budget) that give the largest rate within the targets (the mean token gap, TTFT at p90,
the inter-token gap at p99) and memory, that rate per replica, and at the fleet's load
the fewest replicas `dp` carrying it. Plans rank by cost per hour where prices are
given, else by chips within each accelerator (chips of different kinds are never
compared), then by headroom (the max rate over the load each replica carries); with
`chips`, by the load a fleet of exactly that many chips carries (tokens/s per chip).
Groups are bounded first and evaluated exactly only while they can still make the list
(`plan_search`). Split prefill/decode pools come from `plan_split`. Everything here is
an analytic bound; `serving.plan_check` simulates and sizes the top plans.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxroof import errors
from jaxroof.parallel import engine_drive
from jaxroof.parallel import plan_grid
from jaxroof.parallel import plan_rows
from jaxroof.parallel import plan_search
from jaxroof.parallel import plan_split
from jaxroof.parallel import replica_load
from jaxroof.specs import parameters as params
from jaxroof.specs.accelerators import Accelerator
from jaxroof.specs.model_spec import ModelSpec
from jaxroof.symbolic import load_model
from jaxroof.symbolic.step_model import StepModel

WEIGHT_DTYPES = ("bf16", "fp8", "int8", "int4")
KV_DTYPES = ("bf16", "fp8", "int8")
TP_CHOICES, PP_CHOICES, EP_CHOICES = (plan_grid.TP_CHOICES, plan_grid.PP_CHOICES,
                                      plan_grid.EP_CHOICES)
BATCHES = tuple(int(b) for b in np.unique(np.round(np.geomspace(1, 4096, 200))))

DEFAULT_WEIGHT_DTYPES = ("published",)
DEFAULT_KV_DTYPES = ("bf16",)
DEFAULT_OUTPUT_TOKENS = 256
POOLS = ("both", "shared", "split")

ASSUMPTIONS = (
    "analytic bound from datasheet figures (memory bandwidth, dense FLOP/s, interconnect)",
    "every iteration from the one cost model (per-operation rooflines by default: linear "
    "layers, the LM head at the rows that sample, attention with its K/V per layer kind), "
    "decode rows at the requests' mean context P + G/2, a prompt's prefill in the form "
    "the cost model is given (MLA: the MHA or absorbed form asked)",
    "load: per replica, the load model (" + load_model.MODEL + "); the running count and "
    "scheduling with the largest max rate within the targets and memory; dp the fewest "
    "replicas whose share of the fleet's rate is within it",
    "communication serial unless an overlap is given; a fully connected mesh's collective "
    "over n chips runs on its n - 1 peer links; every collective pays its fabric's base "
    "latency",
    "microbatches 1 or pp: a pass carries B/m rows, and a prompt holds every stage it "
    "crosses (the other microbatches wait behind it); a batch splits evenly over "
    "microbatches and expert groups",
    "pools: shared (each replica prefills and decodes) and split (" + plan_split.SUMMARY + ")",
    "ranked by cost per hour where prices are given, else by chips within each accelerator "
    "(never across kinds), then headroom = max rate / load per replica; with a fixed "
    "fleet, by the rate it carries; one plan per accelerator, layout and bytes; dtypes "
    "with identical bytes and rates merged",
)


@dataclasses.dataclass(frozen=True)
class Targets:
  """Service targets and the fleet's load: `aggregate_tokens_per_s` (output tokens/s)
  or `arrival_rate_per_s` (requests/s), one of them (neither only for a fixed fleet).
  TTFT is held at its `ttft_quantile`; the inter-token gap at its `itl_quantile` within
  the token gap (None: the mean gap alone, as a TPOT target is often stated)."""

  token_gap_s: float
  ttft_s: float
  aggregate_tokens_per_s: float | None = None
  arrival_rate_per_s: float | None = None
  ttft_quantile: float = 0.9
  itl_quantile: float | None = 0.99

  def __post_init__(self):
    errors.require_positive("token_gap_ms", self.token_gap_s * 1e3)
    errors.require_positive("ttft_ms", self.ttft_s * 1e3)
    for name, q in (("ttft_percentile", self.ttft_quantile), ("itl_percentile", self.itl_quantile)):
      if q is not None and not 0 < q < 1:
        raise errors.InputError(
            f"{name}={100 * q:g} is not allowed: give a percentile in (0, "
            "100).", field=name)
    if self.aggregate_tokens_per_s is not None and self.arrival_rate_per_s is not None:
      raise errors.InputError(
          "give the load once: aggregate_tokens_per_s or arrival_rate, "
          "not both.", field="aggregate_tokens_per_s")
    if self.aggregate_tokens_per_s is not None:
      errors.require_positive("aggregate_tokens_per_s", self.aggregate_tokens_per_s)
    elif self.arrival_rate_per_s is not None:
      errors.require_positive("arrival_rate", self.arrival_rate_per_s)

  @property
  def has_load(self) -> bool:
    return self.aggregate_tokens_per_s is not None or self.arrival_rate_per_s is not None

  def request_rate(self, output_tokens: int) -> float | None:
    """Fleet requests/s: the arrival rate, or the aggregate output rate / G (None: no
    load given)."""
    if self.arrival_rate_per_s is not None:
      return float(self.arrival_rate_per_s)
    if self.aggregate_tokens_per_s is None:
      return None
    return float(self.aggregate_tokens_per_s) / output_tokens


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
    if not (math.isfinite(price) and 1e-6 <= price <= 1e6):  # Beyond: inf or 0 in the costs.
      raise errors.InputError(
          f"price_per_hour for {name} is {value.strip()}: a price must "
          "be a finite number > 0, in [1e-06, 1e+06] ($ per chip-hour).", field="price_per_hour")
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


def _check(spec: ModelSpec, devices: Sequence[Accelerator], *, context: int,
           prompt_tokens: int | None, output_tokens: int, weight_dtypes: Sequence[str],
           kv_dtypes: Sequence[str], prices: Mapping[str, float], pools: str) -> tuple[int, int]:
  """Validated (prompt_tokens, output_tokens); one line per bad input."""
  context = errors.require_positive_int("context", context)
  output_tokens = errors.require_positive_int("output_tokens", output_tokens)
  if output_tokens < 2:
    raise errors.InputError(
        f"output_tokens={output_tokens} is not allowed: a request needs >= 2 outputs (one "
        "output has no gap between tokens).", field="output_tokens")
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
  if prices:
    missing = [d.name for d in devices if d.name not in prices]
    if missing:
      raise errors.InputError(
          f"no price per hour for {', '.join(missing)}: give one for "
          "every accelerator searched, or leave it out.", field="price_per_hour")
  return prompt_tokens, output_tokens


def _check_chips(chips: Any, grid: plan_grid.Grid, fits: np.ndarray) -> int:
  """A fleet size: whole, >= 1, and one that replicas holding the model can fill."""
  if isinstance(chips, bool) or not isinstance(chips, (int, np.integer)) or chips < 1:
    raise errors.InputError(f"chips={chips!r} is not allowed: give a whole number of chips >= 1.",
                            field="chips")
  sizes = sorted({int(x) for x in grid.per_replica[fits]})
  if not sizes:
    raise errors.InputError(f"chips={chips}: no layout searched holds the model in memory.",
                            field="chips")
  if not any(chips % s == 0 for s in sizes):
    raise errors.InputError(
        f"chips={chips} is beyond the search: no replica of it divides {chips} chips "
        f"(replicas searched span {', '.join(map(str, sizes))} chips).", field="chips")
  return int(chips)


def _merged(each: Sequence[dict[str, Any]], devices: Sequence[Accelerator], left: list[str], *,
            top: int, priced: bool, fixed: bool, start: float) -> dict[str, Any]:
  """Plans of each accelerator made alone (`plan`), ranked together as one search's."""
  out = dict(each[0])
  for key in ("searched", "meeting", "split_searched", "split_meeting", "evaluated_groups"):
    out[key] = sum(r[key] for r in each)
  for key in ("notes", "assumptions"):
    out[key] = list(
        dict.fromkeys([*(x for r in each for x in r[key]), *(left if key == "notes" else [])]))
  out["plans"] = plan_rows.order([p for r in each for p in r["plans"]], devices, priced=priced,
                                 top=top, fixed=fixed)
  out["closest"] = None if out["plans"] else next(
      (r["closest"] for r in each if r["closest"]), None)
  out["accelerators"] = [d.name for d in devices]
  out["prices_per_hour"] = {k: v for r in each
                            for k, v in (r["prices_per_hour"] or {}).items()} or None
  out["wall_s"] = time.perf_counter() - start
  return out


def plan(spec: ModelSpec, devices: Sequence[Accelerator], *, context: int, targets: Targets,
         prompt_tokens: int | None = None, output_tokens: int = DEFAULT_OUTPUT_TOKENS,
         weight_dtypes: Sequence[str] = DEFAULT_WEIGHT_DTYPES,
         kv_dtypes: Sequence[str] = DEFAULT_KV_DTYPES, batches: Sequence[int] | None = None,
         workspace_fraction: float = 0.1, top: int = 20, bound: str = "per_op",
         comm_overlap: float = 0.0, prices: Mapping[str, float] | None = None,
         max_chips: int | None = None, pools: str = "both", hold_cv2: float = 0.0,
         scheduler: str | None = None, token_budget: int | None = None, chips: int | None = None,
         mla_prefill: str = "mha", engine: str = engine_drive.BOUND) -> dict[str, Any]:
  """Configurations serving the workload within `targets`, ranked.

  `prompt_tokens` defaults to context - output_tokens; lengths are means, and
  `hold_cv2` (the squared coefficient of variation of the output lengths, 0 when
  fixed) is the spread of the time a request holds its slot. With `prices` ($ per
  chip-hour by accelerator slug, one for every device searched) plans rank by
  cost per hour; without, by chips within each accelerator, the accelerators'
  first plans first. With `chips`, the fleet is exactly that many chips and plans rank
  by the rate it carries within the targets (tokens/s per chip). `scheduler` and
  `token_budget` fix the scheduling (default: each plan's best, or an `engine`'s own);
  `batches` the running counts allowed (default: any that fits). An `engine`
  (`engine_drive`) makes every figure its calibrated prediction: its step, its scheduler
  defaults, its running cap and memory reservation (`engine_plan.plan` puts the bound's
  plans beside).

  Returns:
    `{"plans": [...], "searched", "meeting", "split_searched", "split_meeting", "wall_s",
    "assumptions", "targets", ...}`; each plan has accelerator, chips, tp, pp, ep, dp,
    microbatches, max_running (= batch), scheduler, token_budget,
    max_rate_per_replica_s, tokens_per_s_per_chip, the operating point (token gap,
    TTFT mean and p90, p99 inter-token gap, slot wait and utilisation), cost, pools and
    simulated (None here).
  """
  asked = dict(locals())  # Every argument, to plan each accelerator alone (below).
  start = time.perf_counter()
  prices = dict(prices or {})
  prompt_tokens, output_tokens = _check(spec, devices, context=context, prompt_tokens=prompt_tokens,
                                        output_tokens=output_tokens, weight_dtypes=weight_dtypes,
                                        kv_dtypes=kv_dtypes, prices=prices, pools=pools)
  if max_chips is not None:
    max_chips = errors.require_positive_int("max_chips", max_chips)
  hold_cv2 = errors.require_non_negative("hold_cv2", hold_cv2)
  allowed = None if batches is None else np.asarray(
      errors.require_positive_ints("batch_sizes", batches), dtype=float)
  drives, left = engine_drive.drives(engine, devices)  # {} for the bound; one line if unknown.
  devices = [d for d in devices if not drives or d.name in drives]
  if len({tuple(sorted(d.entry.terms.items())) for d in drives.values()}) > 1:
    # The engine's entries carry their accelerators' own terms: each planned alone.
    each = [
        plan(**{**asked, "devices": [d], "prices": {d.name: prices[d.name]} if prices else None})
        for d in devices
    ]
    return _merged(each, devices, left, top=top, priced=bool(prices), fixed=chips is not None,
                   start=start)
  if drives and scheduler is None and token_budget is None:
    schedulings = tuple(
        dict.fromkeys(
            replica_load.Scheduling(d.scheduler, d.token_budget) for d in drives.values()))
  else:
    schedulings = plan_search.schedulings(scheduler, token_budget)
  # An engine's fixed cost per request (before it sees the prompt) comes out of the TTFT target.
  t0 = next(iter(drives.values())).entry.terms.get("t0_request", 0.0) if drives else 0.0
  rate = targets.request_rate(output_tokens)
  if rate is None and chips is None:
    raise errors.InputError(
        "give the load (aggregate_tokens_per_s or arrival_rate), or a fleet size (chips) "
        "to find the most load it carries.", field="aggregate_tokens_per_s")
  work = plan_search.Workload(
      prompt_tokens=prompt_tokens, output_tokens=output_tokens,
      context=replica_load.mean_context(prompt_tokens, output_tokens),
      targets=load_model.Targets(token_gap_s=targets.token_gap_s,
                                 ttft_s=max(targets.ttft_s - t0,
                                            1e-9), ttft_quantile=targets.ttft_quantile,
                                 itl_quantile=targets.itl_quantile), cv2=hold_cv2,
      schedulings=schedulings, batches=allowed)
  notes = format_notes(spec, devices, weight_dtypes) + left
  grid = plan_grid.build(spec, devices, context=context, prompt_tokens=prompt_tokens,
                         weight_dtypes=weight_dtypes, kv_dtypes=kv_dtypes,
                         workspace_fraction=workspace_fraction, mla_prefill=mla_prefill,
                         comm_overlap=comm_overlap, engine=engine)
  model = next(iter(drives.values())).model if drives else StepModel.bound(bound)
  grid_batches = np.asarray(BATCHES, dtype=float) if allowed is None else allowed
  cheap = plan_search.bound(grid, model, work, grid_batches)
  if chips is not None:
    chips = _check_chips(chips, grid, cheap.valid)
  price = np.array([prices.get(d.name, np.nan) for d in devices])[grid.device]
  objective = plan_rows.objective(grid, rate=rate, prices=price if prices else None, chips=chips,
                                  max_chips=max_chips)
  allowed_groups = None if chips is None else (np.mod(chips, grid.per_replica) == 0) & cheap.valid
  per_device = not prices and chips is None
  # Unpriced, the list takes each accelerator's first plan, then its second, ...
  live_devices = max(len(np.unique(grid.device[cheap.rate > 0])), 1)
  keep = math.ceil(top / live_devices) if per_device else top
  found = []
  if pools in ("both", "shared"):
    found = plan_search.search(grid, model, work, cheap, objective=objective, keep=keep,
                               per_device=per_device, allowed=allowed_groups)
  values = [float(objective(np.array([f.group]), np.array([f.rate]))[0]) for f in found]

  def limit(device: int) -> float:
    """The objective a split plan must beat to make the list."""
    mine = sorted(
        v for v, f in zip(values, found) if not per_device or int(grid.device[f.group]) == device)
    return mine[keep - 1] if len(mine) >= keep else math.inf

  plans = [
      plan_rows.shared_row(grid, devices, f, work, rate=rate, chips=chips, prices=prices,
                           model=model) for f in found
  ]
  split = plan_split.SplitSearch(searched=0, meeting=0, plans=[])
  if pools in ("both", "split"):
    split = plan_split.plans(grid, devices, model, work, cheap, rate=rate, chips=chips,
                             prices=prices, max_chips=max_chips, keep=keep, limit=limit,
                             price=price if prices else None)
  plans = plan_rows.order(plans + split.plans, devices, priced=bool(prices), top=top, fixed=chips
                          is not None)
  for p in plans:  # The TTFT an engine's user sees: its per-request cost included.
    p["ttft_s"] += t0
    p["ttft_p90_s"] += t0
  served = None if rate is None else rate * output_tokens
  labels = next(iter(drives.values())).label_fields() if drives else {"kind": "bound"}
  assumptions = list(ASSUMPTIONS)
  if drives:
    assumptions[0] = ("calibrated: " + "; ".join(d.entry.label for d in drives.values()) +
                      " (the engine's profile fitted on published measurements, on the "
                      "datasheet figures)")
    assumptions += [engine_drive.memory_note(d) for d in drives.values()]
    assumptions.append(f"TTFT includes the engine's fixed cost per request, t0_request = "
                       f"{t0 * 1e3:.3g} ms (its profile's), taken out of the TTFT target")
  return {
      **labels,
      "model": spec.name,
      "context": context,
      "pools_searched": pools,
      "workload": {
          "prompt_tokens": prompt_tokens, "output_tokens": output_tokens,
          "arrival_rate_per_s": rate, "output_tokens_per_s": served, "hold_cv2": hold_cv2
      },
      "targets": dataclasses.asdict(targets),
      "chips": chips,
      "scheduling": {"scheduler": scheduler, "token_budget": token_budget},
      "searched": cheap.configurations,
      "meeting": cheap.meeting,
      "split_searched": split.searched,
      "split_meeting": split.meeting,
      "evaluated_groups": len(found),
      "wall_s": time.perf_counter() - start,
      "accelerators": [d.name for d in devices],
      "prices_per_hour": prices or None,
      "ranked_by":
          ("rate at the fixed fleet (tokens/s per chip)" if chips is not None else "cost per hour"
           if prices else "chips within each accelerator (no prices: kinds not compared)"),
      "weight_dtypes": list(weight_dtypes),
      "kv_dtypes": list(kv_dtypes),
      "max_chips": max_chips,
      "notes": notes,
      "assumptions": assumptions,
      "plans": plans,
      "closest": None if plans else plan_rows.closest(grid, devices, model, work, cheap),
      "units": plan_rows.UNITS,
  }
