"""From a profile to a real model (issue 13 §3): Llama-3-8B on the profile's device.

A profile measured on a device predicts a shipped model on that same device
(`profiles.step_model` -> `model_sweep`), labelled a calibrated prediction
with its factors and measured ceilings applied; on another accelerator's
datasheet it stays a what-if, allowed only when asked for.
"""

import os
import subprocess
import sys

import pytest

from jaxroof import errors
from jaxroof.measure import profiles
from jaxroof.specs import accelerators
from jaxroof.specs import models
from jaxroof.specs.model_sweep import model_sweep

# Made-up but plausible factors of an H100 profile; r_ovl large, so the
# linear layers take the larger of their two times (the roofline's Max).
FACTORS = {
    "eta_w": 0.7, "eta_kv": 0.5, "eta_f": 0.6, "t0_step": 2e-4, "t0_layer": 1e-5, "r_ovl": 60.0
}
MEASURED_BW, MEASURED_F = 2.9e12, 6.5e14  # What the device sustained.


def h100_profile() -> profiles.Profile:
  return profiles.Profile(
      device_kind="NVIDIA H100 80GB HBM3", platform="gpu", backend="pallas", dtype="bfloat16",
      jax_version="", created="",
      ceilings={"bandwidth_Bps": MEASURED_BW, "flops_per_s": {"bfloat16": MEASURED_F}},
      factors=FACTORS, fit={"heldout_median_rel_error": 0.06,
                            "heldout_max_rel_error": 0.15}, path="profile_h100.json")


def test_a_profile_predicts_llama_3_8b_on_its_own_device():
  prof = h100_profile()
  assert profiles.check_applies(prof, "h100-sxm") == []
  spec = models.load_model("llama-3-8b")
  device = accelerators.load_accelerator("h100-sxm")
  batches = [1, 16]
  result = model_sweep(spec, device, context=2048, batch_sizes=batches,
                       model=profiles.step_model(prof))
  assert result["kind"] == "calibrated"
  assert result["profile"]["factors"] == FACTORS
  assert result["ceilings"]["source"] == "profile"
  assert not any("what-if" in n for n in result["summary"]["notes"])
  assert any("this accelerator" in n for n in result["summary"]["notes"])
  # The step by hand from Llama-3-8B's shipped config (32 layers, 8 K/V
  # heads of 128, bf16): the profile's factors on its measured ceilings.
  si = result["inputs"]["si"]
  kv_per_token = 2 * 32 * 8 * 128 * 2
  assert si["k"] == kv_per_token and si["q"] == 2
  for i, row in enumerate(result["rows"]):
    b, n = row["batch"], float(si["N"][i])
    weight_s = n * 2 / (FACTORS["eta_w"] * MEASURED_BW)
    compute_s = 2 * n * b / (FACTORS["eta_f"] * MEASURED_F)
    kv_s = b * si["T"] * kv_per_token / (FACTORS["eta_kv"] * MEASURED_BW)
    expected = (FACTORS["t0_step"] + 32 * FACTORS["t0_layer"] + max(weight_s, compute_s) + kv_s)
    assert row["step_s"] == pytest.approx(expected, rel=1e-3)
  bound = model_sweep(spec, device, context=2048, batch_sizes=batches)
  assert bound["kind"] == "bound"
  assert all(c["step_s"] > b["step_s"] for c, b in zip(result["rows"], bound["rows"]))


def test_a_profile_on_another_accelerator_is_a_labelled_what_if():
  prof = h100_profile()
  with pytest.raises(errors.InputError, match="what_if"):
    profiles.check_applies(prof, "a100-80gb")
  notes = profiles.check_applies(prof, "a100-80gb", what_if=True)
  assert notes and "what-if" in notes[0]
  result = model_sweep(models.load_model("llama-3-8b"), accelerators.load_accelerator("a100-80gb"),
                       context=2048, batch_sizes=[1],
                       model=profiles.step_model(prof, notes=tuple(notes)))
  assert any("what-if" in n for n in result["summary"]["notes"])


def _batch_sweep(*flags):
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  return subprocess.run([
      sys.executable, "-m", "experiments.batch_sweep", "--model=llama-3-8b", "--context=2048",
      "--batch_sizes=1,16", *flags
  ], cwd=root, capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # Three experiment start-ups: ~10-20 s on 2 cores.
def test_batch_sweep_labels_a_profiles_prediction_and_its_what_if(tmp_path):
  path = tmp_path / "profile_h100.json"
  profiles.save_profile(h100_profile(), path)
  own = _batch_sweep("--accelerator=h100-sxm", f"--profile={path}")
  assert own.returncode == 0, own.stderr
  assert "calibrated prediction" in own.stdout
  assert "what-if" not in own.stdout
  refused = _batch_sweep("--accelerator=a100-80gb", f"--profile={path}")
  assert refused.returncode == 2 and "--what_if" in refused.stderr
  what_if = _batch_sweep("--accelerator=a100-80gb", f"--profile={path}", "--what_if")
  assert what_if.returncode == 0, what_if.stderr
  assert "calibrated prediction" in what_if.stdout
  assert "what-if" in what_if.stdout
