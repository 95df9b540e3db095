"""Regression tests for issue 28 ("Bad input, second pass"): each input a
held-out fuzz run or a new user got through, now refused in one clean line or
answered with a labelled warning (FIFO inputs: tests/test_input_files.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from jaxroof import errors
from jaxroof.report import table
from jaxroof.specs import hf_config
from jaxroof.specs import models
from jaxroof.toy import check
from jaxroof.toy.config import LESSON

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "jaxroof", "specs", "data", "models")


def run(module: str, *flags: str, timeout: float = 300) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", f"experiments.{module}", *flags], cwd=ROOT,
                        capture_output=True, text=True, timeout=timeout)


def one_error_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
  assert lines[0].startswith("error:") and "Traceback" not in proc.stderr
  for needle in needles:
    assert needle in lines[0], lines[0]
  return lines[0]


def _config(tmp_path, shipped: str, drop: str) -> str:
  with open(os.path.join(MODELS, f"{shipped}.json"), encoding="utf-8") as f:
    config = json.load(f)
  del config[drop]
  config.pop(models.SOURCE_KEY, None)
  folder = tmp_path / f"{shipped}-without-{drop}"
  folder.mkdir()
  (folder / "config.json").write_text(json.dumps(config))
  return str(folder)


# Real defects.


def test_measure_ops_with_no_attention_point_is_one_line():
  proc = run("measure_ops", "--contexts=128", "--max_tokens=1", "--decode_rows=1",
             "--prefill_rows=2", "--d_in=8", "--d_out=8", "--repeats=1")
  one_error_line(proc, "--max_tokens=1", "128")


def test_decode_equivalence_refuses_work_and_memory_before_allocating():
  with pytest.raises(errors.InputError, match=r"700,000 block passes"):
    check.require_feasible(LESSON.__class__(**{**LESSON.__dict__, "num_blocks": 100_000}), 3, 2)
  with pytest.raises(errors.InputError, match=r"attention scores .* over the 4 GB limit"):
    check.require_feasible(LESSON, 100_000, 2)
  check.require_feasible(LESSON, 3, 2)  # The lesson's check is allowed.
  one_error_line(run("decode_equivalence", "--blocks=100000", timeout=60), "block passes")
  prompt = ",".join(["1"] * 30_000)
  one_error_line(run("decode_equivalence", f"--prompt={prompt}", timeout=60), "GB")


def test_long_terminal_tables_are_capped():
  text = table.format_table(["batch"], [[i] for i in range(1000)], max_rows=10)
  lines = text.splitlines()
  assert len(lines) == 2 + 10 + 1 and "990 rows not shown (1,000 rows in all" in text
  assert lines[2].strip() == "0" and lines[-1].strip() == "999"
  assert "not shown" not in table.format_table(["b"], [[1], [2]], max_rows=2)
  batches = ",".join(str(b) for b in range(1, 1001))
  proc = run("compare_accelerators", "--model=llama-3-8b", "--context=4096",
             "--accelerators=h100-sxm", f"--batch_sizes={batches}")
  assert proc.returncode == 0, proc.stderr
  assert "rows not shown (1,000 rows in all" in proc.stdout
  assert len(proc.stdout.splitlines()) < 400


# Accepted although the input was wrong.


@pytest.mark.parametrize("experiment, flags, needle", [
    ("batch_sweep", ("--model=", "--accelerator=h100-sxm", "--context=4096"), "--model=''"),
    ("batch_sweep", ("--accelerator=",), "--accelerator=''"),
    ("kv_sizing", ("--model=llama-3-8b", "--context=4096", "--accelerator="), "--accelerator=''"),
    ("calibrate", ("--from_csv=", "--accelerator=h100-sxm"), "--from_csv=''"),
])
def test_an_empty_flag_value_is_an_error(experiment, flags, needle):
  one_error_line(run(experiment, *flags), needle, "is empty")


def test_batch_sweep_refuses_layers_with_a_model():
  one_error_line(
      run("batch_sweep", "--model=llama-3-8b", "--accelerator=h100-sxm", "--context=4096",
          "--layers=32"), "--layers")


def test_a_profile_with_an_unknown_dtype_is_refused(tmp_path):
  with open(os.path.join(ROOT, "results", "profile_cpu.json"), encoding="utf-8") as f:
    data = json.load(f)
  data["dtype"] = "float8"
  path = tmp_path / "p.json"
  path.write_text(json.dumps(data))
  one_error_line(run("batch_sweep", f"--profile={path}", "--batch_sizes=1"), "dtype='float8'",
                 "float32")


@pytest.mark.parametrize("budget", ["-1", "0"])
def test_autotune_refuses_a_budget_of_zero_or_less(budget):
  one_error_line(run("autotune", f"--time_budget_s={budget}"), "--time_budget_s")


# Silent defaults in a user's config.json.


def test_a_missing_kv_heads_field_is_said_and_in_the_json(tmp_path):
  config = _config(tmp_path, "llama-3-8b", "num_key_value_heads")
  out = tmp_path / "kv.json"
  proc = run("kv_sizing", f"--model={config}", "--context=4096", f"--json_out={out}")
  assert proc.returncode == 0, proc.stderr
  assert ("num_key_value_heads missing from config.json: read as num_attention_heads = 32"
          in proc.stdout)
  applied = json.loads(out.read_text())["defaults_applied"]
  assert any(a.startswith("num_key_value_heads missing") for a in applied)
  out = tmp_path / "s.json"
  proc = run("batch_sweep", f"--model={config}", "--accelerator=h100-sxm", "--context=4096",
             "--batch_sizes=1", f"--json_out={out}")
  assert proc.returncode == 0, proc.stderr
  document = json.loads(out.read_text())
  assert any("num_key_value_heads missing" in a for a in document["assumptions"])
  assert any("num_key_value_heads missing" in a for a in document["defaults_applied"])


def test_a_missing_experts_per_token_field_is_recorded(tmp_path):
  spec = models.load_model(_config(tmp_path, "qwen3-30b-a3b", "num_experts_per_tok"))
  assert ("num_experts_per_tok missing from config.json: read as 8, as Hugging Face's "
          "qwen3_moe config does") in spec.default_assumptions
  shipped = models.load_model("qwen3-30b-a3b")
  assert shipped.default_assumptions == () and shipped.defaults_applied == tuple(
      hf_config.spec_from_config(json.load(open(os.path.join(MODELS, "qwen3-30b-a3b.json"))),
                                 name="q").defaults_applied)


# Smaller points.


def test_a_context_beyond_the_model_is_a_labelled_warning(tmp_path):
  out = tmp_path / "kv.json"
  proc = run("kv_sizing", "--model=llama-3-8b", "--context=200000", f"--json_out={out}")
  assert proc.returncode == 0, proc.stderr
  assert "WARNING: context 200,000 tokens is beyond llama-3-8b's max_position_embeddings" \
      in proc.stdout
  assert json.loads(out.read_text())["warnings"][0].startswith("WARNING")


def test_crossovers_say_overflow_and_name_the_inputs(tmp_path):
  out = tmp_path / "c.json"
  proc = run("crossovers", "--values=N=1e308,q=2,B=32", "--only=weight_traffic,linear_flops",
             f"--json_out={out}")
  assert proc.returncode == 0, proc.stderr
  assert "= inf" not in proc.stdout
  assert "overflow" in proc.stdout and "N=1e+308, q=2" in proc.stdout
  items = {q["name"]: q for q in json.loads(out.read_text())["quantities"]}
  assert items["weight_traffic"]["value"] is None
  assert items["weight_traffic"]["note"].startswith("overflow")


# The fuzz tier covers every flag an experiment takes.


def test_fuzz_cases_cover_shared_flags_and_empty_strings():
  code = ("import sys; sys.argv = ['x']; import importlib; "
          "from experiments import _fuzzing as f; "
          "importlib.import_module('experiments.batch_sweep'); "
          "cases = f.cases_for('experiments.batch_sweep')[1:]; "
          "print(sorted({c.args[-1].split('=')[0] for c in cases})); "
          "print([c.must_refuse for c in cases if c.kind == 'string:empty'])")
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                        timeout=120)
  assert proc.returncode == 0, proc.stderr
  names, refuse = proc.stdout.strip().splitlines()
  for flag in ("--model", "--accelerator", "--accelerator_file", "--tp", "--layers"):
    assert f"'{flag}'" in names
  assert "False" not in refuse and "True" in refuse


@pytest.mark.parametrize(
    "flags, needle",
    [
        (("--slots=100000",), "GB"),  # Was killed by the kernel at ~22 GB.
        (("--prompt_tokens=10000000",), "prompt lengths"),  # Was a JAX out-of-memory traceback.
    ])
def test_serve_toy_refuses_loads_beyond_the_machine_before_allocating(flags, needle):
  one_error_line(run("serve_toy", "--num_requests=4", *flags, timeout=60), needle)


def test_bench_simulate_caps_requests_like_simulate():
  one_error_line(run("bench_simulate", "--num_requests=2000000000", timeout=60),
                 "--num_requests")  # Was killed by the kernel at ~22 GB.


def test_bench_decode_refuses_a_billion_blocks_at_once():
  # Was silent past the timeout: the memory estimate traced every block.
  one_error_line(
      run("bench_decode", "--preset=lesson", "--blocks=1000000000", "--new_tokens=2",
          "--prompt_len=8", timeout=60), "block passes")


def test_heldout_model_without_heldout_runs_is_refused():
  """Found by the long fuzz run: the flag was silently ignored."""
  fixture = os.path.join(ROOT, "tests", "data", "vllm_cpu_detailed_fixture.json")
  proc = subprocess.run([
      sys.executable, "-m", "experiments.calibrate_engine", f"--from_vllm={fixture}",
      "--model=tinyllama-1.1b", "--accelerator=h100-sxm", "--search=max_simulations=10",
      "--heldout_model=-5"
  ], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 2
  assert "--heldout_model" in proc.stderr and "Traceback" not in proc.stderr
  assert proc.stderr.strip().count("\n") == 0
