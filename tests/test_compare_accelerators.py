"""Decode inputs for a real model on a real device, the comparison, and the CLIs.

Expected step times and crossovers are recomputed here from the lesson's
formulas (and `solved`'s closed forms) with the model's and device's figures.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from jaxroof.specs import comparison
from jaxroof.symbolic import solved
from jaxroof.errors import InputError
from jaxroof.symbolic.evaluate import step_model
from jaxroof.specs.accelerators import load_accelerator
from jaxroof.specs.models import load_model
from jaxroof.specs.parameters import parameter_counts
from jaxroof.specs.step_inputs import crossover_batches, decode_step_inputs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(module, *flags):
  return subprocess.run([sys.executable, "-m", f"experiments.{module}", *flags], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)


def test_decode_inputs_feed_the_step_model():
  model, h100 = load_model("llama-3-8b"), load_accelerator("h100-sxm")
  inputs = decode_step_inputs(model, h100, context=1024, batch_sizes=[1, 32])
  kwargs = inputs.step_kwargs()
  assert set(kwargs) == {"B", "T", "N", "q", "k", "BW", "F", "N_act", "A_t"}
  assert kwargs["A_t"] == 32 * 4 * 32 * 128  # 32 blocks x 4*H*d FLOPs per retained token.
  assert (inputs.q, inputs.k, inputs.BW, inputs.F) == (2.0, 131_072, 3.35e12, 989.4e12)
  out = step_model("numpy")(**kwargs)
  weights = parameter_counts(model).total - parameter_counts(
      model).embeddings  # Table looked up, not read.
  memory_b1 = (2 * (weights + 4096) + 1024 * 131_072) / 3.35e12
  assert out["step_s"][0] == pytest.approx(memory_b1)
  assert inputs.assumptions and all(isinstance(a, str) for a in inputs.assumptions)


def test_moe_weights_read_vary_with_batch():
  inputs = decode_step_inputs(load_model("mixtral-8x7b"), load_accelerator("mi300x"), context=512,
                              batch_sizes=[1, 4, 64])
  assert np.all(np.diff(inputs.N) > 0)
  assert inputs.N_act == parameter_counts(load_model("mixtral-8x7b")).active_matmul


def test_fits_agrees_with_the_largest_batch_in_memory():
  inputs = decode_step_inputs(load_model("llama-3-8b"), load_accelerator("h100-sxm"), context=4096,
                              batch_sizes=[1, 64, 103, 104, 105, 1000])
  m = inputs.max_batch_in_memory
  usable = 80e9 * 0.9 - 2 * parameter_counts(load_model("llama-3-8b")).total
  assert m == int(usable // (131_072 * 4096))
  assert list(inputs.fits) == [b <= m for b in inputs.batch_sizes]


def test_weights_that_do_not_fit_leave_no_batch():
  inputs = decode_step_inputs(load_model("llama-3.1-70b"), load_accelerator("l4"), context=128,
                              batch_sizes=[1])
  assert inputs.max_batch_in_memory == 0 and not inputs.fits[0]


def test_dense_crossovers_agree_with_the_closed_forms():
  model, h100 = load_model("llama-3-8b"), load_accelerator("h100-sxm")
  cross = crossover_batches(model, h100, context=128, form="fused")
  n_act = parameter_counts(model).active_matmul
  values = dict(N=n_act, q=2, F=989.4e12, BW=3.35e12, T=128, k=131_072)
  # Fused, with decode attention's FLOPs (32 blocks x 4*H*d = 524,288 per retained token):
  # (N*q + B*T*k)/BW = (2*N_act*B + B*T*A)/F solved for B by hand.
  A = 32 * 4 * 32 * 128
  by_hand = (n_act * 2 / 3.35e12) / ((2 * n_act + 128 * A) / 989.4e12 - 128 * 131_072 / 3.35e12)
  assert cross.compute_crossover_batch == pytest.approx(by_hand, rel=2e-3)
  # Per operation: the linear layers turn compute-bound at F*N*q/(2*BW*N_act) = F/BW for
  # bf16 weights (the embedding rows read aside), whatever the K/V.
  per_op = crossover_batches(model, h100, context=8192)
  assert per_op.compute_crossover_batch == pytest.approx(989.4e12 / 3.35e12, rel=2e-3)
  assert cross.weight_kv_crossover_batch == pytest.approx(
      float(solved.weight_kv_crossover_batch(**values)), rel=2e-3)
  never = crossover_batches(model, h100, context=8192, form="fused")
  assert never.compute_crossover_batch is None  # KV reads outgrow the FLOPs.
  assert float(solved.compute_crossover_batch(**{**values, "T": 8192})) < 0


def test_comparison_marks_the_best_and_what_does_not_fit():
  result = comparison.compare(load_model("llama-3-8b"),
                              [load_accelerator(n) for n in ("h100-sxm", "h200", "l4")],
                              context=4096, batch_sizes=[1, 64])
  names = [a["name"] for a in result["accelerators"]]
  assert names == ["h100-sxm", "h200", "l4"]
  for entry in result["accelerators"]:
    assert {
        "name", "ridge_flop_per_byte", "compute_crossover_batch", "weight_kv_crossover_batch",
        "max_batch_in_memory", "rows"
    } <= set(entry)
  best = result["best"]
  assert best["by_batch"]["1"]["step_s"] == ["h200"]  # Most bandwidth.
  assert best["max_batch_in_memory"] == ["h200"]
  assert best["ridge_flop_per_byte"] == ["h200"]  # 206 < 295 < 403 FLOP/B.
  l4_rows = result["accelerators"][2]["rows"]
  assert [r["fits_in_memory"] for r in l4_rows] == [True, False]
  assert "l4" not in best["by_batch"]["64"]["aggregate_tokens_per_s"]


@pytest.mark.parametrize("kwargs, needle", [
    ({"context": 0, "batch_sizes": [1]}, "context=0"),
    ({"context": 8, "batch_sizes": [0]}, r"batch_sizes\[0\]=0"),
    ({"context": 8, "batch_sizes": [1], "weight_dtype": "int2"}, "weight_dtype='int2'"),
    ({"context": 8, "batch_sizes": [1], "kv_dtype": "e5m2"}, "kv_dtype='e5m2'"),
])
def test_bad_workload_inputs(kwargs, needle):
  with pytest.raises(InputError, match=needle):
    decode_step_inputs(load_model("llama-3-8b"), load_accelerator("h100-sxm"), **kwargs)


def test_compare_accelerators_cli(tmp_path):
  out, png = tmp_path / "c.json", tmp_path / "c.png"
  proc = run("compare_accelerators", "--model=qwen3-30b-a3b", "--context=2048",
             "--batch_sizes=1,16,4096", "--accelerators=h100-sxm,mi300x", "--weight_dtype=fp8",
             f"--json_out={out}", f"--plot_out={png}")
  assert proc.returncode == 0, proc.stderr
  data = json.loads(out.read_text())
  assert data["kind"] == "bound" and data["inputs"]["weight_dtype"] == "fp8"
  entries = {a["name"]: a for a in data["accelerators"]}
  assert set(entries) == {"h100-sxm", "mi300x"}
  assert entries["h100-sxm"]["ridge_flop_per_byte"] == pytest.approx(1978.9 / 3.35, rel=1e-3)
  assert [r["batch"] for r in entries["mi300x"]["rows"]] == [1, 16, 4096]
  assert entries["h100-sxm"]["rows"][2]["fits_in_memory"] is False
  assert png.read_bytes()[:4] == b"\x89PNG"
  assert "NO" in proc.stdout and "*" in proc.stdout


def test_kv_sizing_cli(tmp_path):
  out = tmp_path / "kv.json"
  proc = run("kv_sizing", "--model=gemma-2-9b", "--context=8192", "--batch=4", "--accelerator=l4",
             "--max_new_tokens=100", f"--json_out={out}")
  assert proc.returncode == 0, proc.stderr
  data = json.loads(out.read_text())
  assert data["kv_bytes_per_token"] == 172_032
  assert data["payload_bytes"] == 4 * 172_032 * (8192 + 4096)
  assert data["allocated_bytes"] >= data["payload_bytes"]
  assert data["allocated_bytes_windowed_as_full"] > data["allocated_bytes"]
  assert data["params_total"] == pytest.approx(9.24e9, rel=0.01)
  assert data["params_active"] == data["params_total"]
  assert data["fits"] is False  # 18.5 GB of weights on a 24 GB L4 leave no room.
  assert "does NOT fit" in proc.stdout


BAD_INPUT = [
    ("compare_accelerators", ["--model=llama-3-8b", "--context=8",
                              "--accelerators=h100"], "accelerator='h100'"),
    ("kv_sizing", ["--model=llama3", "--context=8"], "model='llama3'"),
    ("kv_sizing", ["--model=llama-3-8b"], "--context"),
]


def test_cli_bad_input_is_one_line():
  procs = [(needle,
            subprocess.Popen([sys.executable, "-m", f"experiments.{module}", *flags], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
           for module, flags, needle in BAD_INPUT]
  for needle, proc in procs:
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err
    assert needle in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_report_section_writes_its_plot(tmp_path):
  from jaxroof.report import specs_section
  markdown = specs_section.report_section(str(tmp_path))
  assert "## KV sizing of real models" in markdown and "## Accelerators compared" in markdown
  assert "deepseek-v3" in markdown and "mistral-7b" in markdown and "h100-sxm" in markdown
  assert (tmp_path / specs_section.COMPARE_PLOT).read_bytes()[:4] == b"\x89PNG"
