"""The search for the cost terms that make simulated serving runs match measured ones.

The loss is the mean squared log ratio of simulated to measured medians over every
run's metrics (`engine_replay.simulate_run`). The simulator is discrete (admission and
page events), so the loss has small jumps and no jax gradient: `search` is a damped
Gauss-Newton (Levenberg-Marquardt) on the log residuals within `BOUNDS`, its Jacobian
from finite differences `FD_STEP` apart (wider than the jumps), some 30-60 simulations
of every run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from jaxroof import errors
from jaxroof.calibrate import engine_replay
from jaxroof.calibrate.engine_replay import ServingSetup
from jaxroof.measure import vllm_results

# Search ranges of the searched terms (registry names).
BOUNDS = {
    "eta_w": (0.05, 1.0), "eta_f": (0.01, 1.0), "t0_step": (1e-5, 0.05), "t0_request": (1e-5, 0.5),
    "t0_seq": (1e-6, 0.02), "t0_layer": (1e-7, 0.01), "t_wake": (1e-5, 0.05)
}
START = {
    "eta_w": 0.6, "eta_f": 0.4, "t0_step": 1e-3, "t0_request": 5e-3, "t0_seq": 1e-4,
    "t0_layer": 5e-5, "t_wake": 2e-3
}
# `search(starts=2)`'s second start: every searched fixed cost at its lower bound.
LOW_COST_START = {n: BOUNDS[n][0] for n in ("t0_step", "t0_request", "t0_seq", "t0_layer", "t_wake")}
FD_STEP = 0.05  # Log-space step of the finite-difference Jacobian (5%).
MAX_DAMPING = 1e6  # Beyond this no damped step lowers the loss: a minimum.
DAMPING = 1e-3  # Levenberg-Marquardt's first damping (relative to the curvature).
TOLERANCE = 0.01  # Stop when a step moves every log factor by < 1%.
MISSING_RESIDUAL = 5.0  # The log residual of a metric the simulation cannot produce.
MAX_EVALUATIONS = 200


def _residuals(runs: Sequence[vllm_results.BenchRun], setup: ServingSetup,
               values: Mapping[str, float], cache: dict) -> np.ndarray:
  """Log ratios of simulated to measured medians, every run's metrics in order."""
  key = tuple(round(values[n], 12) for n in setup.searched)
  if key not in cache:
    out = []
    for run in runs:
      simulated = engine_replay.simulate_run(run, setup, values)
      for name, measured in run.measured.items():
        value = simulated[name]
        # A metric the simulation cannot produce: a large, finite residual.
        out.append(
            math.log(value / measured) if value is not None and value > 0 else MISSING_RESIDUAL)
    cache[key] = np.asarray(out)
  return cache[key]


def _clip(name: str, value: float) -> float:
  """A factor held within its `BOUNDS`."""
  low, high = BOUNDS[name]
  return float(min(max(value, low), high))


def search(runs: Sequence[vllm_results.BenchRun], setup: ServingSetup, *,
           start: Mapping[str, float] | None = None, max_simulations: int = MAX_EVALUATIONS,
           tolerance: float = TOLERANCE, starts: int = 1) -> tuple[dict[str, float], float, int]:
  """Damped Gauss-Newton (Levenberg-Marquardt) on the log factors within `BOUNDS`.

  The loss is the mean squared log ratio of simulated to measured medians.
  The simulator is discrete, so there is no jax gradient: each step takes the
  residuals' Jacobian from one simulation per factor `FD_STEP` apart in log
  space (wider than the loss's small jumps) and solves the damped normal
  equations. A step that lowers the loss is taken and the damping eased; one
  that does not raises the damping. It starts at `start` (default `START`) and
  stops when a taken step moves every log factor by less than `tolerance` (~1%)
  or after `max_simulations` loss evaluations (each simulates every run once;
  repeated points are cached). Deterministic.

  The loss can hold more than one minimum: the additive costs trade against each other and
  against eta_f (one fit landed at t0_seq 0.4 ms or at none as a held term moved by 1%). `starts=2` descends again from `LOW_COST_START` (every searched fixed cost at its
  lower bound) and keeps the lower loss; each descent has `max_simulations`.

  Returns:
    (factors, loss, distinct loss evaluations).
  """
  if starts not in (1, 2):
    raise errors.InputError(f"starts={starts} is not allowed: give 1 (from START) or 2 (from "
                            "START and from every fixed cost at its lower bound).")
  names = setup.searched
  low = np.log([BOUNDS[n][0] for n in names])
  high = np.log([BOUNDS[n][1] for n in names])
  cache: dict = {}

  def residuals(x: np.ndarray) -> np.ndarray:
    return _residuals(runs, setup, dict(zip(names, np.exp(np.clip(x, low, high)))), cache)

  def descend(origin: Mapping[str, float]) -> tuple[np.ndarray, np.ndarray]:
    x = np.log([_clip(n, origin[n]) for n in names])
    here = residuals(x)
    damping, budget = DAMPING, len(cache) + max_simulations
    # A point clipped at a bound or seen before adds nothing to the cache, so the steps are
    # bounded too, and a damping no step can satisfy ends the search at a minimum within
    # the bounds (the log factors pinned there).
    for _ in range(max_simulations):
      if len(cache) >= budget or damping > MAX_DAMPING:
        break
      steps = [FD_STEP if x[i] + FD_STEP <= high[i] else -FD_STEP for i in range(len(names))]
      jacobian = np.stack(
          [(residuals(x + h * e) - here) / h for h, e in zip(steps, np.eye(len(names)))], axis=1)
      normal = jacobian.T @ jacobian
      move = np.linalg.solve(normal + damping * np.diag(np.diag(normal) + 1e-12),
                             -jacobian.T @ here)
      trial = np.clip(x + move, low, high)
      there = residuals(trial)
      if np.mean(there**2) < np.mean(here**2):
        settled = np.max(np.abs(trial - x)) < tolerance
        x, here, damping = trial, there, damping / 3
        if settled:
          break
      else:
        damping *= 4
    return x, here

  origins = [start or START, {**(start or START), **LOW_COST_START}][:starts]
  x, here = min((descend(o) for o in origins), key=lambda found: float(np.mean(found[1]**2)))
  return ({n: float(v) for n, v in zip(names, np.exp(x))}, float(np.mean(here**2)), len(cache))
