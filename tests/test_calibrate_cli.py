"""The calibrate and measure_ops experiments as a user runs them."""

import dataclasses
import json
import math
import os
import subprocess
import sys

import jax
import pytest

from jaxroof.measure import calibration_models
from jaxroof.measure import profiles

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dataclasses.replace(calibration_models.CALIBRATION, vocab_size=64, num_blocks=2, num_heads=4,
                           num_kv_heads=2, head_dim=8, width=32, mlp_dim=64)


def run(module, *flags):
  return subprocess.run([sys.executable, "-m", f"experiments.{module}", *flags], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("flags, needle", [
    (("--validate",), "--validate"),
    (("--budget_s=0",), "--budget_s"),
    (("--budget_s=10",), "at least 25 s"),
    (("--validate=/nonexistent/p.json",), "does not exist"),
    (("--compare_profile=/nonexistent/p.json",), "does not exist"),
    (("--hold=eta_w=0.5",), "--hold is not read with --source=ops"),
])
def test_calibrate_bad_input_is_one_line(flags, needle):
  proc = run("calibrate", *flags)
  assert proc.returncode == 2
  lines = proc.stderr.strip().splitlines()
  assert lines[-1].startswith("error:") and needle in lines[-1]
  assert "Traceback" not in proc.stderr


def test_calibrate_validates_a_profile_at_chosen_points(tmp_path):
  prof = profiles.Profile(
      device_kind=jax.devices()[0].device_kind, platform="cpu", backend="xla", dtype="float32",
      jax_version="", created="",
      ceilings={"bandwidth_Bps": 1e10, "flops_per_s": {"float32": 1e11}}, factors={
          "eta_w": 0.5, "eta_kv": 0.5, "eta_f": 0.5, "t0_step": 1e-4, "t0_layer": 1e-5, "r_ovl": 1.0
      }, fit={}, model={"configs": {"calibration": dataclasses.asdict(TINY)}})
  path, out = tmp_path / "p.json", tmp_path / "v.json"
  profiles.save_profile(prof, path)
  proc = run("calibrate", f"--validate={path}", "--batch_sizes=2", "--contexts=8,24", "--rounds=2",
             f"--json_out={out}")
  assert proc.returncode == 0, proc.stderr
  rows = json.loads(out.read_text())["validation"]
  assert [(r["batch"], r["context"]) for r in rows] == [(2, 8), (2, 24)]
  assert all(r["measured_s"] > 0 for r in rows)
  # The prediction, by hand: fixed costs, the linear layers' weight and FLOP times
  # combined as a 2-norm (r_ovl = 1), and the K/V read of context + 1 positions.
  f = prof.factors
  n = calibration_models.step_inputs(TINY, "float32").N
  kv_per_position = 2 * TINY.num_blocks * TINY.num_kv_heads * TINY.head_dim * 4
  for r in rows:
    weight = n * 4 / (f["eta_w"] * 1e10)
    flops = 2 * r["batch"] * n / (f["eta_f"] * 1e11)
    kv = r["batch"] * (r["context"] + 1) * kv_per_position / (f["eta_kv"] * 1e10)
    expected = f["t0_step"] + TINY.num_blocks * f["t0_layer"] + math.hypot(weight, flops) + kv
    assert r["predicted_s"] == pytest.approx(expected, rel=1e-9)
    assert r["rel_error"] == pytest.approx(abs(expected - r["measured_s"]) / r["measured_s"])


def test_measure_ops_refuses_interpreted_pallas_on_cpu():
  if jax.devices()[0].device_kind != "cpu":
    pytest.skip("CPU-only behaviour")
  proc = run("measure_ops", "--backend=pallas")
  assert proc.returncode == 2 and "pallas" in proc.stderr


def test_every_calibrate_flag_belongs_to_a_source():
  """A flag no source lists in `USED` is never refused where it does nothing (an
  --engine_eta_attn once parsed and went nowhere): each belongs to every source or to one.
  At most 30 of them, and no --engine_* term flag: engine terms go through --hold and
  --engine_terms by their registry names. In a child process: importing the flags module
  defines absl flags that other experiments of this test process may have defined already."""
  check = (
      "import re, sys; from experiments import _calibrate_flags as F; "
      "text = open(F.__file__, encoding='utf-8').read(); "
      "defined = set(re.findall(r'flags\\.DEFINE_\\w+\\(\\s*\"(\\w+)\"', text)); "
      "listed = set(F._EVERY_SOURCE).union(*F.USED.values()); "
      "engine = sorted(d for d in defined if d.startswith('engine_') and d != 'engine_terms'); "
      "print(len(defined), sorted(defined - listed) + engine)")
  done = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True,
                        timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  count, missing = done.stdout.split(" ", 1)
  assert 20 < int(count) <= 30 and missing.strip() == "[]", done.stdout
