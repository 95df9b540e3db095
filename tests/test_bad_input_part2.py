"""Issue 53 ("Bad input, third pass"), part 2: vLLM results, measurements, cost-term files and
profiles read through their schemas; a fit that is not finite never exits 0; outputs checked
first and written all or none; strict JSON. Each refusal is one line naming the file, the field
(or line and column), the value and what is allowed; valid edges are still answered."""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from experiments import _finite
from jaxroof import files
from jaxroof.calibrate import row_checks
from jaxroof.calibrate import row_fit
from jaxroof.calibrate import user_fit
from jaxroof.errors import InputError, NonFiniteResult
from jaxroof.measure import engine_terms_schema
from jaxroof.measure import profile_schema
from jaxroof.measure import profiles
from jaxroof.measure import user_measurements as um
from jaxroof.measure import vllm_result_schema
from jaxroof.measure import vllm_results
from jaxroof.symbolic import terms

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
FIXTURE = os.path.join(DATA, "vllm_cpu_detailed_fixture.json")
FIVE_ROWS = os.path.join(DATA, "user_llama2_7b_a100_5pts.csv")


def _one_line(error: pytest.ExceptionInfo, *needles: str) -> str:
  message = str(error.value)
  assert "\n" not in message and len(message) < 600, message
  for needle in needles:
    assert needle in message, message
  return message


