"""Calibration from users' measurements: reading, fitting, hold-out, refusals."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from jaxroof import errors
from jaxroof.measure import profiles
from jaxroof.calibrate import row_fit
from jaxroof.calibrate import user_fit
from jaxroof.measure import user_measurements as um
from jaxroof.measure import vllm_results

DATA = pathlib.Path(__file__).parent / "data"
ROOT = pathlib.Path(__file__).parent.parent
HEADER = "model,accelerator,phase,batch,context,prompt_tokens,time_s,weight_dtype,kv_dtype,tp\n"


def _rows(records):
  return [um.parse_row("synthetic", i + 2, r) for i, r in enumerate(records)]


def _synthetic_records():
  """A grid on one device: 3 models, decode at several batches and contexts,
  prefill at several prompt lengths."""
  records = []
  for model in ("llama-2-7b", "llama-3-8b", "mistral-7b"):
    for batch in (1, 8, 64, 256):
      for context in (256, 4096):
        records.append({
            "model": model, "accelerator": "h100-sxm", "phase": "decode", "batch": batch,
            "context": context, "time_s": 1.0
        })
    for prompt in (128, 1024, 4096):
      records.append({
          "model": model, "accelerator": "h100-sxm", "phase": "prefill", "batch": 1,
          "prompt_tokens": prompt, "time_s": 1.0
      })
  return records


@pytest.mark.slow
def test_recovers_known_factors_from_noisy_synthetic_rows():
  truth = {
      "eta_w": 0.7, "eta_kv": 0.55, "eta_f": 0.45, "eta_f_prefill": 0.6, "t0_step": 3e-4,
      "t0_layer": 0.0, "r_ovl": 1.0
  }
  rows = _rows(_synthetic_records())
  clean = row_fit.predict_rows(rows, truth)
  noise = np.random.default_rng(0).lognormal(0.0, 0.02, size=clean.size)
  records = [dict(r, time_s=float(t)) for r, t in zip(_synthetic_records(), clean * noise)]
  fit = row_fit.fit_rows(_rows(records), steps=2000)
  assert {"eta_w", "eta_kv", "eta_f_prefill"} <= set(fit.free)
  for name in fit.free:
    if name in row_fit.EFFICIENCIES:
      assert fit.factors[name] == pytest.approx(truth[name], rel=0.1), name
  for name in set(row_fit.ALL_FACTORS) - set(fit.free):
    assert fit.fixed[name]  # Every fixed factor says why.
  predicted = row_fit.predict_rows(_rows(records), fit.factors)
  assert np.median(np.abs(predicted / clean - 1)) < 0.05


def test_heldout_rows_never_enter_the_fit(monkeypatch):
  seen = []

  def recording_fit(rows, **kw):
    seen.append([(r.model, r.line) for r in rows])
    factors = dict(row_fit.FIXED_VALUES)
    return row_fit.UserFit(factors=factors, free=(), fixed={}, flags=(), loss=0.0, rows=len(rows))

  monkeypatch.setattr(row_fit, "fit_rows", recording_fit)
  rows = _rows(_synthetic_records())
  result = user_fit.heldout_by_model(rows)
  models = sorted({r.model for r in rows})
  assert [f["heldout_model"] for f in result["folds"]] == models
  for fold, train in zip(result["folds"], seen):
    assert all(model != fold["heldout_model"] for model, _ in train)
    assert not set(fold["heldout_lines"]) & {line for _, line in train}
  # Every row is predicted exactly once, by a fit that never saw its model.
  assert sorted(r["line"] for r in result["rows"]) == sorted(r.line for r in rows)


def test_user_profile_round_trip_and_old_profiles(tmp_path):
  prof = profiles.Profile(
      device_kind="NVIDIA H200", platform="", backend="TensorRT-LLM", dtype="fp8", jax_version="0",
      created="2026-01-01T00:00:00+00:00", ceilings={}, factors={
          "eta_w": 0.5, "eta_kv": 0.6, "eta_f": 0.4, "t0_step": 1e-4, "t0_layer": 1e-6, "r_ovl": 1.0
      }, fit={"heldout_median_rel_error": 0.2, "heldout_max_rel_error": 0.5}, accelerator="h200",
      source={
          "file": "x.csv", "engine": "TensorRT-LLM", "date": "2026-01-01", "rows_used": [2, 3, 4]
      }, prefill_factors={"eta_f_prefill": 0.3})
  path = tmp_path / "p.json"
  profiles.save_profile(prof, path)
  back = profiles.load_profile(path)
  assert back == dataclasses_replace_path(prof, str(path))
  data = json.loads(path.read_text())
  assert data["version"] == profiles.VERSION == 3
  for key in ("accelerator", "source", "prefill_factors"):
    del data[key]
  data["version"] = 1
  data["dtype"] = "float32"  # Version 1 held toy profiles only, measured in a JAX dtype.
  old = profiles.Profile.from_json(data)
  assert old.accelerator is None and old.source == {} and old.factors == prof.factors
  data["version"] = profiles.VERSION + 1
  with pytest.raises(errors.InputError, match="version"):
    profiles.Profile.from_json(data)


def dataclasses_replace_path(prof, path):
  import dataclasses  # pylint: disable=import-outside-toplevel
  return dataclasses.replace(prof, path=path)


def test_profile_applies_to_its_own_device_kind_only():
  factors = dict(row_fit.FIXED_VALUES)
  del factors["eta_f_prefill"]
  user = profiles.Profile(device_kind="NVIDIA H200", platform="", backend="", dtype="fp8",
                          jax_version="0", created="", ceilings={}, factors=factors, fit={},
                          accelerator="h200")
  assert profiles.check_applies(user, "h200") == []
  with pytest.raises(errors.InputError, match="what_if"):
    profiles.check_applies(user, "h100-sxm")
  assert "what-if" in profiles.check_applies(user, "h100-sxm", what_if=True)[0]
  toy = profiles.Profile(device_kind="NVIDIA H100 80GB HBM3", platform="gpu", backend="xla",
                         dtype="bfloat16", jax_version="0", created="", ceilings={},
                         factors=factors, fit={})
  assert profiles.check_applies(toy, "h100-sxm") == []
  cpu = profiles.Profile(**{**toy.__dict__, "device_kind": "cpu"})
  with pytest.raises(errors.InputError, match="'cpu'"):
    profiles.check_applies(cpu, "h100-sxm")


@pytest.mark.parametrize("row, where", [
    ("llama-9-9b,h200,decode,8,1024,,0.01,fp8,fp8,1", "line 2, column model\\b"),
    ("llama-2-7b,h200,decode,8,1024,,0,fp8,fp8,1", "line 2, column time_s\\b"),
    ("llama-2-7b,h200,decode,8,1024,,-0.5,fp8,fp8,1", "line 2, column time_s\\b"),
    ("llama-2-7b,h200,decode,8,0,,0.01,fp8,fp8,1", "line 2, column context\\b"),
    ("llama-2-7b,h200,decode,8,,,0.01,fp8,fp8,1", "line 2, column context\\b"),
    ("llama-2-7b,h200,prefill,1,,,0.01,fp8,fp8,1", "line 2, column prompt_tokens\\b"),
    ("llama-2-7b,h200,train,8,1024,,0.01,fp8,fp8,1", "line 2, column phase\\b"),
    ("llama-2-7b,h999,decode,8,1024,,0.01,fp8,fp8,1", "line 2, column accelerator\\b"),
    ("llama-2-7b,h200,decode,8,1024,,0.01,fp8,unknown,1", "line 2, column kv_dtype\\b"),
    ("llama-2-7b,h200,decode,8,1024,,0.01,fp8,fp8,0", "line 2, column tp\\b"),
])
def test_bad_rows_are_refused_naming_line_and_column(tmp_path, row, where):
  path = tmp_path / "m.csv"
  path.write_text(HEADER + row + "\n")
  with pytest.raises(errors.InputError, match=where):
    um.read_measurements(path)


def test_jsonl_rows_are_read_and_checked(tmp_path):
  path = tmp_path / "m.jsonl"
  good = {
      "model": "llama-2-7b", "accelerator": "h200", "phase": "decode", "batch": 8, "context": 1024,
      "time_s": 0.01
  }
  path.write_text(json.dumps(good) + "\n\n" + json.dumps(dict(good, batch=2.5)) + "\n")
  with pytest.raises(errors.InputError, match="line 3, field batch=2.5 is not allowed"):
    um.read_measurements(path)
  path.write_text(json.dumps(good) + "\n")
  [row] = um.read_measurements(path).rows
  assert row.kv_dtype == "bf16" and row.weight_dtype == "bf16" and row.tp == 1


def test_mixed_devices_need_an_accelerator(tmp_path):
  path = tmp_path / "m.csv"
  path.write_text(HEADER + "llama-2-7b,h200,decode,8,1024,,0.01,fp8,fp8,1\n"
                  "llama-2-7b,h100-sxm,decode,8,1024,,0.02,fp8,fp8,1\n")
  with pytest.raises(errors.InputError, match="line 3.*mixes devices.*accelerator=SLUG"):
    um.read_measurements(path)
  assert len(um.read_measurements(path, accelerator="h100-sxm").rows) == 1


def test_too_few_rows_or_models_are_refused():
  rows = _rows(_synthetic_records())
  with pytest.raises(errors.InputError, match=f"at least {row_fit.MIN_ROWS}"):
    row_fit.fit_rows(rows[:row_fit.MIN_ROWS - 1])
  one_model = [r for r in rows if r.model == "llama-2-7b"]
  with pytest.raises(errors.InputError, match=f"at least {user_fit.MIN_MODELS} models"):
    user_fit.heldout_by_model(one_model)


def test_tp_splits_per_chip_traffic():
  one, two = _rows([{
      "model": "llama-2-70b", "accelerator": "h200", "phase": "decode", "batch": 8, "context": 1024,
      "time_s": 0.02, "tp": tp
  } for tp in (1, 2)])
  a, b = um.decode_inputs([one]), um.decode_inputs([two])
  for name in ("N", "N_act", "k"):
    assert b[name][0] == pytest.approx(a[name][0] / 2)
  assert row_fit.bound_rows([two])[0] == pytest.approx(row_fit.bound_rows([one])[0] / 2)


def test_vllm_result_maps_to_the_in_flight_batch():
  # VLLM_FORMAT.md §3 (research notes): from the per-request arrays of this run,
  # mean in flight = sum(latency) / duration = 5.1, mean lengths ~213 in / 213 out.
  path = DATA / "vllm_llama-3.3-70b_8xa100-40gb_tp8_sharegpt_qps_01.json"
  measured = vllm_results.read_results([str(path)], model="llama-3.1-70b", accelerator="a100-40gb",
                                       tp=8)
  [row] = measured.rows
  assert row.batch == 5 and row.context == pytest.approx(213 + 213 / 2, abs=2)
  assert row.time_s == pytest.approx(0.02431, rel=1e-3)  # median_itl_ms in the file
  assert "vLLM" in measured.engine and "not the continuous-batching simulator" in row.source


def test_vllm_file_of_another_kind_is_refused(tmp_path):
  path = tmp_path / "x.json"
  path.write_text(json.dumps({"hello": 1}))
  with pytest.raises(errors.InputError, match="not a vLLM"):
    vllm_results.read_results([str(path)], model="llama-2-7b", accelerator="h200")


def test_cli_refuses_mixed_devices_without_accelerator(tmp_path):
  path = tmp_path / "m.csv"
  path.write_text(HEADER + "llama-2-7b,h200,decode,8,1024,,0.01,fp8,fp8,1\n"
                  "llama-2-7b,h100-sxm,decode,8,1024,,0.02,fp8,fp8,1\n")
  proc = subprocess.run([sys.executable, "-m", "experiments.calibrate", f"--from_csv={path}"],
                        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
  assert proc.returncode == 2 and "mixes devices" in proc.stderr and "accelerator" in proc.stderr
  assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_cli_fits_the_shipped_trtllm_rows(tmp_path):
  profile, out = tmp_path / "p.json", tmp_path / "r.json"
  proc = subprocess.run([
      sys.executable, "-m", "experiments.calibrate",
      f"--from_csv={DATA / 'trtllm_0.9.0_steps.csv'}", "--accelerator=a100-80gb",
      f"--profile_out={profile}", f"--json_out={out}", "--fit_steps=500"
  ], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr
  result = json.loads(out.read_text())
  for key in ("heldout_median_rel_error", "heldout_max_rel_error", "factors", "rows_used",
              "bound_heldout_median_rel_error"):
    assert key in result
  assert all(0 < result["factors"][n] <= 1 for n in row_fit.EFFICIENCIES)
  prof = profiles.load_profile(profile)
  assert prof.accelerator == "a100-80gb" and prof.source["engine"] == "TensorRT-LLM"


@pytest.mark.slow
def test_batch_sweep_applies_a_user_profile_to_its_own_device_only(tmp_path):
  factors = {
      "eta_w": 0.5, "eta_kv": 0.5, "eta_f": 0.5, "t0_step": 1e-4, "t0_layer": 1e-6, "r_ovl": 1.0
  }
  prof = profiles.Profile(device_kind="NVIDIA H200", platform="", backend="TensorRT-LLM",
                          dtype="fp8", jax_version="0", created="", ceilings={}, factors=factors,
                          fit={"heldout_median_rel_error": 0.2,
                               "heldout_max_rel_error": 0.5}, accelerator="h200")
  path, out = tmp_path / "p.json", tmp_path / "s.json"
  profiles.save_profile(prof, path)

  def sweep(accelerator, *extra):
    return subprocess.run([
        sys.executable, "-m", "experiments.batch_sweep", "--model=llama-2-7b",
        f"--accelerator={accelerator}", "--context=1024", "--batch_sizes=1,8", f"--profile={path}",
        f"--json_out={out}", *extra
    ], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)

  proc = sweep("h200")
  assert proc.returncode == 0, proc.stderr
  assert json.loads(out.read_text())["kind"] == "calibrated"
  proc = sweep("h100-sxm")
  assert proc.returncode != 0 and "--what_if" in proc.stderr
  assert "Traceback" not in proc.stderr
  proc = sweep("h100-sxm", "--what_if")
  assert proc.returncode == 0, proc.stderr


def test_sglang_jsonl_runs_map_by_littles_law(tmp_path):
  # Keys of sglang.bench_serving's JSONL (VLLM_FORMAT.md §4); one run per line.
  run = {
      "backend": "sglang", "dataset_name": "random", "request_rate": 4.0, "max_concurrency": None,
      "duration": 50.0, "completed": 200, "total_input_tokens": 200 * 1000,
      "total_output_tokens": 200 * 300, "mean_e2e_latency_ms": 6000.0, "mean_ttft_ms": 100.0,
      "mean_tpot_ms": 20.0, "median_itl_ms": 19.0, "concurrency": 23.9
  }
  path = tmp_path / "sglang.jsonl"
  path.write_text(json.dumps(run) + "\n" + json.dumps(dict(run, max_concurrency=8)) + "\n")
  first, capped = vllm_results.read_results([str(path)], model="llama-3-8b",
                                            accelerator="h100-sxm").rows
  assert first.batch == 24  # 200 requests / 50 s x 6 s in flight each.
  assert first.context == 1150 and first.time_s == pytest.approx(0.019)
  assert capped.batch == 8 and capped.line == 2


# --- One model's rows ---

SINGLE_TRUTH = {
    "eta_w": 0.7, "eta_kv": 0.55, "eta_f": 0.45, "eta_f_prefill": 0.6, "t0_step": 3e-4,
    "t0_layer": 1e-9, "r_ovl": 1.0, "eta_comm": 0.5
}


def _single_model_records():
  """llama-2-7b on h100-sxm: decode over batch x context, prefill over prompts."""
  records = [{
      "model": "llama-2-7b", "accelerator": "h100-sxm", "phase": "decode", "batch": b, "context": c,
      "time_s": 1.0
  } for b in (1, 4, 16, 64, 256) for c in (512, 4096)]
  records += [{
      "model": "llama-2-7b", "accelerator": "h100-sxm", "phase": "prefill", "batch": 1,
      "prompt_tokens": p, "time_s": 1.0
  } for p in (128, 1024, 4096)]
  return records


def _write_csv(path, records):
  columns = ("model", "accelerator", "phase", "batch", "context", "prompt_tokens", "time_s")
  lines = [",".join(columns)] + [",".join(str(r.get(c, "")) for c in columns) for r in records]
  path.write_text("\n".join(lines) + "\n")


def test_row_folds_hold_each_row_out_once_and_span_the_grid():
  rows = _rows(_single_model_records())
  folds = user_fit.row_folds(rows)
  assert sorted(set(folds)) == list(range(user_fit.MAX_FOLDS))
  decode = [(r.batch * r.context, f) for r, f in zip(rows, folds) if r.phase == "decode"]
  smallest = min(decode)[1]
  # The folds are dealt in size order: the smallest and largest decode steps differ.
  assert smallest != max(decode)[1]
  assert sorted(user_fit.row_folds(rows[:4])) == [0, 1, 2, 3]  # Few rows: leave-one-out.


@pytest.mark.slow
def test_single_model_rows_recover_known_factors_and_predict_heldout_rows(tmp_path):
  sigma = 0.02
  clean = row_fit.predict_rows(_rows(_single_model_records()), SINGLE_TRUTH)
  noise = np.random.default_rng(1).lognormal(0.0, sigma, size=clean.size)
  path = tmp_path / "one_model.csv"
  _write_csv(path,
             [dict(r, time_s=f"{t:.9g}") for r, t in zip(_single_model_records(), clean * noise)])
  prof, result = user_fit.calibrate(um.read_measurements(path), steps=2000)
  assert result["heldout_by"] == "rows" and prof.heldout_by == "rows"
  assert {f"fold {k} of {user_fit.MAX_FOLDS}" for k in range(1, 6)
         } == {f["heldout"] for f in result["folds"]}
  # Every row held out exactly once, by a fit that never saw it.
  assert sorted(r["line"] for r in result["heldout_rows"]) == list(range(2, 2 + clean.size))
  for fold in result["folds"]:
    assert not set(fold["heldout_lines"]) & set(fold["trained_on_lines"])
  assert {"eta_w", "eta_kv"} <= set(result["free_factors"])
  for name in result["free_factors"]:
    if name in row_fit.EFFICIENCIES:
      assert result["factors"][name] == pytest.approx(SINGLE_TRUTH[name], rel=0.1), name
  # Held-out rows within the added noise (lognormal, sigma 2%): median under 2 sigma.
  assert result["heldout_median_rel_error"] < 2 * sigma
  assert result["heldout_max_rel_error"] < 5 * sigma
  assert any("carry-over" in w for w in result["warnings"])
  assert result["suspicious_rows"] == []
  # The largest steps, predicted by a fit on the smaller ones, also within the noise.
  larger = result["extrapolation"]
  assert len(larger["heldout_lines"]) >= 2
  assert larger["calibrated"]["max_rel_error"] < 5 * sigma
  assert prof.fit["heldout_median_rel_error"] == result["heldout_median_rel_error"]


def test_a_row_faster_than_the_bound_is_flagged_with_its_line(tmp_path):
  records = [dict(r, time_s=1.0) for r in _single_model_records()]
  rows = _rows(records)
  bound = row_fit.bound_rows(rows)
  times = 1.5 * bound
  times[3] = 0.8 * bound[3]  # File line 5 (header is line 1): faster than its bound.
  times[7] = 25.0 * bound[7]  # File line 9: more than 20x slower.
  path = tmp_path / "m.csv"
  _write_csv(path, [dict(r, time_s=f"{t:.9g}") for r, t in zip(records, times)])
  measured = um.read_measurements(path)
  flagged = user_fit.suspicious_rows(measured.rows)
  assert [(f["line"], round(f["ratio_to_bound"], 3)) for f in flagged] == [(5, 0.8), (9, 25.0)]
  assert "faster" in flagged[0]["reason"] and "slower" in flagged[1]["reason"]


def test_suspicious_rows_are_kept_with_a_warning_or_dropped(monkeypatch, tmp_path):
  monkeypatch.setattr(row_fit, "fit_rows", _fixed_fit)
  records = [dict(r, time_s=1.0) for r in _single_model_records()]
  bound = row_fit.bound_rows(_rows(records))
  times = 1.5 * bound
  times[3] = 0.8 * bound[3]
  path = tmp_path / "m.csv"
  _write_csv(path, [dict(r, time_s=f"{t:.9g}") for r, t in zip(records, times)])
  measured = um.read_measurements(path)
  _, kept = user_fit.calibrate(measured)
  assert [f["line"] for f in kept["suspicious_rows"]] == [5]
  assert not kept["suspicious_rows"][0]["dropped"] and kept["rows_used"] == len(records)
  assert any("line 5" in w and "kept" in w for w in kept["warnings"])
  assert 5 in [r["line"] for r in kept["heldout_rows"]]
  prof, dropped = user_fit.calibrate(measured, drop_suspicious=True)
  assert dropped["suspicious_rows"][0]["dropped"] and dropped["rows_used"] == len(records) - 1
  assert 5 not in [r["line"] for r in dropped["heldout_rows"] + dropped["training_rows"]]
  assert prof.source["rows_dropped"] == [5]


def _fixed_fit(rows, **kw):
  del kw
  return row_fit.UserFit(factors=dict(SINGLE_TRUTH), free=(), fixed={}, flags=(), loss=0.0,
                         rows=len(rows))


def test_several_models_are_still_held_out_by_model(monkeypatch, tmp_path):
  monkeypatch.setattr(row_fit, "fit_rows", _fixed_fit)
  path = tmp_path / "m.csv"
  records = _synthetic_records()
  rows = _rows(records)
  times = 1.5 * row_fit.bound_rows(rows)
  _write_csv(path, [dict(r, time_s=f"{t:.9g}") for r, t in zip(records, times)])
  prof, result = user_fit.calibrate(um.read_measurements(path))
  assert result["heldout_by"] == "model" == prof.heldout_by
  assert [f["heldout_model"] for f in result["folds"]] == sorted({r.model for r in rows})
  assert not any("carry-over" in w for w in result["warnings"])


def _hand_bound_s(batch, context):
  """Llama-2-7B on an A100-80GB (bf16), by hand: a lower estimate of the memory time.

  Weights: 32 blocks x (4 x 4096^2 attention + 3 x 4096 x 11008 MLP) = 6.48e9
  (the embedding and output projection left out, so this is below the model's
  bound), 2 bytes each; K/V: 2 (K and V) x 32 layers x 4096 x 2 bytes = 524,288 B
  per token; bandwidth 2.039 TB/s (NVIDIA A100 datasheet, 80 GB SXM).
  """
  weights = 32 * (4 * 4096**2 + 3 * 4096 * 11008) * 2
  kv_per_token = 2 * 32 * 4096 * 2
  return (weights + batch * context * kv_per_token) / 2.039e12


@pytest.mark.slow
def test_cli_fits_the_issue_users_five_points_and_flags_the_fast_rows(tmp_path):
  path = DATA / "user_llama2_7b_a100_5pts.csv"
  # Independently: lines 5 (B 64, 1024) and 6 (B 16, 2048) beat even a lower estimate of
  # the memory time; the others do not.
  assert 0.0225 < _hand_bound_s(64, 1024) and 0.0136 < _hand_bound_s(16, 2048)
  assert all(t > _hand_bound_s(b, c)
             for b, c, t in ((1, 512, 0.0078), (8, 512, 0.0094), (32, 1024, 0.0149)))
  profile, out = tmp_path / "p.json", tmp_path / "r.json"
  proc = subprocess.run([
      sys.executable, "-m", "experiments.calibrate", f"--from_csv={path}",
      f"--profile_out={profile}", f"--json_out={out}", "--fit_steps=500"
  ], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr
  result = json.loads(out.read_text())
  assert result["heldout_by"] == "rows" and result["heldout_median_rel_error"] > 0
  assert [f["line"] for f in result["suspicious_rows"]] == [5, 6]
  for f in result["suspicious_rows"]:
    assert f["ratio_to_bound"] < 1 and "faster" in f["reason"]
  assert any("carry-over" in w for w in result["warnings"])
  assert "line 5" in proc.stdout and "line 6" in proc.stdout
  prof = profiles.load_profile(profile)
  assert prof.heldout_by == "rows" and prof.heldout_median_rel_error is not None
  assert prof.bound_heldout_median_rel_error is not None
