"""The calibration job, within a time budget: measure, fit, validate, profile.

1. Device ceilings (`jaxroof.measure.ceilings`), measured.
2. The fit (`fit="ops"`, the default): the operations the step is made of,
   timed alone at the fit models' shapes (`op_sweeps.op_sweep`: the linear
   layer over M = 1 ... 2048, one layer's decode attention over batch x
   context), then the fit models' smallest decode steps; `op_fit` fits the
   efficiency factors to the operations and the fixed costs to the steps.
   `fit="steps"` instead fits every factor to the fit models' decode steps
   over a batch x context grid (the older end-to-end fit).
3. Validation: the whole toy decode step of two models the fit never saw
   (`op_sweeps.HELDOUT_MODELS`: other width, depth and K/V heads), timed over
   batch x context and predicted from the factors. That held-out error is
   what the profile reports; `status` says whether it met its targets.
4. A `Profile` with the factors and the held-out error, and a plot of
   measured against predicted step time.

Every point is timed in rounds, each point's figure is its lower-quartile
round, points whose fastest rounds disagree are measured again, and the load
average is recorded with every timing. The fit models' and the held-out
models' steps are timed in the same rounds (interleaved), so load from other
processes hits both alike; their benches are alive together (about 1 GB of
toy weights in all) and size their caches from `MAX_KV_BYTES`, so a job stays
within about 2 GB. On a CPU the linear layer's fit also finds XLA's weight
re-pack from B = 2 (`r_pack`, the profile's `regime_factors`).

`validate` times the step afresh at a user's points and compares it with a
profile's prediction; `compare_profiles` checks two calibrations agree.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from jaxroof import errors
from jaxroof.measure import ceilings as ceilings_lib
from jaxroof.measure import fitting
from jaxroof.measure import op_fit
from jaxroof.measure import op_sweeps
from jaxroof.measure import profiles
from jaxroof.measure import measurement
from jaxroof.measure.op_sweeps import StepPoint
from jaxroof.symbolic import calibrated as calibration
from jaxroof.symbolic.step_model import StepModel
from jaxroof.toy.config import ToyConfig

Progress = Callable[[str], None]

FITS = ("ops", "steps")
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CONTEXTS = (128, 256, 512, 1024, 2048, 4096)
# Near the 250,000-token cap, which the powers of two stop short of.
EDGE_POINTS = ((64, 3900), (128, 1950), (256, 976))
QUICK_BUDGET_S = 150.0  # Below this, sparser grids.
MIN_BUDGET_S = 25.0  # Below this too few points are measured to fit.
_FIT_RESERVE_S = 10.0  # Kept for the fits, the profile and the plot.
# One cache of a timed point at most (the step's K/V, one copy): with the
# largest toy's two weight copies, a job stays within about 2 GB resident.
MAX_KV_BYTES = 400e6
# Weights below this get a second copy to rotate (so a CPU's 32 MB last-level
# cache cannot hold them between steps); larger ones stream from memory anyway
# (one copy also keeps the job within about 2 GB).
ROTATE_WEIGHTS_BELOW = 64e6
# What a calibration must reach on each held-out model to report "ok".
TARGET_MEDIAN = 0.08
TARGET_MAX = 0.20
# Two calibrations agree when (the repeatability criteria):
REPEAT_FACTOR_REL = 0.10
REPEAT_MEDIAN_POINTS = 3.0
# Row counts of the linear layer (M = 1 ... 2048) and attention's points.
LINEAR_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
LINEAR_ROWS_QUICK = (1, 2, 4, 16, 64, 256, 2048)
ATTENTION_GRID = ((1, 128), (1, 1024), (1, 4096), (4, 512), (4, 2048),
                  (16, 256), (16, 1024), (16, 4096), (64, 512), (64, 1024),
                  (256, 128), (256, 512))
ATTENTION_GRID_QUICK = ((1, 128), (1, 4096), (4, 1024), (16, 2048),
                        (64, 512), (256, 128), (256, 512))
# The fixed costs' points: each fit model's smallest steps.
SMALLEST = ((1, 128), (2, 128), (1, 512))
# Held-out steps: batch 1-256, context 128-4096, spread over the grid.
HELDOUT_GRID = ((1, 128), (1, 1024), (1, 4096), (2, 512), (4, 1024),
                (8, 256), (16, 256), (16, 2048), (32, 1024), (64, 512),
                (128, 256), (256, 128))
HELDOUT_GRID_QUICK = ((1, 128), (1, 4096), (4, 1024), (16, 256), (16, 2048),
                      (64, 512), (256, 128))
HELDOUT_GRID_SHORT = ((1, 128), (4, 1024), (16, 2048), (64, 512), (256, 128))


def check_budget(name: str, budget_s: float) -> float:
  """Refuses, at once, a budget too small to measure the points a fit needs."""
  budget_s = errors.require_positive(name, budget_s)
  if budget_s < MIN_BUDGET_S:
    raise errors.InputError(
        f"{name}={budget_s:g} s is too short to measure the 8 points a fit needs: "
        f"give at least {MIN_BUDGET_S:g} s.")
  return budget_s


def _fits_memory(config: ToyConfig, dtype: Any, batch: int, context: int
                 ) -> bool:
  return (op_sweeps.kv_bytes(config, dtype, batch, context) <= MAX_KV_BYTES
          and batch * context <= op_sweeps.MAX_RETAINED_TOKENS)


def default_points(budget_s: float, models: Mapping[str, ToyConfig] | None = None,
                   dtype: Any = "float32") -> list[StepPoint]:
  """The end-to-end fit's grid (`fit="steps"`): batch 1-256 x context 128-4096.

  The main model over the whole grid (and three points near the 250k-token
  cap); its variants (`op_sweeps.MODELS`) at short contexts, where their
  weights and layers rather than their K/V set the step time; with a budget
  under `QUICK_BUDGET_S`, sparser grids still. Points whose cache would pass
  `MAX_KV_BYTES` are left out.
  """
  configs = op_sweeps.MODELS if models is None else models
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
            for model, (batches, contexts) in grids.items() if model in configs
            for b, c in op_sweeps.decode_grid(batches, contexts)]
  if not quick:
    points += [StepPoint("calibration", b, c) for b, c in EDGE_POINTS]
  return [p for p in points if p.model in configs
          and _fits_memory(configs[p.model], dtype, p.batch, p.context)]


def heldout_points(budget_s: float, models: Mapping[str, ToyConfig],
                   dtype: Any = "float32") -> list[StepPoint]:
  """The held-out models' points: batch 1-256 x context 128-4096, sparser on
  smaller budgets, each within `MAX_KV_BYTES`."""
  grid = (HELDOUT_GRID if budget_s >= QUICK_BUDGET_S else
          HELDOUT_GRID_QUICK if budget_s >= 90 else HELDOUT_GRID_SHORT)
  return [StepPoint(name, b, c) for name, config in models.items()
          for b, c in grid if _fits_memory(config, dtype, b, c)]


def model_inputs(records: Sequence[measurement.Measurement], bandwidth: float,
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


def bound_errors(records: Sequence[measurement.Measurement],
                 inputs: Mapping[str, np.ndarray]) -> np.ndarray:
  """Relative error of the analytic bound (the step floor at the measured
  ceilings) on measured steps: the yardstick a calibrated profile must beat."""
  names = ("B", "T", "N", "q", "k", "BW", "F", "N_act")
  bound = StepModel.bound().evaluate(**{n: np.asarray(inputs[n]) for n in names})["step_s"]
  return fitting.relative_errors(np.asarray(bound), [r.median_s for r in records])


def _point_row(record: measurement.Measurement, predicted: float,
               subset: str) -> dict[str, Any]:
  measured = record.median_s
  return {
      "model": record.extra["model"],
      "batch": record.shapes["batch"],
      "context": record.shapes["context"],
      "layers": record.shapes["layers"],
      "measured_s": measured,
      "predicted_s": predicted,
      "rel_error": abs(predicted - measured) / measured,
      "set": subset,
      "spread": record.spread,
      "round_medians_s": record.extra.get("round_medians_s", [measured]),
      "round_spread": _finite(record.extra.get("round_spread")),
      "load_avg_1m": record.extra.get("load_avg_1m"),
  }


def _finite(value: float | None) -> float | None:
  return None if value is None or not np.isfinite(value) else float(value)


def _named_configs(configs: Mapping[str, ToyConfig]) -> list[dict[str, Any]]:
  return [{"name": name, **dataclasses.asdict(c)} for name, c in configs.items()]


@dataclasses.dataclass(frozen=True)
class CalibrationRun:
  """What a calibration job measured, fitted and concluded."""

  profile: profiles.Profile
  ceilings: ceilings_lib.Ceilings
  points: list[dict[str, Any]]  # One row per measured step (`_point_row`).
  records: list[measurement.Measurement]  # The decode steps.
  elapsed_s: float
  budget_s: float
  operations: list[measurement.Measurement] = dataclasses.field(
      default_factory=list)

  def rows(self, subset: str) -> list[dict[str, Any]]:
    return [p for p in self.points if p["set"] == subset]

  @property
  def status(self) -> str:
    return self.profile.fit.get("status", "unknown")

  @property
  def warnings(self) -> list[str]:
    return list(self.profile.fit.get("warnings", []))

  def to_json(self) -> dict[str, Any]:
    fit = self.profile.fit
    model = self.profile.model
    return {
        "kind": "calibrated",
        "what": ("calibrated step model: factors fitted from "
                 + ("operation sweeps and the smallest decode steps"
                    if fit.get("method") == "ops" else "decode steps")
                 + " of the fit models; error measured on held-out models"),
        "device_kind": self.profile.device_kind,
        "platform": self.profile.platform,
        "backend": self.profile.backend,
        "dtype": self.profile.dtype,
        "jax_version": self.profile.jax_version,
        "created": self.profile.created,
        "method": self.profile.method,
        "fit": fit.get("method"),
        "status": fit.get("status"),
        "warnings": list(fit.get("warnings", [])),
        "targets": fit.get("targets"),
        "heldout_median_rel_error": fit["heldout_median_rel_error"],
        "heldout_max_rel_error": fit["heldout_max_rel_error"],
        "heldout_by_model": fit.get("heldout_by_model"),
        "train_median_rel_error": fit["train_median_rel_error"],
        "train_max_rel_error": fit["train_max_rel_error"],
        "fit_models": model.get("fit_models", []),
        "heldout_models": model.get("heldout_models", []),
        "factors": dict(self.profile.factors),
        "regime_factors": dict(self.profile.regime_factors),
        "factor_units": dict(calibration.FACTOR_UNITS),
        "operation_fit": fit.get("operations"),
        "expression": str(calibration.calibrated_step()),
        "readable_expression": calibration.readable_step(),
        "ceilings": self.ceilings.to_json(),
        "load": fit.get("load"),
        "training_points": self.rows("train"),
        "heldout_points": self.rows("heldout"),
        "model": dict(model),
        "budget_s": self.budget_s,
        "elapsed_s": self.elapsed_s,
        "measurements": [r.to_json() for r in self.records],
        "operations": [r.to_json() for r in self.operations],
    }


def fit_records(
    records: Sequence[measurement.Measurement],
    ceilings: ceilings_lib.Ceilings,
    dtype: str,
    *,
    heldout_fraction: float = 0.25,
    seed: int = 0,
) -> tuple[fitting.Fit, list[dict[str, Any]]]:
  """Splits points of the same models, fits on the rest, predicts every one.

  The older end-to-end check (random points of the fit's own models held
  out); `run` reports its error on models the fit never saw instead.
  """
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
  rows = [_point_row(r, float(p), "heldout" if h else "train")
          for r, p, h in zip(records, predicted, held_out)]
  return fit, rows


def _now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(
      timespec="seconds")


def _sweep_models(configs: Mapping[str, ToyConfig], points: Sequence[StepPoint],
                  dtype: Any, *, deadline: float, rounds: int, warmup: int,
                  repeats: int, seed: int, say: Progress
                  ) -> list[measurement.Measurement]:
  """Times each model's points with one bench alive at a time (memory)."""
  records = []
  names = [n for n in configs if any(p.model == n for p in points)]
  for index, name in enumerate(names):
    mine = [p for p in points if p.model == name]
    # Each model gets its share of the time left, so the last is not starved.
    share = (deadline - time.monotonic()) / (len(names) - index)
    weight_bytes = op_sweeps.step_inputs(configs[name], dtype).N * np.dtype(
        dtype).itemsize
    bench = op_sweeps.DecodeStepBench(
        configs[name], dtype, name=name, seed=seed,
        param_sets=2 if weight_bytes < ROTATE_WEIGHTS_BELOW else 1)
    records += op_sweeps.decode_step_sweep(
        {name: bench}, mine, rounds=rounds, warmup=warmup, repeats=repeats,
        deadline=time.monotonic() + share, seed=seed, always=mine[:1],
        progress=say)
    del bench
    measurement.release_memory()
  return records


