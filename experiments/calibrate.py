"""Calibrates the step model on this device, or validates a profile.

Calibration (the default) measures the device's ceilings, then fits the
calibrated model's factors from the operations the toy Transformer's decode
step is made of (`--fit=ops`): the linear layer at the fit models' shapes
over M = 1 ... 2048 rows gives eta_w, eta_f and r_ovl; one layer's decode
attention over batch x context gives eta_kv; the fit models' smallest decode
steps give the fixed costs t0_step and t0_layer. On a CPU the operations are
XLA's; on a GPU or TPU the Pallas kernels. It then times the whole decode
step of two toy models the fit never saw (`op_sweeps.HELDOUT_MODELS`: other
width, depth and K/V heads) over batch x context and reports the relative
error there, per model, with a status that says whether it met its targets
(median <= 8%, max <= 20% on each). `--fit=steps` fits every factor to the
fit models' whole steps instead (the error is still on the held-out models).
All within `--budget_s`:

  python -m experiments.calibrate --budget_s=120 \
      --profile_out=results/profile_cpu.json \
      --json_out=results/calibration_cpu.json \
      --plot_out=results/calibration_cpu.png

A second run can check it repeats (factors within 10%, held-out medians
within 3 points), written under `repeatability`:

  python -m experiments.calibrate --budget_s=120 \
      --compare_profile=results/profile_cpu.json --json_out=/tmp/again.json

Validation times the step afresh at the points you choose (every batch with
every context) and compares it with a profile's prediction:

  python -m experiments.calibrate --validate \
      --profile=results/profile_cpu.json --batch_sizes=3,20,48 \
      --contexts=300,1500 --json_out=results/validation_cpu.json

From measurements you already have (no timing here; see
`jaxroof.measure.user_measurements` for the CSV/JSONL columns):

  python -m experiments.calibrate --from_csv=tests/data/trtllm_0.9.0_steps.csv \
      --accelerator=h200 --profile_out=results/profile_h200_trtllm.json \
      --json_out=results/user_calibration_h200.json
  python -m experiments.calibrate --from_csv=tests/data/trtllm_0.9.0_steps.csv \
      --carry_over --json_out=results/carry_over_trtllm.json
  python -m experiments.calibrate --from_vllm=a.json,b.json --model=llama-3.1-70b \
      --accelerator=a100-40gb --served_tp=8 --rows_out=rows.csv

`--from_vllm` maps each run to one decode step analytically (not yet through
the continuous-batching simulator; the assumptions are in the output).

Figures are labelled: ceilings and step times are measurements (device,
backend, dtype, timing method and load average in the JSON); predictions are
calibrated. A run that misses its targets says so (`status`, `warnings` and a
STATUS line), never only a number.
"""

from __future__ import annotations

import itertools

from absl import flags
from absl import logging

from experiments import _cli
from jaxroof.measure import fitting
from jaxroof.symbolic import calibrated as calibration
from jaxroof.measure import calibration_job
from jaxroof import errors
from jaxroof.report import calibration as calibration_report
from jaxroof import files
from jaxroof.measure import measurement
from jaxroof.measure import profiles
from jaxroof.measure import user_fit
from jaxroof.measure import user_measurements
from jaxroof.measure import vllm_results
from jaxroof.report import table
from jaxroof.specs import kv_sizing
from jaxroof.specs import parameters

# Calibration.
_BUDGET_S = flags.DEFINE_float(
    "budget_s", 600.0,
    "Wall-clock budget of the calibration, seconds (> 0; under 150 s a "
    "sparser grid is measured).")
_DTYPE = flags.DEFINE_enum("dtype", "float32", list(measurement.DTYPES), "Weights and K/V.")
_ROUNDS = flags.DEFINE_integer(
    "rounds", 5, "Passes over the points while the budget lasts (>= 1); each "
    "point keeps its lower-quartile round (the 2nd fastest of 5); points "
    "whose fastest rounds disagree get up to 3 more.", lower_bound=1)
_REPEATS = flags.DEFINE_integer(
    "repeats", 3, "Timed steps per point and round (>= 1).", lower_bound=1)
_HELDOUT = flags.DEFINE_float(
    "heldout_fraction", 0.25, "Unused: the held-out set is two whole toy "
    "models (kept so older command lines run); in (0, 0.5].")
_SEED = flags.DEFINE_integer("seed", 0, "Seeds the split, order and data.")
_FIT = flags.DEFINE_enum(
    "fit", "ops", list(calibration_job.FITS),
    "ops: efficiency factors from operation sweeps (linear layer, decode "
    "attention), fixed costs from the smallest steps; steps: every factor "
    "from whole decode steps of the fit models. Either way the error is "
    "measured on two held-out toy models the fit never saw.")
