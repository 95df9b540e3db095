"""batch_sweep on a model: what-ifs, list-valued dtypes and contexts, normalised rates
(issue 14 sections 1-3). Lists must give the same numbers as single runs."""

import json
import os
import subprocess
import sys

import pytest

from jaxroof.errors import InputError
from jaxroof.parallel import variants
from jaxroof.parallel.layout import Layout
from jaxroof.parallel.layout_sweep import layout_sweep
from jaxroof.specs.accelerators import load_accelerator
from jaxroof.specs.models import load_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = load_model("llama-3-8b")
BATCHES = [1, 16, 256]


def _run(*flags):
  return subprocess.run([sys.executable, "-m", "experiments.batch_sweep", *flags], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)


def test_each_combination_is_its_single_sweep():
  device = load_accelerator("h100-sxm")
  sweeps = variants.variant_sweeps(SPEC, device, contexts=[4096,
                                                           32768], weight_dtypes=["bf16", "fp8"],
                                   kv_dtypes=["fp8"], batch_sizes=BATCHES)
  assert [(s["inputs"]["weight_dtype"], s["inputs"]["context"]) for s in sweeps] == [("bf16", 4096),
                                                                                     ("bf16",
                                                                                      32768),
                                                                                     ("fp8", 4096),
                                                                                     ("fp8", 32768)]
  for sweep in sweeps:
    i = sweep["inputs"]
    alone = layout_sweep(SPEC, device, context=i["context"], batch_sizes=BATCHES,
                         weight_dtype=i["weight_dtype"], kv_dtype=i["kv_dtype"])
    for row, single in zip(sweep["rows"], alone["rows"]):
      assert {k: row[k] for k in single} == single
      assert (row["weight_dtype"], row["kv_dtype"], row["context"]) == (i["weight_dtype"],
                                                                        i["kv_dtype"], i["context"])


def test_published_in_a_list_is_its_single_sweep_and_tags_the_stored_dtype():
  """gpt-oss's published format (experts mxfp4, rest bf16) beside bf16 and
  fp8_block K/V: each combination equals its own run, rows name the dtype."""
  spec, device = load_model("gpt-oss-20b"), load_accelerator("b200")
  sweeps = variants.variant_sweeps(spec, device, contexts=[4096],
                                   weight_dtypes=["published", "bf16"],
                                   kv_dtypes=["bf16", "fp8_block"], batch_sizes=BATCHES)
  assert [(s["rows"][0]["weight_dtype"], s["rows"][0]["kv_dtype"]) for s in sweeps
         ] == [("mxfp4", "bf16"), ("mxfp4", "fp8_block"), ("bf16", "bf16"), ("bf16", "fp8_block")]
  assert sweeps[0]["inputs"]["weight_dtype_label"] == "mxfp4 (published)"
  for sweep, weight_dtype in zip(sweeps, ["published"] * 2 + ["bf16"] * 2):
    alone = layout_sweep(spec, device, context=4096, batch_sizes=BATCHES, weight_dtype=weight_dtype,
                         kv_dtype=sweep["inputs"]["kv_dtype"])
    for row, single in zip(sweep["rows"], alone["rows"]):
      assert {k: row[k] for k in single} == single
  published, bf16 = sweeps[0]["rows"][0], sweeps[2]["rows"][0]
  assert published["weight_bytes"] < 0.6 * bf16["weight_bytes"]


