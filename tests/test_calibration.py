"""The calibrated model, its optax fit and the toy calibration job."""

import dataclasses

import numpy as np
import pytest
import sympy as sp

from jaxroof import errors
from jaxroof.calibrate import fitting
from jaxroof.symbolic import calibrated as calibration
from jaxroof.calibrate import toy_fit
from jaxroof.calibrate import toy_job
from jaxroof.measure import calibration_models
from jaxroof.measure import ceilings as ceilings_lib
from jaxroof.measure import profiles
from jaxroof.measure import step_sweeps
from jaxroof.measure import toy_steps
from jaxroof.report import calibration as calibration_report
from jaxroof.symbolic import formulas
from jaxroof.symbolic import solved
from jaxroof.symbolic.symbols import B, BW, F, N, N_act, T, k

TRUE = {
    "eta_w": 0.6, "eta_kv": 0.08, "eta_f": 0.35, "t0_step": 4e-4, "t0_layer": 1.5e-4, "r_ovl": 0.5
}


def synthetic_inputs():
  """A calibration-like design: three models over a batch x context grid."""
  models = {
      "main": (30.4e6, 4, 4096.0, 7.3e6), "shallow": (17.3e6, 2, 2048.0, 7.3e6),
      "wide": (59.8e6, 4, 4096.0, 7.3e6)
  }
  rows = []
  for n, layers, kv, _ in models.values():
    for b in (1, 2, 4, 8, 16, 32, 64, 128, 256):
      for c in (128, 512, 2048):
        rows.append((b, c + 1, n, layers, kv))
  data = np.asarray(rows, dtype=np.float64)
  ones = np.ones(len(data))
  return {
      "B": data[:, 0], "T": data[:, 1], "N": data[:, 2], "N_act": data[:, 2], "L": data[:, 3],
      "k": data[:, 4], "q": 4 * ones, "BW": 1e11 * ones, "F": 4.2e11 * ones
  }


def test_calibrated_step_is_built_from_the_floors_terms():
  ideal = {
      calibration.eta_w: 1, calibration.eta_kv: 1, calibration.eta_f: 1, calibration.t0_step: 0,
      calibration.t0_layer: 0
  }
  step = calibration.calibrated_step().subs(ideal)
  weight = formulas.memory_time(formulas.weight_traffic())
  compute = formulas.compute_time(B, N_act)
  kv = formulas.memory_time(formulas.retained_kv_bytes())
  # No overlap (r_ovl -> 0): the linear layers' two times add up.
  no_overlap = step.subs(calibration.r_ovl, 0).subs({compute: sp.Symbol("c", positive=True)})
  assert sp.simplify(
      no_overlap.subs(sp.Symbol("c", positive=True), compute) - (weight + compute + kv)) == 0
  assert sp.diff(calibration.calibrated_step(),
                 calibration.t0_layer) == (sp.Symbol("L", positive=True))


def test_full_overlap_is_the_roofline():
  inputs = {
      "B": np.array([1.0, 64.0, 4096.0]), "T": 1000.0, "N": 8e9, "q": 2.0, "k": 1e5, "BW": 2e12,
      "F": 6e14, "N_act": 8e9, "L": 32.0
  }
  factors = {
      "eta_w": 1.0, "eta_kv": 1.0, "eta_f": 1.0, "t0_step": 1e-30, "t0_layer": 1e-30, "r_ovl": 1e4
  }
  out = calibration.decode_model("numpy")(**inputs, **factors)
  weight, compute = 8e9 * 2 / 2e12, 2 * 8e9 * inputs["B"] / 6e14
  np.testing.assert_allclose(out["linear_s"], np.maximum(weight, compute), rtol=1e-3)
  np.testing.assert_allclose(out["step_s"], out["linear_s"] + inputs["B"] * 1000 * 1e5 / 2e12,
                             rtol=1e-9)


