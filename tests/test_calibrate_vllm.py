"""`calibrate --source=vllm`: held-out rows, runs of several models, the command line with
terms held by their registry names (`--hold`, `--engine_terms`), predictions that fit
nothing, and the report's section of such a fit.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from jaxroof import errors
from jaxroof.calibrate import engine_fit
from jaxroof.calibrate import engine_replay
from jaxroof.calibrate import engine_search
from jaxroof.engines import vllm_model
from tests._vllm_helpers import FIXTURE, REPO
from tests._vllm_helpers import device_file_fixture, model_dir_fixture  # noqa: F401


def _calibrate(*flags: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "experiments.calibrate", *flags],
                        capture_output=True, text=True, cwd=REPO, timeout=600)


@pytest.mark.parametrize(
    "flags, match",
    [
        (("--hold=t0_request=3.5e-3", "--search=t0_request"),
         "--hold=t0_request=3.5e-3: t0_request is both held and searched"),
        (("--hold=c_lc=5e7",), "--hold=c_lc=5e7: 'c_lc' is not a cost term. Did you mean 'c_llc'?"),
        (("--hold=eta_w=1.5",), r"--hold=eta_w=1.5: eta_w=1.5 is outside its bounds \(0, 1\]"),
        (("--search=t0_sq",), "Did you mean 't0_seq'"),
        (("--server=sched=vllm",), "Did you mean 'scheduler'"),
        (("--engine_act_ns=1.5",),
         "Unknown command line flag 'engine_act_ns'"),  # Now --hold=t_act=.
    ])
def test_a_bad_term_is_one_clean_line(model_dir, device_file, flags, match):
  """A term held and searched, an unknown name (with "did you mean"), a value outside its
  bounds, a removed --engine_* flag: one line naming them (the engine's pairings and the
  rest of the parsing: tests/test_terms.py, tests/test_engine_replay.py)."""
  done = _calibrate("--source=vllm", f"--from_vllm={FIXTURE}", f"--model={model_dir}",
                    f"--accelerator_file={device_file}", *flags)
  lines = done.stderr.strip().splitlines()
  assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), done.stderr
  assert re.search(match, lines[0]), lines[0]


def test_heldout_rows_and_refusal(tmp_path, monkeypatch, model_dir, device_file):
  factors = {"eta_w": 0.5, "eta_f": 0.3, "t0_step": 2e-3, "t0_request": 0.01}
  monkeypatch.setattr(engine_search, "search", lambda runs, setup, **_: (dict(factors), 0.0, 1))
  setup = engine_replay.ServingSetup(model=model_dir, accelerator="", scheduler="vllm",
                                     accelerator_file=device_file, search=("t0_request",))
  result = engine_fit.calibrate_engine([FIXTURE], setup, heldout_paths=[FIXTURE],
                                       heldout_model=model_dir)
  rows = result["heldout"]
  assert {(r["metric"], r["percentile"]) for r in rows
         } == {(m, q) for m in ("ttft", "tpot", "itl") for q in (50, 90)}
  for r in rows:
    assert r["rel_error"] == pytest.approx(
        abs(r["predicted_s"] - r["measured_s"]) / r["measured_s"])
    assert 0 < r["bound_s"] <= r["predicted_s"] * (1 + 1e-9) or r["metric"] == "itl"
  assert result["heldout_median_rel_error"] == pytest.approx(
      float(np.median([r["rel_error"] for r in rows])))
  assert result["factors"]["t0_request"] == pytest.approx(0.01)
  assert result["heldout_throughput"][0]["metric"] == "request_throughput"
  assert result["cdfs"][0]["measured"]["ttft"] == sorted(result["cdfs"][0]["measured"]["ttft"])
  bare = tmp_path / "bare.json"
  raw = json.loads(FIXTURE.read_text())
  bare.write_text(json.dumps({k: v for k, v in raw.items() if k != "itls"}))
  with pytest.raises(errors.InputError, match="no per-request detail"):
    engine_fit.calibrate_engine([FIXTURE], setup, heldout_paths=[str(bare)])


def test_each_fit_run_is_simulated_on_its_own_model(tmp_path, monkeypatch, model_dir, device_file):
  """`fit_model` names each fitted file's model: the search sees runs of two sizes, and a
  larger model's run is slower under the same factors."""
  wider = vllm_model.write_model_folder(str(tmp_path / "wide"), "tiny-llama",
                                        {"hidden_size": 1024, "num_layers": 8})["model_dir"]
  seen = {}

  def fake_search(runs, setup, **_):
    seen.setdefault("models", [r.model for r in runs])  # The full fit (folds come after).
    return dict(engine_search.START), 0.0, 1

  monkeypatch.setattr(engine_search, "search", fake_search)
  setup = engine_replay.ServingSetup(model=model_dir, accelerator="", scheduler="vllm",
                                     accelerator_file=device_file)
  result = engine_fit.calibrate_engine([FIXTURE, FIXTURE], setup, fit_model=[model_dir, wider])
  assert seen["models"] == [model_dir, wider]
  assert result["source"]["fit_models"] == [model_dir, wider]
  small, large = (r["calibrated"]["median_tpot_s"]["simulated_s"] for r in result["runs"])
  assert large > 1.5 * small
  with pytest.raises(errors.InputError, match="fit_model names 3 models for 2 files"):
    engine_fit.calibrate_engine([FIXTURE, FIXTURE], setup, fit_model=[model_dir] * 3)
  for field in ("fit_model", "heldout_model"):
    with pytest.raises(errors.InputError, match="no such file") as raised:
      engine_fit.calibrate_engine([FIXTURE], setup, heldout_paths=[FIXTURE],
                                  **{field: str(tmp_path / "absent")})
    assert raised.value.field == field