def _sweep_interleaved(configs: Mapping[str, ToyConfig], points: Sequence[StepPoint],
                       dtype: Any, *, deadline: float, rounds: int, warmup: int,
                       repeats: int, seed: int, say: Progress
                       ) -> list[measurement.Measurement]:
  """Times every model's points in the same rounds (fit and held-out together).

  Each round visits all points in a fresh random order, so load from other
  processes hits the fit's steps and the held-out steps alike; the benches are
  alive together (one weight copy each above `ROTATE_WEIGHTS_BELOW`).
  """
  names = [n for n in configs if any(p.model == n for p in points)]
  benches = {}
  for name in names:
    weight_bytes = op_sweeps.step_inputs(configs[name], dtype).N * np.dtype(
        dtype).itemsize
    benches[name] = op_sweeps.DecodeStepBench(
        configs[name], dtype, name=name, seed=seed,
        param_sets=2 if weight_bytes < ROTATE_WEIGHTS_BELOW else 1)
  always = [next(p for p in points if p.model == n) for n in names]
  records = op_sweeps.decode_step_sweep(
      benches, list(points), rounds=rounds, warmup=warmup, repeats=repeats,
      deadline=deadline, seed=seed, always=always, progress=say)
  del benches
  measurement.release_memory()
  return records