def test_solved_summary_matches_the_bound_when_ideal():
  ideal = {calibration.eta_w: 1, calibration.eta_kv: 1, calibration.eta_f: 1}
  kv_cross, memory_limit, compute_cross, rate_limit = (
      e.subs(ideal) for e in calibration._summary_exprs())
  assert sp.simplify(kv_cross - solved.weight_kv_crossover_batch()) == 0
  assert sp.simplify(memory_limit - solved.memory_limit_rate()) == 0
  dense = {N_act: N}  # Whether solved.py tells N_act from N or not.
  assert sp.simplify(compute_cross.subs(dense) - solved.compute_crossover_batch().subs(dense)) == 0
  assert sp.simplify(rate_limit - 1 / (2 * N_act / F + T * k / BW)) == 0


def test_fit_recovers_known_factors_from_exact_data():
  inputs = synthetic_inputs()
  measured = fitting.predict(inputs, TRUE)
  fit = fitting.fit_factors(inputs, measured, prior_weight=0.0)
  for name, value in TRUE.items():
    assert fit.factors[name] == pytest.approx(value, rel=0.02), name


def test_fit_recovers_factors_from_noisy_data_and_predicts_heldout():
  inputs = synthetic_inputs()
  rng = np.random.default_rng(0)
  measured = fitting.predict(inputs, TRUE) * np.exp(rng.normal(0.0, 0.03, inputs["B"].size))
  held_out = np.arange(inputs["B"].size) % 4 == 0  # Every fourth point.
  train = {n: v[~held_out] for n, v in inputs.items()}
  fit = fitting.fit_factors(train, measured[~held_out])
  for name in ("eta_w", "eta_kv", "eta_f"):
    assert fit.factors[name] == pytest.approx(TRUE[name], rel=0.15), name
  fixed = TRUE["t0_step"] + 4 * TRUE["t0_layer"]
  assert fit.factors["t0_step"] + 4 * fit.factors["t0_layer"] == pytest.approx(fixed, rel=0.5)
  test = {n: v[held_out] for n, v in inputs.items()}
  errors = fitting.relative_errors(fitting.predict(test, fit.factors), measured[held_out])
  summary = fitting.error_summary(errors)
  assert summary["median_rel_error"] < 0.05 and summary["max_rel_error"] < 0.15


def test_a_wrong_model_shows_in_the_heldout_error():
  inputs = synthetic_inputs()
  # Data with a cost the model lacks (quadratic in batch): the fit cannot
  # absorb it, and the errors say so.
  measured = fitting.predict(inputs, TRUE) + 2e-6 * inputs["B"]**2
  fit = fitting.fit_factors(inputs, measured)
  errors = fitting.relative_errors(fitting.predict(inputs, fit.factors), measured)
  assert fitting.error_summary(errors)["max_rel_error"] > 0.1


def test_error_summary():
  rel = fitting.relative_errors(np.array([1.1, 0.8, 1.0]), np.array([1.0, 1.0, 1.0]))
  np.testing.assert_allclose(rel, [0.1, 0.2, 0.0])
  assert fitting.error_summary(rel) == {
      "median_rel_error": pytest.approx(0.1), "max_rel_error": pytest.approx(0.2), "points": 3
  }
  assert fitting.error_summary([])["median_rel_error"] is None


TINY = dataclasses.replace(calibration_models.CALIBRATION, vocab_size=64, num_blocks=2, num_heads=4,
                           num_kv_heads=2, head_dim=8, width=32, mlp_dim=64)