def test_calibrate_engine_cli_with_accelerator_file(tmp_path, model_dir, device_file):
  out = tmp_path / "cal.json"
  done = subprocess.run([
      sys.executable, "-m", "experiments.calibrate_engine", f"--from_vllm={FIXTURE}",
      f"--heldout_vllm={FIXTURE}", f"--model={model_dir}", f"--accelerator_file={device_file}",
      "--server=scheduler=vllm", "--search=t0_request,max_simulations=12",
      "--hold=r_ovl=0.06,m_pass=256,eta_kv=0.23,eta_attn=0.26,c_llc=5e7,bw_llc=2.2e10,"
      "t_build=9e-6,t_act=1.5e-9,s_cold=1,s_lru=1", f"--json_out={out}"
  ], capture_output=True, text=True, cwd=REPO, timeout=600)
  assert done.returncode == 0, done.stderr[-2000:]
  result = json.loads(out.read_text())
  assert result["heldout"] and math.isfinite(result["heldout_median_rel_error"])
  assert set(result["factors"]) >= {"eta_w", "eta_f", "t0_step", "t0_request"}
  assert all(0 < result["factors"][n] <= 1 for n in ("eta_w", "eta_f"))
  # Every held engine term reaches the fit, as measured.
  assert result["fixed"] == {
      "t0_layer": 1e-9, "r_ovl": 0.06, "eta_kv": 0.23, "eta_attn": 0.26, "m_pass": 256,
      "c_llc": 5e7, "bw_llc": 2.2e10, "s_lru": 1.0, "t_build": 9e-6, "t_act": 1.5e-9, "s_cold": 1.0
  }
  assert result["factors"]["t_act"] == 1.5e-9 and result["factors"]["s_cold"] == 1.0
  assert result["factors"]["eta_kv"] == 0.23 and result["factors"]["eta_attn"] == 0.26
  assert result["factors"]["c_llc"] == 5e7 and result["factors"]["bw_llc"] == 2.2e10


def test_a_fit_carried_to_another_device_predicts_without_fitting(tmp_path, monkeypatch, model_dir,
                                                                  device_file):
  """`read_terms` + `predict_runs`: one calibration's terms on another device's ceilings,
  nothing searched. On the fit's own device the rows are the fit's held-out rows; on a device
  reading memory twice as fast the decode gaps shrink; the JSON says where the factors came
  from; a file that is not an engine calibration is refused by name."""
  factors = {"eta_w": 0.5, "eta_f": 0.3, "t0_step": 2e-3, "t0_request": 0.01}
  monkeypatch.setattr(engine_search, "search", lambda runs, setup, **_: (dict(factors), 0.0, 1))
  setup = engine_replay.ServingSetup(model=model_dir, accelerator="", scheduler="vllm",
                                     accelerator_file=device_file, search=("t0_request",),
                                     held={"m_pass": 256, "r_ovl": 0.06})
  fit = engine_fit.calibrate_engine([FIXTURE], setup, heldout_paths=[FIXTURE])
  fit_path = tmp_path / "fit.json"
  fit_path.write_text(json.dumps(fit))
  monkeypatch.setattr(engine_search, "search", None)  # Nothing below may search.
  carried = engine_fit.read_terms(fit_path)
  assert carried["m_pass"] == 256 and carried["r_ovl"] == 0.06 and carried["eta_w"] == 0.5
  same = engine_fit.predict_runs([FIXTURE], setup, carried, factors_from=str(fit_path))
  assert same["kind"] == "engine_prediction" and same["factors_from"] == str(fit_path)
  assert [r["predicted_s"] for r in same["heldout"]] == [r["predicted_s"] for r in fit["heldout"]]
  faster = json.loads(pathlib.Path(device_file).read_text())
  entry = faster["accelerators"]["cpu-vllm-engine"]
  entry["memory_bandwidth_tb_s"] *= 2
  other = tmp_path / "faster.json"
  other.write_text(json.dumps(faster))
  moved = engine_fit.predict_runs([FIXTURE],
                                  dataclasses.replace(setup, accelerator_file=str(other)), carried)
  gap = {(r["metric"], r["percentile"]): r["predicted_s"] for r in moved["heldout"]}
  assert gap[("tpot", 50)] < next(
      r["predicted_s"] for r in same["heldout"] if (r["metric"], r["percentile"]) == ("tpot", 50))
  for bad, match in (({"kind": "simulation"}, "is not a set of cost terms"),
                     ({**fit, "factors": {**fit["factors"],
                                          "eta_w": -1}}, "factors.eta_w=-1 is not allowed"),
                     ({"terms": {"eta_q": 1}}, "terms.eta_q=1 is not allowed: not a known field")):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(errors.InputError, match=match) as raised:
      engine_fit.read_terms(path)
    assert raised.value.field == "engine_terms" and str(path) in str(raised.value)
  with pytest.raises(errors.InputError, match="eta_w not given") as raised:
    engine_fit.predict_runs([FIXTURE], setup, {"eta_f": 0.3, "t0_step": 1e-3})


