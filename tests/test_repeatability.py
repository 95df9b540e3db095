"""Whether two toy calibrations agree (`jaxroof.calibrate.repeatability`), and what in
their timings moved a factor. Profiles and timings here are synthetic, made from known
factors."""

import dataclasses
import math

import pytest

from jaxroof.calibrate import repeatability
from tests._calibration_helpers import BW, TRUE, fake_profile


def test_repeatability_passes_within_ten_percent_and_three_points():
  same = repeatability.compare_profiles(fake_profile(TRUE, 0.06), fake_profile(TRUE, 0.06))
  assert same["pass"] and same["max_factor_rel_diff"] == 0
  close = {**TRUE, "eta_w": TRUE["eta_w"] * 1.09}
  result = repeatability.compare_profiles(fake_profile(TRUE, 0.06), fake_profile(close, 0.085))
  assert result["pass"]
  assert result["factor_rel_diff"]["eta_w"] == pytest.approx(0.09)
  assert result["heldout_median_diff_points"] == pytest.approx(2.5)


@pytest.mark.parametrize(
    "change, median, failing",
    [
        ({"t0_layer": TRUE["t0_layer"] * 1.2}, 0.06, ["t0_layer"]),
        ({}, 0.095, []),  # 3.5 points apart.
        ({"eta_kv": TRUE["eta_kv"] * 0.8}, 0.10, ["eta_kv"]),
    ])
def test_repeatability_fails_outside_its_criteria(change, median, failing):
  result = repeatability.compare_profiles(fake_profile(TRUE, 0.06),
                                          fake_profile({**TRUE, **change}, median))
  assert not result["pass"]
  assert result["factors_outside"] == failing


def test_repeatability_compares_tiny_fixed_costs_with_the_fastest_step():
  tiny = {**TRUE, "t0_step": 1e-5, "t0_layer": 5e-6}
  moved = {**tiny, "t0_step": 3e-5, "t0_layer": 1e-6}  # 3x and 1/5: 20 us.
  # Beneath a 5 ms step, 20 us is 0.4% of it: the runs agree.
  assert repeatability.compare_profiles(fake_profile(tiny, 0.06, fastest=5e-3),
                                        fake_profile(moved, 0.06))["pass"]
  # Without the step's scale they are compared with themselves, and differ.
  result = repeatability.compare_profiles(fake_profile(tiny, 0.06), fake_profile(moved, 0.06))
  assert result["factors_outside"] == ["t0_step", "t0_layer"]
  # A fixed cost of the step's own size is still compared with itself.
  big = {**TRUE, "t0_step": 8e-3}
  result = repeatability.compare_profiles(fake_profile(big, 0.06, fastest=5e-3),
                                          fake_profile({**big, "t0_step": 1e-2}, 0.06))
  assert result["factor_rel_diff"]["t0_step"] == pytest.approx(0.25)


def test_repeatability_compares_efficiencies_as_the_rates_they_give():
  """A shared machine's ceiling moved 2x between runs (119 and 53 GB/s here): the fraction
  of it moved the other way, the rate eta x BW, the one a prediction uses, did not."""
  slow, fast = {"bandwidth_Bps": 50e9, "flops_per_s": {"float32": 4e11}
               }, {"bandwidth_Bps": 100e9, "flops_per_s": {"float32": 4e11}}
  half = {**TRUE, "eta_w": TRUE["eta_w"] / 2, "eta_kv": TRUE["eta_kv"] / 2}
  a = dataclasses.replace(fake_profile(TRUE, 0.06), ceilings=slow)
  b = dataclasses.replace(fake_profile(half, 0.06), ceilings=fast)
  result = repeatability.compare_profiles(a, b)
  assert result["pass"], result
  assert result["fraction_rel_diff"]["eta_w"] == pytest.approx(0.5)
  assert result["factor_rel_diff"]["eta_w"] == pytest.approx(0.0)
  assert result["ceiling_rel_diff"]["bandwidth_Bps"] == pytest.approx(1.0)
  # The same fractions of a doubled ceiling are twice the rate: not a repeat.
  c = dataclasses.replace(fake_profile(TRUE, 0.06), ceilings=fast)
  assert repeatability.compare_profiles(a, c)["factors_outside"] == ["eta_w", "eta_kv"]


