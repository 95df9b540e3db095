"""The calibration job, within a time budget: measure, fit, profile, plot.

1. Device ceilings (`jaxroof.measure.ceilings`), measured.
2. The toy model's decode step at a grid of (model, batch, context) points
   (`jaxroof.measure.op_sweeps`), in rounds while the budget lasts.
3. A held-out quarter of the points, spread over the grid; optax fits the
   calibrated model's factors (`jaxroof.symbolic.calibrated`) to the rest.
4. A `Profile` with the factors and the held-out error, and a plot of
   measured against predicted step time.

`validate` times the step afresh at a user's points and compares it with a
profile's prediction; `report_section` runs a short job for the report.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from jaxroof.measure import fitting
from jaxroof.symbolic import calibrated as calibration
from jaxroof.measure import ceilings as ceilings_lib
from jaxroof import errors
from jaxroof.measure import records as measure
from jaxroof.measure import op_sweeps
from jaxroof.measure import profiles
from jaxroof.measure.op_sweeps import StepPoint
from jaxroof.toy.config import ToyConfig

Progress = Callable[[str], None]

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CONTEXTS = (128, 256, 512, 1024, 2048, 4096)
# Near the 250,000-token cap, which the powers of two stop short of.
EDGE_POINTS = ((64, 3900), (128, 1950), (256, 976))
QUICK_BUDGET_S = 150.0  # Below this, the sparser grid.
MIN_BUDGET_S = 25.0  # Below this too few points are measured to fit (>= 8).
_FIT_RESERVE_S = 8.0  # Kept for the fit, the profile and the plot.


def check_budget(name: str, budget_s: float) -> float:
  """Refuses, at once, a budget too small to measure the points a fit needs."""
  budget_s = errors.require_positive(name, budget_s)
  if budget_s < MIN_BUDGET_S:
    raise errors.InputError(
        f"{name}={budget_s:g} s is too short to measure the 8 points a fit needs: "
        f"give at least {MIN_BUDGET_S:g} s.")
  return budget_s


def default_points(budget_s: float) -> list[StepPoint]:
  """The calibration grid: batch 1-256 x context 128-4096, <= 250k tokens.

  The main model over the whole grid (and three points near the cap); its
  variants (`op_sweeps.MODELS`) at
  short contexts, where their weights and layers rather than their K/V set
  the step time (that is what they are there to tell apart); with a budget
  under `QUICK_BUDGET_S`, sparser grids still.
  """
  quick = budget_s < QUICK_BUDGET_S
  grids = {
      "calibration": (BATCHES[::2], CONTEXTS[::2]) if quick
                     else (BATCHES, CONTEXTS),
      "shallow": ((1, 16, 256), (128,)) if quick
                 else ((1, 4, 16, 64, 256), (128, 256)),
      "wide_vocab": ((1, 16), (128,)) if quick
                    else ((1, 4, 16, 64), (128, 512)),
  }
  points = [StepPoint(model, b, c)
            for model, (batches, contexts) in grids.items()
            for b, c in op_sweeps.decode_grid(batches, contexts)]
  if not quick:
    points += [StepPoint("calibration", b, c) for b, c in EDGE_POINTS]
  return points


def model_inputs(records: Sequence[measure.Measurement], bandwidth: float,
                 flop_rate: float) -> dict[str, np.ndarray]:
  """The calibrated model's inputs of measured decode steps."""
  steps = [r.extra["step_inputs"] for r in records]

  def column(values):
    return np.asarray(values, dtype=np.float64)

  return {
      "B": column([r.shapes["batch"] for r in records]),
      "T": column([r.extra["retained_tokens"] for r in records]),
      "N": column([s["N"] for s in steps]),
      "N_act": column([s["N_act"] for s in steps]),
      "q": column([s["q"] for s in steps]),
      "k": column([s["k"] for s in steps]),
      "L": column([s["L"] for s in steps]),
      "BW": np.full(len(records), bandwidth),
      "F": np.full(len(records), flop_rate),
  }


def _point_row(record: measure.Measurement, predicted: float,
               held_out: bool) -> dict[str, Any]:
  measured = record.median_s
  return {
      "model": record.extra["model"],
      "batch": record.shapes["batch"],
      "context": record.shapes["context"],
      "layers": record.shapes["layers"],
      "measured_s": measured,
      "predicted_s": predicted,
      "rel_error": abs(predicted - measured) / measured,
      "set": "heldout" if held_out else "train",
      "spread": record.spread,
      "round_medians_s": record.extra.get("round_medians_s", [measured]),
      "load_avg_1m": record.extra.get("load_avg_1m"),
  }


