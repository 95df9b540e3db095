"""The foundation's experiments as a user runs them (subprocesses)."""

import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(module, *flags):
  return subprocess.run([sys.executable, "-m", f"experiments.{module}", *flags], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)


def test_batch_sweep_json_and_plot(tmp_path):
  out, png = tmp_path / "s.json", tmp_path / "s.png"
  proc = run("batch_sweep", "--batch_sizes=1,8,32", "--tflops=600", f"--json_out={out}",
             f"--plot_out={png}")
  assert proc.returncode == 0, proc.stderr
  data = json.loads(out.read_text())
  assert data["kind"] == "bound"
  assert {"inputs", "units", "rows", "summary"} <= set(data)
  by_batch = {r["batch"]: r for r in data["rows"]}
  assert by_batch[32]["step_s"] == pytest.approx(0.012)  # The lesson's figure.
  assert data["summary"]["weight_kv_crossover_batch"] == pytest.approx(64)
  assert png.read_bytes()[:4] == b"\x89PNG"
  assert "memory" in proc.stdout and "crossover" in proc.stdout


def test_batch_sweep_from_kv_per_token_and_context(tmp_path):
  out = tmp_path / "s.json"
  proc = run("batch_sweep", "--kv_bytes_per_token=131072", "--context=4096", "--batch_sizes=1",
             f"--json_out={out}")
  assert proc.returncode == 0, proc.stderr
  row = json.loads(out.read_text())["rows"][0]
  assert row["kv_bytes"] == 131072 * 4096
  assert row["compute_s"] is None


@pytest.mark.parametrize("flag, needle", [
    ("--batch_sizes=0,4", "--batch_sizes"),
    ("--batch_sizes=", "--batch_sizes"),
    ("--batch_sizes=two", "--batch_sizes"),
    ("--bandwidth_tbps=0", "--bandwidth_tbps"),
    ("--tflops=-5", "--tflops"),
    ("--bytes_per_weight=abc", "--bytes_per_weight"),
    ("--context=100", "--kv_bytes_per_token"),
])
def test_batch_sweep_bad_input_is_one_line(tmp_path, flag, needle):
  out = tmp_path / "s.json"
  proc = run("batch_sweep", flag, f"--json_out={out}")
  assert proc.returncode != 0
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("error:")
  assert "Traceback" not in proc.stderr
  assert not out.exists()


def test_lesson_exits_zero_and_writes_claims(tmp_path):
  out = tmp_path / "l.json"
  proc = run("lesson", f"--json_out={out}")
  assert proc.returncode == 0, proc.stdout + proc.stderr
  claims = json.loads(out.read_text())
  assert claims and all(
      {"claim", "expected", "computed", "unit", "agrees"} <= set(c) for c in claims)
  assert all(c["agrees"] for c in claims)


def test_crossovers_json_has_expressions_and_latex(tmp_path):
  out = tmp_path / "c.json"
  proc = run("crossovers", f"--json_out={out}")
  assert proc.returncode == 0, proc.stderr
  items = {q["name"]: q for q in json.loads(out.read_text())["quantities"]}
  assert items["weight_kv_crossover_batch"]["expression"] == "N*q/(T*k)"
  assert items["weight_kv_crossover_batch"]["latex"] == r"\frac{N q}{T k}"
  assert items["weight_kv_crossover_batch"]["value"] == pytest.approx(64)
  assert items["memory_limit_rate"]["value"] == pytest.approx(8000)
  bad = run("crossovers", "--values=Z=1")
  assert bad.returncode == 2 and "Known:" in bad.stderr


