"""Percentiles for the serving decision: the analytic means, checked by the simulator.

The decision (`decision.py`) works with means (M/D/1 TTFT, the step at the
chosen batch). Users decide on percentiles, so this runs the simulator
(`simulator.py`, iteration-level scheduling) at the decision's load with the
chosen concurrency as the cap on running sequences, and reports TTFT, TPOT and
ITL percentiles beside the means, with whether the targets hold at p90/p99.
"""

from __future__ import annotations

from typing import Any

from jaxroof.serving import arrivals
from jaxroof.serving import metrics
from jaxroof.serving import simulator
from jaxroof.serving.simulator import Replica

DEFAULT_REQUESTS = 2000


def simulated_percentiles(replica: Replica, *, arrival_rate: float, prompt_tokens: int,
                          output_tokens: int, ttft_s: float | None, token_gap_s: float | None,
                          num_requests: int = DEFAULT_REQUESTS, seed: int = 0,
                          scheduler: str = "iteration") -> dict[str, Any]:
  """Simulates `num_requests` Poisson arrivals at `arrival_rate` on `replica`.

  Returns the vLLM-style metrics block (`metrics.serving_metrics`) plus, for
  each target given, whether its p90 and p99 meet it; labelled a simulated
  prediction from the replica's step model.
  """
  workload = arrivals.synthetic(arrival="poisson", num_requests=num_requests,
                                arrival_rate=arrival_rate, seed=seed, prompt_tokens=prompt_tokens,
                                output_tokens=output_tokens)
  run = simulator.simulate(workload, replica, scheduler)
  block = metrics.run_metrics(run, ttft_target_s=ttft_s, tpot_target_s=token_gap_s)
  checks = {}
  for name, key, target in (("ttft", "ttft_s", ttft_s), ("token_gap", "itl_s", token_gap_s)):
    if target is not None:
      stats = block[key]
      checks[name] = {
          f"{p}_meets": None if stats[p] is None else stats[p] <= target
          for p in ("median", "p90", "p99")
      }
  return {
      "kind": "simulated", "scheduler": scheduler, "num_requests": num_requests,
      "arrival_rate_per_s": arrival_rate, "seed": seed, "metrics": block, "targets": checks,
      "iterations": run.iterations, "wall_s": run.wall_s
  }
