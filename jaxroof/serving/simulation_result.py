"""What `experiments.simulate` runs and writes: one replica's run, a fleet behind a
router, the goodput against the arrival rate, and the largest rate meeting the SLOs,
each as its JSON.

A workload is asked of `workload_at(rate, num_requests)`, so that every simulated rate
draws its arrivals and lengths the same way.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxroof import progress
from jaxroof.serving import arrivals
from jaxroof.serving import fleet
from jaxroof.serving import load
from jaxroof.serving import metrics
from jaxroof.serving import multichip
from jaxroof.serving import replica
from jaxroof.serving import simulator
from jaxroof.symbolic import load_model
from jaxroof.symbolic.step_model import StepModel

WorkloadAt = Callable[[float, int], arrivals.Workload]

# The goodput plot's rates, as multiples of the given arrival rate.
GOODPUT_RATE_FACTORS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0)


def simulate(workload: arrivals.Workload, replica_: replica.Replica, scheduler: str, *,
             show_progress: bool) -> simulator.Run:
  """`simulator.simulate`, with a bar over the requests for runs of 2,000 or more (on a
  terminal, unless `show_progress` is False)."""
  if len(workload) < 2000 or not progress.enabled(show_progress):
    return simulator.simulate(workload, replica_, scheduler)
  bar = progress.bar(total=len(workload), unit="req", desc="simulating", requested=show_progress)
  run = simulator.simulate(workload, replica_, scheduler,
                           lambda finished: bar.update(finished - bar.n))
  bar.close()
  return run


def goodput_sweep(workload_at: WorkloadAt, replica_: replica.Replica, rate: float, *,
                  num_requests: int, targets: dict[str, float | None],
                  show_progress: bool) -> dict[str, Any]:
  """Goodput (or, without targets, the request rate) of every scheduler at multiples of
  `rate`, `num_requests` requests each."""
  rates = [rate * f for f in GOODPUT_RATE_FACTORS]
  out: dict[str, list[float]] = {name: [] for name in simulator.SCHEDULERS}
  for x in progress.bar(rates, desc="goodput sweep", unit="rate", requested=show_progress):
    w = workload_at(x, num_requests)
    for name in simulator.SCHEDULERS:
      m = metrics.run_metrics(simulator.simulate(w, replica_, name), **targets)
      out[name].append(
          m["goodput_per_s"] if m["goodput_per_s"] is not None else m["request_throughput_per_s"])
  return {"arrival_rate_per_s": rates, "goodput_per_s": out, "num_requests": num_requests}


def as_users_time(run: simulator.Run, t0_request_s: float) -> simulator.Run:
  """A run as its users time it when each request reaches the engine `t0_request_s` after
  it arrived (an engine's fixed cost per request): TTFT and latency longer by it."""
  if not t0_request_s:
    return run
  return dataclasses.replace(run, arrival_s=np.asarray(run.arrival_s, float) - t0_request_s)


def fleet_run(workload: arrivals.Workload, replica_: replica.Replica, replicas: int, *,
              scheduler: str, router: str, seed: int, targets: dict[str, float | None],
              pipeline: int = 1, t0_request_s: float = 0.0) -> dict[str, Any]:
  """The fleet behind the router: its run, its metrics and each replica's (`pipeline`:
  microbatches per pipelined replica, `fleet.simulate_fleet`), as users time it
  (`as_users_time`)."""
  run = fleet.simulate_fleet(workload, replica_, replicas, scheduler=scheduler, router=router,
                             seed=seed, pipeline=pipeline)
  run = dataclasses.replace(run, fleet=as_users_time(run.fleet, t0_request_s),
                            replicas=[as_users_time(r, t0_request_s) for r in run.replicas])
  return {
      "run": run, "metrics": metrics.run_metrics(run.fleet, **targets),
      "replicas": fleet.replica_metrics(run, **targets), "t0_request_s": t0_request_s
  }


def fleet_json(out: dict[str, Any], *, label: str, scheduler: str, router: str,
               replica_: replica.Replica, workload: arrivals.Workload) -> dict[str, Any]:
  """A fleet's JSON (`fleet_run`'s `out`)."""
  m = out["metrics"]
  return {
      "label": label, "scheduler": scheduler, "router": router, "replica": replica_.description,
      "workload": workload.description, "metrics": m, "fleet": {
          "replicas": len(out["replicas"]), "router": router,
          "request_throughput_per_s": m["request_throughput_per_s"],
          "output_throughput_tokens_per_s": m["output_throughput_tokens_per_s"]
      }, "replicas": out["replicas"], "t0_request_s": out["t0_request_s"]
  }


def max_rate(workload_at: WorkloadAt, replica_: replica.Replica, *, replicas: int, chips: int,
             scheduler: str, router: str, seed: int, num_requests: int, start_rate: float,
             percentile: float, targets: dict[str, float | None], pipeline: int = 1,
             t0_request_s: float = 0.0, analytic: dict[str, Any] | None = None) -> dict[str, Any]:
  """The largest fleet arrival rate whose SLO percentiles hold (`fleet.find_max_rate`, a
  seeded bisection), per chip too; each run as users time it (`as_users_time`). The
  bisection starts from the load model's rate (`analytic`, `analytic_max_rate`'s, kept
  beside) where it gives one, else from `start_rate`; `start` says which."""
  analytic = analytic or {}
  start = ("the load model's max rate (analytic bound)"
           if analytic.get("analytic_max_rate_per_s") else "the arrival rate given")
  start_rate = analytic.get("analytic_max_rate_per_s") or start_rate

  def run_at(rate: float) -> simulator.Run:
    w = workload_at(rate, num_requests)
    if replicas == 1:
      return as_users_time(simulator.simulate(w, replica_, scheduler), t0_request_s)
    return as_users_time(
        fleet.simulate_fleet(w, replica_, replicas, scheduler=scheduler, router=router, seed=seed,
                             pipeline=pipeline).fleet, t0_request_s)

  found = fleet.find_max_rate(run_at, start_rate=start_rate, percentile=percentile, targets=targets)
  rate = found["max_rate_per_s"]
  return {
      **found, "max_rate_per_chip": None if rate is None else rate / chips, "replicas": replicas,
      "chips": chips, "slo_percentile": percentile, "targets": targets,
      "num_requests": num_requests, "seed": seed, "t0_request_s": t0_request_s,
      "start_rate_per_s": start_rate, "start": start,
      "label": "simulated (seeded bisection over the arrival rate)", **analytic
  }


def analytic_max_rate(spec: Any, device: Any, layout: Any, *, options: dict[str, Any],
                      prompt_tokens: float, output_tokens: float, max_running: int, scheduler: str,
                      token_budget: int, targets: dict[str, float | None],
                      percentile: float) -> dict[str, Any] | None:
  """The load model's largest rate for the simulated replica (its B, scheduler and budget;
  the mean lengths; TTFT at `percentile`, the gap's mean at the TPOT target, the gap at
  p99 within the ITL target when given): the bisection's start and its analytic peer.
  None for a scheduler the load model does not cover (static)."""
  if scheduler == "static":
    return None
  gap = targets.get("tpot_s") or targets.get("itl_s")
  inputs = multichip.model_inputs(spec, device, layout=layout, prompt_tokens=round(prompt_tokens),
                                  output_tokens=max(round(output_tokens), 2), **options)
  a = load.answer(StepModel.bound(), inputs, prompt_tokens=round(prompt_tokens), output_tokens=max(
      round(output_tokens),
      2), token_gap_s=math.inf if gap is None else gap, ttft_s=targets.get("ttft_s"),
                  scheduler="chunked" if scheduler == "vllm" else scheduler,
                  token_budget=token_budget if scheduler != "iteration" else None,
                  max_running=max_running, ttft_quantile=percentile / 100,
                  itl_quantile=0.99 if targets.get("itl_s") else None,
                  microbatches=layout.microbatches)
  return {
      "analytic_max_rate_per_s": a.max_rate * layout.dp, "analytic_model": load_model.MODEL,
      "analytic_label": "analytic bound (the load model) for the same replica, B and scheduling"
  }


def max_rate_json(found: dict[str, Any], replica_: replica.Replica, scheduler: str,
                  router: str) -> dict[str, Any]:
  """`max_rate`'s answer as its JSON, with the replica and scheduling (a router only for a
  fleet)."""
  return {
      "label": found["label"], "replica": replica_.description, "scheduler": scheduler,
      "router": router if found["replicas"] > 1 else None, **found
  }


def run_json(run: simulator.Run, m: dict[str, Any], *, label: str, scheduler: str,
             replica_: replica.Replica, workload: arrivals.Workload) -> dict[str, Any]:
  """One replica's run as its JSON: what ran, its metrics, the simulation's figures."""
  return {
      "label": label, "scheduler": scheduler, "replica": replica_.description,
      "workload": workload.description, "metrics": m,
      "simulation": metrics.simulation_block(run, replica_.total_pages)
  }
