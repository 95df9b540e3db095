"""The report as a decision document: its opening summary, its flags, its order,
and the files it names."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import pytest

from jaxroof.errors import InputError
from jaxroof.report import document
from jaxroof.report import summary_section
from jaxroof.serving import answer
from jaxroof.serving import requests
from jaxroof.specs.accelerators import load_accelerator
from jaxroof.specs.models import load_model
from jaxroof.symbolic import solved

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "results")
SMALL = answer.Subject(accelerators=("a100-80gb", "h100-sxm", "tpu-v5e"))

# Llama 3 8B as published (Meta's model card and config.json): 8,030,261,248
# parameters; 32 layers, 8 K/V heads of 128 dims.
LLAMA3_8B_PARAMS = 8_030_261_248
LLAMA3_8B_KV_BYTES_PER_TOKEN_BF16 = 2 * 32 * 8 * 128 * 2  # K and V, layers, heads, dims, bytes.


@pytest.fixture(scope="module")
def small():
  return answer.summarise(SMALL, RESULTS)


def _entry(result, slug):
  return next(e for e in result["accelerators"] if e["accelerator"] == slug)


def _memory_limit(slug: str, kv_bytes_per_token: float) -> int:
  """Sequences whose 16-token pages of K/V fit beside bf16 weights in 90% of memory."""
  capacity = load_accelerator(slug).memory_capacity_bytes
  per_sequence = math.ceil(SMALL.context / 16) * 16 * kv_bytes_per_token
  return max(math.floor((capacity * 0.9 - LLAMA3_8B_PARAMS * 2) / per_sequence), 0)


def _token_gap_limit(slug: str, kv_scale: float = 1.0) -> int:
  """floor of sympy's solved B(t_gap) at the mean context P + G/2 (K/V bytes scaled)."""
  inputs = requests.model_inputs(load_model(SMALL.model), load_accelerator(slug),
                                 prompt_tokens=SMALL.prompt_tokens,
                                 output_tokens=SMALL.output_tokens)
  mean_context = SMALL.prompt_tokens + SMALL.output_tokens / 2
  return math.floor(
      float(
          solved.max_batch_for_token_gap(N=inputs.N, q=inputs.q, T=mean_context,
                                         k=inputs.k * kv_scale, BW=inputs.BW, F=inputs.F,
                                         t_gap=SMALL.token_gap_s)))


def test_memory_fit_matches_an_independent_count(small):
  """Weights + 16-token pages of K/V for prompt + outputs in 90% of memory."""
  for slug in ("a100-80gb", "h100-sxm"):
    entry = _entry(small, slug)
    assert entry["max_batch_in_memory"] == _memory_limit(slug,
                                                         LLAMA3_8B_KV_BYTES_PER_TOKEN_BF16), slug
    assert entry["fits"] and entry["chips"] == 1
  # 90% of 16 GB holds less than 16.06 GB of weights: the answer takes more chips.
  assert load_accelerator("tpu-v5e").memory_capacity_bytes * 0.9 < LLAMA3_8B_PARAMS * 2
  assert _entry(small, "tpu-v5e")["chips"] >= 2


def test_token_gap_batch_matches_the_solved_formula(small):
  """The largest batch the token gap allows is floor of sympy's solved B(t_gap).

  The step is linear in the context, so the mean gap over a request's decode steps is
  the step at P + G/2, and the closed form `max_batch_for_token_gap` (solved by sympy)
  must agree; the load model's batch (`max_running`) is never past it.
  """
  bound = _entry(small, "a100-80gb")["bound"]
  assert bound["token_gap_limit_batch"] == _token_gap_limit("a100-80gb")
  assert 1 <= bound["batch"] <= bound["token_gap_limit_batch"]
  assert bound["loaded_token_gap_s"] <= SMALL.token_gap_s


