"""The textbook three schedulers on one replica under one load (simulated).

`compare(spec, device, workload)` simulates static batching, iteration-level
(Orca) and chunked-prefill (Sarathi) scheduling of the same requests on one
replica from the analytic iteration bound, and returns vLLM's metrics and the
TTFT and ITL samples of each run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxroof.serving import arrivals, metrics, replica, simulator
from jaxroof.specs.accelerators import Accelerator
from jaxroof.specs.model_spec import ModelSpec

SCHEDULERS = ("static", "iteration", "chunked")


def compare(spec: ModelSpec, device: Accelerator, workload: arrivals.Workload, *, context: int,
            batch_window_s: float, token_budget: int, ttft_target_s: float, tpot_target_s: float,
            schedulers: Sequence[str] = SCHEDULERS) -> dict[str, dict[str, Any]]:
  """Per scheduler: `metrics` (vLLM's, with goodput at the targets) and `series`
  (`ttft_s` per request, `itl_s` per gap, seconds)."""
  out = {}
  r = replica.from_model(spec, device, context=context, batch_window_s=batch_window_s,
                         token_budget=token_budget)  # Frozen: one replica serves every run.
  for scheduler in schedulers:
    run = simulator.simulate(workload, r, scheduler)
    out[scheduler] = {
        "metrics": metrics.run_metrics(run, ttft_target_s=ttft_target_s,
                                       tpot_target_s=tpot_target_s), "series": {
                                           "ttft_s": np.asarray(run.first_token_s - run.arrival_s),
                                           "itl_s": np.asarray(run.itl_s)
                                       }
    }
  return out
