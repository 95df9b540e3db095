"""Calibrates the step model's factors, from whichever measurements you have.

  --source=ops (default)  this device: the toy decode step's operations (linear layer over
                          M = 1 ... 2048, decode attention), fixed costs from its smallest
                          steps; error on two held-out toy models, with a STATUS line
  --source=toy            this device: every factor from the toy's whole decode steps
  --source=csv            your step times (--from_csv), or vLLM results mapped to rows
                          analytically (--from_vllm); `jaxroof.measure.user_measurements`
  --source=layouts        rows on tp/pp/ep layouts, with eta_comm (--from_csv)
  --source=vllm           vLLM `bench serve` runs replayed through the simulator
  --source=published      an engine's profile refitted from the shipped published points
                          (--engine=trtllm|vllm|sglang|gpt-fast), its error by source held out

  python -m experiments.calibrate --budget_s=120 --profile_out=results/profile_cpu.json \
      --json_out=results/calibration_cpu.json --plot_out=results/calibration_cpu.png
  python -m experiments.calibrate --validate=results/profile_cpu.json --batch_sizes=3,20,48
  python -m experiments.calibrate --from_csv=tests/data/trtllm_0.9.0_steps.csv \
      --accelerator=h200 [--carry_over]
  python -m experiments.calibrate --source=layouts --from_csv=LAYOUT_ROWS.csv [--carry_over]
  python -m experiments.calibrate --source=vllm --from_vllm=A.json,B.json \
      --model=llama-3.1-70b --accelerator=a100-40gb --server=tp=8 [--heldout_vllm=C.json] \
      [--hold=eta_kv=0.3,t0_request=3e-3] [--search=t0_seq]
  python -m experiments.calibrate --source=published --engine=trtllm --json_out=/tmp/t.json
  python -m experiments.calibrate --engine_terms=FIT.json --heldout_vllm=C.json,D.json \
      --model=MODEL_DIR --accelerator_file=OTHER/accelerator.json   # no fit: FIT's terms

`calibrate_engine` and `calibrate_layouts` run this with --source=vllm and layouts. Every
number is labelled: measurement, calibrated prediction or bound.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from absl import logging

from experiments import _calibrate_flags as F
from experiments import _cli
from jaxroof import errors
from jaxroof import files
from jaxroof.calibrate import engine_fit
from jaxroof.calibrate import fitting
from jaxroof.calibrate import layout_fit
from jaxroof.calibrate import published_profile
from jaxroof.calibrate import repeatability
from jaxroof.calibrate import toy_fit
from jaxroof.calibrate import toy_job
from jaxroof.calibrate import user_fit
from jaxroof.measure import measurement
from jaxroof.measure import profiles
from jaxroof.measure import user_measurements
from jaxroof.measure import vllm_results
from jaxroof.report import calibration as calibration_report
from jaxroof.report import calibration_tables as tables

_cli.key_flags("source", "from_csv", "from_vllm", "model", "accelerator", "budget_s", "profile_out",
               "json_out")


def _progress(line: str) -> None:
  logging.info("%s", line)


def _write(result: dict, prof: profiles.Profile | None = None) -> None:
  if prof is not None and F.PROFILE_OUT.value:
    profiles.save_profile(prof, F.PROFILE_OUT.value)
  if F.JSON_OUT.value:
    files.write_json(F.JSON_OUT.value, result)


def toy(fit: str) -> None:
  """Times the toy here, fits, reports the held-out error (and the repeatability)."""
  measurement.require_dtype(F.DTYPE.value)
  toy_job.check_budget("--budget_s", F.BUDGET_S.value)
  previous = profiles.load_profile(F.COMPARE_PROFILE.value) if F.COMPARE_PROFILE.value else None
  job = toy_job.run(F.BUDGET_S.value, dtype=F.DTYPE.value, fit=fit, rounds=F.ROUNDS.value,
                    repeats=F.REPEATS.value, seed=F.SEED.value, progress=_progress)
  print(tables.toy_text(job))
  data = job.to_json()
  if previous is not None:
    data["repeatability"] = repeatability.compare_profiles(previous, job.profile)
    print(tables.repeatability_line(data["repeatability"], F.COMPARE_PROFILE.value))
  _write(data, job.profile)
  calibration_report.write_results(job, json_out=None, profile_out=None, plot_out=F.PLOT_OUT.value)


def validate() -> None:
  """Times the toy afresh at the chosen points against a profile's prediction."""
  prof = profiles.load_profile(F.VALIDATE.value)
  points = list(itertools.product(_cli.int_list(F.BATCH_SIZES), _cli.int_list(F.CONTEXTS)))
  rows = toy_job.validate(prof, points, rounds=F.ROUNDS.value, repeats=F.REPEATS.value,
                          progress=_progress)
  errs = fitting.error_summary([r["rel_error"] for r in rows])
  print(tables.validation_text(F.VALIDATE.value, prof, rows, errs))
  _write(toy_job.validation_result(F.VALIDATE.value, prof, rows, errs))
  if F.PLOT_OUT.value:
    calibration_report.plot(rows, F.PLOT_OUT.value,
                            calibration_report.title(prof) + " (validation)")