_COMPARE_PROFILE = flags.DEFINE_string(
    "compare_profile", None, "An earlier calibration's profile JSON: report "
    "whether this run agrees with it (factors within 10%, held-out medians "
    "within 3 points) under `repeatability`.")
_VALIDATE_MODEL = flags.DEFINE_string(
    "validate_model", "calibration", "With --validate: which of the "
    "profile's toy models to time (a fit or a held-out model).")
# Validation.
_VALIDATE = flags.DEFINE_bool(
    "validate", False, "Validate --profile at --batch_sizes x --contexts "
    "instead of calibrating.")
_PROFILE = flags.DEFINE_string(
    "profile", None, "Profile JSON to validate (with --validate).")
_BATCH_SIZES = flags.DEFINE_list(
    "batch_sizes", "2,24,64", "Validation batch sizes (sequences), whole "
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

# From users' measurements.
_FROM_CSV = flags.DEFINE_string(
    "from_csv", None, "Fit to measured step times in this CSV (or .jsonl): columns model, "
    "accelerator, phase, batch, time_s, context|prompt_tokens, optional weight_dtype, "
    "kv_dtype, tp, source.")
_FROM_VLLM = flags.DEFINE_list(
    "from_vllm", None, "Fit to vLLM `bench serve` result JSONs (or SGLang bench_serving "
    "JSONL), comma-separated; needs --model and --accelerator.")
_ACCELERATOR = flags.DEFINE_string(
    "accelerator", None, "Accelerator slug of the rows to fit (required when the file "
    "holds several devices, and with --from_vllm).")
_CARRY_OVER = flags.DEFINE_bool(
    "carry_over", False, "With --from_csv: fit on each model's rows, predict every other "
    "model on the same device, and report errors of calibrated vs bound.")
_MODEL = flags.DEFINE_string(
    "model", None, "With --from_vllm: the shipped model (or config path) the runs served.")
_SERVED_TP = flags.DEFINE_integer(
    "served_tp", 1, "With --from_vllm: tensor-parallel chips the runs were served on "
    "(their per-chip traffic is split as the CSV's tp column is).", lower_bound=1,
    upper_bound=1024)
_WEIGHT_DTYPE = flags.DEFINE_enum("weight_dtype", "bf16", list(parameters.WEIGHT_DTYPES),
                                  "With --from_vllm: the served weights' dtype.")
_KV_DTYPE = flags.DEFINE_enum("kv_dtype", "bf16", list(kv_sizing.KV_DTYPES),
                              "With --from_vllm: the K/V dtype.")
_ROWS_OUT = flags.DEFINE_string(
    "rows_out", None, "With --from_vllm: write the derived rows as the documented CSV.")
_DROP_SUSPICIOUS = flags.DEFINE_bool(
    "drop_suspicious", False, "With --from_csv/--from_vllm: leave out rows faster than "
    "their analytic bound or more than 20x slower (flagged by line either way).")
_FIT_STEPS = flags.DEFINE_integer("fit_steps", 3000, "Adam steps of the user fit, "
                                  "in [10, 100000].", lower_bound=10, upper_bound=100_000)

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


def _print_status(status: str, warnings: list[str]) -> None:
  for warning in warnings:
    print(f"WARNING: {warning}")
  if status != "ok":
    print(f"STATUS: {status}: this calibration did not reach its accuracy "
          "targets; do not use its figures as if it had.")
  else:
    print("STATUS: ok (every held-out model within its targets)")


def calibrate() -> None:
  dtype = _DTYPE.value
  measurement.require_dtype(dtype)
  calibration_job.check_budget("--budget_s", _BUDGET_S.value)
  previous = (profiles.load_profile(_COMPARE_PROFILE.value)
              if _COMPARE_PROFILE.value else None)
  job = calibration_job.run(
      _BUDGET_S.value, dtype=dtype, fit=_FIT.value, rounds=_ROUNDS.value,
      repeats=_REPEATS.value, seed=_SEED.value,
      progress=lambda line: logging.info("%s", line))
  prof = job.profile
  fit = prof.fit
  print(f"Calibration on {prof.device_kind} ({prof.platform}), backend "
        f"{prof.backend}, {prof.dtype}, jax {prof.jax_version}; fit "
        f"{fit['method']}: {len(job.operations)} operation and "
        f"{len(job.points)} step points in {job.elapsed_s:.0f} s.")
  print("Ceilings (measurement):")
  print(table.format_table(("ceiling", "value"),
                           calibration_report.ceiling_rows(job.ceilings)))
  print(f"Calibrated model: step = {calibration.readable_step()}")
  if prof.regime_factors:
    print(f"  plus the weight re-pack from B = 2: {calibration.repack_time()}")
  print(table.format_table(("factor", "value", "meaning"),
                           calibration_report.factor_rows(prof.factors,
                                                          prof.regime_factors)))
  _print_points(job.points)
  print("fit models: " + ", ".join(m["name"] for m in prof.model["fit_models"])
        + "; held out: "
        + ", ".join(m["name"] for m in prof.model["heldout_models"]))
  for name, errs in fit["heldout_by_model"].items():
    print(f"held-out {name}: median {errs['median_rel_error']:.1%}, max "
          f"{errs['max_rel_error']:.1%} ({errs['points']} points)")
  print(f"held-out relative error: median "
        f"{fit['heldout_median_rel_error']:.1%}, max "
        f"{fit['heldout_max_rel_error']:.1%} ({fit['heldout_points']} points "
        "on models the fit never saw); analytic bound's median on the same points: "
        f"{table.percent(fit.get('bound_heldout_median_rel_error'))}")
  load = fit["load"]
  if load["load_avg_1m_max"] is not None:
    print(f"load average during the timings: {load['load_avg_1m_min']:.1f}-"
          f"{load['load_avg_1m_max']:.1f} on {load['cpu_count']} cores")
  _print_status(job.status, job.warnings)
  data = job.to_json()
  if previous is not None:
    repeat = calibration_job.compare_profiles(previous, prof)
    data["repeatability"] = repeat
    print(f"repeatability against {_COMPARE_PROFILE.value}: largest factor "
          f"difference {repeat['max_factor_rel_diff']:.1%}, held-out median "
          f"difference {_points(repeat['heldout_median_diff_points'])}: "
          f"{'PASS' if repeat['pass'] else 'FAIL'} (factors within "
          f"{calibration_job.REPEAT_FACTOR_REL:.0%}, medians within "
          f"{calibration_job.REPEAT_MEDIAN_POINTS:g} points)")
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, data)
  calibration_report.write_results(job, json_out=None,
                                   profile_out=_PROFILE_OUT.value,
                                   plot_out=_PLOT_OUT.value)