@dataclasses.dataclass(frozen=True)
class CalibrationRun:
  """What a calibration job measured, fitted and concluded."""

  profile: profiles.Profile
  ceilings: ceilings_lib.Ceilings
  points: list[dict[str, Any]]  # One row per measured point (`_point_row`).
  records: list[measure.Measurement]
  elapsed_s: float
  budget_s: float

  def rows(self, subset: str) -> list[dict[str, Any]]:
    return [p for p in self.points if p["set"] == subset]

  def to_json(self) -> dict[str, Any]:
    fit = self.profile.fit
    return {
        "kind": "calibrated",
        "what": "calibrated step model fitted to measured toy decode steps",
        "device_kind": self.profile.device_kind,
        "platform": self.profile.platform,
        "backend": self.profile.backend,
        "dtype": self.profile.dtype,
        "jax_version": self.profile.jax_version,
        "created": self.profile.created,
        "method": self.profile.method,
        "heldout_median_rel_error": fit["heldout_median_rel_error"],
        "heldout_max_rel_error": fit["heldout_max_rel_error"],
        "train_median_rel_error": fit["train_median_rel_error"],
        "train_max_rel_error": fit["train_max_rel_error"],
        "factors": dict(self.profile.factors),
        "factor_units": dict(calibration.FACTOR_UNITS),
        "expression": str(calibration.calibrated_step()),
        "readable_expression": calibration.readable_step(),
        "ceilings": self.ceilings.to_json(),
        "training_points": self.rows("train"),
        "heldout_points": self.rows("heldout"),
        "model": dict(self.profile.model),
        "budget_s": self.budget_s,
        "elapsed_s": self.elapsed_s,
        "measurements": [r.to_json() for r in self.records],
    }


def fit_records(
    records: Sequence[measure.Measurement],
    ceilings: ceilings_lib.Ceilings,
    dtype: str,
    *,
    heldout_fraction: float = 0.25,
    seed: int = 0,
) -> tuple[fitting.Fit, list[dict[str, Any]]]:
  """Splits, fits on the training points, predicts every point."""
  if len(records) < 8:
    raise errors.InputError(
        f"only {len(records)} points were measured: the fit needs at least 8;"
        " give a larger --budget_s.")
  records = sorted(records, key=lambda r: (
      r.extra["model"], r.shapes["batch"], r.shapes["context"]))
  inputs = model_inputs(records, ceilings.bandwidth_Bps,
                        ceilings.flop_rate(dtype))
  measured = np.asarray([r.median_s for r in records])
  held_out = fitting.split_heldout(len(records), heldout_fraction, seed)
  fit = fitting.fit_factors(
      {n: v[~held_out] for n, v in inputs.items()}, measured[~held_out])
  predicted = fitting.predict(inputs, fit.factors)
  rows = [_point_row(r, float(p), bool(h))
          for r, p, h in zip(records, predicted, held_out)]
  return fit, rows


def _fit_summary(fit: fitting.Fit, rows: list[dict[str, Any]]
                 ) -> dict[str, Any]:
  summary = {"loss": fit.loss, "steps": fit.steps,
             "learning_rate": fit.learning_rate,
             "statistic": op_sweeps.STATISTIC,
             "objective": "mean squared log error (Adam on log factors)"}
  for subset in ("train", "heldout"):
    errs = fitting.error_summary(
        [r["rel_error"] for r in rows if r["set"] == subset])
    summary[f"{subset}_median_rel_error"] = errs["median_rel_error"]
    summary[f"{subset}_max_rel_error"] = errs["max_rel_error"]
    summary[f"{subset}_points"] = errs["points"]
  return summary


def _now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(
      timespec="seconds")


