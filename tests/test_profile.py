"""Profiles: JSON round trip, clear errors, and the calibrated sweep hook."""

import json

import pytest

from jaxroof.symbolic import calibrated as calibration
from jaxroof import errors
from jaxroof.measure import profiles
from jaxroof.symbolic.sweep import sweep
from jaxroof.symbolic.sweep import decode_sweep

IDEAL = {
    "eta_w": 1.0, "eta_kv": 1.0, "eta_f": 1.0, "t0_step": 1e-12, "t0_layer": 1e-12, "r_ovl": 1e3
}
# The lesson's example: 8B BF16 weights, 0.25 GB of K/V per sequence.
LESSON = dict(N=8e9, q=2.0, T=1.0, k=2.5e8, BW=2e12, F=6e14)


def make_profile(factors=None, ceilings=None, **kwargs) -> profiles.Profile:
  return profiles.Profile(device_kind="cpu", platform="cpu", backend="xla", dtype="float32",
                          jax_version="0.10.2", created="2026-01-01T00:00:00+00:00",
                          ceilings={} if ceilings is None else ceilings,
                          factors=dict(IDEAL if factors is None else factors),
                          fit={"heldout_median_rel_error": 0.05,
                               "heldout_max_rel_error": 0.2}, **kwargs)


def test_save_and_load_round_trip(tmp_path):
  prof = make_profile(ceilings={"bandwidth_Bps": 1e11, "flops_per_s": {"float32": 4e11}},
                      model={"points": 3})
  path = tmp_path / "p.json"
  profiles.save_profile(prof, path)
  data = json.loads(path.read_text())
  assert data["kind"] == "profile" and data["device_kind"] == "cpu"
  assert data["factors"] == IDEAL and "eta_kv" in data["expression"]
  loaded = profiles.load_profile(path)
  assert loaded.path == str(path)
  assert loaded == make_profile(ceilings=prof.ceilings, model={"points": 3}, path=str(path))


@pytest.mark.parametrize("content, needle", [
    (None, "does not exist"),
    ("{not json", "not valid JSON"),
    ("[1, 2]", "not a JSON object"),
    ('{"device_kind": "cpu"}', "lacks factors"),
])
def test_bad_files_are_one_line_input_errors(tmp_path, content, needle):
  path = tmp_path / "p.json"
  if content is not None:
    path.write_text(content)
  with pytest.raises(errors.InputError, match=needle) as info:
    profiles.load_profile(path)
  assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_bad_factors_are_named(tmp_path):
  path = tmp_path / "p.json"
  data = make_profile().to_json()
  data["factors"]["eta_kv"] = -1.0
  path.write_text(json.dumps(data))
  with pytest.raises(errors.InputError, match="eta_kv"):
    profiles.load_profile(path)
  del data["factors"]["eta_kv"]
  path.write_text(json.dumps(data))
  with pytest.raises(errors.InputError, match="expected eta_w"):
    profiles.load_profile(path)


def test_calibrated_model_sweep_has_decode_sweeps_structure():
  batches = [1, 8, 32, 64]
  bound = decode_sweep(batches, **LESSON)
  cal = sweep(profiles.step_model(make_profile()), batches, **LESSON)
  assert cal["kind"] == "calibrated" and bound["kind"] == "bound"
  assert set(bound) <= set(cal)
  assert set(bound["rows"][0]) <= set(cal["rows"][0])
  assert set(bound["summary"]) <= set(cal["summary"])
  assert cal["profile"]["heldout_median_rel_error"] == 0.05
  assert cal["ceilings"]["source"] == "given"
  # Ideal factors: the memory terms are the bound's, rates follow the step.
  for b_row, c_row in zip(bound["rows"], cal["rows"]):
    assert c_row["memory_s"] == pytest.approx(b_row["memory_s"])
    assert c_row["aggregate_tokens_per_s"] == pytest.approx(c_row["batch"] / c_row["step_s"])
  assert cal["summary"]["weight_kv_crossover_batch"] == pytest.approx(64)
  assert cal["summary"]["memory_limit_tokens_per_s"] == pytest.approx(8000)


def test_calibrated_model_sweep_scales_by_factors_and_adds_fixed_costs():
  factors = {
      "eta_w": 0.5, "eta_kv": 0.25, "eta_f": 0.5, "t0_step": 1e-3, "t0_layer": 1e-4, "r_ovl": 1e3
  }
  prof = make_profile(factors)
  [row] = sweep(profiles.step_model(prof), [32], **LESSON, layers=10)["rows"]
  weight_s, kv_s = 16e9 / 1e12, 32 * 2.5e8 / 5e11
  assert row["step_s"] == pytest.approx(1e-3 + 10 * 1e-4 + weight_s + kv_s)
  no_layers = sweep(profiles.step_model(prof), [32], **LESSON)
  assert no_layers["rows"][0]["fixed_s"] == pytest.approx(1e-3)
  assert any("per-layer" in n for n in no_layers["summary"]["notes"])


def test_calibrated_model_sweep_prefers_the_profiles_measured_ceilings():
  prof = make_profile(ceilings={"bandwidth_Bps": 1e12, "flops_per_s": {"float32": 1e14}})
  cal = sweep(profiles.step_model(prof), [1], **LESSON)
  assert cal["ceilings"] == {
      "source": "profile", "BW": 1e12, "F": 1e14, "given_BW": 2e12, "given_F": 6e14
  }
  given = sweep(profiles.step_model(prof, use_profile_ceilings=False), [1], **LESSON)
  assert given["ceilings"]["source"] == "given"
  assert cal["rows"][0]["step_s"] > given["rows"][0]["step_s"]


def test_calibrated_model_sweep_checks_input():
  with pytest.raises(errors.InputError, match="batch_sizes"):
    sweep(profiles.step_model(make_profile()), [0], **LESSON)
  with pytest.raises(errors.InputError, match="layers"):
    sweep(profiles.step_model(make_profile()), [1], **LESSON, layers=0)
  assert calibration.FACTOR_NAMES == tuple(IDEAL)


@pytest.mark.parametrize("change, needle", [
    ({"ceilings": [1]}, "ceilings is not a JSON object"),
    ({"fit": "x"}, "fit is not a JSON object"),
    ({"ceilings": {"bandwidth_Bps": float("nan")}}, "bandwidth_Bps"),
    ({"ceilings": {"bandwidth_Bps": -5.0}}, "bandwidth_Bps"),
    ({"ceilings": {"flops_per_s": {"float32": "fast"}}}, "flops_per_s.float32"),
    ({"device_kind": ["cpu"]}, "device_kind"),
    ({"model": {"configs": {"calibration": {"bogus": 1}}}}, "unknown fields"),
])
def test_malformed_profiles_are_refused_naming_the_field(tmp_path, change, needle):
  data = {**make_profile().to_json(), **change}
  path = tmp_path / "p.json"
  path.write_text(json.dumps(data))
  with pytest.raises(errors.InputError, match=needle):
    profiles.load_profile(path)


def test_an_efficiency_above_one_is_flagged():
  prof = make_profile({**IDEAL, "eta_f": 1.32})
  model = profiles.step_model(prof)
  assert any("eta_f=1.32 is above 1" in note for note in model.notes)