def _points(value) -> str:
  return "n/a" if value is None else f"{value:.1f} points"


def validate() -> None:
  prof = profiles.load_profile(_PROFILE.value)
  points = list(itertools.product(_cli.int_list(_BATCH_SIZES),
                                  _cli.int_list(_CONTEXTS)))
  rows = calibration_job.validate(
      prof, points, model=_VALIDATE_MODEL.value, rounds=_ROUNDS.value,
      repeats=_REPEATS.value,
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
        "model": _VALIDATE_MODEL.value,
        "profile_heldout_median_rel_error": prof.heldout_median_rel_error,
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


def _print_user_rows(rows: list[dict], title: str) -> None:
  print(title)
  headers = ("line", "model", "phase", "batch", "context/prompt", "tp", "measured ms",
             "calibrated ms", "error", "bound ms", "bound error")
  cells = [[r["line"], r["model"], r["phase"], r["batch"],
            r["context"] or r["prompt_tokens"], r["tp"], f"{r['measured_s'] * 1e3:,.2f}",
            f"{r['calibrated_s'] * 1e3:,.2f}", f"{r['calibrated_rel_error']:.1%}",
            f"{r['bound_s'] * 1e3:,.2f}", f"{r['bound_rel_error']:.1%}"] for r in rows]
  print(table.format_table(headers, cells))



def _print_suspicious(flagged: list[dict]) -> None:
  if not flagged:
    return
  print("Suspicious rows (measurement / analytic bound; a step cannot beat the bound, "
        f"and more than {user_fit.SLOWER_LIMIT:g}x slower is doubtful):")
  cells = [[f["line"], f["model"], f["phase"], f["batch"], f["context"] or f["prompt_tokens"],
            f"{f['measured_s'] * 1e3:,.3f}", f"{f['bound_s'] * 1e3:,.3f}",
            f"{f['ratio_to_bound']:.3f}", "left out" if f["dropped"] else "kept"]
           for f in flagged]
  print(table.format_table(("line", "model", "phase", "batch", "context/prompt",
                            "measured ms", "bound ms", "ratio", "in the fit"), cells))


def fit_measurements(measurements: user_measurements.Measurements) -> None:
  """Fits a profile to measured rows; prints and writes the result."""
  prof, result = user_fit.calibrate(measurements, accelerator=_ACCELERATOR.value,
                                    drop_suspicious=_DROP_SUSPICIOUS.value,
                                    steps=_FIT_STEPS.value)
  print(f"Calibration of {result['accelerator']} from {result['rows_used']} of "
        f"{result['rows_read']} measured rows of {measurements.path} (engine: "
        f"{prof.backend}).")
  _print_suspicious(result["suspicious_rows"])
  print(table.factor_table(result))
  by = ("leave-one-model-out" if result["heldout_by"] == user_fit.HELDOUT_BY_MODEL
        else "k-fold over the rows of one model")
  _print_user_rows(result["heldout_rows"],
                   f"Held-out rows ({by}; calibrated prediction vs measurement, and the "
                   "analytic bound):")
  print(table.heldout_line(result) + f" (held out by {result['heldout_by']})")
  larger = result.get("extrapolation")
  if larger:
    print(f"larger steps (line(s) {', '.join(str(n) for n in larger['heldout_lines'])}, "
          "predicted by a fit on the smaller ones): calibrated median "
          f"{table.percent(larger['calibrated']['median_rel_error'])}, bound median "
          f"{table.percent(larger['bound']['median_rel_error'])}")
  for warning in result["warnings"]:
    print(f"WARNING: {warning}")
  kept = [f for f in result["suspicious_rows"] if not f["dropped"]]
  if kept:
    print("(--drop_suspicious leaves the suspicious rows out of the fit.)")
  if _PROFILE_OUT.value:
    profiles.save_profile(prof, _PROFILE_OUT.value)
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, result)


