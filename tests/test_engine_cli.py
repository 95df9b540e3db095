"""`--engine` as a user runs it: iteration, batch_sweep, compare_accelerators, list, the
published refit's refusals and the referee check."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from jaxroof.calibrate import published_fit as fit_lib
from jaxroof.calibrate import published_points as points_lib
from jaxroof.calibrate import published_setups as setups_lib
from jaxroof.engines import engine_profiles as profiles
from jaxroof.engines import published

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(module, *flags):
  return subprocess.run([sys.executable, "-m", f"experiments.{module}", *flags], cwd=ROOT,
                        capture_output=True, text=True, timeout=600)


def test_iteration_with_an_engine_is_the_predictors_step_with_the_bound_beside(tmp_path):
  # trtllm-0.9.0-dli/013: llama-2-70b fp8 on 2 x H100, a static batch of 16 at 128 + 2048
  # tokens: its mean decode step is the step at context 128 + 2048 / 2.
  out = tmp_path / "it.json"
  done = run("iteration", "--model=llama-2-70b", "--accelerator=h100-sxm", "--tp=2",
             "--weight_dtype=fp8", "--kv_dtype=fp8", "--decode_rows=16", "--decode_context=1152",
             "--engine=trtllm", f"--json_out={out}")
  assert done.returncode == 0, done.stderr
  result = json.loads(out.read_text())
  assert result["kind"] == "calibrated" and result["engine"] == "trtllm"
  assert set(result["heldout_error"]) == {"median_rel_error", "p90_rel_error", "max_rel_error"}
  assert result["bound_step_s"] == result["terms"]["step_s"] < result["step_s"]
  [point] = [p for p in published.read_points() if p.point_id == "trtllm-0.9.0-dli/013"]
  stacked = setups_lib.stack([point])
  entry = profiles.entry("trtllm", "h100-sxm")
  values = {**fit_lib.terms_per_point(stacked, lambda i: entry.terms), **fit_lib.held(stacked)}
  predicted = points_lib.predict(stacked, values)["value"][0]
  assert result["step_s"] == pytest.approx(predicted, rel=1e-9)
  assert "prediction: step" in done.stdout and "held-out" in done.stdout


def test_iteration_with_the_bound_says_so(tmp_path):
  out = tmp_path / "it.json"
  done = run("iteration", "--model=llama-3-8b", "--accelerator=h100-sxm", "--decode_rows=8",
             "--engine=bound", f"--json_out={out}")
  assert done.returncode == 0, done.stderr
  result = json.loads(out.read_text())
  assert (result["kind"], result["engine"], result["heldout_error"]) == ("bound", "bound", None)
  assert result["step_s"] == result["bound_step_s"]


@pytest.mark.parametrize("flags, words", [
    (("--engine=vlm",), "Did you mean 'vllm'"),
    (("--engine=trtllm", "--accelerator=mi300x"), "no rule to derive one"),
])
def test_iteration_refuses_in_one_line(flags, words):
  base = ["--model=llama-3-8b", "--accelerator=h100-sxm", "--decode_rows=8"]
  done = run("iteration", *base, *flags)
  assert done.returncode == 2 and words in done.stderr
  assert len([l for l in done.stderr.splitlines() if l.startswith("error")]) == 1


def test_batch_sweep_and_compare_accelerators_predict_with_the_bound_beside(tmp_path):
  out = tmp_path / "sweep.json"
  done = run("batch_sweep", "--model=llama-3-8b", "--accelerator=h100-sxm", "--context=1024",
             "--batch_sizes=1,32", "--engine=vllm", f"--json_out={out}")
  assert done.returncode == 0, done.stderr
  sweep = json.loads(out.read_text())
  assert sweep["kind"] == "calibrated" and sweep["profile"]["engine"] == "vllm"
  assert all(r["bound_step_s"] < r["step_s"] for r in sweep["rows"])
  out = tmp_path / "compare.json"
  done = run("compare_accelerators", "--model=llama-3-8b", "--context=1024", "--batch_sizes=1,32",
             "--accelerators=h100-sxm,h200,mi300x", "--engine=trtllm", f"--json_out={out}")
  assert done.returncode == 0, done.stderr
  result = json.loads(out.read_text())
  assert [e["name"] for e in result["accelerators"]] == ["h100-sxm", "h200"]
  assert all(r["bound_step_s"] < r["step_s"] for e in result["accelerators"] for r in e["rows"])
  assert "left out: mi300x" in done.stdout


def test_list_names_every_engine_and_its_accelerators(tmp_path):
  out = tmp_path / "list.json"
  done = run("list", "--what=engines", f"--json_out={out}")
  assert done.returncode == 0, done.stderr
  engines = {r["engine"]: r for r in json.loads(out.read_text())["engines"]}
  assert set(engines) == set(profiles.ENGINES) and "h200" in engines["trtllm"]["accelerators"]


def test_calibrate_published_needs_an_engine():
  done = run("calibrate", "--source=published")
  assert done.returncode == 2 and "--engine is required" in done.stderr
  done = run("calibrate", "--source=published", "--engine=sglng")
  assert done.returncode == 2 and "Did you mean 'sglang'" in done.stderr


@pytest.mark.e2e
def test_the_referee_predicts_points_never_fitted_on(tmp_path):
  out = tmp_path / "referee.json"
  done = run("referee", f"--json_out={out}")
  assert done.returncode == 0, done.stderr
  result = json.loads(out.read_text(), parse_constant=pytest.fail)  # No NaN, no inf.
  predicted = [r for r in result["predictions"] if r["rel_error"] is not None]
  for row in result["predictions"]:  # Null with its reason, or a number with none.
    assert (row["predicted"] is None) == (row["point_id"] in result["not_predicted"])
    assert (row["predicted"] is None) == bool(row["not_predicted"])
  assert len(predicted) >= 25 and len({r["engine"] for r in predicted}) >= 3
  assert result["bound_ratio"]["violations"] == 0 and result["bound_ratio"]["min"] >= 1
  fitted_on = {s for name in result["profiles"] for s in profiles.load(name)["data"]["sources"]}
  assert not {r["point_id"].split("/")[0] for r in result["predictions"]} & fitted_on
  errors = np.asarray([r["rel_error"] for r in predicted])
  assert result["median_rel_error"] == pytest.approx(float(np.median(errors)))
  assert result["max_rel_error"] == pytest.approx(float(np.max(errors)))


@pytest.mark.e2e
@pytest.mark.parametrize("engine", ["vllm", "trtllm", "sglang", "gpt-fast"])
def test_the_refit_is_the_shipped_profile(tmp_path, engine):
  out = tmp_path / "refit.json"
  done = run("calibrate", "--source=published", f"--engine={engine}", f"--json_out={out}")
  assert done.returncode == 0, done.stderr
  refit, shipped = json.loads(out.read_text()), profiles.load(engine)
  assert refit["points_used"] == shipped["points_used"]
  assert refit["terms"] == pytest.approx(shipped["terms"], rel=1e-4)
  assert refit["factors"] == refit["terms"]  # The name for the fitted terms.
  assert refit["design"] == shipped["design"]
  assert sorted(refit["accelerators"]) == sorted(shipped["accelerators"])
  for name, entry in shipped["accelerators"].items():  # Kernel-fitted terms included.
    assert refit["accelerators"][name]["terms"] == pytest.approx(entry["terms"], rel=1e-4), name
    assert ("kernel_fit" in refit["accelerators"][name]) == ("kernel_fit" in entry), name
  for key in ("median_rel_error", "p90_rel_error", "max_rel_error"):
    for got, want in ((refit, shipped), (refit["derived"], shipped["derived"])):
      # None where the profile has no error of its own kind (SGLang: no own points).
      assert (got[key] is None) == (want[key] is None)
      assert want[key] is None or got[key] == pytest.approx(want[key], rel=1e-4)
  assert [r["source"] for r in refit["heldout_by_source"]
         ] == [r["source"] for r in shipped["heldout_by_source"]]
