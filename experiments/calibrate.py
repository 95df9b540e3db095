"""Calibrates the step model's factors, from whichever measurements you have.

  --source=ops (default)  this device: the toy decode step's operations (linear layer over
                          M = 1 ... 2048, decode attention), fixed costs from its smallest
                          steps; error on two held-out toy models, with a STATUS line
  --source=toy            this device: every factor from the toy's whole decode steps
  --source=csv            your step times (--from_csv), or vLLM results mapped to rows
                          analytically (--from_vllm); `jaxroof.measure.user_measurements`
  --source=layouts        rows on tp/pp/ep layouts, with eta_comm (--from_csv)
  --source=vllm           vLLM `bench serve` runs replayed through the simulator

  python -m experiments.calibrate --budget_s=120 --profile_out=results/profile_cpu.json \
      --json_out=results/calibration_cpu.json --plot_out=results/calibration_cpu.png
  python -m experiments.calibrate --budget_s=120 --compare_profile=results/profile_cpu.json
  python -m experiments.calibrate --validate --profile=results/profile_cpu.json \
      --batch_sizes=3,20,48 --contexts=300,1500
  python -m experiments.calibrate --from_csv=tests/data/trtllm_0.9.0_steps.csv \
      --accelerator=h200 [--carry_over]
  python -m experiments.calibrate --source=layouts \
      --from_csv=tests/data/gptfast_a100_tp_steps.csv --accelerator=a100-80gb [--carry_over]
  python -m experiments.calibrate --source=vllm --from_vllm=A.json,B.json \
      --model=llama-3.1-70b --accelerator=a100-40gb --served_tp=8 [--heldout_vllm=C.json]
  python -m experiments.calibrate --engine_factors=FIT.json --heldout_vllm=C.json,D.json \
      --model=MODEL_DIR --accelerator_file=OTHER/accelerator.json   # no fit: FIT's factors

`calibrate_engine` (--source=vllm) and `calibrate_layouts` (--source=layouts) run this with
the same flags. Every number is labelled: measurement, calibrated prediction or bound; a
toy calibration that misses its targets says so (`status`, warnings, STATUS line).
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
    data["repeatability"] = toy_fit.compare_profiles(previous, job.profile)
    print(tables.repeatability_line(data["repeatability"], F.COMPARE_PROFILE.value))
  _write(data, job.profile)
  calibration_report.write_results(job, json_out=None, profile_out=None, plot_out=F.PLOT_OUT.value)


def validate() -> None:
  """Times the toy afresh at the chosen points against a profile's prediction."""
  prof = profiles.load_profile(F.PROFILE.value)
  points = list(itertools.product(_cli.int_list(F.BATCH_SIZES), _cli.int_list(F.CONTEXTS)))
  rows = toy_job.validate(prof, points, model=F.VALIDATE_MODEL.value, rounds=F.ROUNDS.value,
                          repeats=F.REPEATS.value, progress=_progress)
  errs = fitting.error_summary([r["rel_error"] for r in rows])
  print(tables.validation_text(F.PROFILE.value, prof, rows, errs))
  _write({
      "kind": "validation",
      "what": "toy decode step measured afresh vs the profile's calibrated prediction",
      "profile": F.PROFILE.value, "model": F.VALIDATE_MODEL.value,
      "profile_heldout_median_rel_error": prof.heldout_median_rel_error, "device_kind":
          prof.device_kind, "backend": prof.backend, "dtype": prof.dtype, "method": prof.method,
      "median_rel_error": errs["median_rel_error"], "max_rel_error": errs["max_rel_error"],
      "validation": rows, "units": {"predicted_s": "s", "measured_s": "s", "rel_error": "1"}
  })
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
                                             accelerator=F.ACCELERATOR.value, tp=F.SERVED_TP.value,
                                             weight_dtype=F.WEIGHT_DTYPE.value,
                                             kv_dtype=F.KV_DTYPE.value)
    print(f"{vllm_results.ASSUMPTIONS[0]}.")
    if F.ROWS_OUT.value:
      files.write_text(F.ROWS_OUT.value, vllm_results.rows_to_csv(measurements.rows))

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


def _setup() -> engine_fit.ServingSetup:
  """The vLLM runs' model, device and server, and the engine terms held, from the flags."""
  if bool(F.ACCELERATOR.value) == bool(F.ACCELERATOR_FILE.value):
    raise errors.InputError("give one of --accelerator (a shipped name) and "
                            "--accelerator_file (your device's JSON).")
  if F.REQUEST_COST.value and F.ENGINE_REQUEST_MS.value is not None:
    raise errors.InputError(f"--engine_request_ms={F.ENGINE_REQUEST_MS.value} with "
                            "--request_cost: hold the per-request cost as measured or fit it, "
                            "not both.")
  if F.WAKE_COST.value and F.ENGINE_WAKE_MS.value is not None:
    raise errors.InputError(f"--engine_wake_ms={F.ENGINE_WAKE_MS.value} with --wake_cost: "
                            "hold the wake as measured or fit it, not both.")
  return engine_fit.ServingSetup(
      model=F.MODEL.value, accelerator=F.ACCELERATOR.value or "", tp=F.SERVED_TP.value,
      weight_dtype=F.WEIGHT_DTYPE.value, kv_dtype=F.KV_DTYPE.value, scheduler=F.SCHEDULER.value,
      max_running=F.MAX_RUNNING.value, token_budget=F.TOKEN_BUDGET.value, seed=F.SEED.value,
      accelerator_file=F.ACCELERATOR_FILE.value or None, request_cost=F.REQUEST_COST.value,
      request_seconds=(None if F.ENGINE_REQUEST_MS.value is None else F.ENGINE_REQUEST_MS.value /
                       1e3), sequence_cost=F.SEQUENCE_COST.value, layer_cost=F.LAYER_COST.value,
      wake_cost=F.WAKE_COST.value,
      wake_seconds=(None if F.ENGINE_WAKE_MS.value is None else F.ENGINE_WAKE_MS.value / 1e3),
      overlap=errors.require_non_negative("--engine_overlap", F.ENGINE_OVERLAP.value),
      m_pass=F.ENGINE_M_PASS.value, kv_efficiency=F.ENGINE_ETA_KV.value,
      weight_efficiency=F.ENGINE_ETA_W.value, attention_efficiency=F.ENGINE_ETA_ATTN.value,
      cache_bytes=F.ENGINE_CACHE_MB.value * 1e6, cache_rate=F.ENGINE_CACHE_GBPS.value * 1e9,
      cache_lru=F.ENGINE_CACHE_LRU.value if F.ENGINE_CACHE_MB.value > 0 else 0.0,
      kernel_build=F.ENGINE_BUILD_US.value / 1e6, elementwise_seconds=F.ENGINE_ACT_NS.value / 1e9,
      cold_share=F.ENGINE_COLD_SHARE.value)


