"""Fitting the calibrated factors to serving-benchmark results through the simulator.

A vLLM `bench serve` result (or SGLang `bench_serving` line) gives request
metrics (TTFT, TPOT, ITL) of a workload: request rate (or "inf"), lengths,
number of prompts. Each run is replayed by the continuous-batching simulator
(`jaxroof.serving.simulator`, scheduler "chunked" by default, as vLLM's V1
engine) on a replica of the model (`jaxroof.serving.replica.from_model`, with
the run's tensor-parallel layout), and the factors are chosen whose simulated
medians reproduce the measured ones: the mean squared log error over every
run's `METRICS`.

Three factors are searched, the ones request medians can tell apart: eta_w
(weight and K/V bandwidth; eta_kv tied to it), eta_f (FLOP efficiency:
prefill in TTFT, large batches) and t0_step (fixed cost per iteration);
t0_layer and r_ovl stay at `FIXED` (stated in the result). The simulator is
discrete (admission and page events), so the loss has small jumps and no
useful gradient (optax does not apply; scipy is not a dependency): the
search is a deterministic Nelder-Mead on the log factors within `BOUNDS`
(`search`, written out here), some 50-150 simulations of every run.

The replayed workload: per-request `input_lens`/`output_lens` where the file
has them (the legacy script always writes them), else every request at the
mean lengths; arrivals all at 0 for rate "inf", else a seeded Poisson (or
gamma, vLLM's `--burstiness`) process at the rate. vLLM's own arrival draws
are not in the file, so a finite-rate run is reproduced in distribution, not
request by request. With `max_concurrency` set, TTFT (which vLLM measures
from the client's send, after its semaphore) is left out of the loss.

Held-out error is leave-one-run-out: each run's metrics predicted by factors
fitted on the other runs.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxroof import errors
from jaxroof.measure import fitting
from jaxroof.measure import profiles
from jaxroof.measure import vllm_engine
from jaxroof.measure import vllm_results
from jaxroof.parallel.layout import Layout
from jaxroof.serving import arrivals
from jaxroof.serving import metrics as metrics_lib
from jaxroof.serving import replica as replica_lib
from jaxroof.serving import simulator
from jaxroof.specs import accelerators
from jaxroof.specs import models
from jaxroof.specs import what_if
from jaxroof.symbolic import calibrated
from jaxroof.symbolic.step_model import StepModel

# Metric (seconds here) -> the result file's key (milliseconds).
METRICS = {"median_ttft_s": "median_ttft_ms", "median_tpot_s": "median_tpot_ms",
           "median_itl_s": "median_itl_ms"}
SEARCHED = ("eta_w", "eta_f", "t0_step")
# With `ServingSetup.request_cost`: a fixed cost per request (HTTP, API server,
# tokenisation) before the engine sees it, fitted too (0 at the bound).
REQUEST_COST = "t0_request"
BOUNDS = {"eta_w": (0.05, 1.0), "eta_f": (0.01, 1.0), "t0_step": (1e-5, 0.05),
          REQUEST_COST: (1e-5, 0.5)}
START = {"eta_w": 0.6, "eta_f": 0.4, "t0_step": 1e-3, REQUEST_COST: 5e-3}
# Held-out percentiles (vLLM's np.percentile) of each metric.
PERCENTILES = (50, 90)
COALESCED_S = 1e-4  # A measured token gap below this is a coalesced delivery, not a step.
FIXED = {"t0_layer": 1e-9, "r_ovl": 1.0}
MIN_RUNS = 1
GRID_STEP = math.log(2.0)  # The first simplex: each factor doubled in turn.
TOLERANCE = 0.01  # Stop when the simplex spans < 1% in every factor.
MAX_EVALUATIONS = 200
BOUND_FACTORS = {"eta_w": 1.0, "eta_f": 1.0, "t0_step": 1e-9, REQUEST_COST: 0.0}
# A measured median under this share of the bound's simulated one cannot be
# reproduced by factors in range: it is left out of the fit and flagged.
BELOW_BOUND = 0.9
RESTARTS = 2
ASSUMPTIONS = (
    "each run replayed by the continuous-batching simulator: with per-request detail "
    "(--save-detailed) its own arrivals (start_times) and lengths; else per-request lengths "
    "from the file where present, else mean lengths, and arrivals all at 0 for rate inf, "
    "else a seeded Poisson/gamma draw at the rate",
    "a run with a jaxroof_engine_run block (experiments.vllm_bench) is simulated with its "
    "server's max_num_seqs, token budget, chunked prefill, block size and K/V blocks (read "
    "from the server's log)",
    "eta_kv tied to eta_w; t0_layer and r_ovl fixed (t0_layer = 1 ns, r_ovl = 1); on a "
    "layout, communication as the simulator's (analytic, serial, no eta_comm)",
    "loss: mean squared log error of the simulated vs measured median TTFT, TPOT and ITL "
    "(TTFT left out for runs with max_concurrency)",
)


@dataclasses.dataclass(frozen=True)
class ServingSetup:
  """What the result files do not say: the model, device, layout and server limits."""

  model: str
  accelerator: str
  tp: int = 1
  weight_dtype: str = "bf16"
  kv_dtype: str = "bf16"
  scheduler: str = "chunked"
  max_running: int = 256  # vLLM --max-num-seqs.
  token_budget: int = 2048  # vLLM --max-num-batched-tokens (chunked prefill).
  seed: int = 0
  accelerator_file: str | None = None  # A user's device file (replaces `accelerator`).
  request_cost: bool = False  # Fit `REQUEST_COST` (else 0).

  @property
  def searched(self) -> tuple[str, ...]:
    return SEARCHED + ((REQUEST_COST,) if self.request_cost else ())

  @property
  def device_name(self) -> str:
    return self.accelerator_file or self.accelerator


@dataclasses.dataclass(frozen=True, eq=False)
class BenchRun:
  """One benchmark run: its workload description and measured metrics (seconds)."""

  path: str
  line: int
  engine: str
  request_rate: float  # math.inf for "inf".
  burstiness: float
  max_concurrency: int | None
  prompt_tokens: np.ndarray
  output_tokens: np.ndarray
  measured: dict[str, float]  # METRICS names -> seconds.
  arrival_s: np.ndarray | None = None  # From start_times (detailed results), from 0.
  detail: dict[str, Any] | None = None  # Measured per-request ttft_s, tpot_s, itl_s.
  server: dict[str, Any] | None = None  # The jaxroof_engine_run block's server facts.
  model: str | None = None  # Another model than the setup's (a held-out model).
  measured_throughput: float | None = None  # Requests/s (the file's request_throughput).
  engine_run: dict[str, Any] | None = None  # The whole jaxroof_engine_run block.

  @property
  def label(self) -> str:
    rate = "inf" if math.isinf(self.request_rate) else f"{self.request_rate:g}"
    return f"{os.path.basename(self.path)}:{self.line} (rate {rate})"


def _bad(path: str, line: int, key: str, value: Any, allowed: str) -> errors.InputError:
  return errors.InputError(f"{path} line {line}, key {key!r}: {value!r} is not allowed: "
                           f"{allowed}.")


def _lengths(path: str, line: int, run: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
  inputs, outputs = run.get("input_lens"), run.get("output_lens")
  if isinstance(inputs, list) and isinstance(outputs, list) and inputs and \
      len(inputs) == len(outputs):
    pairs = [(int(i), int(o)) for i, o in zip(inputs, outputs)
             if isinstance(i, (int, float)) and isinstance(o, (int, float)) and i >= 1 and o >= 1]
    if pairs:
      return (np.asarray([p[0] for p in pairs], np.int64),
              np.asarray([p[1] for p in pairs], np.int64))
  completed = run.get("completed")
  if not isinstance(completed, (int, float)) or completed < 1:
    raise _bad(path, line, "completed", completed, "give a run with completed requests >= 1")
  means = []
  for key in ("total_input_tokens", "total_output_tokens"):
    total = run.get(key)
    if not isinstance(total, (int, float)) or total < completed:
      raise _bad(path, line, key, total, "give a whole number >= completed (or the "
                 "input_lens/output_lens lists)")
    means.append(max(1, round(total / completed)))
  n = int(completed)
  return np.full(n, means[0], np.int64), np.full(n, means[1], np.int64)


def parse_run(path: str, line: int, run: Any) -> BenchRun:
  """Validates one result object; errors name the file, line and key."""
  if not isinstance(run, dict) or not vllm_results.engine_of(run):
    raise errors.InputError(
        f"{path} line {line}: not a vLLM `bench serve` or SGLang `bench_serving` result "
        "(no model_id, endpoint_type or concurrency key).")
  rate = run.get("request_rate", "inf")
  if rate in ("inf", None) or (isinstance(rate, float) and math.isinf(rate)):
    rate = math.inf
  elif isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
    raise _bad(path, line, "request_rate", rate, 'give a number > 0 or "inf"')
  burst = run.get("burstiness", 1.0)
  if not isinstance(burst, (int, float)) or isinstance(burst, bool) or not 0 < burst < math.inf:
    raise _bad(path, line, "burstiness", burst, "give a number > 0")
  cap = run.get("max_concurrency")
  if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
    raise _bad(path, line, "max_concurrency", cap, "give a whole number >= 1 or null")
  measured = {}
  for name, key in METRICS.items():
    value = run.get(key)
    if value is None:
      continue
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
        or not math.isfinite(value):
      raise _bad(path, line, key, value, "give a finite number of milliseconds > 0")
    measured[name] = float(value) / 1e3
  if cap is not None:
    measured.pop("median_ttft_s", None)
  if not measured:
    raise errors.InputError(f"{path} line {line}: none of {', '.join(METRICS.values())} is "
                            "present (with max_concurrency, TPOT or ITL); "
                            "the fit needs at least one measured median.")
  extra: dict[str, Any] = {}
  if all(isinstance(run.get(k), list) and run.get(k) for k in vllm_engine.DETAIL_KEYS):
    extra = _detail(path, line, run)
    rate_done = run.get("request_throughput")
    if isinstance(rate_done, (int, float)) and not isinstance(rate_done, bool) \
        and 0 < rate_done < math.inf:
      extra["measured_throughput"] = float(rate_done)
    prompts, outputs = extra.pop("prompt_tokens"), extra.pop("output_tokens")
  else:
    prompts, outputs = _lengths(path, line, run)
  return BenchRun(path=path, line=line, engine=vllm_results.engine_of(run),
                  request_rate=float(rate), burstiness=float(burst), max_concurrency=cap,
                  prompt_tokens=prompts, output_tokens=outputs, measured=measured, **extra)


def _detail(path: str, line: int, run: Mapping[str, Any]) -> dict[str, Any]:
  """Arrivals, lengths and measured per-request metrics of a detailed result.

  Requests that failed (no output) are left out; TPOT per request as vLLM
  computes it, (latency - ttft) / (output - 1).
  """
  vllm_engine.check_detailed(dict(run), f"{path} line {line}")
  n = len(run["start_times"])
  latencies = run.get("latencies") if isinstance(run.get("latencies"), list) else [None] * n
  keep, ttft, tpot, itl = [], [], [], []
  for i in range(n):
    start, inp, out, first = (run[k][i] for k in ("start_times", "input_lens", "output_lens",
                                                 "ttfts"))
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
               for v in (start, inp, out, first)) or out < 1 or inp < 1 or first <= 0:
      continue
    keep.append(i)
    ttft.append(float(first))
    gaps = [float(g) for g in (run["itls"][i] or []) if isinstance(g, (int, float))]
    itl += gaps
    latency = latencies[i] if len(latencies) > i else None
    if out > 1 and isinstance(latency, (int, float)) and latency > first:
      tpot.append((latency - first) / (out - 1))
  if len(keep) < 1:
    raise _bad(path, line, "output_lens", "no completed request", "give a run whose "
               "requests completed")
  starts = np.asarray([run["start_times"][i] for i in keep], float)
  block = run.get(vllm_engine.RUN_KEY)
  block = block if isinstance(block, dict) else None
  server = block.get("server") if block else None
  return {"prompt_tokens": np.asarray([run["input_lens"][i] for i in keep], np.int64),
          "output_tokens": np.asarray([run["output_lens"][i] for i in keep], np.int64),
          "arrival_s": starts - starts.min(),
          "detail": {"ttft_s": np.asarray(ttft), "tpot_s": np.asarray(tpot),
                     "itl_s": np.asarray(itl)},
          "server": server if isinstance(server, dict) else None, "engine_run": block}


def measured_percentile(run: BenchRun, metric: str, percentile: float) -> float | None:
  """A measured percentile (s) of ttft/tpot/itl: from the detail, else the file's median."""
  if run.detail is not None and len(run.detail[f"{metric}_s"]):
    return float(np.percentile(run.detail[f"{metric}_s"], percentile))
  if percentile == 50:
    return run.measured.get(f"median_{metric}_s")
  return None


