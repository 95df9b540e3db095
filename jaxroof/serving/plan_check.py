"""The planner's top plans simulated, sized and re-ranked: the simulator sizes the answer.

`jaxroof.parallel.planner.plan` ranks configurations by the analytic load model; here
each plan in order is simulated iteration by iteration at its workload, with its own
scheduler, token budget and running sequences, over several seeds (a shared plan: one
replica at the fleet's rate / dp, `replica.from_model` with the plan's layout and
dtypes, a pipelined one as its microbatches' virtual engines holding each other's
stages; a split plan: both pools whole, `split_simulation`). Each run is long enough to
fill the slots: `WARMUP_PER_SLOT` x B requests are run first and left out, then at least
`REQUESTS_PER_SLOT` x B per replica are measured. Its replicas (dp; for a split plan the
prefill and the decode pool's) are bisected to the fewest whose simulated p90 TTFT, p90
TPOT and p99 inter-token gap meet the targets in every seed. A plan that no size meets
is dropped, and the next one is simulated, until `k` plans are sized. A run that can
no longer meet the targets (more than a tenth of its requests past the TTFT or TPOT
target, or a hundredth of its gaps past the gap target) stops early. Plans are sized in
parallel over `workers` processes (each plan's runs are its own, seeded: the answer is
the same as in order).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import multiprocessing
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxroof.parallel import engine_drive
from jaxroof.parallel import plan_rows
from jaxroof.parallel.layout import Layout
from jaxroof.serving import arrivals, fleet, metrics, replica, simulator, split_simulation
from jaxroof.specs.accelerators import Accelerator
from jaxroof.specs.model_spec import ModelSpec
from jaxroof.symbolic.step_model import StepModel

DEFAULT_TOP_K = 5
DEFAULT_REQUESTS = 200  # Measured requests per replica at least (with the rule below).
DEFAULT_SEEDS = 2
REQUESTS_PER_SLOT = 10  # Measured requests per replica, per slot.
WARMUP_PER_SLOT = 1  # Requests per slot run first and not measured.
GROWTH = 1.5  # The most a plan's replicas grow over the analytic answer before it is dropped.
_SLACK = 1e-9
MEETS_RULE = ("TTFT p90 <= TTFT target, TPOT p90 <= token-gap target and inter-token gap p99 "
              "<= token-gap target, in every seed, the first requests (warm-up) left out")


@dataclasses.dataclass(frozen=True)
class Check:
  """What every run of a plan shares: the workload, targets, seeds and lengths."""

  spec: ModelSpec
  device: Accelerator
  context: int
  prompt_tokens: int
  output_tokens: int
  token_gap_s: float
  ttft_s: float
  seed: int
  seeds: int
  min_requests: int
  bound: str
  comm_overlap: float
  mla_prefill: str
  lengths: Mapping[str, Any]
  engine: str = engine_drive.BOUND

  def drive(self, tp: int, pp: int) -> engine_drive.Drive | None:
    """The engine on this device and layout (None: the bound)."""
    return engine_drive.drive(self.engine, self.device, tp=tp, pp=pp)


def _counts(replicas: int, slots: int, min_requests: int) -> tuple[int, int]:
  """(warm-up, measured) requests for `replicas` replicas of `slots` each."""
  warmup = WARMUP_PER_SLOT * slots * replicas
  return warmup, max(REQUESTS_PER_SLOT * slots, min_requests) * replicas


def _stopper(warmup: int, n: int, check: Check) -> Callable[[Any], bool]:
  """Whether a run can no longer meet the targets (see the module docstring)."""

  def gone(sims) -> bool:
    sims = sims if isinstance(sims, list) else [sims]
    now = max(s.now for s in sims)
    late = slow = 0
    for s in sims:
      mine = np.asarray(getattr(s, "assigned", range(len(s.arrival))), dtype=int)
      mine = mine[mine >= warmup]
      first, arrival = s.first_s[mine], s.arrival[mine]
      waited = np.where(np.isnan(first), now - arrival, first - arrival)
      late += int(np.sum((waited > check.ttft_s) & (arrival <= now)))
      slow += int(np.sum(s.itl[:s.n_itl] > check.token_gap_s * (1 + _SLACK)))
    return late > 0.1 * n or slow > 0.01 * n * (check.output_tokens - 1)

  return gone


def _verdict(run, warmup: int, check: Check) -> dict[str, Any]:
  """One run's measured figures (warm-up left out) and whether it meets."""
  mask = np.zeros(len(run.arrival_s), dtype=bool)
  mask[warmup:] = True
  m = metrics.run_metrics(run, requests=mask)
  done = bool(np.all(np.isfinite(np.asarray(run.finish_s)[mask])))
  ttft, tpot = m["ttft_s"]["p90"], m["tpot_s"]["p90"]
  itl = (float(np.percentile(run.itl_s, 99)) if np.size(run.itl_s) else None)
  meets = (done and ttft is not None and tpot is not None and itl is not None and
           ttft <= check.ttft_s * (1 + _SLACK) and tpot <= check.token_gap_s * (1 + _SLACK) and
           itl <= check.token_gap_s * (1 + _SLACK))
  return {
      "ttft_p90_s": ttft, "tpot_p90_s": tpot, "itl_p99_s": itl, "itl_p90_s": m["itl_s"]["p90"],
      "ttft_mean_s": m["ttft_s"]["mean"], "tpot_mean_s": m["tpot_s"]["mean"],
      "completed": m["completed"], "stopped_early": not done, "meets": bool(meets)
  }