def test_repeatability_names_a_factor_whose_own_timings_moved():
  """eta_w rests on the M = 1 linear layers: when those moved 20% between two processes,
  eta_w's 20% is the machine's, and the run says so; a factor whose points held is not
  excused."""
  from jaxroof.report import calibration_tables
  m1 = {"linear M=1 1024x1024": 1e-4, "linear M=1 1024x4096": 4e-4}
  steps = {"step calibration B=2 T=128": 5e-3}
  basis = {"eta_w": m1, "eta_kv": steps, "heldout": steps}
  slower = {"eta_w": {k: 1.2 * v for k, v in m1.items()}, "eta_kv": steps, "heldout": steps}
  a = fake_profile(TRUE, 0.06)
  b = fake_profile({**TRUE, "eta_w": TRUE["eta_w"] / 1.2, "eta_kv": TRUE["eta_kv"] * 0.8}, 0.06)
  a = dataclasses.replace(a, fit={**a.fit, "basis": basis})
  b = dataclasses.replace(b, fit={**b.fit, "basis": slower})
  result = repeatability.compare_profiles(a, b)
  assert not result["pass"]
  assert result["factors_outside"] == ["eta_w", "eta_kv"]
  assert result["basis_rel_diff"]["eta_w"] == pytest.approx(0.2)
  assert result["factors_outside_as_their_data"] == ["eta_w"]
  line = calibration_tables.repeatability_line(result, "a.json")
  assert "eta_w's timed points moved 20%" in line and "held-out steps moved 0.0%" in line


def test_repeatability_excuses_a_factor_only_beyond_its_timings_round_noise():
  """A factor 20% apart whose points' rounds disagreed by 25% within a run is within
  the machine's floor; one whose rounds agreed within 3% is not excused."""
  from jaxroof.report import calibration_tables
  steps = {"step calibration B=2 T=128": 5e-3}
  basis = {"eta_w": steps, "eta_kv": steps, "heldout": steps}
  a = fake_profile(TRUE, 0.06)
  b = fake_profile({**TRUE, "eta_w": TRUE["eta_w"] / 1.2, "eta_kv": TRUE["eta_kv"] * 0.8}, 0.06)
  a = dataclasses.replace(
      a, fit={**a.fit, "basis": basis, "basis_round_spread": {"eta_w": 0.25, "eta_kv": 0.03}})
  b = dataclasses.replace(
      b, fit={**b.fit, "basis": basis, "basis_round_spread": {"eta_w": 0.05, "eta_kv": 0.02}})
  result = repeatability.compare_profiles(a, b)
  assert result["factors_outside"] == ["eta_w", "eta_kv"]
  assert result["factors_outside_within_round_noise"] == ["eta_w"]
  assert not result["outside_explained_by_machine"] and not result["pass"]
  line = calibration_tables.repeatability_line(result, "a.json")
  assert "eta_w inherits 25% of noise from its timed points' rounds" in line
  assert "machine's floor" not in line
  b = fake_profile({**TRUE, "eta_w": TRUE["eta_w"] / 1.2}, 0.06)
  b = dataclasses.replace(b, fit={**b.fit, "basis": basis, "basis_round_spread": {}})
  result = repeatability.compare_profiles(a, b)
  assert result["outside_explained_by_machine"] and not result["pass"]
  assert "within this machine's floor" in calibration_tables.repeatability_line(result, "a.json")


def _kv_profiles(eta_kv_ratio, heavy_ratio, round_spread=0.0):
  """Two runs whose eta_kv rests on three steps, 80% of it on the heavy one."""
  keys = ["step a B=2 T=128", "step a B=16 T=2048", "step a B=64 T=512"]
  times = dict(zip(keys, (5e-3, 14e-3, 23e-3)))
  slopes = dict(zip(keys, (0.1, -0.8, -0.2)))
  fit = {"basis_sensitivity": {"eta_kv": slopes}, "point_round_spread": {keys[1]: round_spread}}
  a = fake_profile(TRUE, 0.06)
  a = dataclasses.replace(a, fit={**a.fit, **fit, "basis": {"eta_kv": times}})
  b = fake_profile({**TRUE, "eta_kv": TRUE["eta_kv"] * eta_kv_ratio}, 0.06)
  later = {**times, keys[1]: times[keys[1]] * heavy_ratio}
  b = dataclasses.replace(b, fit={**b.fit, **fit, "basis": {"eta_kv": later}})
  return a, b