def test_rates_per_chip_per_kw_and_per_dollar():
  # h100-sxm: 700 W TDP (shipped table, glennklockwood.com/garden/processors/h100).
  device = load_accelerator("h100-sxm")
  [sweep] = variants.variant_sweeps(SPEC, device, contexts=[4096], weight_dtypes=["bf16"],
                                    kv_dtypes=["bf16"], batch_sizes=[8], layout=Layout(tp=2, dp=2),
                                    price_per_hour=2.0)
  row = sweep["rows"][0]
  assert row["fleet_tokens_per_s"] == pytest.approx(2 * row["aggregate_tokens_per_s"])
  assert row["tokens_per_s_per_chip"] == pytest.approx(row["fleet_tokens_per_s"] / 4)
  assert row["tokens_per_s_per_kw"] == pytest.approx(row["tokens_per_s_per_chip"] / 0.7)
  assert row["tokens_per_dollar"] == pytest.approx(row["tokens_per_s_per_chip"] * 3600 / 2.0)
  # No TDP published for TPU v5e in the shipped table: null, with a note.
  [tpu] = variants.variant_sweeps(SPEC, load_accelerator("tpu-v5e"), contexts=[1024],
                                  weight_dtypes=["int8"], kv_dtypes=["bf16"], batch_sizes=[1])
  assert tpu["rows"][0]["tokens_per_s_per_kw"] is None
  assert any("no TDP" in n for n in tpu["summary"]["rate_notes"])
  with pytest.raises(InputError, match="price_per_hour"):
    variants.normalise_rows([dict(row)], device, 1, price_per_hour=0.0)


@pytest.mark.slow
def test_cli_lists_one_table_one_figure_and_the_same_numbers(tmp_path):
  out, png = tmp_path / "c.json", tmp_path / "c.png"
  proc = _run("--model=llama-3-8b", "--accelerator=h100-sxm", "--context=4096,32768",
              "--weight_dtype=bf16,fp8", "--kv_dtype=fp8", "--batch_sizes=1,16",
              "--price_per_hour=2.5", f"--json_out={out}", f"--plot_out={png}")
  assert proc.returncode == 0, proc.stderr
  data = json.loads(out.read_text())
  assert len(data["rows"]) == 8 and len(data["summaries"]) == 4
  assert png.read_bytes()[:4] == b"\x89PNG"
  single = tmp_path / "s.json"
  proc = _run("--model=llama-3-8b", "--accelerator=h100-sxm", "--context=32768",
              "--weight_dtype=fp8", "--kv_dtype=fp8", "--batch_sizes=1,16", "--price_per_hour=2.5",
              f"--json_out={single}")
  assert proc.returncode == 0, proc.stderr
  one = json.loads(single.read_text())
  assert set(one) >= {"kind", "rows", "summary", "inputs"}  # Today's structure.
  listed = [r for r in data["rows"] if r["weight_dtype"] == "fp8" and r["context"] == 32768]
  for a, b in zip(listed, one["rows"]):
    for key in ("step_s", "aggregate_tokens_per_s", "tokens_per_s_per_kw", "tokens_per_dollar",
                "fits_in_memory", "kv_dtype"):
      assert a[key] == b[key]


@pytest.mark.slow
def test_cli_what_ifs_with_a_model_are_labelled(tmp_path):
  base, fast = tmp_path / "b.json", tmp_path / "f.json"
  args = ("--model=llama-3-8b", "--accelerator=h100-sxm", "--context=4096", "--batch_sizes=1,8")
  assert _run(*args, f"--json_out={base}").returncode == 0
  proc = _run(*args, "--bandwidth_tbps=6.7", "--memory_gb=160", f"--json_out={fast}")
  assert proc.returncode == 0, proc.stderr
  assert "what-if" in proc.stdout
  a, b = json.loads(base.read_text()), json.loads(fast.read_text())
  assert len(b["inputs"]["what_if"]) == 2 and not a["inputs"]["what_if"]
  # Memory-bound rows: twice the datasheet's 3.35 TB/s halves the step.
  for ra, rb in zip(a["rows"], b["rows"]):
    assert rb["step_s"] == pytest.approx(ra["step_s"] / 2, rel=1e-9)
  assert b["summary"]["max_batch_in_memory"] > 2 * a["summary"]["max_batch_in_memory"]


@pytest.mark.parametrize("flags, needle", [
    (("--weight_dtype=bf16,fp7",), "--weight_dtype"),
    (("--block_size=32",), "--model"),
    (("--kv_bytes_per_token=1000", "--context=10,20"), "--context"),
    (("--model=llama-3-8b", "--accelerator=h100-sxm", "--context=0"), "--context"),
])
def test_cli_bad_shared_flags_are_one_line(flags, needle):
  proc = _run(*flags)
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], proc.stderr