def _workload(rate: float, total: int, seed: int, check: Check) -> arrivals.Workload:
  return arrivals.synthetic(arrival="poisson", num_requests=total, arrival_rate=rate, seed=seed,
                            prompt_tokens=check.prompt_tokens, output_tokens=check.output_tokens,
                            max_total=check.context, **dict(check.lengths))


def _shared_runner(row: dict[str, Any], check: Check) -> Callable[[int, int], dict[str, Any]]:
  """`run(dp, seed)`: one replica of the shared plan at the fleet's rate / dp."""
  layout = Layout(tp=row["tp"], pp=row["pp"], ep=row["ep"], microbatches=row["microbatches"])
  d = check.drive(row["tp"], row["pp"])
  r = replica.from_model(check.spec, check.device, context=check.context,
                         weight_dtype=split_simulation.published_dtype(row["weight_dtype"]),
                         kv_dtype=row["kv_dtype"],
                         step_model=StepModel.bound(check.bound) if d is None else d.model,
                         max_running=row["max_running"], layout=layout,
                         comm_overlap=check.comm_overlap, mla_prefill=check.mla_prefill,
                         token_budget=row.get("token_budget") or 512,
                         reservation=None if d is None else d.settings)
  micro = row["microbatches"]
  r = replica.per_microbatch(r, micro)
  fleet_rate = row["fleet_rate_per_s"]

  def run(dp: int, seed: int) -> dict[str, Any]:
    warmup, measured = _counts(1, row["max_running"], check.min_requests)
    w = _workload(fleet_rate / dp, warmup + measured, seed, check)
    stop = _stopper(warmup, measured, check)
    if micro > 1:
      out = fleet.simulate_fleet(w, r, micro, scheduler=row["scheduler"],
                                 router=split_simulation.DECODE_ROUTER, seed=seed, pipeline=micro,
                                 stop=stop)
      result = dataclasses.replace(out.fleet, wall_s=out.wall_s)
    else:
      result = simulator.simulate(w, r, row["scheduler"], stop=stop)
    return {
        "seed": seed, "replicas": dp, "arrival_rate_per_s": fleet_rate / dp,
        "requests": warmup + measured, "warmup": warmup, "wall_s": result.wall_s,
        **_verdict(result, warmup, check)
    }

  return run