@pytest.mark.slow  # Compiles a dozen decode steps: ~20-40 s on 2 cores.
def test_job_measures_fits_and_labels_a_profile(tmp_path, monkeypatch):
  calls = []
  sweep = step_sweeps.decode_step_sweep

  def recording(benches, points, **kw):
    calls.append(sorted({p.model for p in points}))
    return sweep(benches, points, **kw)

  monkeypatch.setattr(step_sweeps, "decode_step_sweep", recording)
  models = {"tiny": TINY, "tinier": dataclasses.replace(TINY, num_blocks=1)}
  held = {"held": dataclasses.replace(TINY, num_blocks=3, num_kv_heads=4, num_heads=8)}
  points = [step_sweeps.StepPoint(m, b, 8) for m in models for b in (1, 2)]
  heldout = [step_sweeps.StepPoint("held", b, c) for b in (1, 16) for c in (8, 32)]
  ceilings = ceilings_lib.measure_ceilings(("float32",), bandwidth_bytes=2**20, matmul_size=64,
                                           repeats=2, rounds=1)
  job = toy_job.run(60.0, points=points, heldout=heldout, models=models, heldout_models=held,
                    ceilings=ceilings, rounds=1, repeats=2, linear_rows=(1, 16),
                    attention_grid=((1, 8), (4, 32)))
  prof = job.profile
  assert prof.device_kind == ceilings.device_kind and prof.backend == "xla"
  assert set(prof.factors) == set(calibration.FACTOR_NAMES)
  assert len(job.rows("heldout")) == 4 and 2 <= len(job.rows("train")) <= 4
  assert {r["model"] for r in job.rows("heldout")} == {"held"}
  # Fit and held-out steps are timed in the same rounds (one sweep over all models).
  assert calls == [["held", "tinier", "tiny"]] and prof.model["interleaved"]
  # The bound's error on the same held-out steps is recorded beside the profile's.
  bound = prof.fit["bound_heldout_median_rel_error"]
  assert bound is not None and bound >= 0 and prof.heldout_by == "model"
  assert prof.fit["heldout_max_rel_error"] >= prof.fit["heldout_median_rel_error"] >= 0
  assert prof.fit["status"] in ("ok", "inaccurate", "incomplete")
  data = job.to_json()
  assert {
      "heldout_median_rel_error", "heldout_max_rel_error", "factors", "training_points",
      "heldout_points", "fit_models", "heldout_models", "status", "warnings", "load"
  } <= set(data)
  assert [m["name"] for m in data["heldout_models"]] == ["held"]
  calibration_report.write_results(job, json_out=str(tmp_path / "c.json"),
                                   profile_out=str(tmp_path / "p.json"),
                                   plot_out=str(tmp_path / "c.png"))
  assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
  # Validation rebuilds the profile's model and times it afresh.
  loaded = profiles.load_profile(tmp_path / "p.json")
  rows = toy_job.validate(loaded, [(2, 16)], model="held", rounds=1, repeats=2)
  assert rows[0]["batch"] == 2 and rows[0]["predicted_s"] > 0
  assert rows[0]["measured_s"] > 0 and rows[0]["set"] == "validation"
  text = calibration_report.section_markdown(job)
  assert "held-out" in text and "calibration.png" in text
  assert "the calibrate experiment with a longer budget" in text  # No command given.
  assert "A longer run (`go longer`)" in calibration_report.section_markdown(job, "go longer")
  assert "measurement" in text and "calibrated" in text and "`held`" in text


def test_fit_refuses_a_run_without_heldout_steps():
  ceilings = ceilings_lib.Ceilings("cpu", 1e10, 1e10, 1e10, {"float32": 1e11})
  measured = toy_fit.Measured(ceilings=ceilings, operations=[], fit_records=[], heldout_records=[],
                              heldout_planned=4)
  with pytest.raises(errors.InputError, match="budget_s") as caught:
    toy_fit.fit_steps(measured, fit="steps", dtype="float32", backend="xla", regime=False,
                      models={}, heldout_models={}, budget_s=60.0,
                      plan={"rounds": 1, "warmup": 1, "repeats": 1, "interleaved": True})
  assert caught.value.field == "budget_s"


def test_default_points_cover_the_issue_grid_within_memory():
  points = toy_steps.default_points(600)
  main = [p for p in points if p.model == "calibration"]
  assert {p.batch for p in main} == {1, 2, 4, 8, 16, 32, 64, 128, 256}
  assert {128, 256, 512, 1024, 2048, 4096} <= {p.context for p in main}
  assert max(
      step_sweeps.kv_bytes(calibration_models.MODELS[p.model], "float32", p.batch, p.context)
      for p in points) <= toy_steps.MAX_KV_BYTES
  assert len(toy_steps.default_points(60)) < len(points)
  held = toy_steps.heldout_points(120, calibration_models.HELDOUT_MODELS)
  assert {p.model for p in held} == set(calibration_models.HELDOUT_MODELS)
  assert {1, 256} <= {p.batch for p in held}
  assert {128, 4096} <= {p.context for p in held}