def read_runs(paths: Sequence[str]) -> list[BenchRun]:
  """Every run of the given result files (JSON, or JSONL one run per line)."""
  out = []
  for path in paths:
    path = os.fspath(path)
    for line, run in vllm_results.load_runs(path):
      out.append(parse_run(path, line, run))
  if not out:
    raise errors.InputError(f"from_vllm={','.join(map(str, paths))!r} holds no runs.")
  return out


def workload_of(run: BenchRun, seed: int) -> arrivals.Workload:
  """The run's requests: its lengths, arrivals at its rate (see the module docstring)."""
  n = len(run.prompt_tokens)
  if run.arrival_s is not None:
    return arrivals.Workload(run.arrival_s.copy(), run.prompt_tokens, run.output_tokens,
                             {"from": run.label, "num_requests": n,
                              "arrivals": "replayed from the result's start_times"})
  if math.isinf(run.request_rate):
    times = np.zeros(n)
  else:
    rng = np.random.default_rng(seed)
    kind = "poisson" if run.burstiness == 1.0 else "gamma"
    times = arrivals.arrival_times(kind, n, run.request_rate, rng, run.burstiness)
    times -= times[0]
  return arrivals.Workload(times, run.prompt_tokens, run.output_tokens,
                           {"from": run.label, "num_requests": n})