def _split_runner(row: dict[str, Any], check: Check) -> Callable[[int, int, int], dict[str, Any]]:
  """`run(prefill replicas, decode replicas, seed)`: the whole split plan."""
  fleet_rate = row["fleet_rate_per_s"]

  def run(n_p: int, n_d: int, seed: int) -> dict[str, Any]:
    pools = {
        **row["pools"], "prefill": {**row["pools"]["prefill"], "replicas": n_p},
        "decode": {**row["pools"]["decode"], "replicas": n_d}
    }
    warmup, measured = _counts(n_d, row["max_running"], check.min_requests)
    w = _workload(fleet_rate, warmup + measured, seed, check)
    out = split_simulation.simulate_split(check.spec, check.device, {**row, "pools": pools}, w,
                                          context=check.context, bound=check.bound,
                                          engine=check.engine, comm_overlap=check.comm_overlap,
                                          scheduler="iteration", seed=seed,
                                          stop=_stopper(warmup, measured, check))
    return {
        "seed": seed, "replicas": {"prefill": n_p, "decode": n_d}, "arrival_rate_per_s": fleet_rate,
        "requests": warmup + measured, "warmup": warmup, "wall_s": out.wall_s,
        **_verdict(out, warmup, check)
    }

  return run


def _all_seeds(run_one: Callable[[int], dict[str, Any]], check: Check) -> list[dict[str, Any]]:
  """Runs the seeds in turn, stopping at the first that misses."""
  runs = []
  for s in range(check.seed, check.seed + check.seeds):
    runs.append(run_one(s))
    if not runs[-1]["meets"]:
      break
  return runs


def _fewest(meets: Callable[[int], bool], start: int, floor: int = 1) -> int | None:
  """The fewest replicas n >= floor with `meets(n)` (true from some n up), searched from
  the analytic `start`: up to GROWTH x start where it misses, then bisected down."""
  hi = None
  if meets(start):
    hi = start
  else:
    n = start
    while n < math.ceil(GROWTH * start) + 1:
      n = max(n + 1, math.ceil(n * 1.15))
      if meets(n):
        hi = n
        break
    if hi is None:
      return None
    floor = max(floor, start + 1)
  lo = floor - 1  # Assumed to miss (the analytic answer's neighbours are tried first).
  if hi - 1 > lo and not meets(hi - 1):
    return hi
  if hi - 1 > lo:
    hi -= 1
  while hi - lo > 1:
    mid = (lo + hi) // 2
    if meets(mid):
      hi = mid
    else:
      lo = mid
  return hi


def size_plan(row: dict[str, Any], check: Check) -> dict[str, Any]:
  """The fewest replicas of `row` that meet the targets in simulation, and its runs there."""
  start = time.perf_counter()
  runs: dict[Any, list[dict[str, Any]]] = {}
  split = row["pools"]["kind"] == "split"
  if split:
    runner = _split_runner(row, check)
    n_p0, n_d0 = row["pools"]["prefill"]["replicas"], row["pools"]["decode"]["replicas"]

    def meets_pair(n_p: int, n_d: int) -> bool:
      key = (n_p, n_d)
      if key not in runs:
        runs[key] = _all_seeds(lambda s: runner(n_p, n_d, s), check)
      return all(r["meets"] for r in runs[key])

    n_p = n_p0
    if not meets_pair(n_p0, n_d0) and not meets_pair(math.ceil(n_p0 * GROWTH), n_d0):
      n_p = math.ceil(n_p0 * GROWTH)  # The decode pool's size is then searched with room.
    n_d = _fewest(lambda d: meets_pair(n_p, d), n_d0)
    n_p = None if n_d is None else _fewest(lambda p: meets_pair(p, n_d), n_p0)
    best = None if n_p is None else (n_p, n_d)
    needed = None if best is None else {"prefill": n_p, "decode": n_d}
  else:
    runner = _shared_runner(row, check)

    def meets_dp(dp: int) -> bool:
      if dp not in runs:
        runs[dp] = _all_seeds(lambda s: runner(dp, s), check)
      return all(r["meets"] for r in runs[dp])

    fixed = row.get("fixed_fleet")
    best = (row["dp"] if meets_dp(row["dp"]) else None) if fixed else _fewest(meets_dp, row["dp"])
    needed = best
  shown = runs[best] if best is not None else runs[max(runs, key=_size)]
  worst = max(shown, key=lambda x: (not x["meets"], x["ttft_p90_s"] or math.inf))
  return {
      "label": "simulated prediction, " +
               ("analytic iteration bound" if check.engine == engine_drive.BOUND else
                f"calibrated iteration model ({check.engine})"), "scheduler": row["scheduler"],
      "token_budget": row.get("token_budget"), "replicas_needed": needed, "analytic_replicas": ({
          "prefill": row["pools"]["prefill"]["replicas"], "decode": row["pools"]["decode"]
                                                                    ["replicas"]
      } if split else row["dp"]), "meets": best is not None, "worst_seed": worst["seed"], **{
          k: worst[k] for k in ("ttft_p90_s", "tpot_p90_s", "itl_p99_s", "itl_p90_s", "ttft_mean_s",
                               "tpot_mean_s", "completed")
      }, "requests": worst["requests"], "warmup": worst["warmup"],
      "runs": [r for values in runs.values() for r in values],
      "wall_s": time.perf_counter() - start, "meets_rule": MEETS_RULE, "simulated":
          ("the whole split plan: prefill pool, K/V transfer, "
           f"decode pool behind a {split_simulation.DECODE_ROUTER}"
           " router" if split else "one replica at the fleet's rate / dp")
  }