def test_crossovers_for_a_real_model_agree_with_the_sweep_and_filter(tmp_path):
  """llama-3-8b on h100-sxm at 8k: the closed-form weight/KV crossover equals
  the one batch_sweep solves numerically (N barely moves with B: embedding
  rows); --only prints just the named ones; t_queue=0 and t_window=0 are
  allowed and leave TTFT = prefill."""
  from jaxroof.specs import step_inputs
  out = tmp_path / "c.json"
  proc = run("crossovers", "--model=llama-3-8b", "--accelerator=h100-sxm", "--context=8192",
             "--only=weight_kv_crossover_batch,time_to_first_token,prefill_time",
             "--values=t_queue=0,t_window=0", f"--json_out={out}")
  assert proc.returncode == 0, proc.stderr
  document = json.loads(out.read_text())
  items = {q["name"]: q for q in document["quantities"]}
  assert set(items) == {"weight_kv_crossover_batch", "time_to_first_token", "prefill_time"}
  solved = step_inputs.crossover_batches(step_inputs.load_model("llama-3-8b"),
                                         step_inputs.load_accelerator("h100-sxm"), context=8192)
  assert items["weight_kv_crossover_batch"]["value"] == pytest.approx(
      solved.weight_kv_crossover_batch, rel=1e-3)
  assert items["time_to_first_token"]["value"] == items["prefill_time"]["value"]
  assert document["inputs"]["model"] == "llama-3-8b" and document["values"]["T"] == 8192
  assert "weight_kv_crossover_batch" in proc.stdout and "ridge_point" not in proc.stdout


@pytest.mark.parametrize("flags, needle", [
    (("--only=foo",), "--only='foo'"),
    (("--context=4096",), "only with --model"),
    (("--model=llama-3-8b", "--accelerator=h100-sxm"), "--context"),
    (("--values=t_gap=0",), "t_gap"),
    (("--values=t_queue=-1",), "t_queue"),
])
def test_crossovers_bad_flags_are_one_line(flags, needle):
  proc = run("crossovers", *flags)
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], proc.stderr


def test_report_writes_summary_and_plots(tmp_path):
  proc = run("report", f"--out_dir={tmp_path}", "--calibration_budget_s=0")
  assert proc.returncode == 0, proc.stderr
  text = (tmp_path / "README.md").read_text()
  # The lesson's sweep: 8e9 BF16 weights, 0.25 GB of K/V per sequence, 2 TB/s.
  weight_bytes, kv_bytes, bandwidth = 8e9 * 2, 0.25e9, 2e12
  limit = re.search(r"memory-only limit of ([\d,]+) tokens/s", text)
  crossover = re.search(r"K/V traffic passes the weights at B = ([\d,]+)", text)
  assert limit and crossover, text[:2000]
  assert float(limit[1].replace(",", "")) == pytest.approx(bandwidth / kv_bytes)
  assert float(crossover[1].replace(",", "")) == pytest.approx(weight_bytes / kv_bytes)
  assert "![batch sweep](batch_sweep.png)" in text
  assert (tmp_path / "batch_sweep.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_sweep_reports_points_per_second(tmp_path):
  out = tmp_path / "b.json"
  proc = run("bench_sweep", "--batches=64", "--contexts=64", "--repeats=2", "--loop_points=10",
             f"--json_out={out}")
  assert proc.returncode == 0, proc.stderr
  data = json.loads(out.read_text())
  assert data["points"] == 64 * 64 and data["kind"] == "measurement"
  numpy = data["backends"]["numpy"]
  assert data["points_per_s"] == pytest.approx(64 * 64 / numpy["timing"]["median_s"])
  assert numpy["timing"]["repeats"] == 2 and data["backends"]["python_loop"]["points"] == 10
  assert f"{data['points_per_s']:,.0f}" in proc.stdout


def test_bench_decode_counts_positions_and_compares_outputs(tmp_path):
  out = tmp_path / "d.json"
  proc = run("bench", "--what=decode", "--preset=lesson", "--prompt_len=6", "--new_tokens=3",
             "--repeats=2", f"--json_out={out}")
  assert proc.returncode == 0, proc.stderr
  data = json.loads(out.read_text())
  # Cached: the prompt once, then one row per further token; recompute: every slot per step.
  assert data["positions_processed"] == {"cached": 6 + 3 - 1, "recompute": 3 * (6 + 3)}
  assert data["speedup"] == pytest.approx(data["recompute"]["median_s"] /
                                          data["cached"]["median_s"])
  assert data["outputs_match"] is True and data["experiment"] == "bench_decode"


@pytest.mark.parametrize("flags, needle", [
    ((), "--what is required"),
    (("--what=plan", "--batches=8"), "--batches applies only with --what=sweep"),
    (("--what=simulate", "--schedulers=fifo"), "--schedulers='fifo' is unknown"),
    (("--what=sweep", "--batches=100000", "--contexts=100000"),
     "--batches=100000: batches x contexts = 10,000,000,000 points"),
])
def test_bench_bad_flags_are_one_line_naming_the_flag(flags, needle):
  proc = run("bench", *flags)
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], proc.stderr