def _errors_by_model(rows: Sequence[Mapping[str, Any]]
                     ) -> dict[str, dict[str, Any]]:
  out = {}
  for name in sorted({r["model"] for r in rows}):
    out[name] = fitting.error_summary(
        [r["rel_error"] for r in rows if r["model"] == name])
  return out


def _load_summary(records: Sequence[measurement.Measurement]) -> dict[str, Any]:
  loads = [x for r in records for x in (r.extra.get("load_avg_1m"),
                                        r.extra.get("load_avg_1m_max"))
           if x is not None]
  return {"load_avg_1m_min": min(loads) if loads else None,
          "load_avg_1m_median": float(np.median(loads)) if loads else None,
          "load_avg_1m_max": max(loads) if loads else None,
          "cpu_count": os.cpu_count(),
          "what": "the 1-minute load average at each timing (this process "
                  "included)"}


def assess(rows: Sequence[Mapping[str, Any]], expected: int, *,
           spread_limit: float = 0.08, load: Mapping[str, Any] | None = None
           ) -> tuple[str, list[str]]:
  """The run's status and its warnings, from its held-out rows.

  "ok" only when every held-out model is within `TARGET_MEDIAN` and
  `TARGET_MAX`; "inaccurate" when one is not; "incomplete" when fewer
  held-out points were measured than planned (the budget ran out).
  """
  warnings = []
  status = "ok"
  if len(rows) < expected:
    status = "incomplete"
    warnings.append(f"only {len(rows)} of {expected} held-out points were "
                    "measured: give a larger --budget_s")
  for name, errs in _errors_by_model(rows).items():
    if errs["median_rel_error"] > TARGET_MEDIAN or (
        errs["max_rel_error"] > TARGET_MAX):
      status = "inaccurate" if status == "ok" else status
      warnings.append(
          f"held-out model {name}: median {errs['median_rel_error']:.1%}, max "
          f"{errs['max_rel_error']:.1%} misses the target (median <= "
          f"{TARGET_MEDIAN:.0%}, max <= {TARGET_MAX:.0%})")
  if not rows:
    status = "incomplete"
  unsettled = [r for r in rows if r["round_spread"] is None
               or r["round_spread"] > spread_limit]
  if unsettled:
    warnings.append(
        f"{len(unsettled)} of {len(rows)} held-out points still vary by more "
        f"than {spread_limit:.0%} between their fastest rounds (a busy "
        "machine?): their errors include that noise")
  cores = (load or {}).get("cpu_count")
  busiest = (load or {}).get("load_avg_1m_max")
  if cores and busiest is not None and busiest > cores:
    warnings.append(f"the load average reached {busiest:.1f} on {cores} "
                    "cores during the timings: other processes competed")
  return status, warnings