def _size(key: Any) -> int:
  return key if isinstance(key, int) else sum(key)


def _resize(row: dict[str, Any], sim: dict[str, Any], prices: Mapping[str, float] | None,
            output_tokens: int) -> None:
  """The plan at the replicas the simulator needed: chips, dp and cost."""
  need = sim["replicas_needed"]
  if need is None:
    return
  if isinstance(need, dict):
    pre, dec = row["pools"]["prefill"], row["pools"]["decode"]
    cp = need["prefill"] * pre["tp"] * pre["pp"] * pre["ep"]
    cd = need["decode"] * dec["tp"] * dec["pp"] * dec["ep"]
    row["pools"].update(prefill_chips=cp, decode_chips=cd)
    pre["replicas"], dec["replicas"] = need["prefill"], need["decode"]
    row["dp"], row["chips"] = need["decode"], cp + cd
  else:
    row["dp"], row["chips"] = need, need * row["tp"] * row["pp"] * row["ep"]
  if prices:
    row["cost_per_hour"] = row["chips"] * prices[row["accelerator"]]
    served = row["fleet_rate_per_s"] * output_tokens * 3600 / 1e6
    row["cost_per_million_tokens"] = row["cost_per_hour"] / served
  row["tokens_per_s_per_chip"] = row["fleet_rate_per_s"] * output_tokens / row["chips"]


def _sized(row: dict[str, Any], check: Check) -> dict[str, Any]:
  return size_plan(row, check)


def _start_method() -> str:
  """"fork" (the workers inherit the lambdified models) where no thread has started: no
  other Python thread and no jax backend (its runtime's threads do not survive a fork);
  else "spawn"."""
  if "fork" not in multiprocessing.get_all_start_methods() or threading.active_count() > 1:
    return "spawn"
  bridge = sys.modules.get("jax._src.xla_bridge")
  if bridge is not None and getattr(bridge, "_backends", True):
    return "spawn"
  return "fork"


def _pool(workers: int) -> concurrent.futures.Executor | None:
  """Processes that size plans side by side (`_start_method`); None where one worker is
  asked."""
  if workers <= 1:
    return None
  context = multiprocessing.get_context(_start_method())
  return concurrent.futures.ProcessPoolExecutor(workers, mp_context=context)