def _step_factors(values: Mapping[str, float]) -> dict[str, float]:
  return {"eta_w": values["eta_w"], "eta_kv": values["eta_w"], "eta_f": values["eta_f"],
          "t0_step": values["t0_step"], **FIXED}


def _factors(values: Mapping[str, float]) -> dict[str, float]:
  return {**_step_factors(values), REQUEST_COST: float(values.get(REQUEST_COST, 0.0))}


def load_device(setup: ServingSetup) -> accelerators.Accelerator:
  if setup.accelerator_file:
    return what_if.load_accelerator_file(setup.accelerator_file)
  return accelerators.load_accelerator(setup.accelerator)


def replica_of(run: BenchRun, setup: ServingSetup, factors: Mapping[str, float]
               ) -> replica_lib.Replica:
  """The replica a run is simulated on: the run's own server facts where it has them."""
  spec = models.load_model(run.model or setup.model)
  longest = int(np.max(run.prompt_tokens + run.output_tokens))
  server = run.server or {}
  config = server.get("config") or {}
  max_running = int(config.get("max_num_seqs") or setup.max_running)
  max_running = min(max_running, run.max_concurrency or max_running)
  block = int(config.get("block_size") or 16)
  replica = replica_lib.from_model(
      spec, load_device(setup), context=longest,
      step_model=StepModel.calibrated(_step_factors(factors)), weight_dtype=setup.weight_dtype,
      kv_dtype=setup.kv_dtype, max_running=max_running,
      token_budget=int(config.get("max_num_batched_tokens") or setup.token_budget),
      layout=Layout(tp=setup.tp), block_size=block)
  if server.get("kv_blocks"):
    description = {**replica.description, "kv_pages": int(server["kv_blocks"]),
                   "kv_pages_from": "the server's log (KV cache size / block size)",
                   "chunked_prefill": bool(config.get("chunked_prefill", True))}
    replica = dataclasses.replace(replica, total_pages=int(server["kv_blocks"]),
                                  description=description)
  return replica


