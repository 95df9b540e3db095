"""The error travels with the number: every calibrated prediction shows its held-out error."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from jaxroof.measure import profiles
from jaxroof.report import accuracy
from jaxroof.report import summary_section
from jaxroof.report import user_calibration
from jaxroof.serving import answer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "results")
FACTORS = {
    "eta_w": 0.6, "eta_kv": 0.6, "eta_f": 0.5, "t0_step": 1e-4, "t0_layer": 1e-6, "r_ovl": 1.0
}


def _profile(path, cal: float, bound: float, top: float = 0.4) -> str:
  prof = profiles.Profile(
      device_kind="NVIDIA A100 SXM 80GB", platform="", backend="vLLM", dtype="bf16",
      jax_version="0", created="2026-01-01T00:00:00+00:00", ceilings={}, factors=FACTORS, fit={
          "heldout_median_rel_error": cal, "heldout_max_rel_error": top,
          "bound_heldout_median_rel_error": bound, "heldout_by": "model"
      }, accelerator="a100-80gb")
  profiles.save_profile(prof, path)
  return str(path)


def test_summary_shows_each_calibrated_prediction_with_its_profile_error():
  result = answer.summarise(answer.Subject(accelerators=("a100-80gb", "h100-sxm")), RESULTS)
  rows = summary_section.table_rows(result)
  shown = 0
  for entry, row in zip(result["accelerators"], rows):
    if entry["calibrated"] is None or entry["calibrated"]["batch"] is None:
      continue
    # Read the shipped profile independently of the code under test.
    with open(os.path.join(RESULTS, os.path.basename(entry["calibrated"]["profile"])),
              encoding="utf-8") as f:
      fit = json.load(f)["fit"]
    cell = row[-1]
    assert f"held-out error {fit['heldout_median_rel_error']:.0%} median" in cell
    assert f"{fit['heldout_max_rel_error']:.0%} max" in cell
    assert f"bound's {fit['bound_heldout_median_rel_error']:.0%}" in cell
    assert entry["calibrated"][accuracy.ROW_FIELD] == fit["heldout_median_rel_error"]
    shown += 1
  assert shown == 2  # Both devices ship a TensorRT-LLM profile.
  assert "held-out error" in summary_section.HEADERS[-1]


def test_summary_says_when_the_bound_is_better():
  cell = summary_section.calibrated_error({
      accuracy.ROW_FIELD: 0.30, "profile_heldout_max_rel_error": 0.9,
      "bound_heldout_median_rel_error": 0.10, "worse_than_bound": True
  })
  assert "30% median" in cell and "bound's 10%" in cell and "worse than the bound" in cell


def test_carry_over_table_shows_the_bound_first_and_marks_a_worse_calibration():
  result = {
      "pairs": [{
          "accelerator": "h200", "fit_model": "a", "target": "b", "relation": ["small to large"],
          "calibrated": {"median_rel_error": 1.055}, "bound": {"median_rel_error": 0.357}
      }, {
          "accelerator": "h200", "fit_model": "b", "target": "a", "relation": ["large to small"],
          "calibrated": {"median_rel_error": 0.05}, "bound": {"median_rel_error": 0.30}
      }]
  }
  worse, better = user_calibration.carry_over_rows(result)
  assert worse[4:] == ["35.7%", "105.5% (worse than the bound)"]
  assert better[4:] == ["30.0%", "5.0%"]


def _sweep(*flags):
  return subprocess.run([
      sys.executable, "-m", "experiments.batch_sweep", "--model=llama-2-7b",
      "--accelerator=a100-80gb", "--context=1024", "--batch_sizes=1,8", *flags
  ], cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)


def test_batch_sweep_table_and_json_carry_the_profile_error(tmp_path):
  path, out = _profile(tmp_path / "p.json", 0.123, 0.40), tmp_path / "s.json"
  proc = _sweep(f"--profile={path}", f"--json_out={out}")
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  header = next(i for i, line in enumerate(lines) if line.startswith("batch"))
  assert accuracy.HEADER in lines[header]
  assert all("±12.3% (max 40%)" in line for line in lines[header + 2:header + 4])
  assert "analytic bound, shown first" not in proc.stdout  # Calibrated is the better here.
  rows = json.loads(out.read_text())["rows"]
  assert [r["profile_heldout_median_rel_error"] for r in rows] == [0.123, 0.123]


def test_batch_sweep_shows_the_bound_first_when_the_profile_is_worse(tmp_path):
  path, out = _profile(tmp_path / "p.json", 0.35, 0.10), tmp_path / "s.json"
  proc = _sweep(f"--profile={path}", f"--json_out={out}")
  assert proc.returncode == 0, proc.stderr
  text = proc.stdout
  assert text.index("analytic bound, shown first") < text.index("calibrated prediction:")
  assert "the bound is the better estimate" in text
  assert json.loads(out.read_text())["kind"] == "calibrated"  # The JSON stays the calibrated.


@pytest.mark.parametrize("module, flags", [
    ("compare_accelerators",
     ("--model=llama-2-7b", "--accelerators=a100-80gb", "--context=1024", "--batch_sizes=1,8")),
    ("serving", ("--model=llama-2-7b", "--accelerator=a100-80gb", "--prompt_tokens=512",
                 "--output_tokens=64", "--token_gap_ms=20", "--batch_sizes=1,8")),
    ("simulate", ("--model=llama-2-7b", "--accelerator=a100-80gb", "--context=1024",
                  "--num_requests=50", "--arrival_rate=2")),
])
def test_other_experiments_show_the_error_beside_calibrated_numbers(tmp_path, module, flags):
  path, out = _profile(tmp_path / "p.json", 0.123, 0.40), tmp_path / "o.json"
  proc = subprocess.run([
      sys.executable, "-m", f"experiments.{module}", *flags, f"--profile={path}",
      f"--json_out={out}"
  ], cwd=ROOT, capture_output=True, text=True, timeout=180, check=False)
  assert proc.returncode == 0, proc.stderr
  assert accuracy.HEADER in proc.stdout and "±12.3%" in proc.stdout
  assert "held-out error: median 12.3%" in proc.stdout
  data = json.loads(out.read_text())
  if module == "compare_accelerators":
    assert all(r["profile_heldout_median_rel_error"] == 0.123 for e in data["accelerators"]
               for r in e["rows"])
  else:
    assert data["accuracy"]["profile_heldout_median_rel_error"] == 0.123


def test_user_calibration_section_lists_each_fits_warnings(tmp_path):
  result = {
      "accelerator": "a100-80gb", "rows_used": 5, "heldout_by": "rows", "free_factors": ["eta_w"],
      "heldout_median_rel_error": 0.149, "heldout_max_rel_error": 0.19,
      "bound_heldout_median_rel_error": 0.096, "source": {"engine": "vLLM", "file": "x.csv"},
      "warnings": ["2 suspicious row(s): line 5 (0.964x the bound)"]
  }
  (tmp_path / "user_calibration_a100-80gb_trtllm_0.9.0.json").write_text(json.dumps(result))
  text = user_calibration.report_section(str(tmp_path))
  assert "- a100-80gb: 2 suspicious row(s): line 5 (0.964x the bound)." in text
  row = next(line for line in text.splitlines() if line.startswith("| a100-80gb"))
  assert "| rows |" in row and "| 9.6% | 14.9% (worse than the bound) |" in row