def test_best_serves_and_memory_binds_where_memory_is_smaller(small):
  """On an H100 the 80 GB hold fewer sequences than the 30 ms gap allows: memory caps the
  batch, and fp8 K/V (half the bytes per token) raises the cap and the rate."""
  assert small["best"] == "h100-sxm"  # 3.35 TB/s against 2.04 TB/s, same 80 GB.
  h100 = _entry(small, "h100-sxm")["bound"]
  memory, gap = _memory_limit("h100-sxm",
                              LLAMA3_8B_KV_BYTES_PER_TOKEN_BF16), _token_gap_limit("h100-sxm")
  assert memory < gap
  assert h100["memory_limit_batch"] == h100["token_gap_limit_batch"] == memory
  assert 1 <= h100["batch"] <= memory
  assert small["best_token_gap_only_batch"] == gap
  fp8_kv = next(a for a in small["what_moves_best"] if a["change"] == "kv_dtype=fp8")
  fp8_memory = _memory_limit("h100-sxm", LLAMA3_8B_KV_BYTES_PER_TOKEN_BF16 / 2)
  assert fp8_kv["token_gap_limit_batch"] == min(fp8_memory,
                                                _token_gap_limit("h100-sxm", kv_scale=0.5))
  assert fp8_kv["max_arrival_rate_per_s"] > h100["max_arrival_rate_per_s"]


# Each bad subject: the field at fault, how the message starts, and what it says is allowed
# (derived from the shipped specs, not from the message).
_LLAMA3_8B_POSITIONS = load_model("llama-3-8b").max_position_embeddings


@pytest.mark.parametrize("change, field, start, allowed", [
    (dict(model="llama-9"), "model", "model=llama-9 ", ["llama-3-8b", "mixtral-8x7b"]),
    (dict(accelerators=("h100-sxm", "h100")), "accelerators", "accelerators=h100-sxm,h100 ",
     ["unknown: h100;", "h100-sxm", "tpu-v5e"]),
    (dict(context=200), "context", "context=200 ", [f"output_tokens={SMALL.output_tokens}"]),
    (dict(context=10**7), "context", "context=10000000 ", [f"at most {_LLAMA3_8B_POSITIONS + 1:,}"
                                                          ]),
])
def test_bad_subject_is_one_line_naming_field_value_and_allowed(change, field, start, allowed):
  bad = answer.Subject(**{**SMALL.__dict__, **change})
  with pytest.raises(InputError) as err:
    bad.check()
  message = str(err.value)
  assert err.value.field == field
  assert message.startswith(start) and "\n" not in message and "--" not in message
  for needle in allowed:
    assert needle in message


def test_accelerator_list_takes_all_and_drops_repeats():
  assert answer.accelerator_list(["all"]) == answer.known_accelerators()
  assert answer.accelerator_list(["H200", "h200 ", "b200"]) == ("h200", "b200")


def test_report_cli_refuses_a_bad_flag_in_one_line(tmp_path):
  proc = subprocess.run([
      sys.executable, "-m", "experiments.report", "--accelerators=h100,b200",
      "--calibration_budget_s=0", f"--out_dir={tmp_path}/r"
  ], cwd=ROOT, capture_output=True, text=True, timeout=120)
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1, proc.stderr
  assert "accelerators=h100,b200" in lines[0] and "h100-sxm" in lines[0]
  assert not (tmp_path / "r").exists()


def test_sections_come_in_the_decision_order():
  names = [s.__name__ for s in document.SECTIONS]
  order = [
      "summary", "_serving_section", "_parallel_section", "_accelerators_section",
      "_kv_sizing_section", "calibration_section", "lesson_section"
  ]
  positions = [names.index(n) for n in order]
  assert positions == sorted(positions) and positions[0] == 0
  assert names.index("lesson_section") > names.index("_user_calibration_section")


# What a report may name: a path inside the repository, or a file it wrote beside itself.
_FILE = re.compile(r"[\w./<>*-]+\.(?:json|png|txt|py|md|csv|jsonl|sh)\b")
_ABSOLUTE = re.compile(r"(?<![\w.:/<])/(?:[\w.+-]+/)+[\w.+-]*")