def test_engine_terms_cli_predicts_runs_as_the_fit_did(tmp_path, model_dir, device_file):
  """`calibrate --engine_terms=FIT.json --heldout_vllm=...` (no --from_vllm): an earlier fit's
  terms predict its held-out run exactly as the fit did, nothing fitted; a --hold over the
  file's eta_w (half its rate) slows the decode; flags that shape a fit are refused."""
  fit = tmp_path / "fit.json"
  done = _calibrate("--source=vllm", f"--from_vllm={FIXTURE}", f"--heldout_vllm={FIXTURE}",
                    f"--model={model_dir}", f"--accelerator_file={device_file}",
                    "--server=scheduler=vllm", "--search=max_simulations=10",
                    "--hold=eta_kv=0.3,t0_request=3e-3", f"--json_out={fit}")
  assert done.returncode == 0, done.stderr[-2000:]
  flags = [
      f"--engine_terms={fit}", f"--heldout_vllm={FIXTURE}", f"--model={model_dir}",
      f"--accelerator_file={device_file}", "--server=scheduler=vllm"
  ]
  out = tmp_path / "pred.json"
  done = _calibrate(*flags, f"--json_out={out}")
  assert done.returncode == 0, done.stderr[-2000:]
  assert "no fit" in done.stdout
  predicted, fitted = json.loads(out.read_text()), json.loads(fit.read_text())
  assert predicted["kind"] == "engine_prediction"
  assert [r["predicted_s"] for r in predicted["heldout"]
         ] == pytest.approx([r["predicted_s"] for r in fitted["heldout"]], rel=1e-9)
  slower = tmp_path / "slower.json"
  done = _calibrate(*flags, f"--hold=eta_w={fitted['factors']['eta_w'] / 2}",
                    f"--json_out={slower}")
  assert done.returncode == 0, done.stderr[-2000:]

  def p50_tpot(path: pathlib.Path) -> float:
    rows = json.loads(path.read_text())["heldout"]
    return next(r["predicted_s"] for r in rows if (r["metric"], r["percentile"]) == ("tpot", 50))

  assert p50_tpot(slower) > p50_tpot(out)  # Half the weights' rate: slower decode steps.
  refused = _calibrate(*flags, "--search=t0_seq")  # A search shapes a fit.
  last = refused.stderr.strip().splitlines()[-1]
  assert refused.returncode == 2 and last.startswith("error:") and "--search" in last


def test_report_section_renders_committed_results_or_says_how(tmp_path):
  from jaxroof.report import real_engine
  empty = real_engine.report_section(str(tmp_path / "none"), str(tmp_path))
  assert "## Checked against a real engine" in empty and "vllm_setup.sh" in empty
  assert "/work" not in empty  # Names no path of this machine.
  folder = tmp_path / "results" / real_engine.FOLDER
  folder.mkdir(parents=True)
  row = {
      "run": "vllm_rate4_in128_out32.json:1 (rate 4)", "metric": "ttft", "percentile": 50,
      "measured_s": 0.020, "predicted_s": 0.022, "bound_s": 0.004, "rel_error": 0.1
  }
  result = {
      "heldout": [row], "heldout_median_rel_error": 0.1, "heldout_max_rel_error": 0.1,
      "heldout_points": 1, "factors": {"eta_w": 0.5, "t0_request": 0.01},
      "fixed": {"t0_layer": 1e-9, "r_ovl": 0.06, "eta_kv": 0.23, "eta_attn": 0.26,
                "m_pass": 256}, "source": {"files": ["a/vllm_rate2_in128_out32.json"]}, "cdfs": [{
                    "run": row["run"], "measured": {"ttft": [0.02, 0.03], "itl": [0.004]},
                    "predicted": {"ttft": [0.021, 0.029], "itl": [0.005]}
                }]
  }
  (folder / "calibration.json").write_text(json.dumps(result))
  text = real_engine.report_section(str(tmp_path / "results"), str(tmp_path))
  assert "| vllm_rate4_in128_out32 | p50 TTFT | 20.00 | 22.00 | 10.0% | 4.00 |" in text
  assert "Held: r_ovl = 0.06, eta_kv = 0.23, eta_attn = 0.26, m_pass = 256 (" in text
  assert (tmp_path / "real_engine_cdfs.png").stat().st_size > 0
