"""The calibration job, within a time budget: measure, fit, validate, profile.

1. Device ceilings (`jaxroof.measure.ceilings`), measured.
2. The fit (`fit="ops"`, the default): the operations the step is made of,
   timed alone at the fit models' shapes (`op_sweeps.op_sweep`: the linear
   layer over M = 1 ... 2048, one layer's decode attention over batch x
   context), then the fit models' smallest decode steps; `op_fit` fits the
   efficiency factors to the operations and the fixed costs to the steps.
   `fit="steps"` instead fits every factor to the fit models' decode steps
   over a batch x context grid (the older end-to-end fit). The shipped fit
   models read their K/V in two layouts; fit models of one layout get one
   layer's attention timed at another too (`toy_steps.layout_probe`), and
   `eta_kv` is moved to the K/V rate midway over the layouts
   (`toy_fit.layout_scale`: a held-out model has a layout of its own). The
   layouts' spread says how far one K/V rate can hold (`toy_fit.layout_floor`).
3. Validation: the whole toy decode step of two models the fit never saw
   (`calibration_models.HELDOUT_MODELS`: other width, depth and K/V heads), timed over
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

What is timed, and how, is `jaxroof.measure.toy_steps`; the fit and the
verdict are `jaxroof.calibrate.toy_fit`. `validate` times the step afresh at a
user's points and compares it with a profile's prediction.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from jaxroof import errors
from jaxroof.calibrate import fitting
from jaxroof.calibrate import toy_fit
from jaxroof.measure import calibration_models
from jaxroof.measure import ceilings as ceilings_lib
from jaxroof.measure import measurement
from jaxroof.measure import op_sweeps
from jaxroof.measure import profiles
from jaxroof.measure import step_sweeps
from jaxroof.measure import toy_steps
from jaxroof.measure.step_sweeps import StepPoint
from jaxroof.toy.config import ToyConfig

Progress = Callable[[str], None]

MIN_BUDGET_S = 25.0  # Below this too few points are measured to fit.
_FIT_RESERVE_S = 10.0  # Kept for the fits, the profile and the plot.


def check_budget(name: str, budget_s: float) -> float:
  """Refuses, at once, a budget too small to measure the points a fit needs."""
  budget_s = errors.require_positive(name, budget_s)
  if budget_s < MIN_BUDGET_S:
    raise errors.InputError(
        f"{name}={budget_s:g} s is too short to measure the 8 points a fit needs: "
        f"give at least {MIN_BUDGET_S:g} s.")
  return budget_s


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
) -> toy_fit.CalibrationRun:
  """Measures, fits, validates on unseen models, profiles: within `budget_s`.

  Args:
    budget_s: wall-clock budget for the whole job.
    dtype: weights and K/V of the timed operations and steps.
    fit: "ops" (operation sweeps, then the fixed costs from the smallest
      steps) or "steps" (every factor from the fit models' decode steps).
    points: the fit models' steps to time; None means `SMALLEST` and `KV_STEPS` of each
      (ops) or `default_points` (steps).
    heldout: the held-out models' steps; None means `heldout_points`.
    rounds: passes over the points while the budget lasts (each point's
      figure is its lower-quartile round, `step_sweeps.lower_quartile`).
    warmup, repeats: per point and round.
    seed: the visiting order and the data.
    models: the fit's models; None means `calibration_models.FIT_MODELS` (ops) or
      `calibration_models.MODELS` (steps).
    heldout_models: models the fit never sees; None means
      `calibration_models.HELDOUT_MODELS` with the default models, else the two
      `calibration_models.heldout_variant`s of the first fit model.
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
  budget_s = check_budget("budget_s", budget_s)
  errors.require_choice("fit", fit, toy_fit.FITS)
  dtype_value = measurement.require_dtype(dtype)
  measurement.keep_allocations()
  start = time.monotonic()
  end = start + budget_s - _FIT_RESERVE_S
  say = progress or (lambda _: None)
  quick = budget_s < toy_steps.QUICK_BUDGET_S
  platform = jax.default_backend()
  backend = backend or ("xla" if platform == "cpu" else "pallas")
  if models is None:
    configs = dict(calibration_models.FIT_MODELS if fit == "ops" else calibration_models.MODELS)
    if heldout_models is None:
      heldout_models = calibration_models.HELDOUT_MODELS
  else:
    configs = dict(models)
  if heldout_models is None:
    first = next(iter(configs.values()))
    heldout_models = {
        f"heldout_{kind}": calibration_models.heldout_variant(first, kind)
        for kind in ("narrow", "wide")
    }
  clash = sorted(set(configs) & set(heldout_models))
  if clash:
    raise errors.InputError(f"models {clash} are both fitted and held out: "
                            "a held-out model must be one the fit never sees.")
  if points is None:
    points = ([
        StepPoint(n, b, c) for n in configs for b, c in toy_steps.SMALLEST + toy_steps.KV_STEPS
    ] if fit == "ops" else toy_steps.default_points(budget_s, configs, dtype))
  points = list(points)
  heldout = list(
      toy_steps.heldout_points(budget_s, heldout_models, dtype) if heldout is None else heldout)
  known = {**configs, **heldout_models}
  unknown = sorted({p.model for p in points + heldout} - set(known))
  if unknown:
    raise errors.InputError(f"models {unknown} have no config: known {', '.join(known)}.")
  if any(p.model in heldout_models for p in points) or any(p.model in configs for p in heldout):
    raise errors.InputError("a fit point names a held-out model (or a "
                            "held-out point a fit model).")
  if ceilings is None:
    say(f"ceilings on {jax.devices()[0].device_kind} ({platform})")
    ceilings = ceilings_lib.measure_ceilings((dtype,), repeats=3 if quick else 8,
                                             rounds=2 if quick else 3, progress=say)
  measurement.release_memory()
  # The phases share the time the ceilings left: operations, the fit's
  # steps, then the held-out steps (the reported error) to the end.
  now = time.monotonic()
  left = max(end - now, 0.0)
  ops_deadline = now + 0.3 * left
  fit_deadline = now + 0.5 * left
  operations: list[measurement.Measurement] = []
  op_points: list[op_sweeps.OpPoint] = []
  op_rounds: dict[op_sweeps.OpPoint, list[measurement.Measurement]] = {}
  after_round = None
  if fit == "ops":
    rows_m = linear_rows or (toy_steps.LINEAR_ROWS_QUICK if quick else toy_steps.LINEAR_ROWS)
    grid = attention_grid or (toy_steps.ATTENTION_GRID_QUICK if quick else toy_steps.ATTENTION_GRID)
    linear_pts = sorted({p for c in configs.values() for p in op_sweeps.linear_points(c, rows_m)})
    attention_pts = sorted(
        {p for c in configs.values() for p in op_sweeps.attention_points(c, grid)})
    probe_pts = toy_steps.layout_probe(configs, heldout_models)
    attention_pts = [
        p for p in sorted(set(attention_pts) | set(probe_pts))
        if toy_steps.attention_kv_bytes(p, dtype_value) <= toy_steps.MAX_KV_BYTES
    ]
    say(f"operations ({backend}): {len(linear_pts)} linear, "
        f"{len(attention_pts)} attention points ({len(probe_pts)} of another K/V layout)")
    op_points = linear_pts + attention_pts
    single_rows = toy_steps.single_row_operations(linear_pts)
    operations = op_sweeps.op_sweep(
        op_points, dtype=dtype_value, backend=backend, rounds=3, deadline=ops_deadline, seed=seed,
        always=toy_steps.minimum_operations(linear_pts,
                                            [p for p in attention_pts if p not in probe_pts]),
        every_round=single_rows, progress=say, timed=op_rounds)
    measurement.release_memory()

    def after_round():
      # eta_w rests on these points alone: their rounds, spread over the
      # whole run as the steps' are, outvote a slow minute of the machine.
      op_sweeps.op_sweep(single_rows, dtype=dtype_value, backend=backend, rounds=1,
                         max_extra_rounds=0, deadline=end, seed=seed, timed=op_rounds)

  if interleave:
    say(f"fit and held-out steps, interleaved in every round: {len(points)} points of "
        f"{', '.join(configs)}, {len(heldout)} of {', '.join(heldout_models)}")
    both = toy_steps.sweep_interleaved({**configs, **heldout_models}, points + heldout, dtype_value,
                                       deadline=end, rounds=rounds, warmup=warmup, repeats=repeats,
                                       seed=seed, say=say, after_round=after_round)
    fit_records = [r for r in both if r.extra["model"] in configs]
    heldout_records = [r for r in both if r.extra["model"] in heldout_models]
  else:
    say(f"fit steps: {len(points)} points of {', '.join(configs)}")
    fit_records = toy_steps.sweep_models(configs, points, dtype_value, deadline=fit_deadline,
                                         rounds=rounds, warmup=warmup, repeats=repeats, seed=seed,
                                         say=say, after_round=after_round)
    say(f"held-out steps: {len(heldout)} points of "
        f"{', '.join(heldout_models)}")
    heldout_records = toy_steps.sweep_models(heldout_models, heldout, dtype_value, deadline=end,
                                             rounds=rounds, warmup=warmup, repeats=repeats,
                                             seed=seed + 1, say=say, after_round=after_round)
  if op_rounds:  # The operations again, with the M = 1 rounds timed between the steps'.
    operations = op_sweeps.summarized(op_points, op_rounds)
  with_regime = platform == "cpu" if regime is None else regime
  measured = toy_fit.Measured(ceilings=ceilings, operations=operations, fit_records=fit_records,
                              heldout_records=heldout_records, heldout_planned=len(heldout))
  job = toy_fit.fit_steps(
      measured, fit=fit, dtype=dtype, backend=backend, regime=with_regime, models=configs,
      heldout_models=heldout_models, budget_s=budget_s,
      plan={"rounds": rounds, "warmup": warmup, "repeats": repeats, "interleaved": interleave})
  say(f"held-out relative error: median {job.profile.heldout_median_rel_error:.1%}, max "
      f"{job.profile.heldout_max_rel_error:.1%} ({job.status})")
  return dataclasses.replace(job, elapsed_s=time.monotonic() - start)


def config_from_profile(prof: profiles.Profile, model: str) -> ToyConfig:
  """The toy model a profile was calibrated with (to time it again)."""
  configs = prof.model.get("configs", {})
  if model not in configs:
    raise errors.InputError(f"model={model!r} is not in the profile: it has "
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
    raise errors.InputError(f"profile device_kind={prof.device_kind!r} is not this device "
                            f"({device.device_kind!r}): validate on the device it describes.")
  config = config_from_profile(prof, model)
  dtype = measurement.require_dtype(prof.dtype)
  too_big = [(b, c) for b, c in points if not toy_steps.fits_memory(config, dtype, b, c)]
  if too_big:
    b, c = too_big[0]
    raise errors.InputError(f"batch={b} x context={c} needs a "
                            f"{step_sweeps.kv_bytes(config, dtype, b, c) / 1e9:.2f} GB cache: "
                            f"allowed up to {toy_steps.MAX_KV_BYTES / 1e9:g} GB and "
                            f"{calibration_models.MAX_RETAINED_TOKENS:,} tokens per point.")
  bench = step_sweeps.DecodeStepBench(config, dtype, name=model, seed=seed)
  step_points = [StepPoint(model, b, c) for b, c in points]
  records = step_sweeps.decode_step_sweep({model: bench}, step_points, rounds=rounds, warmup=warmup,
                                          repeats=repeats, seed=seed, progress=progress)
  inputs = toy_fit.model_inputs(records, prof.bandwidth(), prof.flop_rate())
  predicted = fitting.predict(inputs, {**prof.factors, **prof.regime_factors})
  rows = []
  for record, pred in zip(records, predicted):
    row = toy_fit.point_row(record, float(pred), "validation")
    row["inside_calibrated_grid"] = (
        toy_steps.BATCHES[0] <= row["batch"] <= toy_steps.BATCHES[-1] and
        toy_steps.CONTEXTS[0] <= row["context"] <= toy_steps.CONTEXTS[-1] and
        row["batch"] * row["context"] <= calibration_models.MAX_RETAINED_TOKENS)
    rows.append(row)
  return rows


def validation_result(path: str, prof: profiles.Profile, rows: list[dict],
                      errs: Mapping[str, Any]) -> dict[str, Any]:
  """The JSON of a validation: the toy timed afresh against a profile's prediction."""
  return {
      "kind": "validation",
      "what": "toy decode step measured afresh vs the profile's calibrated prediction",
      "profile": path, "model": "calibration", "profile_heldout_median_rel_error":
          prof.heldout_median_rel_error, "device_kind": prof.device_kind, "backend": prof.backend,
      "dtype": prof.dtype, "method": prof.method, "median_rel_error": errs["median_rel_error"],
      "max_rel_error": errs["max_rel_error"], "validation": rows,
      "units": {"predicted_s": "s", "measured_s": "s", "rel_error": "1"}
  }