def simulate_run(run: BenchRun, setup: ServingSetup, factors: Mapping[str, float],
                 detail: bool = False) -> dict[str, Any]:
  """Simulated TTFT, TPOT and ITL (seconds) of a run under the factors.

  Keys: `METRICS` (medians) and `p90_<metric>_s`; with `detail`, also the
  per-request arrays (`detail`). A request's `REQUEST_COST` delays when the
  engine sees it; its TTFT still runs from the client's send.
  """
  replica = replica_of(run, setup, factors)
  workload = workload_of(run, setup.seed)
  cost = float(factors.get(REQUEST_COST, 0.0))
  sent = workload.arrival_s
  if cost:
    workload = arrivals.Workload(sent + cost, workload.prompt_tokens, workload.output_tokens,
                                 workload.description)
  out = simulator.simulate(workload, replica, setup.scheduler)
  block = metrics_lib.serving_metrics(sent, out.first_token_s, out.finish_s,
                                      out.output_tokens, out.itl_s)
  result: dict[str, Any] = {}
  for metric in ("ttft", "tpot", "itl"):
    result[f"median_{metric}_s"] = block[f"{metric}_s"]["median"]
    result[f"p90_{metric}_s"] = block[f"{metric}_s"]["p90"]
  result["request_throughput_per_s"] = block["request_throughput_per_s"]
  if detail:
    per = metrics_lib.per_request(sent, out.first_token_s, out.finish_s, out.output_tokens)
    result["detail"] = {"ttft_s": per["ttft_s"], "tpot_s": per["tpot_s"], "itl_s": out.itl_s}
  return result


