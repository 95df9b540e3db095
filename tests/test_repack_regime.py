"""XLA:CPU's small-batch regime: a weight re-pack from B = 2, as the r_pack term.

Timings here are synthetic: a linear layer timed by an independent closed form
(weights at eta_w*BW, FLOPs at eta_f*F added, plus r_pack extra weight reads
from M = 2 on), so the expected factor is the one put in.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxroof.calibrate import fitting
from jaxroof.calibrate import op_fit
from jaxroof.measure import profiles
from jaxroof.measure import measurement
from jaxroof import engines  # noqa: F401  (registers r_pack)
from jaxroof.symbolic import calibrated
from jaxroof.symbolic.step_model import StepModel
from jaxroof.timing import Timing

BW, F = 5e10, 2e11
FACTORS = {
    "eta_w": 0.6, "eta_kv": 0.5, "eta_f": 0.5, "t0_step": 1e-4, "t0_layer": 1e-6, "r_ovl": 1.0
}
DEVICE = measurement.Device("cpu", "cpu", jax.__version__)


def test_repack_is_zero_at_batch_one_and_one_scaled_weight_read_from_two():
  values = {"T": 100.0, "N": 1e8, "q": 2.0, "k": 1e5, "BW": BW, "F": F, "N_act": 1e8, "L": 4.0}
  batches = np.array([1.0, 2.0, 3.0, 64.0])
  plain = calibrated.decode_model()(B=batches, **values, **FACTORS)["step_s"]
  with_pack = calibrated.decode_model("numpy", ("xla_cpu",))(B=batches, **values, **FACTORS,
                                                             r_pack=1.5)["step_s"]
  weight_read = 1e8 * 2.0 / (0.6 * BW)  # N*q / (eta_w*BW), by hand.
  np.testing.assert_allclose(with_pack - plain, [0.0] + [1.5 * weight_read] * 3, rtol=1e-9)
  zero = calibrated.decode_model("numpy", ("xla_cpu",))(B=batches, **values, **FACTORS,
                                                        r_pack=0.0)["step_s"]
  np.testing.assert_allclose(zero, plain, rtol=1e-12)


def test_step_model_and_profile_carry_the_regime(tmp_path):
  prof = profiles.Profile(device_kind="cpu", platform="cpu", backend="xla", dtype="float32",
                          jax_version="0", created="", ceilings={}, factors=FACTORS,
                          fit={"heldout_median_rel_error": 0.1}, terms={"r_pack": 1.5})
  path = tmp_path / "p.json"
  profiles.save_profile(prof, path)
  back = profiles.load_profile(path)
  assert back.regime_factors == {"r_pack": 1.5}
  model = profiles.step_model(back, use_profile_ceilings=False)
  plain = StepModel.calibrated(FACTORS)
  inputs = {"T": 100.0, "N": 1e8, "q": 2.0, "k": 1e5, "BW": BW, "F": F, "L": 4.0}
  one, two = (model.evaluate(B=np.array([b]), **inputs)["step_s"][0] for b in (1.0, 2.0))
  assert one == pytest.approx(plain.evaluate(B=np.array([1.0]), **inputs)["step_s"][0])
  assert two - plain.evaluate(B=np.array([2.0]), **inputs)["step_s"][0] == pytest.approx(
      1.5 * 1e8 * 2.0 / (0.6 * BW))
  assert any("re-packs" in a for a in model.assumptions)
  # The profile names it by its registry name; an older profile (version 2) under
  # regime_factors, read into the same terms; one without either has no re-pack term.
  data = back.to_json()
  assert data["terms"] == {"r_pack": 1.5} and data["version"] == 3
  older = {**data, "version": 2, "regime_factors": data["terms"]}
  del older["terms"]
  assert profiles.Profile.from_json(older).terms == {"r_pack": 1.5}
  del older["regime_factors"]
  assert profiles.Profile.from_json(older).terms == {}


def _linear(rows: int, d: int, r_pack: float, noise: float, rng) -> measurement.Measurement:
  """One timed linear layer, by hand: weights + FLOPs (no overlap) + re-pack from M = 2."""
  n = d * d
  weights = n * 4.0 / (0.6 * BW)
  seconds = (3e-5 + weights + 2.0 * n * rows / (0.5 * F) +
             (r_pack * weights if rows >= 2 else 0.0)) * float(np.exp(rng.normal(0, noise)))
  timing = Timing(median_s=seconds, min_s=seconds, max_s=seconds, p10_s=seconds, p90_s=seconds,
                  repeats=3, warmup=1)
  return measurement.Measurement(op="linear", shapes={"rows": rows, "d_in": d, "d_out": d},
                                 dtype="float32", backend="xla", device=DEVICE, timing=timing)


def test_linear_fit_finds_the_repack_and_predicts_both_regimes():
  rng = np.random.default_rng(0)
  timed = [
      _linear(m, d, 1.5, 0.01, rng) for d in (1024, 2048) for m in (1, 2, 4, 16, 64, 256, 1024)
  ]
  single = [r for r in timed if r.shapes["rows"] == 1]
  many = [r for r in timed if r.shapes["rows"] > 1]
  fit = op_fit.fit_linear(single, many, bandwidth=BW, flop_rate=F, regime=True)
  assert fit["r_pack"] == pytest.approx(1.5, rel=0.15)
  assert fit["eta_w"] == pytest.approx(0.6, rel=0.05)
  x = op_fit.linear_inputs(timed, BW, F)
  measured = np.array([r.median_s for r in timed])
  with_pack = np.abs(fitting.predict(x, fit) / measured - 1)
  without = op_fit.fit_linear(single, many, bandwidth=BW, flop_rate=F)
  assert "r_pack" not in without
  plain = np.abs(fitting.predict(x, without) / measured - 1)
  small = np.array([2 <= r.shapes["rows"] <= 16 for r in timed])
  # The term explains the small-batch step that the other factors cannot.
  assert np.max(with_pack) < 0.05
  assert np.max(plain[small]) > 0.3


def test_accelerators_fit_no_repack():
  rng = np.random.default_rng(1)
  timed = [_linear(m, 1024, 0.0, 0.0, rng) for m in (1, 2, 4, 16, 64, 256)]
  fit = op_fit.fit_linear([r for r in timed if r.shapes["rows"] == 1],
                          [r for r in timed if r.shapes["rows"] > 1], bandwidth=BW, flop_rate=F,
                          regime=True)
  assert fit["r_pack"] < 0.05  # A fit finds none where there is none.


def test_noise_floor_is_the_median_round_spread():
  from jaxroof.calibrate import toy_fit
  rows = [{"round_spread": 0.02}, {"round_spread": 0.10}, {"round_spread": None},
          {"round_spread": 0.04}]
  assert toy_fit.noise_floor(rows) == pytest.approx(0.04)
  assert toy_fit.noise_floor([{"round_spread": None}]) is None
