"""`gpu_bench.sh --dry_run` runs the whole GPU-run path on the CPU.

Interpreted kernels on tiny shapes, tiny ceilings, a tiny toy calibration:
the times mean nothing; what is checked is that every stage ran and left its
JSON, so the one script a lent GPU runs cannot rot unseen.
"""

import json
import os
import subprocess
import sys

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_dry_run_leaves_every_stage_json(tmp_path):
  out = tmp_path / "out"
  # The suite may run on a loaded shared CPU: more time than the 89 s the
  # script gives itself by default, so a slow machine does not skip stages.
  env = {
      **os.environ, "PYTHONPATH": _ROOT, "PYTHON": sys.executable,
      "GPU_BENCH_DRY_RUN_LIMIT_S": "170"
  }
  proc = subprocess.run(["bash", "experiments/gpu_bench.sh", "--dry_run",
                         str(out)], cwd=_ROOT, env=env, capture_output=True, text=True, timeout=240)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  summary = json.loads((out / "summary.json").read_text())
  assert summary["dry_run"] is True
  assert not summary["errors"] and not summary["skipped"], summary
  assert set(summary["stages"]) == {"ceilings", "calibrate", *summary["cases"]}
  # The calibration's accuracy is recorded, not gated: a loaded CPU's timings are noise.
  calibration = summary["calibration"]
  assert calibration["gated"] is False
  assert calibration["status"] in ("ok", "inaccurate", "incomplete")
  assert calibration["heldout_median_rel_error"] >= 0
  assert len(summary["cases"]) == 3
  for name in summary["cases"]:
    record = json.loads((out / f"{name}.json").read_text())
    assert record["backend"] == "pallas-interpret"
  for name in ("ceilings", "op_sweeps", "calibration", "validation"):
    assert (out / f"{name}.json").exists(), name
  validation = json.loads((out / "validation.json").read_text())
  assert {"batch", "context", "predicted_s", "measured_s"} <= set(validation["validation"][0])
  assert list((out / "results").glob("profile_gpu_*.json"))