def run(
    budget_s: float,
    *,
    dtype: str = "float32",
    points: Sequence[StepPoint] | None = None,
    rounds: int = 7,
    warmup: int = 1,
    repeats: int = 3,
    heldout_fraction: float = 0.25,
    seed: int = 0,
    models: Mapping[str, ToyConfig] | None = None,
    ceilings: ceilings_lib.Ceilings | None = None,
    progress: Progress | None = None,
) -> CalibrationRun:
  """Measures, fits and builds a profile within about `budget_s` seconds.

  Args:
    budget_s: wall-clock budget for the whole job.
    dtype: weights and K/V of the timed steps.
    points: where to time the step; None means `default_points(budget_s)`.
    rounds: passes over the points, while the budget lasts (each point's
      figure is its lower-quartile round, `op_sweeps.lower_quartile`).
    warmup, repeats: per point and round.
    heldout_fraction: share of the points the fit never sees.
    seed: the split and the visiting order.
    models: name -> toy config of every model in `points`; None means
      `op_sweeps.MODELS`.
    ceilings: already measured ceilings; None measures them.
    progress: called with a line per step of the job.
  """
  budget_s = check_budget("budget_s", budget_s)
  dtype_value = measure.require_dtype(dtype)
  measure.keep_allocations()
  start = time.monotonic()
  deadline = start + budget_s
  say = progress or (lambda _: None)
  points = list(default_points(budget_s) if points is None else points)
  quick = budget_s < QUICK_BUDGET_S
  configs = op_sweeps.MODELS if models is None else models
  unknown = sorted({p.model for p in points} - set(configs))
  if unknown:
    raise errors.InputError(
        f"models {unknown} have no config: known {', '.join(configs)}.")
  if ceilings is None:
    say(f"ceilings on {jax.devices()[0].device_kind} "
        f"({jax.default_backend()})")
    ceilings = ceilings_lib.measure_ceilings(
        (dtype,), repeats=5 if quick else 10, rounds=2 if quick else 3,
        progress=say)
  names = sorted({p.model for p in points})
  benches = {name: op_sweeps.DecodeStepBench(
      configs[name], dtype_value, name=name, seed=seed) for name in names}
  say(f"{len(points)} points, up to {rounds} rounds, "
      f"{deadline - time.monotonic():.0f} s left")
  records = op_sweeps.decode_step_sweep(
      benches, points, rounds=rounds, warmup=warmup, repeats=repeats,
      deadline=deadline - _FIT_RESERVE_S, seed=seed, progress=say)
  fit, rows = fit_records(records, ceilings, dtype,
                          heldout_fraction=heldout_fraction, seed=seed)
  device = measure.current_device()
  fit_info = _fit_summary(fit, rows)
  say(f"held-out relative error: median "
      f"{fit_info['heldout_median_rel_error']:.1%}, max "
      f"{fit_info['heldout_max_rel_error']:.1%}")
  model_info = {
      "configs": {name: dataclasses.asdict(configs[name]) for name in names},
      "step_inputs": {name: benches[name].inputs.to_json() for name in names},
      "points": len(rows),
      "rounds": rounds, "warmup": warmup, "repeats": repeats,
  }
  prof = profiles.Profile(
      device_kind=device.device_kind, platform=device.platform,
      backend="xla", dtype=dtype, jax_version=device.jax_version,
      created=_now(),
      ceilings={"bandwidth_Bps": ceilings.bandwidth_Bps,
                "copy_bandwidth_Bps": ceilings.copy_bandwidth_Bps,
                "read_bandwidth_Bps": ceilings.read_bandwidth_Bps,
                "flops_per_s": dict(ceilings.flops_per_s)},
      factors=fit.factors, fit=fit_info, model=model_info,
      method=(f"{records[0].method}; {op_sweeps.STATISTIC} of up to "
              f"{rounds} rounds visiting the points in random order; "
              f"cache donated; {measure.allocator()}"))
  return CalibrationRun(profile=prof, ceilings=ceilings, points=rows,
                        records=records, elapsed_s=time.monotonic() - start,
                        budget_s=budget_s)


def config_from_profile(prof: profiles.Profile, model: str) -> ToyConfig:
  """The toy model a profile was calibrated with (to time it again)."""
  configs = prof.model.get("configs", {})
  if model not in configs:
    raise errors.InputError(
        f"model={model!r} is not in the profile: it has "
        f"{', '.join(configs) or 'no model configs'}.")
  return ToyConfig(**configs[model])


def validate(
    prof: profiles.Profile,
    points: Sequence[tuple[int, int]],
    *,
    model: str = "calibration",
    rounds: int = 5,
    warmup: int = 1,
    repeats: int = 3,
    seed: int = 1,
    progress: Progress | None = None,
) -> list[dict[str, Any]]:
  """Times the toy decode step afresh and compares it with the profile.

  The step is timed like the calibration's points (lower-quartile round), on
  this device, and predicted from the profile's factors and ceilings.

  Returns:
    Rows of batch, context, predicted_s, measured_s and rel_error, and
    whether the point lies inside the default calibration grid.
  """
  measure.keep_allocations()
  device = measure.current_device()
  if device.device_kind != prof.device_kind:
    raise errors.InputError(
        f"profile device_kind={prof.device_kind!r} is not this device "
        f"({device.device_kind!r}): validate on the device it describes.")
  config = config_from_profile(prof, model)
  dtype = measure.require_dtype(prof.dtype)
  bench = op_sweeps.DecodeStepBench(config, dtype, name=model, seed=seed)
  step_points = [StepPoint(model, b, c) for b, c in points]
  records = op_sweeps.decode_step_sweep(
      {model: bench}, step_points, rounds=rounds, warmup=warmup,
      repeats=repeats, seed=seed, progress=progress)
  inputs = model_inputs(records, prof.bandwidth(), prof.flop_rate())
  predicted = fitting.predict(inputs, prof.factors)
  rows = []
  for record, pred in zip(records, predicted):
    row = _point_row(record, float(pred), held_out=False)
    row["set"] = "validation"
    row["inside_calibrated_grid"] = (
        BATCHES[0] <= row["batch"] <= BATCHES[-1]
        and CONTEXTS[0] <= row["context"] <= CONTEXTS[-1]
        and row["batch"] * row["context"] <= op_sweeps.MAX_RETAINED_TOKENS)
    rows.append(row)
  return rows