def check_top(result: dict[str, Any], spec: ModelSpec, devices: Sequence[Accelerator], *,
              k: int = DEFAULT_TOP_K, num_requests: int = DEFAULT_REQUESTS, seed: int = 0,
              seeds: int = DEFAULT_SEEDS, bound: str = "per_op", comm_overlap: float = 0.0,
              lengths: Mapping[str, Any] | None = None, mla_prefill: str = "mha", workers: int = 1,
              engine: str = engine_drive.BOUND) -> dict[str, Any]:
  """Simulates and sizes plans of `result` in order (in place) until `k` meet at some size,
  dropping those none meets; re-ranks the sized plans by their simulated cost (or chips),
  then the plans not simulated. `workers` processes size plans side by side (where they
  are spawned, a script that asks for more than one needs its `if __name__ ==
  "__main__"` guard); the answer does not depend on it."""
  start = time.perf_counter()
  by_name = {d.name: d for d in devices}
  work, targets = result["workload"], result["targets"]
  sized: list[dict[str, Any]] = []
  dropped: list[dict[str, Any]] = []
  plans, taken = list(result["plans"]), 0
  pool = _pool(min(max(int(workers), 1), k, len(plans)))
  try:
    while len(sized) < k and taken < len(plans):
      # As many as are still wanted, in order: the first k that meet, as one by one.
      batch = plans[taken:taken + k - len(sized)]
      taken += len(batch)
      checks = [
          Check(spec=spec, device=by_name[row["accelerator"]], context=result["context"],
                prompt_tokens=work["prompt_tokens"], output_tokens=work["output_tokens"],
                token_gap_s=targets["token_gap_s"], ttft_s=targets["ttft_s"], seed=seed,
                seeds=seeds, min_requests=num_requests, bound=bound, comm_overlap=comm_overlap,
                mla_prefill=mla_prefill, lengths=dict(lengths or {}), engine=engine)
          for row in batch
      ]
      sims = (list(pool.map(_sized, batch, checks))
              if pool is not None else [_sized(row, check) for row, check in zip(batch, checks)])
      for row, sim in zip(batch, sims):
        row["simulated"] = sim
        _keep(row, sized, dropped, result.get("prices_per_hour"), work["output_tokens"])
  finally:
    if pool is not None:
      pool.shutdown()
  result["plans"] = reranked(sized, plans[taken:], devices, fixed=result.get("chips") is not None,
                             priced=bool(result.get("prices_per_hour")))
  result["simulation"] = {
      "top_k": len(sized), "dropped": dropped, "seed": seed, "seeds": seeds,
      "num_requests": num_requests, "requests_rule":
          (f"{WARMUP_PER_SLOT} x B warm-up requests per replica left out, then "
           f"max({REQUESTS_PER_SLOT} x B, {num_requests}) measured per replica"),
      "lengths": dict(lengths or {"prompt_distribution": "fixed", "output_distribution": "fixed"}),
      "wall_s": time.perf_counter() - start, "meets_rule": MEETS_RULE,
      "note": "each plan with its own scheduler, token budget and max_running; a shared plan "
              "as one replica at the fleet's arrival rate / dp, a split plan whole (prefill "
              "pool, K/V transfer, decode pool behind a "
              f"{split_simulation.DECODE_ROUTER} router) at the fleet's rate"
  }
  return result


def reranked(sized: list[dict[str, Any]], rest: list[dict[str, Any]],
             devices: Sequence[Accelerator], *, fixed: bool, priced: bool) -> list[dict[str, Any]]:
  """The sized plans ordered again at their simulated sizes as the search orders plans
  (`plan_rows.order`), the unsimulated rest after them; `rank` and
  `rank_within_accelerator` numbered down the whole list."""
  out = plan_rows.order(sized, devices, priced=priced, top=len(sized), fixed=fixed) + rest
  seen: dict[str, int] = {}
  for rank, p in enumerate(out, 1):
    p["rank"] = rank
    seen[p["accelerator"]] = p["rank_within_accelerator"] = seen.get(p["accelerator"], 0) + 1
  return out


def _keep(row: dict[str, Any], sized: list[dict[str, Any]], dropped: list[dict[str, Any]],
          prices: Mapping[str, float] | None, output_tokens: int) -> None:
  """A simulated plan resized where some size meets, else dropped (with a line why)."""
  sim = row["simulated"]
  if sim["meets"]:
    _resize(row, sim, prices, output_tokens)
    sized.append(row)
    return
  dropped.append({
      "accelerator": row["accelerator"], "tp": row["tp"], "pp": row["pp"], "ep": row["ep"],
      "pools": row["pools"]["kind"], "simulated": sim,
      "line": (f"{row['accelerator']} tp{row['tp']} pp{row['pp']} {row['pools']['kind']}: "
               f"p90 TTFT {_ms(sim['ttft_p90_s'])} / TPOT {_ms(sim['tpot_p90_s'])} / p99 ITL "
               f"{_ms(sim['itl_p99_s'])} ms at up to {GROWTH:g}x its replicas")
  })


def _ms(value: float | None) -> str:
  return "-" if value is None else f"{value * 1e3:,.0f}"