def carry_over(measurements: user_measurements.Measurements) -> None:
  """The carry-over study: fit on one model, predict another, per device."""
  result = user_fit.carry_over(measurements, steps=_FIT_STEPS.value)
  headers = ("device", "fit on", "predict", "relation", "free factors",
             "bound median", "calibrated median")
  cells = [[p["accelerator"], p["fit_model"], p["target"], ", ".join(p["relation"]),
            ", ".join(p["free"]), table.percent(p["bound"]["median_rel_error"]),
            table.percent(p["calibrated"]["median_rel_error"])
            + (" (worse than the bound)" if p["calibrated"]["median_rel_error"]
               > p["bound"]["median_rel_error"] else "")]
           for p in result["pairs"] if "skipped" not in p]
  if not result["pairs"]:
    raise errors.InputError(
        f"--carry_over needs rows of at least 2 models on one device; {measurements.path} "
        f"has {', '.join(sorted({r.model for r in measurements.rows}))} only: fit it "
        "without --carry_over (held out by rows).")
  print(f"Carry-over from {measurements.path} (engine: {measurements.engine}):")
  print(table.format_table(headers, cells))
  for p in result["pairs"]:
    if "skipped" in p:
      print(f"skipped {p['accelerator']} {p['fit_model']} -> {p['target']}: {p['skipped']}")
  print(f"all predicted rows: calibrated median {table.percent(result['median_rel_error'])}, "
        f"max {table.percent(result['max_rel_error'])}; bound median "
        f"{table.percent(result['bound_median_rel_error'])}; targets (median <= 10%, "
        f"calibrated >= 2x better than bound) met: {result['meets_targets']}")
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, result)


def from_vllm() -> None:
  if not _MODEL.value or not _ACCELERATOR.value:
    raise errors.InputError(
        "--from_vllm needs --model=NAME and --accelerator=SLUG: the result files name "
        "neither the shipped model nor the device.")
  measurements = vllm_results.read_results(
      _FROM_VLLM.value, model=_MODEL.value, accelerator=_ACCELERATOR.value,
      tp=_SERVED_TP.value, weight_dtype=_WEIGHT_DTYPE.value, kv_dtype=_KV_DTYPE.value)
  print(f"{vllm_results.ASSUMPTIONS[0]}.")
  if _ROWS_OUT.value:
    files.write_text(_ROWS_OUT.value, vllm_results.rows_to_csv(measurements.rows))
  fit_measurements(measurements)


def main(argv: list[str]) -> None:
  del argv  # Unused.
  if _FROM_CSV.value and _FROM_VLLM.value:
    raise errors.InputError("give one of --from_csv and --from_vllm, not both.")
  if _FROM_CSV.value:
    accelerator = None if _CARRY_OVER.value else _ACCELERATOR.value
    measurements = user_measurements.read_measurements(
        _FROM_CSV.value, accelerator=accelerator, several_devices=_CARRY_OVER.value)
    if _CARRY_OVER.value:
      carry_over(measurements)
    else:
      fit_measurements(measurements)
    return
  if _FROM_VLLM.value:
    from_vllm()
    return
  if _VALIDATE.value:
    validate()
  else:
    calibrate()


if __name__ == "__main__":
  _cli.run(main)
