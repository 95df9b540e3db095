"""Limits on the simulation a command asks for, checked before any run.

The simulator runs one iteration at a time, about 50 us each on a 2-core CPU (measured
here: 38-61 us for llama-3-8b on h100-sxm, 2,000 requests). A run of n requests of o
output tokens on a replica that holds at most B sequences (--max_running, or fewer where
K/V memory runs out) takes about n*(o + 1)/c iterations (at least the longest request's
o_max), where c, the sequences decoding together, is by Little's law the replica's
arrival rate x a request's decode time at the fastest step (batch 1), between 1 and B
(B for --find_max_rate, whose bisection ends near capacity). A fleet's step also scans
its dp replicas (about 0.35 us each), and each replica holds arrays over the whole
workload (about 140 bytes a request). A command is refused, in one line naming
the flag, its value and the range allowed with the other flags as given, when

  * its runs need more than `MAX_ITERATIONS` iterations (about ten minutes), counting
    every run: `--find_max_rate`'s bisection up to `FIND_MAX_RATE_RUNS` runs, the
    goodput plot's rates x schedulers;
  * a fleet has more than `MAX_REPLICAS` replicas, or replicas x requests above
    `MAX_FLEET_ROWS` (about 1.4 GB);
  * `plan` asks for more than `MAX_PLAN_TOKENS` simulated output tokens (--top_k x
    --sim_seeds x --sim_requests x --output_tokens: at a hundred or more sequences per
    iteration and a few sizes per plan, about ten minutes over two workers).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from absl import flags

from jaxroof.errors import InputError
from jaxroof.serving import fleet
from jaxroof.serving import simulation_result

MAX_ITERATIONS = 10**7
MAX_REPLICAS = 4096
MAX_FLEET_ROWS = 10**7
MAX_PLAN_TOKENS = 10**9
FIND_MAX_RATE_RUNS = fleet.find_max_rate.__kwdefaults__["max_runs"]
_SCAN_PER_ITERATION = 1 / 150  # A fleet step's scan of one replica, in iterations.
_ABOUT = "about ten minutes of simulation"


def _value(name: str) -> Any:
  return flags.FLAGS[name].value if name in flags.FLAGS else None


def _running(r: Any, prompt: float, output: float) -> int:
  """The most sequences the replica runs at once: --max_running, or fewer where its K/V
  pages hold fewer requests of these lengths."""
  pages = max(1, math.ceil((prompt + output) / r.page_tokens))
  return max(1, min(int(r.max_running), int(r.total_pages) // pages or 1))


def _step_s(r: Any, context: float) -> float | None:
  """The replica's iteration time decoding one sequence at `context` (its fastest step), or
  None where it cannot be timed (the run itself then says why)."""
  try:
    mix = r.cost.mix(np.asarray([max(1.0, context)]))
    step = float(r.cost.evaluate(mix, r.step_model, step_only=True)["step_s"])
  except Exception:  # noqa: BLE001 (the run reports a model it cannot time, in one line)
    return None
  return step if math.isfinite(step) and step > 0 else None


def _iterations(requests: int, output_mean: float, output_max: float, running: int,
                rate: float | None = None, step_s: float | None = None) -> float:
  """Iterations of one replica's run: each of `requests` prefilled in an iteration, then
  its output tokens decoded, `concurrency` sequences at a time: by Little's law `rate` x
  a request's decode time at the fastest step `step_s`, at least 1 and at most `running`
  (`running` where the rate or the step is None)."""
  concurrency = (running if rate is None or step_s is None else min(
      running, max(1.0, rate * output_mean * step_s)))
  return max(output_max, requests * (output_mean + 1) / concurrency)


def check_replicas(replicas: int, requests: int) -> None:
  """Refuses a fleet beyond `MAX_REPLICAS`, or replicas x requests beyond `MAX_FLEET_ROWS`
  (`replicas`: --dp x --microbatches, a pipelined replica's virtual engines)."""
  micro = _value("microbatches") or 1
  dp = max(1, replicas // micro)  # replicas = dp x microbatches.
  given = f"--dp={dp:,}" + (f" with --microbatches={micro:,}" if micro > 1 else "")
  simulated = f" ({replicas:,} simulated engines)" if micro > 1 else ""
  if replicas > MAX_REPLICAS:
    raise InputError(f"{given} is not allowed{simulated}: a simulated fleet has at most "
                     f"{MAX_REPLICAS:,} replicas (--dp in [1, {MAX_REPLICAS // micro:,}] here).")
  if replicas * requests > MAX_FLEET_ROWS:
    most = max(1, MAX_FLEET_ROWS // requests // micro)
    raise InputError(
        f"{given} with {requests:,} requests is not allowed{simulated}: each replica holds the "
        f"whole workload's arrays, at most {MAX_FLEET_ROWS:.0e} replicas x requests (--dp in "
        f"[1, {most:,}] here, or fewer --num_requests).")


# Raw-number flags of `simulate` that --model replaces (they were once silently ignored).
RAW_FLAGS = ("params_b", "bandwidth_tbps", "layers", "heads", "head_dim", "kv_memory_gb",
             "max_context", "bytes_per_weight", "kv_bytes_per_token", "tflops")


def refuse_raw_with_model() -> None:
  """Refuses `simulate`'s raw-number flags given beside --model (which replaces them)."""
  if _value("model") is None:
    return
  given = [
      f"--{n}={flags.FLAGS[n].value}" for n in RAW_FLAGS
      if n in flags.FLAGS and flags.FLAGS[n].present
  ]
  if given:
    raise InputError(f"{', '.join(given)} not allowed with --model={_value('model')}: the "
                     "model and --accelerator give every figure (leave the raw numbers out, "
                     "or --model out to simulate raw numbers).")


def checked(r: Any, workload: Any, replicas: int) -> Any:
  """`simulate`'s replica `r`, once its flags and work are checked: no raw numbers beside
  --model, and the runs within the limits (`check_simulate`)."""
  refuse_raw_with_model()
  check_simulate(r, workload, replicas)
  return r


def check_simulate(r: Any, workload: Any, replicas: int) -> None:
  """Refuses `simulate`'s runs beyond the limits (see the module): `r` the replica,
  `workload` the trace's (None: synthetic, from the flags), `replicas` the fleet's."""
  find = bool(_value("find_max_rate"))
  if workload is not None:
    n, o_mean = len(workload), float(np.mean(workload.output_tokens))
    o_max, p = float(np.max(workload.output_tokens)), float(np.mean(workload.prompt_tokens))
    what = "--trace"
  else:
    n, o_mean, p = int(_value("num_requests")), float(_value("output_tokens")), float(
        _value("prompt_tokens"))
    o_max, what = o_mean, f"--num_requests={n:,}"
  check_replicas(replicas, n)
  running = _running(r, p, o_mean)  # Per replica: a fleet's steps are its replicas' sum.
  scan = 1 + replicas * _SCAN_PER_ITERATION if replicas > 1 else 1
  runs = FIND_MAX_RATE_RUNS if find else 1
  if workload is not None:
    span = float(workload.arrival_s[-1] - workload.arrival_s[0])
    rate = n / span if span > 0 else None
  else:
    rate = None if find else float(_value("arrival_rate"))  # Bisected: near capacity.
  step_s = _step_s(r, p + o_mean / 2)
  per_replica = None if rate is None else rate / replicas
  goodput = bool(_value("plot_out")) and workload is None and not find

  def total(requests: int) -> tuple[float, float]:
    """(all iterations, one run's) for `requests` requests."""
    per_run = _iterations(requests, o_mean, o_max, running, per_replica, step_s) * scan
    out = runs * per_run
    if goodput:  # Every scheduler at each rate, up to --goodput_requests requests.
      m = min(requests, int(_value("goodput_requests")))
      out += 4 * sum(
          _iterations(m, o_mean, o_max, running, rate * f, step_s)
          for f in simulation_result.GOODPUT_RATE_FACTORS)
    return out, per_run

  asked, per_run = total(n)
  if asked <= MAX_ITERATIONS:
    return
  how = [f"{runs} bisection runs of {per_run:.2g}"] if find else []
  if goodput and asked > runs * per_run:
    how.append("--plot_out's goodput sweep included")
  how_text = f" ({', '.join(how)})" if how else ""
  if workload is not None:
    allowed = "a trace of fewer or shorter requests, or a higher rate"
  elif total(1)[0] > MAX_ITERATIONS:
    allowed = "fewer --output_tokens" + (" or --goodput_requests" if goodput else "")
  else:
    lo, hi = 1, n  # The most requests within the limit (the estimate grows with them).
    while hi - lo > 1:
      mid = (lo + hi) // 2
      lo, hi = (mid, hi) if total(mid)[0] <= MAX_ITERATIONS else (lo, mid)
    allowed = f"--num_requests in [1, {lo:,}]"
  fleet_ = f" x {replicas:,} replicas (--dp)" if replicas > 1 else ""
  at_rate = "" if rate is None else f" at {rate:.3g} requests/s"
  raise InputError(
      f"{what} is not allowed with {o_mean:,.0f} output tokens a request, at most "
      f"{running:,} running a replica{fleet_}{at_rate}: about {asked:.2g} simulated iterations"
      f"{how_text}, over {MAX_ITERATIONS:.0e} ({_ABOUT}): allowed {allowed} here.")


def check_plan() -> None:
  """Refuses `plan`'s simulation of its top plans beyond `MAX_PLAN_TOKENS`."""
  top_k, seeds, requests = (int(_value(n)) for n in ("top_k", "sim_seeds", "sim_requests"))
  output = int(_value("output_tokens"))
  tokens = top_k * seeds * requests * output
  if tokens <= MAX_PLAN_TOKENS:
    return
  most = max(0, MAX_PLAN_TOKENS // (seeds * requests * output))
  raise InputError(
      f"--top_k={top_k} with --sim_seeds={seeds}, --sim_requests={requests:,} and "
      f"--output_tokens={output:,} is not allowed: {tokens:.2g} simulated output tokens, over "
      f"{MAX_PLAN_TOKENS:.0e} ({_ABOUT}): allowed --top_k in [0, {most:,}] here (or fewer "
      "seeds, requests or output tokens).")