def _loss(runs: Sequence[BenchRun], setup: ServingSetup, values: Mapping[str, float],
          cache: dict) -> float:
  key = tuple(round(values[n], 12) for n in setup.searched)
  if key not in cache:
    total, count = 0.0, 0
    for run in runs:
      simulated = simulate_run(run, setup, values)
      for name, measured in run.measured.items():
        value = simulated[name]
        if value is None or not value > 0:
          total += 25.0  # A metric the simulation cannot produce: a large, finite penalty.
        else:
          total += math.log(value / measured) ** 2
        count += 1
    cache[key] = total / max(count, 1)
  return cache[key]


def _clip(name: str, value: float) -> float:
  """A factor held within its `BOUNDS`."""
  low, high = BOUNDS[name]
  return float(min(max(value, low), high))


def search(runs: Sequence[BenchRun], setup: ServingSetup, *,
           start: Mapping[str, float] | None = None, max_simulations: int = MAX_EVALUATIONS,
           tolerance: float = TOLERANCE, restarts: int = RESTARTS
           ) -> tuple[dict[str, float], float, int]:
  """Nelder-Mead on the log factors, clipped to `BOUNDS` (deterministic).

  The simplex starts at `start` (default `START`) with each factor doubled in
  turn; it stops when the simplex spans less than `tolerance` in every log
  factor (~1%) or after `max_simulations` loss evaluations (each simulates
  every run once; repeated points are cached). The loss has small jumps, so
  the search restarts `restarts` times from its best point with a fresh
  simplex of half the size.

  Returns:
    (factors, loss, distinct loss evaluations).
  """
  names = setup.searched
  low = np.log([BOUNDS[n][0] for n in names])
  high = np.log([BOUNDS[n][1] for n in names])
  cache: dict = {}

  def f(x: np.ndarray) -> float:
    x = np.clip(x, low, high)
    return _loss(runs, setup, dict(zip(names, np.exp(x))), cache)

  best = np.log([_clip(n, (start or START)[n]) for n in names])
  size = GRID_STEP
  for _ in range(restarts + 1):
    best = _nelder_mead(f, best, size, low, high, max_simulations, tolerance,
                        lambda: len(cache))
    size /= 2
  return ({n: float(v) for n, v in zip(names, np.exp(best))}, f(best), len(cache))


def _nelder_mead(f, origin: np.ndarray, size: float, low: np.ndarray, high: np.ndarray,
                 max_simulations: int, tolerance: float, spent) -> np.ndarray:
  """The best vertex of one Nelder-Mead descent from `origin` (simplex edge `size`)."""
  simplex = [np.clip(origin, low, high)]
  for i in range(len(origin)):
    vertex = origin.copy()
    vertex[i] += size if origin[i] + size <= high[i] else -size
    simplex.append(np.clip(vertex, low, high))
  values = [f(x) for x in simplex]
  while spent() < max_simulations:
    order = np.argsort(values, kind="stable")
    simplex = [simplex[i] for i in order]
    values = [values[i] for i in order]
    if np.max(np.ptp(np.asarray(simplex), axis=0)) < tolerance:
      break
    centroid = np.mean(simplex[:-1], axis=0)
    worst = simplex[-1]
    reflected = np.clip(centroid + (centroid - worst), low, high)
    fr = f(reflected)
    if fr < values[0]:
      expanded = np.clip(centroid + 2 * (centroid - worst), low, high)
      fe = f(expanded)
      simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
    elif fr < values[-2]:
      simplex[-1], values[-1] = reflected, fr
    else:
      contracted = np.clip(centroid + 0.5 * (worst - centroid), low, high)
      fc = f(contracted)
      if fc < values[-1]:
        simplex[-1], values[-1] = contracted, fc
      else:
        simplex = [simplex[0]] + [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex[1:]]
        values = [values[0]] + [f(x) for x in simplex[1:]]
  return np.clip(simplex[int(np.argmin(values))], low, high)


def _errors(run: BenchRun, simulated: Mapping[str, float | None]) -> dict[str, Any]:
  out = {}
  for name, measured in run.measured.items():
    value = simulated[name]
    out[name] = {"measured_s": measured, "simulated_s": value,
                 "rel_error": None if value is None else abs(value - measured) / measured}
  return out