def predict_vllm() -> None:
  """vLLM runs predicted with an earlier calibration's factors, nothing fitted."""
  if F.FROM_VLLM.value:
    raise errors.InputError(f"--from_vllm={','.join(F.FROM_VLLM.value)[:60]} with "
                            "--engine_factors: a prediction fits nothing; give the runs to "
                            "predict as --heldout_vllm.")
  if F.PROFILE_OUT.value:
    raise errors.InputError(f"--profile_out={F.PROFILE_OUT.value!r} with --engine_factors: a "
                            "prediction fits no factors; the profile is the earlier fit's.")
  for flag in (F.FIT_MODEL, F.REQUEST_COST, F.SEQUENCE_COST, F.LAYER_COST, F.WAKE_COST,
               F.MAX_SIMULATIONS, F.FIT_STARTS):
    if flag.present:
      raise errors.InputError(f"--{flag.name} with --engine_factors: it shapes a fit, and a "
                              "prediction fits nothing (the factors are the earlier fit's).")
  if not F.HELDOUT_VLLM.value or not F.MODEL.value:
    raise errors.InputError("--engine_factors needs --heldout_vllm and --model: the runs to "
                            "predict and the model they served.")
  setup = _setup()
  factors = engine_fit.read_factors(F.ENGINE_FACTORS.value)
  efficiencies = {
      "eta_w": F.ENGINE_ETA_W.value, "eta_kv": F.ENGINE_ETA_KV.value,
      "eta_attn": F.ENGINE_ETA_ATTN.value
  }
  replaced = {
      **efficiencies, "r_ovl": setup.overlap if F.ENGINE_OVERLAP.present else None,
      "m_pass": setup.m_pass if F.ENGINE_M_PASS.present else None,
      "c_llc": setup.cache_bytes if F.ENGINE_CACHE_MB.present else None,
      "bw_llc": setup.cache_rate if F.ENGINE_CACHE_GBPS.present else None,
      "s_lru": F.ENGINE_CACHE_LRU.value if F.ENGINE_CACHE_LRU.present else None,
      "t_build": setup.kernel_build if F.ENGINE_BUILD_US.present else None,
      "t_act": setup.elementwise_seconds if F.ENGINE_ACT_NS.present else None,
      "s_cold": setup.cold_share if F.ENGINE_COLD_SHARE.present else None,
      "t0_request": setup.request_seconds, "t_wake": setup.wake_seconds
  }
  factors.update({n: float(v) for n, v in replaced.items() if v is not None})
  result = engine_fit.predict_runs(F.HELDOUT_VLLM.value, setup, factors,
                                   heldout_model=F.HELDOUT_MODEL.value or None,
                                   factors_from=F.ENGINE_FACTORS.value)
  print(tables.engine_prediction_text(result))
  _write(result)


def vllm() -> None:
  """vLLM runs replayed through the simulator (`engine_fit`)."""
  if F.ENGINE_FACTORS.value:
    predict_vllm()
    return
  if not F.FROM_VLLM.value or not F.MODEL.value:
    raise errors.InputError("--from_vllm and --model are required: the result files and "
                            "the model they served.")
  if F.HELDOUT_MODEL.value and not F.HELDOUT_VLLM.value:
    raise errors.InputError(f"--heldout_model={','.join(F.HELDOUT_MODEL.value)[:60]} without "
                            "--heldout_vllm: give the held-out runs it belongs to.")
  setup = _setup()
  result = engine_fit.calibrate_engine(F.FROM_VLLM.value, setup,
                                       heldout_paths=F.HELDOUT_VLLM.value or (),
                                       heldout_model=F.HELDOUT_MODEL.value or None,
                                       fit_model=F.FIT_MODEL.value or None,
                                       max_simulations=F.MAX_SIMULATIONS.value,
                                       starts=F.FIT_STARTS.value)
  print(tables.engine_fit_text(result))
  _write(result, engine_fit.engine_profile(result))


def main(argv: list[str]) -> None:
  del argv  # Unused.
  chosen = F.source()
  F.check_used(chosen)
  if chosen in ("ops", "toy"):
    validate() if F.VALIDATE.value else toy("ops" if chosen == "ops" else "steps")
  else:
    {"csv": csv, "layouts": layouts, "vllm": vllm}[chosen]()


if __name__ == "__main__":
  _cli.run(main)