def noise_floor(rows: Sequence[Mapping[str, Any]]) -> float | None:
  """The median spread between a point's fastest rounds (`round_spread`): how
  far the same step's timing moves on this machine, a floor for any error."""
  spreads = [r["round_spread"] for r in rows if r.get("round_spread") is not None]
  return float(np.median(spreads)) if spreads else None


def _minimum_operations(linear: Sequence[op_sweeps.OpPoint],
                        attention: Sequence[op_sweeps.OpPoint]
                        ) -> list[op_sweeps.OpPoint]:
  """What each operation fit cannot do without, however short the budget:
  the largest linear layer at its fewest, middle and most rows, and the
  smallest and largest attention."""
  largest = max({p.sizes[1:] for p in linear}, key=lambda s: s[0] * s[1])
  rows = sorted(p for p in linear if p.sizes[1:] == largest)
  by_tokens = sorted(attention, key=lambda p: p.sizes[0] * p.sizes[1])
  return [rows[0], rows[len(rows) // 2], rows[-1], by_tokens[0],
          by_tokens[-1]]


def run(
    budget_s: float,
    *,
    dtype: str = "float32",
    fit: str = "ops",
    points: Sequence[StepPoint] | None = None,
    heldout: Sequence[StepPoint] | None = None,
    rounds: int = 5,
    warmup: int = 1,
    repeats: int = 3,
    heldout_fraction: float = 0.25,
    seed: int = 0,
    models: Mapping[str, ToyConfig] | None = None,
    heldout_models: Mapping[str, ToyConfig] | None = None,
    ceilings: ceilings_lib.Ceilings | None = None,
    backend: str | None = None,
    linear_rows: Sequence[int] | None = None,
    attention_grid: Sequence[tuple[int, int]] | None = None,
    progress: Progress | None = None,
    interleave: bool = True,
    regime: bool | None = None,
) -> CalibrationRun:
  """Measures, fits, validates on unseen models, profiles: within `budget_s`.

  Args:
    budget_s: wall-clock budget for the whole job.
    dtype: weights and K/V of the timed operations and steps.
    fit: "ops" (operation sweeps, then the fixed costs from the smallest
      steps) or "steps" (every factor from the fit models' decode steps).
    points: the fit models' steps to time; None means `SMALLEST` of each
      (ops) or `default_points` (steps).
    heldout: the held-out models' steps; None means `heldout_points`.
    rounds: passes over the points while the budget lasts (each point's
      figure is its lower-quartile round, `op_sweeps.lower_quartile`).
    warmup, repeats: per point and round.
    heldout_fraction: unused (kept for callers of the older job).
    seed: the visiting order and the data.
    models: the fit's models; None means `op_sweeps.FIT_MODELS` (ops) or
      `op_sweeps.MODELS` (steps).
    heldout_models: models the fit never sees; None means
      `op_sweeps.HELDOUT_MODELS` with the default models, else the two
      `op_sweeps.heldout_variant`s of the first fit model.
    ceilings: already measured ceilings; None measures them.
    backend: the operations' backend; None means "xla" on a CPU and
      "pallas" (the autotuned kernels) on a GPU or TPU.
    linear_rows: the linear layer's row counts M; None means `LINEAR_ROWS`
      (`LINEAR_ROWS_QUICK` under `QUICK_BUDGET_S`).
    attention_grid: decode attention's (batch, context) points; None means
      `ATTENTION_GRID` (`ATTENTION_GRID_QUICK`).
    progress: called with a line per step of the job.
    interleave: time the fit's steps and the held-out steps in the same
      rounds (so load drift hits both alike); False times them one model
      after another.
    regime: fit XLA:CPU's weight re-pack from B = 2 (`calibration.repack_time`)
      with the linear layer's factors; None means on a CPU only (`fit="ops"`).
  """
  del heldout_fraction  # The held-out set is whole models now.
  budget_s = check_budget("budget_s", budget_s)
  errors.require_choice("fit", fit, FITS)
  dtype_value = measurement.require_dtype(dtype)
  measurement.keep_allocations()
  start = time.monotonic()
  end = start + budget_s - _FIT_RESERVE_S
  say = progress or (lambda _: None)
  quick = budget_s < QUICK_BUDGET_S
  platform = jax.default_backend()
  backend = backend or ("xla" if platform == "cpu" else "pallas")
  if models is None:
    configs = dict(op_sweeps.FIT_MODELS if fit == "ops" else op_sweeps.MODELS)
    if heldout_models is None:
      heldout_models = op_sweeps.HELDOUT_MODELS
  else:
    configs = dict(models)
  if heldout_models is None:
    first = next(iter(configs.values()))
    heldout_models = {f"heldout_{kind}": op_sweeps.heldout_variant(first, kind)
                      for kind in ("narrow", "wide")}
  clash = sorted(set(configs) & set(heldout_models))
  if clash:
    raise errors.InputError(f"models {clash} are both fitted and held out: "
                            "a held-out model must be one the fit never sees.")
  if points is None:
    points = ([StepPoint(n, b, c) for n in configs for b, c in SMALLEST]
              if fit == "ops" else default_points(budget_s, configs, dtype))
  points = list(points)
  heldout = list(heldout_points(budget_s, heldout_models, dtype)
                 if heldout is None else heldout)
  known = {**configs, **heldout_models}
  unknown = sorted({p.model for p in points + heldout} - set(known))
  if unknown:
    raise errors.InputError(
        f"models {unknown} have no config: known {', '.join(known)}.")
  if any(p.model in heldout_models for p in points) or any(
      p.model in configs for p in heldout):
    raise errors.InputError("a fit point names a held-out model (or a "
                            "held-out point a fit model).")
  if ceilings is None:
    say(f"ceilings on {jax.devices()[0].device_kind} ({platform})")
    ceilings = ceilings_lib.measure_ceilings(
        (dtype,), repeats=3 if quick else 8, rounds=2 if quick else 3,
        progress=say)
  bandwidth, flop_rate = ceilings.bandwidth_Bps, ceilings.flop_rate(dtype)
  measurement.release_memory()
  # The phases share the time the ceilings left: operations, the fit's
  # steps, then the held-out steps (the reported error) to the end.
  now = time.monotonic()
  left = max(end - now, 0.0)
  ops_deadline = now + 0.3 * left
  fit_deadline = now + 0.5 * left
  operations: list[measurement.Measurement] = []
  if fit == "ops":
    rows_m = linear_rows or (LINEAR_ROWS_QUICK if quick else LINEAR_ROWS)
    grid = attention_grid or (ATTENTION_GRID_QUICK if quick
                              else ATTENTION_GRID)
    linear_pts = sorted({p for c in configs.values()
                         for p in op_sweeps.linear_points(c, rows_m)})
    attention_pts = sorted({p for c in configs.values()
                            for p in op_sweeps.attention_points(c, grid)})
    attention_pts = [p for p in attention_pts if 2 * p.sizes[0] * p.sizes[1]
                     * p.sizes[3] * p.sizes[4] * np.dtype(dtype_value).itemsize
                     <= MAX_KV_BYTES]
    say(f"operations ({backend}): {len(linear_pts)} linear, "
        f"{len(attention_pts)} attention points")
    operations = op_sweeps.op_sweep(
        linear_pts + attention_pts, dtype=dtype_value, backend=backend,
        rounds=3, deadline=ops_deadline, seed=seed,
        always=_minimum_operations(linear_pts, attention_pts), progress=say)
    measurement.release_memory()
  if interleave:
    say(f"fit and held-out steps, interleaved in every round: {len(points)} points of "
        f"{', '.join(configs)}, {len(heldout)} of {', '.join(heldout_models)}")
    both = _sweep_interleaved({**configs, **heldout_models}, points + heldout,
                              dtype_value, deadline=end, rounds=rounds, warmup=warmup,
                              repeats=repeats, seed=seed, say=say)
    fit_records_ = [r for r in both if r.extra["model"] in configs]
    heldout_records = [r for r in both if r.extra["model"] in heldout_models]
  else:
    say(f"fit steps: {len(points)} points of {', '.join(configs)}")
    fit_records_ = _sweep_models(configs, points, dtype_value,
                                 deadline=fit_deadline, rounds=rounds,
                                 warmup=warmup, repeats=repeats, seed=seed,
                                 say=say)
    say(f"held-out steps: {len(heldout)} points of "
        f"{', '.join(heldout_models)}")
    heldout_records = _sweep_models(heldout_models, heldout, dtype_value,
                                    deadline=end, rounds=rounds, warmup=warmup,
                                    repeats=repeats, seed=seed + 1, say=say)
  fit_inputs = model_inputs(fit_records_, bandwidth, flop_rate)
  details: dict[str, Any] = {}
  regime_factors: dict[str, float] = {}
  if fit == "ops":
    with_regime = platform == "cpu" if regime is None else regime
    factors, details = op_fit.fit_operations(
        [r for r in operations if r.op == "linear"],
        [r for r in operations if r.op == "decode_attention"],
        fit_records_, fit_inputs, bandwidth=bandwidth, flop_rate=flop_rate,
        regime=with_regime)
    regime_factors = {n: factors.pop(n) for n in calibration.REGIME_FACTOR_NAMES
                      if n in factors}
    loss = None
  else:
    if len(fit_records_) < 8:
      raise errors.InputError(
          f"only {len(fit_records_)} fit points were measured: the fit needs "
          "at least 8; give a larger --budget_s.")
    result = fitting.fit_factors(fit_inputs, np.asarray(
        [r.median_s for r in fit_records_]))
    factors, loss = result.factors, result.loss
  if not heldout_records:
    raise errors.InputError(
        "no held-out point was measured: give a larger --budget_s.")
  every = {**factors, **regime_factors}
  rows = [_point_row(r, float(p), "train") for r, p in zip(
      fit_records_, fitting.predict(fit_inputs, every))]
  held_inputs = model_inputs(heldout_records, bandwidth, flop_rate)
  rows += [_point_row(r, float(p), "heldout") for r, p in zip(
      heldout_records, fitting.predict(held_inputs, every))]
  held_rows = [r for r in rows if r["set"] == "heldout"]
  load = _load_summary(operations + fit_records_ + heldout_records)
  status, warnings = assess(held_rows, len(heldout), load=load)
  floor = noise_floor(held_rows)
  if status != "ok" and floor is not None:
    warnings.append(f"this machine's floor: the same held-out point's fastest rounds "
                    f"differ by {floor:.1%} (median over the points), which no fit "
                    "can go below")
  fit_info: dict[str, Any] = {
      "noise_floor_median_round_spread": floor,
      "method": fit, "loss": loss, "statistic": op_sweeps.STATISTIC,
      "objective": "mean squared log error (Adam on log factors)",
      "status": status, "warnings": warnings,
      "targets": {"heldout_median_rel_error": TARGET_MEDIAN,
                  "heldout_max_rel_error": TARGET_MAX,
                  "per": "held-out model"},
      "heldout_by_model": _errors_by_model(held_rows),
      "fastest_fit_step_s": min(r.median_s for r in fit_records_),
      "operations": details, "load": load,
  }
  bound_errs = fitting.error_summary(bound_errors(heldout_records, held_inputs))
  fit_info.update(heldout_by="model",
                  bound_heldout_median_rel_error=bound_errs["median_rel_error"],
                  bound_heldout_max_rel_error=bound_errs["max_rel_error"])
  for subset in ("train", "heldout"):
    errs = fitting.error_summary(
        [r["rel_error"] for r in rows if r["set"] == subset])
    fit_info[f"{subset}_median_rel_error"] = errs["median_rel_error"]
    fit_info[f"{subset}_max_rel_error"] = errs["max_rel_error"]
    fit_info[f"{subset}_points"] = errs["points"]
  say(f"held-out relative error: median "
      f"{fit_info['heldout_median_rel_error']:.1%}, max "
      f"{fit_info['heldout_max_rel_error']:.1%} ({status})")
  device = measurement.current_device()
  model_info = {
      "configs": {name: dataclasses.asdict(c) for name, c in known.items()},
      "fit_models": _named_configs(configs),
      "heldout_models": _named_configs(heldout_models),
      "step_inputs": {name: op_sweeps.step_inputs(c, dtype_value).to_json()
                      for name, c in known.items()},
      "points": len(rows), "operations": len(operations),
      "rounds": rounds, "warmup": warmup, "repeats": repeats,
      "interleaved": interleave,
  }
  timing = (fit_records_ + heldout_records)[0].method
  prof = profiles.Profile(
      device_kind=device.device_kind, platform=device.platform,
      backend=backend if fit == "ops" else "xla", dtype=dtype,
      jax_version=device.jax_version, created=_now(),
      ceilings={"bandwidth_Bps": ceilings.bandwidth_Bps,
                "copy_bandwidth_Bps": ceilings.copy_bandwidth_Bps,
                "read_bandwidth_Bps": ceilings.read_bandwidth_Bps,
                "flops_per_s": dict(ceilings.flops_per_s)},
      factors=factors, fit=fit_info, model=model_info, regime_factors=regime_factors,
      method=(f"{timing}; {op_sweeps.STATISTIC} of up to {rounds} rounds "
              "visiting the points in random order, points whose fastest "
              "rounds disagree re-measured; cache donated; "
              f"{measurement.allocator()}"))
  return CalibrationRun(profile=prof, ceilings=ceilings, points=rows,
                        records=fit_records_ + heldout_records,
                        elapsed_s=time.monotonic() - start, budget_s=budget_s,
                        operations=operations)


def compare_profiles(previous: profiles.Profile, current: profiles.Profile
                     ) -> dict[str, Any]:
  """Whether two calibrations agree: factors within 10%, medians 3 points.

  The relative difference of each factor is |current - previous| / previous,
  except that a fixed cost (t0_step, t0_layer) smaller than the previous
  run's fastest fit step is compared with that step: a few microseconds
  beneath a millisecond step are not determined by the fit, and moving them
  changes no prediction. The held-out medians' difference is in points.
  """
  fastest = previous.fit.get("fastest_fit_step_s")
  diffs = {}
  for n in calibration.FACTOR_NAMES:
    scale = previous.factors[n]
    if n in op_fit.FIXED_FACTORS and fastest:
      # A fixed cost far below the fastest step is not determined by it;
      # its change matters as a share of that step, not of itself.
      scale = max(scale, fastest)
    diffs[n] = abs(current.factors[n] - previous.factors[n]) / scale
  for n in calibration.REGIME_FACTOR_NAMES:
    if n in previous.regime_factors and n in current.regime_factors:
      # A re-pack near zero is compared with one weight read (its unit).
      scale = max(previous.regime_factors[n], 1.0)
      diffs[n] = abs(current.regime_factors[n] - previous.regime_factors[n]) / scale
  old, new = (previous.heldout_median_rel_error,
              current.heldout_median_rel_error)
  median_points = (None if old is None or new is None
                   else abs(new - old) * 100)
  failing = [n for n, d in diffs.items() if d > REPEAT_FACTOR_REL]
  median_ok = median_points is not None and (
      median_points <= REPEAT_MEDIAN_POINTS)
  return {
      "previous": previous.path,
      "previous_created": previous.created,
      "factor_rel_diff": diffs,
      "max_factor_rel_diff": max(diffs.values()),
      "factors_outside": failing,
      "heldout_median_previous": old,
      "heldout_median_current": new,
      "heldout_median_diff_points": median_points,
      "criteria": {"factor_rel_diff_max": REPEAT_FACTOR_REL,
                   "heldout_median_diff_points_max": REPEAT_MEDIAN_POINTS,
                   "fixed_costs_relative_to": (
                       f"the previous run's fastest fit step ({fastest:.3g} s)"
                       " where larger than the cost" if fastest else
                       "themselves")},
      "pass": not failing and median_ok,
  }


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

  The step is timed like the calibration's points (lower-quartile round,
  unsettled points re-measured), on this device, and predicted from the
  profile's factors and ceilings.

  Returns:
    Rows of batch, context, predicted_s, measured_s and rel_error, and
    whether the point lies inside the default calibration grid.
  """
  measurement.keep_allocations()
  device = measurement.current_device()
  if device.device_kind != prof.device_kind:
    raise errors.InputError(
        f"profile device_kind={prof.device_kind!r} is not this device "
        f"({device.device_kind!r}): validate on the device it describes.")
  config = config_from_profile(prof, model)
  dtype = measurement.require_dtype(prof.dtype)
  too_big = [(b, c) for b, c in points if not _fits_memory(config, dtype, b, c)]
  if too_big:
    b, c = too_big[0]
    raise errors.InputError(
        f"batch={b} x context={c} needs a "
        f"{op_sweeps.kv_bytes(config, dtype, b, c) / 1e9:.2f} GB cache: "
        f"allowed up to {MAX_KV_BYTES / 1e9:g} GB and "
        f"{op_sweeps.MAX_RETAINED_TOKENS:,} tokens per point.")
  bench = op_sweeps.DecodeStepBench(config, dtype, name=model, seed=seed)
  step_points = [StepPoint(model, b, c) for b, c in points]
  records = op_sweeps.decode_step_sweep(
      {model: bench}, step_points, rounds=rounds, warmup=warmup,
      repeats=repeats, seed=seed, progress=progress)
  inputs = model_inputs(records, prof.bandwidth(), prof.flop_rate())
  predicted = fitting.predict(inputs, {**prof.factors, **prof.regime_factors})
  rows = []
  for record, pred in zip(records, predicted):
    row = _point_row(record, float(pred), "validation")
    row["inside_calibrated_grid"] = (
        BATCHES[0] <= row["batch"] <= BATCHES[-1]
        and CONTEXTS[0] <= row["context"] <= CONTEXTS[-1]
        and row["batch"] * row["context"] <= op_sweeps.MAX_RETAINED_TOKENS)
    rows.append(row)
  return rows