def screen(runs: Sequence[BenchRun], setup: ServingSetup
           ) -> tuple[list[BenchRun], list[str]]:
  """The runs with only the metrics the bound does not undercut; a flag per dropped one.

  A median measured below `BELOW_BOUND` of the one simulated at the bound
  (datasheet speed, no fixed cost) is faster than any factor in range allows:
  the setup or the benchmark's timing differs from the model, so it would
  only drag the factors to their limits.
  """
  kept_runs, flags = [], []
  for run in runs:
    bound = simulate_run(run, setup, BOUND_FACTORS)
    kept = {}
    for name, measured in run.measured.items():
      floor = bound[name]
      if floor is not None and measured < BELOW_BOUND * floor:
        flags.append(
            f"{run.label} {name.removesuffix('_s')} = {measured * 1e3:.1f} ms is below the "
            f"bound's {floor * 1e3:.1f} ms (simulated at datasheet speed, no fixed cost): no "
            "factor in range reproduces it, so it is left out of the fit; check the setup "
            "(model, device, tp, dtypes, scheduler) or how the benchmark timed it")
      else:
        kept[name] = measured
    if kept:
      kept_runs.append(dataclasses.replace(run, measured=kept))
  return kept_runs, flags


def fit_runs(runs: Sequence[BenchRun], setup: ServingSetup, **search_kw) -> dict[str, Any]:
  """Factors from every run, leave-one-run-out held-out errors, the bound beside them.

  Metrics below the bound are left out first (`screen`, flagged).

  Raises:
    InputError: no runs, or no metric the bound does not undercut.
  """
  if len(runs) < MIN_RUNS:
    raise errors.InputError(f"runs={len(runs)} is too few: give at least {MIN_RUNS} "
                            "benchmark run.")
  all_runs = list(runs)
  runs, flags = screen(all_runs, setup)
  if not runs:
    raise errors.InputError(
        f"from_vllm: every measured median is below the bound for model={setup.model!r} on "
        f"{setup.tp} x {setup.accelerator!r}: {flags[0]}.")
  values, loss, sims = search(runs, setup, **search_kw)
  # Each fold searches afresh from `START` (not from the full fit, which saw the
  # held-out run), with the same settings.
  fold_kw = {k: v for k, v in search_kw.items() if k != "start"}
  folds, held = [], []
  if len(runs) >= 2:
    for i, run in enumerate(runs):
      train = [r for j, r in enumerate(runs) if j != i]
      fold_values, _, _ = search(train, setup, **fold_kw)
      errs = _errors(run, simulate_run(run, setup, fold_values))
      held += [e["rel_error"] for e in errs.values() if e["rel_error"] is not None]
      folds.append({"heldout_run": run.label, "trained_on": [r.label for r in train],
                    "factors": _factors(fold_values), "metrics": errs})
  per_run, bound_errs, train_errs = [], [], []
  fitted = {r.label: set(r.measured) for r in runs}
  for run in all_runs:
    cal = _errors(run, simulate_run(run, setup, values))
    bound = _errors(run, simulate_run(run, setup, BOUND_FACTORS))
    for name in cal:
      cal[name]["in_fit"] = name in fitted.get(run.label, set())
    train_errs += [e["rel_error"] for e in cal.values()
                   if e["rel_error"] is not None and e["in_fit"]]
    bound_errs += [bound[n]["rel_error"] for n, e in cal.items()
                   if bound[n]["rel_error"] is not None and e["in_fit"]]
    per_run.append({"run": run.label, "engine": run.engine,
                    "request_rate": None if math.isinf(run.request_rate) else run.request_rate,
                    "max_concurrency": run.max_concurrency, "requests": len(run.prompt_tokens),
                    "mean_prompt_tokens": float(run.prompt_tokens.mean()),
                    "mean_output_tokens": float(run.output_tokens.mean()),
                    "calibrated": cal, "bound": bound})
  held_summary = fitting.error_summary(held)
  return {
      "factors": _factors(values), "searched": list(setup.searched), "fixed": dict(FIXED),
      "tied": {"eta_kv": "eta_w"}, "loss": loss, "statistic": "mean squared log error",
      "simulations": sims, "setup": dataclasses.asdict(setup),
      "heldout_median_rel_error": held_summary["median_rel_error"],
      "heldout_max_rel_error": held_summary["max_rel_error"],
      "heldout_points": held_summary["points"],
      "heldout_method": ("leave-one-run-out: each run's medians simulated with factors "
                         "searched on the other runs" if folds else
                         "none: one run (give two or more runs for a held-out error)"),
      "train": fitting.error_summary(train_errs),
      "bound": {**fitting.error_summary(bound_errs),
                "what": "simulated with eta = 1 and no fixed cost (the analytic bound "
                        "iteration), on the metrics in the fit"},
      "folds": folds, "runs": per_run, "rows_used": len(runs),
      "metrics_used": sum(len(r.measured) for r in runs), "flags": flags,
      "assumptions": list(ASSUMPTIONS),
  }