def named_files_outside(text: str, out_dir: str) -> list[str]:
  """Paths a report names that are neither in the repository nor in `out_dir`."""
  bad = [m for m in _ABSOLUTE.findall(text) if not m.startswith("/s")]  # "/s" of "tokens/s".
  for name in set(_FILE.findall(text)):
    if re.fullmatch(r"[A-Z_]+", name.split("/")[0]):  # A placeholder: OUT/*.json, PATH.json.
      continue
    if name.startswith(("/", "..")) or "shared/" in name:
      bad.append(name)
      continue
    if "<" in name or "*" in name:  # A pattern: some repository file must match it.
      pattern = re.sub(r"<[^>]*>|\*", "*", name)
      import glob
      if not glob.glob(os.path.join(ROOT, pattern)):
        bad.append(name)
      continue
    if not (os.path.exists(os.path.join(ROOT, name)) or
            os.path.exists(os.path.join(out_dir, name))):
      bad.append(name)
  return sorted(set(bad))


def test_the_property_check_catches_outside_files(tmp_path):
  text = ("see `/work/shared/DESIGN.md`, `seed/weight-reuse-lesson.txt`, `../shared/x.json`, "
          "`results/profile_<slug>_trtllm_0.9.0.json` and `results/bench_decode_cpu.json`; "
          "commit `OUT/*.json`; 1,000 tokens/s")
  assert named_files_outside(text, str(tmp_path)) == sorted(
      ["/work/shared/DESIGN.md", "../shared/x.json", "seed/weight-reuse-lesson.txt"])


def test_summary_section_names_only_repository_files(small, tmp_path):
  text = summary_section.report_section(small, str(tmp_path))
  assert named_files_outside(text, str(tmp_path)) == []
  assert (tmp_path / "summary.json").exists()
  assert (tmp_path / "summary.png").read_bytes()[:4] == b"\x89PNG"
  first_screen = text.splitlines()[:40]
  assert any("h100-sxm **best**" in line for line in first_screen)


@pytest.mark.slow
def test_whole_report_names_only_repository_files_in_order(tmp_path):
  proc = subprocess.run([
      sys.executable, "-m", "experiments.report", "--calibration_budget_s=0",
      f"--out_dir={tmp_path}"
  ], cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  text = (tmp_path / "README.md").read_text()
  assert named_files_outside(text, str(tmp_path)) == []
  headings = [line for line in text.splitlines() if line.startswith("## ")]
  assert headings[0].startswith("## Summary")
  keys = [
      "Summary", "Serving", "Several chips", "Accelerators", "KV sizing", "Calibration", "lesson"
  ]
  at = [next(i for i, h in enumerate(headings) if k in h) for k in keys]
  assert at == sorted(at), headings
  default = answer.Subject()  # The experiment passes its command lines; the README shows them.
  assert (f"`python -m experiments.serving --model={default.model} --accelerator=SLUG "
          f"--prompt_tokens={default.prompt_tokens} --output_tokens={default.output_tokens}"
          in text)


def test_tied_embedding_models_read_one_weight_count_per_batch():
  """Gemma ties its embeddings: the weights read must still come per batch size
  (a scalar broke the serving inputs of every tied model)."""
  from jaxroof.specs import parameters
  counts = parameters.parameter_counts(load_model("gemma-3-1b"))
  assert counts.tied
  read = parameters.weights_read_per_step(counts, [1, 8, 64])
  assert read.shape == (3,) and read[0] == read[2] == counts.read_every_step
  entry = answer.accelerator_entry(
      answer.Subject(model="gemma-3-1b", context=2048, accelerators=("h100-sxm",)), "h100-sxm",
      RESULTS)
  assert entry["fits"] and entry["bound"]["batch"] >= 1
