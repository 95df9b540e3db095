"""How fast the simulator runs: 10,000 requests (prompts ~1,000, outputs ~200) per scheduler.

Measurement of the simulator itself (this machine's CPU, plain Python/numpy):
each scheduler's run is timed after one warm-up run, `--repeats` times; the
JSON has the median and spread of wall seconds, requests/s and iterations/s
simulated, and the machine's load average (the CPU may be shared).

  python -m experiments.bench_simulate --json_out=results/bench_simulate_cpu.json
"""

from __future__ import annotations

import datetime
import os
import platform
import time

import numpy as np
from absl import flags

from experiments import _cli
from jaxroof import files
from jaxroof import progress
from jaxroof.serving import arrivals, replica, simulator
from jaxroof.specs.accelerators import load_accelerator
from jaxroof.specs.models import load_model

_PROGRESS = _cli.define_progress()
_NUM_REQUESTS = flags.DEFINE_integer(
    "num_requests", 10_000, "Requests per run. In [1, 1,000,000] (as simulate: more would "
    "not fit in memory).", lower_bound=1, upper_bound=1_000_000)
_ARRIVAL_RATE = flags.DEFINE_float("arrival_rate", 20.0, "Poisson arrivals per second.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed runs per scheduler. In [1, 1,000].",
                                lower_bound=1, upper_bound=1_000)
_SCHEDULERS = flags.DEFINE_list("schedulers", list(simulator.SCHEDULERS), "Schedulers to time.")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Write the timings as JSON here.")
_cli.require_positive(_ARRIVAL_RATE, "requests/s")


def main(argv: list[str]) -> None:
  del argv  # Unused.
  spec, device = load_model("llama-3-8b"), load_accelerator("h100-sxm")
  w = arrivals.synthetic(arrival="poisson", num_requests=_NUM_REQUESTS.value,
                         arrival_rate=_ARRIVAL_RATE.value, seed=0, prompt_tokens=1000,
                         output_tokens=200, prompt_distribution="lognormal",
                         output_distribution="lognormal", prompt_spread=0.5, output_spread=0.5)
  r = replica.from_model(spec, device, context=1200, batch_window_s=0.05)
  load_before = os.getloadavg()
  rows = {}
  for name in _SCHEDULERS.value:
    simulator.simulate(w, r, name)  # Warm-up (lambdify caches, allocator).
    walls, iterations = [], 0
    for _ in progress.bar(range(_REPEATS.value), desc=name, unit="run",
                          requested=_PROGRESS.value):
      start = time.perf_counter()
      run = simulator.simulate(w, r, name)
      walls.append(time.perf_counter() - start)
      iterations = run.iterations
    median = float(np.median(walls))
    rows[name] = {"wall_s_median": median, "wall_s_min": float(min(walls)),
                  "wall_s_max": float(max(walls)), "iterations": iterations,
                  "requests_per_s_simulated": len(w) / median,
                  "iterations_per_s_simulated": iterations / median,
                  "within_10_s": median <= 10.0}
    print(f"{name}: {median:.2f} s (min {min(walls):.2f}, max {max(walls):.2f}) for {len(w)} "
          f"requests, {iterations} iterations: {len(w) / median:,.0f} requests/s, "
          f"{iterations / median:,.0f} iterations/s simulated")
  result = {
      "label": "measurement of the simulator's own speed (wall clock, time.perf_counter; "
               "1 warm-up + repeats, median)",
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "machine": {"platform": platform.platform(), "processor": platform.processor(),
                  "python": platform.python_version(), "cpu_count": os.cpu_count(),
                  "load_average_1_5_15_before": list(load_before),
                  "load_average_1_5_15_after": list(os.getloadavg())},
      "workload": w.description, "replica": r.description, "repeats": _REPEATS.value,
      "schedulers": rows,
  }
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, result)


if __name__ == "__main__":
  _cli.run(main)