def _thin(values: np.ndarray, keep: int = 101) -> list[float]:
  """Sorted values, or `keep` evenly spaced quantiles of them (for CDF plots)."""
  values = np.sort(np.asarray(values, float))
  if len(values) <= keep:
    return values.tolist()
  return np.quantile(values, np.linspace(0, 1, keep)).tolist()


def predict_heldout(runs: Sequence[BenchRun], setup: ServingSetup,
                    factors: Mapping[str, float]) -> dict[str, Any]:
  """Held-out runs predicted with fitted factors: `heldout[]` rows and CDF samples.

  Each row: `run`, `metric` (ttft, tpot, itl), `percentile`, `measured_s`,
  `predicted_s` (calibrated), `bound_s` (eta = 1, no fixed costs) and
  `rel_error` (|predicted - measured| / measured).
  """
  rows, throughput, cdfs, terms = [], [], [], []
  for run in runs:
    predicted = simulate_run(run, setup, factors, detail=True)
    bound = simulate_run(run, setup, BOUND_FACTORS)
    for metric in ("ttft", "tpot", "itl"):
      for q in PERCENTILES:
        measured = measured_percentile(run, metric, q)
        key = f"median_{metric}_s" if q == 50 else f"p{q}_{metric}_s"
        value = predicted.get(key)
        if measured is None or value is None:
          continue
        rows.append({"run": run.label, "model": run.model or setup.model, "metric": metric,
                     "percentile": q, "measured_s": measured, "predicted_s": value,
                     "bound_s": bound.get(key),
                     "rel_error": abs(value - measured) / measured})
    measured_rate = run.measured_throughput
    if measured_rate and predicted.get("request_throughput_per_s"):
      throughput.append({"run": run.label, "metric": "request_throughput",
                         "measured_per_s": measured_rate,
                         "predicted_per_s": predicted["request_throughput_per_s"],
                         "rel_error": abs(predicted["request_throughput_per_s"] - measured_rate)
                         / measured_rate})
    if run.detail is not None and len(run.detail["itl_s"]):
      terms.append({"run": run.label, "term": "coalesced_itl_share",
                    "value": float(np.mean(run.detail["itl_s"] < COALESCED_S)),
                    "what": f"share of measured token gaps under {COALESCED_S * 1e3:g} ms: "
                            "tokens the client received together (the client, API server "
                            "and engine share the CPU), not engine steps; the simulator has "
                            "no such term"})
    if run.detail is not None:
      cdfs.append({"run": run.label,
                   "measured": {m: _thin(run.detail[f"{m}_s"]) for m in ("ttft", "itl")},
                   "predicted": {m: _thin(predicted["detail"][f"{m}_s"])
                                 for m in ("ttft", "itl")}})
  errors_ = [r["rel_error"] for r in rows]
  return {"heldout": rows, "heldout_throughput": throughput, "cdfs": cdfs,
          "heldout_terms": terms,
          "heldout_median_rel_error": float(np.median(errors_)) if errors_ else None,
          "heldout_median_rel_error_by_metric": {
              f"p{q} {m}": float(np.median([r["rel_error"] for r in rows
                                            if r["metric"] == m and r["percentile"] == q]))
              for m in ("ttft", "tpot", "itl") for q in PERCENTILES
              if any(r["metric"] == m and r["percentile"] == q for r in rows)},
          "heldout_max_rel_error": float(np.max(errors_)) if errors_ else None,
          "heldout_points": len(errors_)}


