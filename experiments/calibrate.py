"""Calibrates the step model on this device, or validates a profile.

Calibration (the default) measures the device's ceilings and the toy
Transformer's jit-compiled decode step over a grid of batch (1-256) and
context (128-4096, batch x context <= 250,000), fits the calibrated model's
efficiency factors and fixed costs with optax on three quarters of the
points, and reports the relative error on the held-out quarter, all within
`--budget_s`:

  python -m experiments.calibrate --budget_s=600 --rounds=7 \
      --profile_out=results/profile_cpu.json \
      --json_out=results/calibration_cpu.json \
      --plot_out=results/calibration_cpu.png

Validation times the step afresh at the points you choose (every batch with
every context) and compares it with a profile's prediction:

  python -m experiments.calibrate --validate \
      --profile=results/profile_cpu.json --batch_sizes=3,48,200 \
      --contexts=300,1500 --json_out=results/validation_cpu.json

Figures are labelled: ceilings and step times are measurements (device,
backend, dtype, timing method in the JSON); predictions are calibrated.
"""

from __future__ import annotations

import itertools

from absl import flags
from absl import logging

from experiments import _cli
from jaxroof.measure import fitting
from jaxroof.symbolic import calibrated as calibration
from jaxroof.measure import calibration_job
from jaxroof.report import calibration as calibration_report
from jaxroof import files
from jaxroof.measure import records as measure
from jaxroof.measure import profiles
from jaxroof.report import table

# Calibration.
_BUDGET_S = flags.DEFINE_float(
    "budget_s", 600.0,
    "Wall-clock budget of the calibration, seconds (> 0; under 150 s a "
    "sparser grid is measured).")
_DTYPE = flags.DEFINE_enum("dtype", "float32", list(measure.DTYPES), "Weights and K/V.")
_ROUNDS = flags.DEFINE_integer(
    "rounds", 7, "Passes over the points while the budget lasts (>= 1); each "
    "point keeps its lower-quartile round (the 3rd fastest of 7).",
    lower_bound=1)
_REPEATS = flags.DEFINE_integer(
    "repeats", 3, "Timed steps per point and round (>= 1).", lower_bound=1)
_HELDOUT = flags.DEFINE_float(
    "heldout_fraction", 0.25, "Share of the points the fit never sees, in "
    "(0, 0.5].")
_SEED = flags.DEFINE_integer("seed", 0, "Seeds the split, order and data.")
# Validation.
_VALIDATE = flags.DEFINE_bool(
    "validate", False, "Validate --profile at --batch_sizes x --contexts "
    "instead of calibrating.")
_PROFILE = flags.DEFINE_string(
    "profile", None, "Profile JSON to validate (with --validate).")
_BATCH_SIZES = flags.DEFINE_list(
    "batch_sizes", "2,24,96", "Validation batch sizes (sequences), whole "
    "numbers >= 1.")
_CONTEXTS = flags.DEFINE_list(
    "contexts", "200,1500", "Validation contexts (tokens already cached per "
    "sequence), whole numbers >= 1.")
# Output.
_PROFILE_OUT = flags.DEFINE_string(
    "profile_out", None, "Write the calibrated profile JSON here.")
_JSON_OUT = flags.DEFINE_string(
    "json_out", None, "Write inputs, points, factors and errors as JSON here.")
_PLOT_OUT = flags.DEFINE_string(
    "plot_out", None, "Write a PNG of measured vs predicted step time here.")

_cli.require_positive(_BUDGET_S, "s")
_cli.require_positive_int_list(_BATCH_SIZES, "sequences")
_cli.require_positive_int_list(_CONTEXTS, "tokens")
flags.register_validator(
    _HELDOUT.name, lambda v: 0 < v <= 0.5,
    message="must be in (0, 0.5] (a share of the points)")


@flags.multi_flags_validator(
    (_VALIDATE.name, _PROFILE.name),
    message="--validate needs --profile=PATH (a profile JSON)")
def _profile_given(values: dict) -> bool:
  return not values[_VALIDATE.name] or bool(values[_PROFILE.name])


def _print_points(rows: list[dict]) -> None:
  headers = ("set", "model", "batch", "context", "measured ms",
             "predicted ms", "error")
  cells = [[r["set"], r["model"], r["batch"], r["context"],
            f"{r['measured_s'] * 1e3:,.2f}", f"{r['predicted_s'] * 1e3:,.2f}",
            f"{r['rel_error']:.1%}"] for r in rows]
  print(table.format_table(headers, cells))


def calibrate() -> None:
  dtype = _DTYPE.value
  measure.require_dtype(dtype)
  calibration_job.check_budget("--budget_s", _BUDGET_S.value)
  job = calibration_job.run(
      _BUDGET_S.value, dtype=dtype, rounds=_ROUNDS.value,
      repeats=_REPEATS.value, heldout_fraction=_HELDOUT.value,
      seed=_SEED.value, progress=lambda line: logging.info("%s", line))
  prof = job.profile
  print(f"Calibration on {prof.device_kind} ({prof.platform}), backend "
        f"{prof.backend}, {prof.dtype}, jax {prof.jax_version}; "
        f"{len(job.points)} points in {job.elapsed_s:.0f} s.")
  print("Ceilings (measurement):")
  print(table.format_table(("ceiling", "value"),
                           calibration_report.ceiling_rows(job.ceilings)))
  print(f"Calibrated model: step = {calibration.readable_step()}")
  print(table.format_table(("factor", "value", "meaning"),
                           calibration_report.factor_rows(prof.factors)))
  _print_points(job.points)
  fit = prof.fit
  print(f"held-out relative error: median "
        f"{fit['heldout_median_rel_error']:.1%}, max "
        f"{fit['heldout_max_rel_error']:.1%} ({fit['heldout_points']} points)")
  calibration_report.write_results(job, json_out=_JSON_OUT.value,
                                profile_out=_PROFILE_OUT.value,
                                plot_out=_PLOT_OUT.value)


def validate() -> None:
  prof = profiles.load_profile(_PROFILE.value)
  points = list(itertools.product(_cli.int_list(_BATCH_SIZES),
                                  _cli.int_list(_CONTEXTS)))
  rows = calibration_job.validate(
      prof, points, rounds=_ROUNDS.value, repeats=_REPEATS.value,
      progress=lambda line: logging.info("%s", line))
  errs = fitting.error_summary([r["rel_error"] for r in rows])
  print(f"Validation of {_PROFILE.value} on {prof.device_kind} "
        f"({prof.backend}, {prof.dtype}): measured afresh vs calibrated.")
  _print_points(rows)
  print(f"relative error: median {errs['median_rel_error']:.1%}, max "
        f"{errs['max_rel_error']:.1%} ({errs['points']} points)")
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, {
        "kind": "validation",
        "what": "toy decode step measured afresh vs the profile's "
                "calibrated prediction",
        "profile": _PROFILE.value,
        "device_kind": prof.device_kind,
        "backend": prof.backend,
        "dtype": prof.dtype,
        "method": prof.method,
        "median_rel_error": errs["median_rel_error"],
        "max_rel_error": errs["max_rel_error"],
        "validation": rows,
        "units": {"predicted_s": "s", "measured_s": "s", "rel_error": "1"},
    })
  if _PLOT_OUT.value:
    calibration_report.plot(rows, _PLOT_OUT.value,
                         calibration_report.title(prof) + " (validation)")


def main(argv: list[str]) -> None:
  del argv  # Unused.
  if _VALIDATE.value:
    validate()
  else:
    calibrate()


if __name__ == "__main__":
  _cli.run(main)