def _rows(fit: Callable, carry_over: Callable, fit_text: Callable, carry_text: Callable,
          measurements: user_measurements.Measurements | None = None) -> None:
  """The skeleton every fit to rows shares: read, then fit or study the carry-over."""
  if measurements is None:
    if not F.FROM_CSV.value:
      raise errors.InputError("--from_csv is required: the measurements CSV.")
    measurements = user_measurements.read_measurements(
        F.FROM_CSV.value, accelerator=None if F.CARRY_OVER.value else F.ACCELERATOR.value,
        several_devices=F.CARRY_OVER.value)
  if F.CARRY_OVER.value:
    result = carry_over(measurements, steps=F.FIT_STEPS.value)
    print(carry_text(result, measurements.path, measurements.engine))
    _write(result)
    return
  prof, result = fit(measurements, accelerator=F.ACCELERATOR.value, steps=F.FIT_STEPS.value)
  print(fit_text(result, measurements))
  _write(result, prof)


def csv() -> None:
  """Users' rows (or vLLM results mapped to rows), fitted with `user_fit`."""
  measurements = None
  if F.FROM_CSV.value and F.FROM_VLLM.value:
    raise errors.InputError("give one of --from_csv and --from_vllm, not both.")
  if F.FROM_VLLM.value:
    if not F.MODEL.value or not F.ACCELERATOR.value:
      raise errors.InputError("--from_vllm needs --model=NAME and --accelerator=SLUG: the result "
                              "files name neither the shipped model nor the device.")
    measurements = vllm_results.read_results(F.FROM_VLLM.value, model=F.MODEL.value,
                                             accelerator=F.ACCELERATOR.value, tp=F.server()["tp"],
                                             weight_dtype=F.WEIGHT_DTYPE.value,
                                             kv_dtype=F.server()["kv_dtype"])
    print(f"{vllm_results.ASSUMPTIONS[0]}.")

  def fit(rows, **kw):
    return user_fit.calibrate(rows, drop_suspicious=F.DROP_SUSPICIOUS.value, **kw)

  def fit_text(result, rows):
    return tables.user_fit_text(result, rows.path, rows.engine, "--drop_suspicious")

  _rows(fit, user_fit.carry_over, fit_text, tables.carry_over_text, measurements)


def layouts() -> None:
  """Rows on parallel layouts, with eta_comm (`layout_fit`)."""
  _rows(layout_fit.calibrate_layouts, layout_fit.layout_carry_over,
        lambda result, rows: tables.layout_fit_text(result, rows.path),
        tables.layout_carry_over_text)


def vllm() -> None:
  """vLLM runs replayed through the simulator (`engine_fit`): fitted, or predicted with
  --engine_terms and nothing fitted."""
  F.check_vllm()
  held = F.held()
  if not F.FROM_VLLM.value:  # A prediction: an earlier fit's terms, nothing fitted.
    result = engine_fit.predict_runs(F.HELDOUT_VLLM.value, F.serving_setup(held), held,
                                     heldout_model=F.HELDOUT_MODEL.value or None,
                                     factors_from=F.ENGINE_TERMS.value)
    print(tables.engine_prediction_text(result))
    _write(result)
    return
  result = engine_fit.calibrate_engine(F.FROM_VLLM.value, F.serving_setup(held),
                                       heldout_paths=F.HELDOUT_VLLM.value or (),
                                       heldout_model=F.HELDOUT_MODEL.value or None,
                                       fit_model=F.FIT_MODEL.value or None,
                                       **F.search()[1])
  print(tables.engine_fit_text(result))
  _write(result, engine_fit.engine_profile(result))


def published() -> None:
  """An engine's profile refitted from the shipped published points (`published_profile`)."""
  profile = published_profile.refit(F.published_engine())
  print(tables.published_fit_text(profile))
  if F.PROFILE_OUT.value:
    files.write_json(F.PROFILE_OUT.value, profile)
  _write({**profile, "factors": profile["terms"]})  # `factors`: the result's fitted terms.


def main(argv: list[str]) -> None:
  del argv  # Unused.
  chosen = F.source()
  F.check_used(chosen)
  if chosen in ("ops", "toy"):
    validate() if F.VALIDATE.value else toy("steps" if chosen == "toy" else "ops")
  else:
    {"csv": csv, "layouts": layouts, "vllm": vllm, "published": published}[chosen]()


if __name__ == "__main__":
  _cli.run(main)