def test_repeatability_follows_a_factor_through_its_fits_sensitivity():
  """One heavy step of three 18% slower in the second process (the median point held)
  moves eta_kv by 1.18^-0.8 - 1 = -12% in the fit: the machine's, and said; the same
  eta_kv move over steps that held is the fit's own, and not excused."""
  from jaxroof.report import calibration_tables
  a, b = _kv_profiles(1.18**-0.8, 1.18)
  result = repeatability.compare_profiles(a, b)
  assert result["factors_outside"] == ["eta_kv"]
  assert result["basis_rel_diff"]["eta_kv"] == 0.0  # The median point did not move.
  assert result["factor_rel_change_from_data"]["eta_kv"] == pytest.approx(1.18**-0.8 - 1)
  assert result["factor_rel_diff_data_removed"]["eta_kv"] == pytest.approx(0.0, abs=1e-9)
  assert result["factors_outside_as_their_data"] == ["eta_kv"]
  assert result["outside_explained_by_machine"] and not result["pass"]
  line = calibration_tables.repeatability_line(result, "a.json")
  assert "eta_kv moved -12%, of which its timed points' move makes -12% in the fit" in line
  a, b = _kv_profiles(1.18**-0.8, 1.0)
  result = repeatability.compare_profiles(a, b)
  assert result["factors_outside_as_their_data"] == []
  assert not result["outside_explained_by_machine"]
  # Rounds of the heavy step 20% apart within a run: 0.8 x 20% = 16% of noise in eta_kv.
  a, b = _kv_profiles(1.18**-0.8, 1.0, round_spread=0.2)
  result = repeatability.compare_profiles(a, b)
  assert result["factor_round_noise"]["eta_kv"] == pytest.approx(math.expm1(0.16))
  assert result["factors_outside_within_round_noise"] == ["eta_kv"]


def test_the_compared_quantities_move_as_their_factors_do():
  """The re-pack compared as the batched weight rate eta_w x BW / (1 + r_pack) moves
  -r / (1 + r) times as r_pack does (and as r_pack itself without rates); a fixed cost
  beneath the fastest step moves, as a share of that step, to first order."""
  key = "step a B=2 T=128"
  fit = {
      "basis_sensitivity": {"r_pack": {key: 2.0}, "t0_step": {key: 10.0}},
      "fastest_fit_step_s": 5e-3
  }
  rates = {"bandwidth_Bps": 50e9, "flops_per_s": {"float32": 4e11}}
  factors = {**TRUE, "t0_step": 1e-3}
  a = dataclasses.replace(fake_profile(factors, 0.06), ceilings=rates, terms={"r_pack": 0.5},
                          fit={**fit, "point_median_s": {key: 1.0}})
  assert repeatability.compared_sensitivity(a)["r_pack"][key] == pytest.approx(-0.5 / 1.5 * 2.0)
  assert repeatability.compared_sensitivity(dataclasses.replace(a,
                                                                ceilings={}))["r_pack"][key] == 2.0
  b = dataclasses.replace(a, fit={**fit, "point_median_s": {key: math.exp(0.01)}})
  result = repeatability.compare_profiles(a, b)
  assert "t0_step" in result["factors_as_share_of_fastest_step"]
  from_data = result["factor_rel_change_from_data"]
  assert from_data["t0_step"] == pytest.approx(1e-3 * 10.0 * 0.01 / 5e-3)
  assert from_data["r_pack"] == pytest.approx(math.expm1(-0.5 / 1.5 * 2.0 * 0.01))


def test_repeatability_compares_the_repack_as_the_batched_weight_rate():
  """A noisy M = 1 timing moves eta_w, and the steps at B >= 2 move r_pack the other way:
  the batched weight rate eta_w x BW / (1 + r_pack) is what repeats."""
  ceilings = {"bandwidth_Bps": 50e9, "flops_per_s": {"float32": 4e11}}
  a = dataclasses.replace(fake_profile(TRUE, 0.06), ceilings=ceilings, terms={"r_pack": 0.2})
  lower = {**TRUE, "eta_w": TRUE["eta_w"] * 0.85}
  b = dataclasses.replace(fake_profile(lower, 0.06), ceilings=ceilings,
                          terms={"r_pack": 1.2 * 0.85 - 1.0})
  result = repeatability.compare_profiles(a, b)
  assert result["factor_rel_diff"]["r_pack"] == pytest.approx(0.0, abs=1e-9)
  assert result["fraction_rel_diff"]["r_pack"] == pytest.approx(0.18)
  assert result["factors_outside"] == ["eta_w"]