def _run(module: str, *flags: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", f"experiments.{module}", *flags], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)


# Class 3: vLLM result JSONs, each fault one line before any use.


def _fixture() -> dict:
  with open(FIXTURE, encoding="utf-8") as f:
    return json.load(f)


@pytest.mark.parametrize("change, needles", [
    (lambda r: r.update(itls=[g[0] for g in r["itls"]]), ["field itls[0]=", "a list"]),
    (lambda r: r["input_lens"].__setitem__(0, math.inf), ["input_lens[0]=inf"]),
    (lambda r: r["input_lens"].__setitem__(0, 1e30), ["input_lens[0]=1e+30", "10,000,000"]),
    (lambda r: r.update(completed=10**12), ["completed=1000000000000", "100,000"]),
    (lambda r: r["jaxroof_engine_run"]["server"]["config"].__setitem__("max_num_seqs", "32"),
     ["jaxroof_engine_run.server.config.max_num_seqs='32'"]),
])
def test_a_reported_result_fault_is_one_line_naming_the_field(tmp_path, change, needles):
  run = _fixture()
  run.setdefault("jaxroof_engine_run", {"server": {"config": {"max_num_seqs": 32}}})
  change(run)
  path = tmp_path / "r.json"
  path.write_text(json.dumps(run))
  with pytest.raises(InputError) as caught:
    vllm_results.read_runs([str(path)])
  _one_line(caught, f"from_vllm='{path}'", *needles)
  assert caught.value.field == "from_vllm"


def test_result_nesting_files_and_runs_are_bounded(tmp_path):
  deep = tmp_path / "deep.json"
  deep.write_text(json.dumps({**_fixture(), "x": [[[[[[[[[[1]]]]]]]]]]}))
  deeper = tmp_path / "deeper.jsonl"
  deeper.write_text(json.dumps(_fixture()) + "\n" + "[" * 100_000 + "]" * 100_000 + "\n")
  for path in (deep, deeper):
    with pytest.raises(InputError) as caught:
      vllm_results.read_runs([str(path)], field="heldout_vllm")
    _one_line(caught, "nested over")
  with pytest.raises(InputError) as caught:  # Refused before any file is opened.
    vllm_results.read_runs(["missing.json"] * (vllm_results.MAX_FILES + 1))
  _one_line(caught, "65 result files", "at most 64")
  many = tmp_path / "many.jsonl"
  many.write_text((json.dumps(_fixture()) + "\n") * (vllm_results.MAX_RUNS + 1))
  with pytest.raises(InputError) as caught:
    vllm_results.read_runs([str(many)])
  _one_line(caught, "more than 256 runs")


def test_every_shipped_run_is_still_read_and_a_rate_inf_run_is_all_at_once(tmp_path):
  [run] = vllm_results.read_runs([FIXTURE])
  assert len(run.prompt_tokens) == _fixture()["completed"]
  path = tmp_path / "inf.json"
  path.write_text(json.dumps({**_fixture(), "request_rate": "inf"}))
  [burst] = vllm_results.read_runs([str(path)])
  assert math.isinf(burst.request_rate) and burst.label == "inf.json:1 (all at once)"
  assert _finite.nonfinite_in(burst.label) is None
  assert vllm_result_schema.MAX_REQUESTS >= 10_000  # A real bench serve run fits.


# Class 1 and 5: measurements, per column; a row limit; a fit that is not finite.

HEADER = "model,accelerator,phase,batch,context,time_s\n"


@pytest.mark.parametrize("cells, needle", [
    ("llama-2-7b,a100-80gb,decode,1e30,1024,0.01", "line 2, column batch=1e30 is not allowed"),
    ("llama-2-7b,a100-80gb,decode,8," + "9" * 400 + ",0.01", "line 2, column context=9999999999"),
    ("llama-2-7b,a100-80gb,decode,8,1024,1e-300", "line 2, column time_s=1e-300 is not allowed"),
    ("llama-2-7b,a100-80gb,decode,8,1024,nan", "line 2, column time_s=nan is not allowed"),
    ("llama-2-7b,a100-80gb,decode,8.5,1024,0.01", "line 2, column batch=8.5 is not allowed"),
])
def test_a_bad_cell_is_one_line_naming_line_and_column(tmp_path, cells, needle):
  path = tmp_path / "m.csv"
  path.write_text(HEADER + cells + "\n")
  with pytest.raises(InputError) as caught:
    um.read_measurements(path)
  _one_line(caught, needle, "allowed")


def test_jsonl_rows_take_json_numbers_and_bounded_lines(tmp_path):
  row = {
      "model": "llama-2-7b", "accelerator": "a100-80gb", "phase": "decode", "batch": 8.0,
      "context": 1024, "time_s": 0.01
  }
  path = tmp_path / "m.jsonl"
  path.write_text(json.dumps(row) + "\n")
  [read] = um.read_measurements(path).rows
  assert read.batch == 8 and isinstance(read.batch, int)
  path.write_text(json.dumps({**row, "batch": "8"}) + "\n")
  with pytest.raises(InputError) as caught:
    um.read_measurements(path)
  _one_line(caught, "line 1, field batch='8' is not allowed")
  path.write_text(json.dumps(row) + "\n" + "[" * 100_000 + "]" * 100_000 + "\n")
  with pytest.raises(InputError) as caught:
    um.read_measurements(path)
  _one_line(caught, "line 2: not one JSON object")


def test_a_file_over_the_row_limit_is_refused_before_any_row_is_read(tmp_path):
  path = tmp_path / "m.csv"
  path.write_text(HEADER + "not,checked,at,all,so,fast\n" * (um.MAX_ROWS + 1))
  with pytest.raises(InputError) as caught:
    um.read_measurements(path)
  _one_line(caught, f"more than {um.MAX_ROWS:,} rows")


def test_the_edges_of_a_row_are_accepted():
  row = um.parse_row(
      "m.csv", 2, {
          "model": "llama-2-7b", "accelerator": "A100-80GB", "phase": "Decode", "batch": "1",
          "context": "1", "time_s": "1e-7"
      })
  assert (row.batch, row.context, row.time_s, row.accelerator) == (1, 1, 1e-7, "a100-80gb")
  top = um.parse_row(
      "m.csv", 3, {
          "model": "llama-2-7b", "accelerator": "a100-80gb", "phase": "prefill", "batch": str(
              um.MAX_BATCH), "prompt_tokens": str(um.MAX_TOKENS), "time_s": "1e5"
      })
  assert top.prompt_tokens == um.MAX_TOKENS and top.context is None


def test_decode_inputs_of_a_table_equal_those_of_each_row_alone():
  rows = [
      um.parse_row(
          "m.csv", i + 2, {
              "model": m, "accelerator": "a100-80gb", "phase": "decode", "batch": str(b),
              "context": str(c), "time_s": "0.01", "tp": str(tp)
          }) for i, (m, b, c, tp) in enumerate([("llama-2-7b", 1, 512,
                                                 1), ("llama-2-7b", 8, 512,
                                                      1), ("mixtral-8x7b", 8, 512,
                                                           2), ("llama-2-7b", 8, 2048,
                                                                1), ("mixtral-8x7b", 64, 512, 2)])
  ]
  together = um.decode_inputs(rows)
  for i, row in enumerate(rows):
    alone = um.decode_inputs([row])
    for name, values in alone.items():
      assert together[name][i] == pytest.approx(values[0], rel=1e-12), (name, i)


def _rows(times):
  return [
      um.parse_row(
          "m.csv", i + 2, {
              "model": "llama-2-7b", "accelerator": "a100-80gb", "phase": "decode", "batch": str(b),
              "context": "1024", "time_s": f"{t:.9g}"
          }) for i, (b, t) in enumerate(zip((1, 4, 16, 64), times))
  ]


def test_a_row_its_bound_makes_impossible_is_refused_naming_it():
  bound = row_fit.bound_rows(_rows([1.0] * 4))
  row_checks.refuse_impossible("m.csv", _rows(1.5 * bound))  # Ordinary rows pass.
  row_checks.refuse_impossible("m.csv", _rows(bound / row_checks.IMPOSSIBLY_FAST * 1.01))
  fast = 1.5 * bound
  fast[2] = bound[2] / 1000  # Line 4: a time in another unit, or not this model.
  with pytest.raises(InputError) as caught:
    row_checks.refuse_impossible("m.csv", _rows(fast))
  _one_line(caught, "m.csv line 4, column time_s=", "1,000x faster than its analytic bound")
  slow = 1.5 * bound
  slow[1] = bound[1] * 1000
  with pytest.raises(InputError) as caught:
    row_checks.refuse_impossible("m.csv", _rows(slow))
  _one_line(caught, "m.csv line 3, column time_s=", "1,000x slower")


def test_a_fit_that_is_not_finite_names_the_rows_that_drove_it(monkeypatch):
  rows = _rows(1.5 * row_fit.bound_rows(_rows([1.0] * 4)))
  result = {
      "factors": {"eta_w": 0.5}, "rows": [{"line": r.line, "calibrated_s": 0.1} for r in rows]
  }
  assert row_checks.finite_result("m.csv", rows, result) is result
  result["rows"][2]["calibrated_s"] = math.nan
  result["factors"]["eta_w"] = math.nan
  with pytest.raises(NonFiniteResult) as caught:
    row_checks.finite_result("m.csv", rows, result)
  _one_line(caught, "factors.eta_w = nan", "line 4", "nothing was written")
  # Through the fit: factors that come out nan are refused, not written.
  nan_fit = row_fit.UserFit(factors={n: math.nan for n in row_fit.ALL_FACTORS}, free=("eta_w",),
                            fixed={}, flags=(), loss=math.nan, rows=4)
  monkeypatch.setattr(row_fit, "fit_rows", lambda rows, **kw: nan_fit)
  measured = um.Measurements(path="m.csv", rows=tuple(rows), engine="")
  with pytest.raises(NonFiniteResult) as caught:
    user_fit.calibrate(measured)
  _one_line(caught, "m.csv: the fit gives", "line")


def test_the_issue_example_gives_one_line_and_writes_nothing(tmp_path):
  with open(FIVE_ROWS, encoding="utf-8") as f:
    text = f.read()
  bad = tmp_path / "t.csv"
  bad.write_text(text.replace("0.0149", "1e-300", 1))
  profile = tmp_path / "p.json"
  proc = _run("calibrate", f"--from_csv={bad}", f"--profile_out={profile}")
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr
  assert "line 4, column time_s=1e-300 is not allowed" in lines[0]
  assert sorted(os.listdir(tmp_path)) == ["t.csv"]


# Class 6: outputs checked first, written all or none.


def test_a_plot_and_its_kv_sibling_are_written_all_or_none(tmp_path, monkeypatch):
  from jaxroof.report import simulate_lines
  from jaxroof.report import simulation

  def broken(*args, **kw):
    raise OSError("disk full")

  monkeypatch.setattr(simulation, "plot_cdfs", lambda series, path, title: open(path, "w").close())
  monkeypatch.setattr(simulation, "plot_kv_over_time", broken)
  run = type("Run", (),
             {"first_token_s": np.ones(2), "arrival_s": np.zeros(2), "itl_s": np.ones(2)})()
  with pytest.raises(InputError, match="sim_kv.png' cannot be written: disk full"):
    simulate_lines.plot_run(run, 10, "vllm", str(tmp_path / "sim.png"), "x")
  assert os.listdir(tmp_path) == []  # Neither the CDFs nor a temporary file.
  monkeypatch.setattr(simulation, "plot_kv_over_time",
                      lambda run, pages, path, title: open(path, "w").close())
  simulate_lines.plot_run(run, 10, "vllm", str(tmp_path / "sim.svg"), "x")
  assert sorted(os.listdir(tmp_path)) == ["sim.svg", "sim_kv.svg"]


@pytest.mark.parametrize("make, needle", [
    (lambda tmp: (tmp / "file").write_text("x") and tmp / "file", "is a file: give a folder"),
    (lambda tmp:
     (tmp / "file").write_text("x") and tmp / "file" / "sub", "is a file, not a folder"),
])
def test_report_refuses_a_bad_out_dir_before_any_work(tmp_path, make, needle):
  out = make(tmp_path)
  proc = _run("report", f"--out_dir={out}")
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
  assert lines[0].startswith(f"error: --out_dir='{out}'") and needle in lines[0]


def test_simulate_checks_the_plot_siblings_first(tmp_path):
  (tmp_path / "sim_kv.png").mkdir()
  proc = _run("simulate", "--model=llama-3-8b", "--accelerator=h100-sxm", "--context=2048",
              f"--plot_out={tmp_path / 'sim.png'}", "--num_requests=10")
  assert proc.returncode == 2 and "sim_kv.png' is a folder" in proc.stderr
  assert sorted(os.listdir(tmp_path)) == ["sim_kv.png"]


# Strict JSON: no result with nan or inf exits 0.


def test_strict_json_is_on_and_the_undefined_rate_limit_is_null(tmp_path):
  from jaxroof.symbolic.sweep import sweep
  assert _finite.STRICT_JSON
  assert _finite.nonfinite_in("run.json:1 (rate inf)") is not None  # No exemption left.
  prof = profiles.Profile(
      device_kind="t", platform="", backend="xla", dtype="float32", jax_version="0", created="",
      ceilings={}, factors={
          "eta_w": 0.5, "eta_kv": 0.5, "eta_f": 1.0, "t0_step": 1e-6, "t0_layer": 1e-9, "r_ovl": 1.0
      }, fit={})
  result = sweep(profiles.step_model(prof), [1, 32], N=7e9, q=2.0, T=1024, k=5e5, BW=2e12)
  assert result["summary"]["rate_limit_tokens_per_s"] is None
  assert files.nonfinite_at(result) is None
  with_f = sweep(profiles.step_model(prof), [1, 32], N=7e9, q=2.0, T=1024, k=5e5, BW=2e12, F=3e14)
  assert with_f["summary"]["rate_limit_tokens_per_s"] > 0


# Classes 7 and 8: held terms, cost-term files, profiles.


@pytest.mark.parametrize("text, needle", [
    ("eta_w=0", "eta_w=0 is outside its bounds (0, 1]"),
    ("eta_kv=0", "eta_kv=0 is outside its bounds (0, 1]"),
    ("t0_step=-1", "t0_step=-1 is outside its bounds [0, 10]"),
    ("t0_request=inf", "t0_request=inf is outside"),
    ("eta_f=nan", "eta_f=nan is outside"),
])
def test_a_held_term_out_of_its_bounds_is_one_line(text, needle):
  with pytest.raises(InputError) as caught:
    terms.parse(text)
  _one_line(caught, needle)


@pytest.mark.parametrize("doc, needle", [
    ({"eta_w": 0}, "field eta_w=0 is not allowed: a finite number > 0 and <= 1"),
    ({"t0_step": -1e-3}, "field t0_step=-0.001 is not allowed"),
    ({"terms": {"eta_kv": "fast"}}, "field terms.eta_kv='fast' is not allowed"),
    ({"kind": "engine_calibration", "factors": [1]}, "field factors=[1] is not allowed"),
    ({"kind": "engine_calibration", "factors": {"eta_w": 0.5}, "fixed": {"m_pass": -1}
     }, "field fixed.m_pass=-1 is not allowed"),
    ({"kind": "engine_calibration"}, "lacks factors"),
    ({"eta_q": 0.5}, "field eta_q=0.5 is not allowed: not a known field"),
])
def test_a_cost_term_file_names_the_term_the_value_and_the_bounds(tmp_path, doc, needle):
  path = tmp_path / "fit.json"
  path.write_text(json.dumps(doc))
  with pytest.raises(InputError) as caught:
    engine_terms_schema.load("engine_terms", path)
  _one_line(caught, f"engine_terms='{path}'", needle)


def test_shipped_fits_and_profiles_pass_and_a_bad_profile_is_named(tmp_path):
  for name in ("calibration_pass5_predicts_pass6_engine_kernels.json",):
    engine_terms_schema.load("engine_terms", os.path.join(DATA, "vllm_cpu", name))
  shipped = os.path.join(ROOT, "results", "profile_cpu.json")
  with open(shipped, encoding="utf-8") as f:
    data = json.load(f)
  profiles.load_profile(shipped)
  assert profile_schema.VERSION == profiles.VERSION
  assert profile_schema.MAX_BYTES == profiles.MAX_PROFILE_BYTES
  for change, needle in (
      (lambda d: d["model"]["configs"]["calibration"].update(width=10**30),
       "model.configs.calibration.width=1000000000000000000000000000000"),
      (lambda d: d["model"]["configs"]["calibration"].update(width=60_000, mlp_dim=200_000),
       "width x mlp_dim x num_blocks must be at most"),
      (lambda d: d["ceilings"].update(bandwidth_Bps=1e30), "ceilings.bandwidth_Bps=1e+30"),
      (lambda d: d["fit"].update(heldout_points="14"), "fit.heldout_points='14'"),
  ):
    bad = copy.deepcopy(data)
    change(bad)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(InputError) as caught:
      profiles.load_profile(path)
    _one_line(caught, f"profile='{path}'", needle)