def calibrate_engine(paths: Sequence[str], setup: ServingSetup, *,
                     heldout_paths: Sequence[str] = (),
                     heldout_model: str | Sequence[str] | None = None,
                     **search_kw) -> dict[str, Any]:
  """Reads result files and fits them (`fit_runs`); predicts held-out files; the JSON.

  Held-out files must carry per-request detail (`--save-detailed`); each is
  replayed with its own arrivals and lengths, on `heldout_model` if given:
  one model for every held-out file, or one per file (in order).

  Raises:
    InputError: a bad file or key, an unknown model or device, a layout the
      model or device refuses, a held-out file without per-request detail.
  """
  models.load_model(setup.model)
  load_device(setup)
  per_file = [heldout_model] if isinstance(heldout_model, str) or heldout_model is None \
      else list(heldout_model)
  if len(per_file) == 1:
    per_file = per_file * len(heldout_paths)
  if heldout_paths and len(per_file) != len(heldout_paths):
    raise errors.InputError(f"heldout_model names {len(per_file)} models for "
                            f"{len(heldout_paths)} held-out files: give one, or one per file.")
  for name in set(per_file) - {None, ""}:
    models.load_model(name)
  runs = read_runs(paths)
  held = []
  try:
    for path, model in zip(heldout_paths, per_file):
      held += [dataclasses.replace(r, model=model or None) for r in read_runs([path])]
  except errors.InputError as e:
    raise errors.InputError(str(e).replace("from_vllm=", "heldout_vllm=", 1)) from None
  for run in held:
    if run.detail is None:
      raise errors.InputError(f"heldout_vllm={run.path!r} has no per-request detail "
                              "(start_times, input_lens, output_lens, ttfts, itls): rerun vllm "
                              "bench serve with --save-result --save-detailed.")
  result = fit_runs(runs, setup, **search_kw)
  if held:
    result["loo"] = {k: result[k] for k in ("heldout_median_rel_error", "heldout_max_rel_error",
                                             "heldout_points", "heldout_method")}
    result.update(predict_heldout(held, setup, result["factors"]))
    result["heldout_method"] = (
        "held-out files: each run replayed with its own arrivals and lengths and predicted "
        "with the factors fitted on --from_vllm; rows: p50 and p90 of TTFT, TPOT, ITL")
  blocks = [r.engine_run for r in [*runs, *held] if r.engine_run]
  if blocks:
    loads = [b["load"]["before"][0] for b in blocks if isinstance(b.get("load"), dict)]
    result["engine_run"] = {
        "vllm_version": blocks[0].get("vllm_version"), "device": blocks[0].get("device"),
        "date": f"{min(b.get('date', '') for b in blocks)} to "
                f"{max(b.get('date', '') for b in blocks)}",
        "load": f"{min(loads):.2f}-{max(loads):.2f}" if loads else None,
        "what": "measurement: vLLM bench serve on loopback (jaxroof_engine_run blocks)"}
  return {"kind": "engine_calibration",
          "what": "calibrated factors chosen so that the continuous-batching simulator "
                  "reproduces measured serving-benchmark medians (TTFT, TPOT, ITL)",
          "labels": {"measured": "measurement (the result files)",
                     "predicted": "calibrated prediction (simulator + fitted factors)",
                     "bound": "analytic bound (simulator, eta = 1, no fixed costs)"},
          "source": {"files": [os.fspath(p) for p in paths],
                     "heldout_files": [os.fspath(p) for p in heldout_paths],
                     "heldout_models": per_file if heldout_paths else [],
                     "engines": sorted({r.engine for r in runs}),
                     "model": setup.model, "accelerator": setup.device_name,
                     "tp": setup.tp},
          **result,
          "units": {"measured_s": "s", "simulated_s": "s", "predicted_s": "s", "bound_s": "s",
                    "rel_error": "1", REQUEST_COST: "s", "t0_step": "s"}}


def engine_profile(result: dict[str, Any]) -> profiles.Profile:
  """The fitted factors as a profile of the device (`--profile` of the experiments)."""
  setup, source = result["setup"], result["source"]
  device = (what_if.load_accelerator_file(setup["accelerator_file"])
            if setup.get("accelerator_file") else accelerators.load_accelerator(setup["accelerator"]))
  created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
  fit_block = {key: result[key] for key in (
      "heldout_median_rel_error", "heldout_max_rel_error", "heldout_points",
      "heldout_method", "loss", "statistic", "searched", "fixed", "tied")}
  return profiles.Profile(
      device_kind=device.full_name, platform="", backend=", ".join(source["engines"]),
      dtype=setup["weight_dtype"], jax_version=importlib.metadata.version("jax"),
      created=created, ceilings={},
      factors={n: float(result["factors"][n]) for n in calibrated.FACTOR_NAMES},
      fit=fit_block, model={"setup": setup},
      method="serving-benchmark medians (TTFT, TPOT, ITL) reproduced by the "
             "continuous-batching simulator (jaxroof.serving.engine_fit)",
      accelerator=device.name,
      source={**source, "date": created, "rows_used": result["rows_used"],
              "what": "request-level metrics of the user's serving benchmark"})
