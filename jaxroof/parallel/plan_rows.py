"""The planner's plans as rows: the objective a search ranks groups by, one row per plan
with its operating point, their order, and the closest miss when nothing meets."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxroof.parallel import plan_grid
from jaxroof.parallel import plan_search
from jaxroof.specs.accelerators import Accelerator
from jaxroof.symbolic import load_model
from jaxroof.symbolic.step_model import StepModel

UNITS = {
    "step_s": "s (the decode iteration at max_running, unloaded)",
    "loaded_token_gap_s": "s (mean gap at the plan's load: TPOT)",
    "ttft_s": "s (mean: slot wait + prefill wait + service)", "ttft_p90_s": "s",
    "itl_p99_s": "s (inter-token gap, p99)", "slot_wait_s": "s (mean wait for a slot)",
    "max_rate_per_replica_s": "requests/s (the load model's largest rate within the targets)",
    "tokens_per_s_per_chip": "output tokens/s per chip at the plan's load (or, at a fixed "
                             "fleet, its max rate)", "comm_s": "s", "chips": "chips",
    "aggregate_tokens_per_s": "tokens/s (the fleet at its max rate)", "chip_memory_bytes": "B",
    "cost_per_hour": "$ per hour (fleet)",
    "cost_per_million_tokens": "$ per million output tokens at the target load",
    "wall_s": "s (wall-clock of the search, this CPU)"
}


def objective(grid: plan_grid.Grid, *, rate: float | None, prices: np.ndarray | None,
              chips: int | None,
              max_chips: int | None) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
  """`f(group index, max rate per replica)`, smaller is better (inf: excluded): the
  fleet's cost or chips at the load, or minus the rate a fixed fleet carries."""

  def f(index: np.ndarray, lam: np.ndarray) -> np.ndarray:
    per = grid.per_replica[index]
    lam = np.asarray(lam, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
      if chips is not None:
        dp = np.where(np.mod(chips, per) == 0, chips / per, np.nan)
        return np.where(np.isfinite(dp) & (lam > 0), -dp * lam, np.inf)
      dp = np.ceil(rate / np.where(lam > 0, lam, np.nan) * (1 - 1e-12))
      n = dp * per
      if max_chips is not None:
        n = np.where(n <= max_chips, n, np.nan)
      value = n * prices[index] if prices is not None else n
    return np.where(np.isfinite(value), value, np.inf)

  return f


def _step_binds(grid: plan_grid.Grid, f: plan_search.Found, work: plan_search.Workload,
                model: StepModel) -> tuple[str, float]:
  """What binds the decode iteration at max_running (weights, K/V, compute or
  communication), and its communication."""
  cost = grid.cost(np.array([f.group]))
  rows = f.B / float(grid.microbatches[f.group])
  out = cost.evaluate(cost.uniform_mix(decode_rows=rows, context=work.context), model)
  v = {k: float(np.asarray(x).reshape(-1)[0]) for k, x in out.items() if k.endswith("_s")}
  terms = {
      "weights": v.get("linear_memory_s", 0.0) + v.get("head_memory_s", 0.0),
      "K/V": v.get("attention_memory_s",
                   0.0), "compute": v.get("compute_s", 0.0), "communication": v.get("comm_s", 0.0)
  }
  return max(terms, key=terms.get), v.get("comm_s", 0.0)


def max_rate_binds(f: plan_search.Found, work: plan_search.Workload) -> str:
  """What stops a group's rate rising past its max rate at its B."""
  out = plan_search.operating(f, f.rate * (1 + 1e-4), work)
  if out["stable"] < 1:
    return "slots"
  if out["token_gap_s"] > work.targets.token_gap_s * (1 + load_model.SLACK):
    return "token_gap"
  q = work.targets.itl_quantile
  if q is not None and out["slow_itl_share"] > (1 - q) * (1 + load_model.SLACK):
    return "itl_p99"
  if out["ttft_q_s"] > work.targets.ttft_s * (1 + load_model.SLACK):
    return "ttft"
  return "slots"


def shared_row(grid: plan_grid.Grid, devices: Sequence[Accelerator], f: plan_search.Found,
               work: plan_search.Workload, *, rate: float | None, chips: int | None,
               prices: Mapping[str, float], model: StepModel | None = None) -> dict[str, Any]:
  """One shared-pool plan: its group's replica answer at the fleet's load."""
  model = model or StepModel.bound()
  g, G = f.group, work.output_tokens
  per = int(grid.per_replica[g])
  if chips is not None:
    dp = chips // per
    fleet_rate = dp * f.rate if rate is None else rate
  else:
    dp = int(math.ceil(rate / f.rate * (1 - 1e-12)))
    fleet_rate = rate
  lam = min(fleet_rate / dp, f.rate)
  at = plan_search.operating(f, lam, work)
  n_chips = dp * per
  device = devices[int(grid.device[g])]
  per_hour = n_chips * prices[device.name] if prices else None
  wname, kname = grid.class_members[int(grid.cls[g])][0]
  bind, comm = _step_binds(grid, f, work, model)
  served = fleet_rate * G
  return {
      "rank": 0, "rank_within_accelerator": 0, "accelerator": device.name, "chips": n_chips,
      "tp": int(grid.tp[g]), "pp": int(grid.pp[g]), "ep": int(grid.ep[g]), "dp": dp,
      "microbatches": int(grid.microbatches[g]), "batch": f.B, "max_running": f.B,
      **f.scheduling.as_dict(), "weight_dtype": wname, "kv_dtype": kname, "merged": [
          {"weight_dtype": w, "kv_dtype": k} for w, k in grid.class_members[int(grid.cls[g])][1:]
      ], "step_s": f.step_s, "loaded_token_gap_s": at["token_gap_s"], "prefill_s": f.alone_s,
      "ttft_s": at["ttft_s"], "ttft_p90_s": at["ttft_q_s"], "itl_p99_s": at["itl_p99_s"],
      "slot_wait_s": at["slot_wait_s"], "prefill_wait_s": at["prefill_wait_s"],
      "slot_utilisation": at["slot_utilisation"], "running": at["mean_running"],
      "arrival_rate_per_replica_per_s": lam, "max_rate_per_replica_s": f.rate,
      "capacity_per_replica_per_s": float(load_model.slot_fill(f.states, G)[0, f.column]
                                         ), "load_binds": max_rate_binds(f, work), "comm_s": comm,
      "aggregate_tokens_per_s": f.rate * dp * G, "replica_tokens_per_s": f.B / f.step_s,
      "per_sequence_tokens_per_s": 1 / f.step_s, "tokens_per_s_per_chip": served / n_chips,
      "chip_memory_bytes": float(plan_grid.chip_bytes(grid, np.array([g]), float(f.B))[0]),
      "binds": bind, "headroom": f.rate / lam, "cost_per_hour": per_hour, "cost_per_million_tokens":
          (None if per_hour is None else per_hour / (served * 3600 / 1e6)), "pools": {
              "kind": "shared", "prefill_chips": n_chips, "decode_chips": n_chips,
              "note": "one pool: every replica prefills and decodes on its own chips"
          }, "network": grid.links[g].network, "fleet_rate_per_s": fleet_rate,
      "fixed_fleet": chips is not None, "simulated": None
  }


def order(plans: list[dict[str, Any]], devices: Sequence[Accelerator], *, priced: bool, top: int,
          fixed: bool = False) -> list[dict[str, Any]]:
  """By the rate a fixed fleet carries; or by cost then headroom with prices; else by
  chips then headroom within each accelerator, rank 1 of each accelerator first."""
  if fixed or priced:
    key = ((lambda p: (-p["tokens_per_s_per_chip"], -p["headroom"])) if fixed else
           (lambda p: (p["cost_per_hour"], -p["headroom"])))
    plans = sorted(plans, key=key)[:top]
    seen: dict[str, int] = {}
    for p in plans:  # Shared and split plans alike, in their order.
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


def closest(grid: plan_grid.Grid, devices: Sequence[Accelerator], model: StepModel,
            work: plan_search.Workload, cheap: plan_search.Bound) -> dict[str, Any] | None:
  """When no plan meets the targets: the group that comes closest (the smallest ratio of
  its one-sequence gap or its prompt alone to its target), and the target it misses."""
  del model  # Unused: the cheap pass holds what is needed.
  gap, ttft = work.targets.token_gap_s, work.targets.ttft_s
  if not cheap.valid.any():
    return {"miss": "memory", "line": "no layout holds the weights and one sequence's K/V"}
  ratio = np.maximum(cheap.one_step / gap, cheap.alone / ttft)
  ratio = np.where(cheap.valid, ratio, np.inf)
  g = int(np.argmin(ratio))
  name = (f"{devices[int(grid.device[g])].name} tp{int(grid.tp[g])} pp{int(grid.pp[g])} "
          f"ep{int(grid.ep[g])}")
  if cheap.one_step[g] / gap >= cheap.alone[g] / ttft:
    miss, line = "token_gap", (f"closest plan {name}: one sequence's token gap "
                               f"{cheap.one_step[g] * 1e3:.4g} ms misses the {gap * 1e3:g} ms "
                               "target")
  else:
    miss, line = "ttft", (f"closest plan {name}: the prompt alone takes "
                          f"{cheap.alone[g] * 1e3:.4g} ms against the {ttft * 1e3:g} ms TTFT "
                          "target")
  if ratio[g] <= 1:
    miss, line = "chips", (f"closest plan {name}: it meets the targets only with more chips "
                           "than allowed")
  return {
      "miss": miss, "line": line, "accelerator": devices[int(grid.device[g])].name,
      "tp": int(grid.tp[g]), "pp": int(grid.pp[g]), "ep": int(grid.ep[g])
  }
