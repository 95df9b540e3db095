"""What `experiments.simulate` prints: the label, the metrics table and the run's figures."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxroof.report import accuracy
from jaxroof.report import simulation
from jaxroof.report import table


def label(step_model: str) -> str:
  """What the simulated numbers are, from the replica's step model ("bound" or not)."""
  return "simulated prediction, " + ("analytic iteration bound" if step_model == "bound"
                                     else "calibrated iteration model")


def metrics_table(name: str, metrics: dict[str, Any],
                  provenance: Mapping[str, Any] | None = None) -> str:
  """One run's metrics; a calibrated run's held-out error beside them."""
  headers, cells = simulation.HEADER, simulation.metrics_rows({name: metrics})
  if provenance is not None:
    headers = tuple(headers) + (accuracy.HEADER,)
    cells = [list(c) + [accuracy.cell(provenance)] for c in cells]
  return table.format_table(headers, cells)


def beyond_context_line(beyond: dict[str, Any]) -> str:
  """Sampled requests past the model's context, and what was done with them."""
  return (f"{beyond['requests_beyond']} sampled request(s) beyond the "
          f"{beyond['max_total_tokens']}-token context: {beyond['policy']}d "
          f"({beyond['draws_redone']} draws redone, {beyond['clipped']} clipped)")


def max_rate_line(found: dict[str, Any], scheduler: str) -> str:
  """The bisection's answer: the largest fleet rate meeting the SLOs."""
  rate = found["max_rate_per_s"]
  return (f"largest arrival rate meeting the SLOs at p{found['slo_percentile']:g} "
          f"({len(found['tried'])} seeded simulations of {found['num_requests']} requests, "
          f"{scheduler} scheduler, {found['replicas']} replica(s), {found['chips']} chip(s)): "
          + ("none (the smallest rate tried misses)" if rate is None else
             f"{rate:.4g} requests/s ({found['max_rate_per_chip']:.4g} per chip); bracket "
             f"{found['bracket']}"))


def run_line(run: Any, total_pages: int) -> str:
  """How much was simulated, and the K/V pages it peaked at."""
  return (f"{run.iterations} iterations simulated in {run.wall_s:.2f} s; {run.preemptions} "
          f"preemptions; peak K/V pages {int(run.pages_in_use.max())} of {total_pages}")


def fleet_line(run: Any, replicas: int) -> str:
  """How evenly the router spread the requests, and the fleet's simulation figures."""
  counts = np.bincount(run.assignment, minlength=replicas)
  return (f"requests per replica: min {counts.min()}, max {counts.max()}; "
          f"{run.fleet.iterations} iterations simulated in {run.wall_s:.2f} s; "
          f"{run.fleet.preemptions} preemptions (per-replica metrics in the JSON)")
