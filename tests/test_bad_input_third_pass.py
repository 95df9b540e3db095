"""Regression tests for issue 53 ("Bad input, third pass"), part 1: the files people
hand us are checked at the edge (model configs, accelerator files), a result that is
not finite never exits 0, and valid edge inputs are still answered correctly."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from jaxroof.specs import kv_sizing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "jaxroof", "specs", "data")


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


def _config(tmp_path, shipped: str, **changes) -> str:
  with open(os.path.join(DATA, "models", f"{shipped}.json"), encoding="utf-8") as f:
    config = json.load(f)
  config.update(changes)
  path = tmp_path / f"{shipped}.json"
  path.write_text(json.dumps(config))
  return str(path)


def _accelerator(tmp_path, slug="h100-sxm", **changes) -> str:
  with open(os.path.join(DATA, "accelerators.json"), encoding="utf-8") as f:
    entry = json.load(f)["accelerators"][slug]
  for dotted, value in changes.items():
    target = entry
    *parents, last = dotted.split("__")
    for part in parents:
      target = target[part]
    target[last] = value
  path = tmp_path / "accelerator.json"
  path.write_text(json.dumps(entry))
  return str(path)


# Class 4: configs.


def test_a_context_limit_of_the_wrong_type_is_refused_not_dropped(tmp_path):
  config = _config(tmp_path, "llama-3-8b", max_position_embeddings="8192")
  needle = "max_position_embeddings='8192' is not allowed"
  one_error_line(run("iteration", f"--model={config}", "--accelerator=h100-sxm", "--decode_rows=8"),
                 needle)
  one_error_line(
      run("serving", f"--model={config}", "--accelerator=h100-sxm", "--prompt_tokens=1000000",
          "--output_tokens=16", "--token_gap_ms=12"), needle)


@pytest.mark.parametrize("changes, needle", [
    ({"experts_per_token": 64, "num_experts_per_tok": 64
     }, "num_experts_per_tok=64 with num_local_experts=32"),
    ({"experts_per_token": 64}, "num_experts_per_tok=4 with experts_per_token=64"),
    ({"quantization_config": [1]}, "quantization_config=[1]"),
    ({"quantization_config": {"quant_method": "gptq", "bits": "four"}}, "bits='four'"),
    ({"quantization_config": {"quant_method": "gptq", "bits": 0}}, "bits=0"),
])
def test_a_malformed_moe_or_quantization_config_is_refused(tmp_path, changes, needle):
  config = _config(tmp_path, "gpt-oss-20b", **changes)
  one_error_line(run("kv_sizing", f"--model={config}", "--context=4096"), needle)
  if "num_local_experts" in needle:  # The case, through a second experiment.
    one_error_line(
        run("batch_sweep", f"--model={config}", "--accelerator=h100-sxm", "--context=4096",
            "--batch_sizes=1"), needle)


# Class 2: accelerator files.


@pytest.mark.parametrize("field, value", [
    ("scale_up__unidirectional_gb_s", math.nan),
    ("scale_up__unidirectional_gb_s", -450),
    ("hop_latency__modeling_assumptions__nccl_ring_per_step_us__LL", "0.6"),
])
def test_a_bad_link_figure_is_refused_before_any_work(tmp_path, field, value):
  path = _accelerator(tmp_path, **{field: value})
  line = one_error_line(
      run("iteration", "--model=llama-3-8b", f"--accelerator_file={path}", "--decode_rows=8",
          "--tp=8"), f"--accelerator_file='{path}' field {field.replace('__', '.')}=")
  assert "nan ms" not in line


# Class 1/2: a result that is not finite never exits 0.


def test_a_row_that_made_the_fit_nan_is_refused_and_nothing_is_written(tmp_path):
  # The example: refused at its row (part 2), before the fit it made nan.
  with open(os.path.join(ROOT, "tests", "data", "user_llama2_7b_a100_5pts.csv")) as f:
    lines = f.read().splitlines()
  lines[3] = lines[3].replace("0.0149", "1e-300")
  csv = tmp_path / "t.csv"
  csv.write_text("\n".join(lines) + "\n")
  profile = tmp_path / "p.json"
  one_error_line(run("calibrate", f"--from_csv={csv}", f"--profile_out={profile}"),
                 "line 4, column time_s=1e-300 is not allowed")
  assert not profile.exists()
  assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]


# Valid edges are still answered, correctly.


def test_batch_one_and_context_one_are_answered(tmp_path):
  out = tmp_path / "kv.json"
  proc = run("kv_sizing", "--model=llama-3-8b", "--context=1", "--batch=1",
             "--accelerator=h100-sxm", f"--json_out={out}")
  assert proc.returncode == 0, proc.stderr
  result = json.loads(out.read_text())
  assert result["fits"] is True and result["capacity"]["max_batch"] >= 1
  proc = run("iteration", "--model=llama-3-8b", "--accelerator=h100-sxm", "--decode_rows=1",
             "--decode_context=1")
  assert proc.returncode == 0, proc.stderr


def test_a_model_that_exactly_fits_memory_is_accepted(tmp_path):
  """An accelerator file whose memory holds the weights, the workspace and one
  sequence's K/V to the byte (the smallest such capacity): one sequence fits; a
  capacity a few bytes smaller fits none."""
  out = tmp_path / "kv.json"
  proc = run("kv_sizing", "--model=llama-3-8b", "--context=4096", "--accelerator=h100-sxm",
             f"--json_out={out}")
  assert proc.returncode == 0, proc.stderr
  capacity = json.loads(out.read_text())["capacity"]
  weights = capacity["weight_bytes"]
  per_sequence = json.loads(out.read_text())["allocated_bytes_per_sequence"]
  fraction = capacity["workspace_fraction"]

  def fits(gb: float) -> int:
    return kv_sizing.sequences_fit(per_sequence_bytes=per_sequence, weight_bytes=weights,
                                   memory_capacity_bytes=gb * 1e9, workspace_fraction=fraction)

  gb = (weights + per_sequence) / (1 - fraction) / 1e9
  while fits(gb) < 1:
    gb = float(np.nextafter(gb, math.inf))
  for memory, sequences in ((gb, 1), (gb - 1e-8, 0)):
    path = _accelerator(tmp_path, memory_capacity_gb=memory)
    proc = run("kv_sizing", "--model=llama-3-8b", "--context=4096", f"--accelerator_file={path}",
               f"--json_out={out}")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["capacity"]["max_batch"] == sequences
