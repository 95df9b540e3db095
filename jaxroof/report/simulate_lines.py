"""What `experiments.simulate` prints and plots: the label, the metrics table, the run's
figures and its CDFs, K/V over time and goodput."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxroof import files
from jaxroof.report import accuracy
from jaxroof.report import simulation
from jaxroof.report import table


def label(step_model: str, engine: str | None = None) -> str:
  """What the simulated numbers are, from the replica's step model ("bound" or not) and
  an engine's label (its entry and held-out error)."""
  if engine:
    return f"simulated prediction, {engine}"
  return "simulated prediction, " + ("analytic iteration bound"
                                     if step_model == "bound" else "calibrated iteration model")


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


def max_rate_line(found: dict[str, Any], scheduler: str, engine: str | None = None) -> str:
  """The bisection's answer: the largest fleet rate meeting the SLOs (an engine's label)."""
  rate = found["max_rate_per_s"]
  return (("" if not engine else f"{engine}: ") +
          f"largest arrival rate meeting the SLOs at p{found['slo_percentile']:g} "
          f"({len(found['tried'])} seeded simulations of {found['num_requests']} requests, "
          f"{scheduler} scheduler, {found['replicas']} replica(s), {found['chips']} chip(s)): " +
          ("none (the smallest rate tried misses)" if rate is None else
           f"{rate:.4g} requests/s ({found['max_rate_per_chip']:.4g} per chip); bracket "
           f"{found['bracket']}" + (f" ({found['note']})" if found.get("note") else "")) +
          ("" if found.get("analytic_max_rate_per_s") is None else
           f"; the load model's (analytic bound, same replica): "
           f"{found['analytic_max_rate_per_s']:.4g} requests/s") +
          ("" if found.get("start_rate_per_s") is None else
           f"; bisected from {found['start_rate_per_s']:.4g}/s ({found['start']})"))


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


def run_lines(run_label: str, scheduler: str, requests: int, metrics: dict[str, Any], run: Any,
              total_pages: int, provenance: Mapping[str, Any] | None = None,
              bound_metrics: dict[str, Any] | None = None, engine: bool = False) -> list[str]:
  """One replica's run: the bound's metrics first when the profile's held-out error is
  larger (`bound_metrics`), then the run's with the profile's error, and its figures;
  an `engine`'s run leads, the bound's run of the same replica beside it."""
  out = []
  if engine:
    return run_lines(run_label, scheduler, requests, metrics, run, total_pages, provenance) + [
        f"{label('bound')}, beside (the same replica, scheduler and workload; the bound's step "
        "instead of the engine's):",
        metrics_table(scheduler, bound_metrics or {})
    ]
  if bound_metrics is not None:
    out += [
        f"{label('bound')}, shown first (the profile's held-out error is larger than "
        f"the bound's on the same data): {scheduler} scheduler, {requests} requests",
        metrics_table(scheduler, bound_metrics) + "\n"
    ]
  out += [
      f"{run_label}: {scheduler} scheduler, {requests} requests",
      metrics_table(scheduler, metrics, provenance)
  ]
  if provenance is not None:
    out += accuracy.footnote_lines(provenance)
  return out + [run_line(run, total_pages)]


def fleet_lines(out: dict[str, Any], label: str, router: str, scheduler: str, requests: int,
                rate: float) -> list[str]:
  """A fleet's run (`simulation_result.fleet_run`): its metrics and the routing."""
  replicas = len(out["replicas"])
  return [
      f"{label}: fleet of {replicas} replicas behind {router}, {scheduler} scheduler, "
      f"{requests} requests at {rate:g}/s",
      metrics_table(f"fleet ({replicas})", out["metrics"]),
      fleet_line(out["run"], replicas)
  ]


def annotate_calibrated(result: dict[str, Any], provenance: Mapping[str, Any]) -> None:
  """Puts the profile and its held-out error beside a calibrated run's metrics (JSON)."""
  result["profile"] = dict(provenance)
  result["accuracy"] = accuracy.fields(provenance)
  result["metrics"] = {**result["metrics"], accuracy.ROW_FIELD: accuracy.row_error(provenance)}


# Files `plot_run` and `plot_goodput` write beside the plot path (`files.sibling_path`).
PLOT_SIBLINGS = ("_kv", "_goodput")


def plot_run(run: Any, total_pages: int, scheduler: str, path: str, label: str) -> None:
  """The run's TTFT/ITL CDFs at `path`, and beside it `<stem>_kv<ext>` (K/V pages and
  queue over time): both written, or neither (`files.atomic_paths`)."""
  with files.atomic_paths([path, files.sibling_path(path, "_kv")]) as (cdf_tmp, kv_tmp):
    simulation.plot_cdfs(
        {scheduler: {"ttft_s": run.first_token_s - run.arrival_s, "itl_s": run.itl_s}}, cdf_tmp,
        label)
    simulation.plot_kv_over_time(run, total_pages, kv_tmp, label)


def plot_goodput(sweep: dict[str, Any], path: str, label: str) -> None:
  """Goodput against the arrival rate per scheduler, at `<stem of path>_goodput<ext>`."""
  simulation.plot_goodput(sweep["arrival_rate_per_s"], sweep["goodput_per_s"],
                          files.sibling_path(path, "_goodput"), label)