def test_batch_sweep_on_a_model_and_accelerator(tmp_path):
  out, png = tmp_path / "m.json", tmp_path / "m.png"
  proc = run("batch_sweep", "--model=llama-3-8b", "--accelerator=h100-sxm", "--context=8192",
             "--batch_sizes=1,8,512", f"--json_out={out}", f"--plot_out={png}")
  assert proc.returncode == 0, proc.stderr
  data = json.loads(out.read_text())
  rows = {r["batch"]: r for r in data["rows"]}
  # Llama-3-8B: 32 layers x 8 KV heads x 128 dims x K and V x 2 bytes per token.
  kv_per_token = 2 * 32 * 8 * 128 * 2
  assert rows[8]["kv_bytes"] == pytest.approx(8 * 8192 * kv_per_token)
  # 80 GB cannot hold 512 sequences of 8192 tokens (4.4 TB of K/V).
  assert rows[1]["fits_in_memory"] and not rows[512]["fits_in_memory"]
  assert 1 <= data["summary"]["max_batch_in_memory"] < 512
  assert "does not fit" in proc.stdout


def test_batch_sweep_model_flag_errors():
  proc = run("batch_sweep", "--model=llama-3-8b", "--accelerator=h100", "--context=64")
  assert proc.returncode == 2 and "h100-sxm" in proc.stderr and "Traceback" not in proc.stderr
  proc = run("batch_sweep", "--model=llama-3-8b", "--context=64")
  assert proc.returncode == 2 and "--accelerator" in proc.stderr


def test_batch_sweep_with_a_profile_is_calibrated(tmp_path):
  from jaxroof.measure import profiles
  # Half the bandwidth for weights and K/V, ideal FLOPs, no fixed cost, the
  # roofline max (large r_ovl): the lesson's batch 32 reads 24 GB at 1 TB/s.
  factors = {
      "eta_w": 0.5, "eta_kv": 0.5, "eta_f": 1.0, "t0_step": 1e-12, "t0_layer": 1e-12, "r_ovl": 1e3
  }
  prof = profiles.Profile(device_kind="test", platform="cpu", backend="xla", dtype="float32",
                          jax_version="0", created="2026-01-01T00:00:00+00:00", ceilings={},
                          factors=factors,
                          fit={"heldout_median_rel_error": 0.05, "heldout_max_rel_error": 0.2})
  path, out = tmp_path / "p.json", tmp_path / "s.json"
  profiles.save_profile(prof, path)
  proc = run("batch_sweep", f"--profile={path}", "--batch_sizes=1,32", "--bandwidth_tbps=2",
             "--token_gap_ms=20", f"--json_out={out}")
  assert proc.returncode == 0, proc.stderr
  data = json.loads(out.read_text())
  assert data["kind"] == "calibrated" and "calibrated prediction" in proc.stdout
  rows = {r["batch"]: r for r in data["rows"]}
  assert rows[32]["step_s"] == pytest.approx(0.024, rel=1e-6)
  assert rows[1]["meets_token_gap"] and not rows[32]["meets_token_gap"]
  proc = run("compare_accelerators", "--model=llama-3-8b", "--context=1024", "--batch_sizes=1",
             "--accelerators=h100-sxm", f"--profile={path}", "--what_if", f"--json_out={out}")
  assert proc.returncode == 0, proc.stderr
  assert json.loads(out.read_text())["kind"] == "calibrated"
