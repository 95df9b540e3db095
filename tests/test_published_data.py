"""The published points as read and checked, and the engines' rules read from their source.

Counts come from the data's own README; bad rows (mixed units, impossible values) are
refused in one line naming the row, the column and the value.
"""

import csv
import io
import math

import pytest

from jaxroof.errors import InputError
from jaxroof.engines import engine_rules
from jaxroof.engines import published
from jaxroof.specs.accelerators import load_accelerator

HEADER = ("point_id,split,source_id,engine,engine_version,accelerator,n_chips,tp,pp,ep,model,"
          "weight_dtype,kv_dtype,prompt_tokens,output_tokens,batch,concurrency,request_rate,"
          "metric,statistic,value,unit,dataset,derivation")
GOOD = ("s/1,train,s,vllm,1,h100-sxm,2,2,1,,llama-3-8b,bf16,bf16,128,128,,4,,"
        "itl_s,mean,0.01,s,fixed,d")


def _csv(**change) -> str:
  row = dict(zip(HEADER.split(","), next(csv.reader([GOOD]))))
  row.update(change)
  out = io.StringIO()
  writer = csv.DictWriter(out, fieldnames=HEADER.split(","))
  writer.writeheader()
  writer.writerow(row)
  return out.getvalue()


def test_the_shipped_points_read_as_the_readme_counts_them():
  points = published.read_points()
  assert len(points) == 754  # README: 754 whole-system points.
  assert sum(p.split == "referee" for p in points) == 217
  assert {p.engine for p in points} == {"trtllm", "nim", "vllm", "sglang", "gpt-fast"}


def test_a_good_row_reads_with_its_layout_and_replicas():
  [p] = published.parse_points(_csv())
  assert (p.tp, p.pp, p.ep, p.replicas, p.layout) == (2, 1, 1, 1, (2, 1, 1))
  assert p.concurrency == 4 and p.request_rate is None and p.seconds


def test_an_expert_parallel_row_spreads_the_experts_over_its_tensor_ranks():
  [p] = published.parse_points(_csv(tp="4", ep="4", n_chips="8"))
  assert p.layout == (1, 1, 4) and p.replicas == 2


def test_the_requests_of_a_saturating_run_come_from_the_dataset_when_not_given():
  [p] = published.parse_points(_csv(concurrency="", request_rate="inf", dataset="500 requests"))
  assert p.requests == 500 and math.isinf(p.request_rate)


@pytest.mark.parametrize("change, words", [
    ({"unit": "ms"}, "unit='ms'"),
    ({"metric": "tokens"}, "metric"),
    ({"value": "-0.01"}, "value='-0.01'"),
    ({"value": "nan"}, "value='nan'"),
    ({"value": "inf"}, "value="),
    ({"n_chips": "3"}, "n_chips='3'"),
    ({"tp": "4", "ep": "3", "n_chips": "4"}, "ep must divide tp"),
    ({"batch": "1.5"}, "batch='1.5'"),
    ({"prompt_tokens": "0"}, "prompt_tokens='0'"),
    ({"weight_dtype": "fp7"}, "weight_dtype='fp7'"),
    ({"kv_dtype": "int3"}, "kv_dtype='int3'"),
])
def test_mixed_units_and_impossible_values_are_one_line(change, words):
  with pytest.raises(InputError) as e:
    published.parse_points(_csv(**change))
  assert words in str(e.value) and "\n" not in str(e.value)


def test_a_point_given_twice_is_refused():
  text = _csv() + _csv().splitlines()[1] + "\n"
  with pytest.raises(InputError, match="given twice"):
    published.parse_points(text)


def test_the_engines_rules_are_their_sources_figures():
  d = published.engine_defaults()
  h100, a100 = load_accelerator("h100-sxm"), load_accelerator("a100-80gb")
  vllm = engine_rules.settings("vllm", h100)
  assert vllm["u_mem"] == d["vllm"]["v1_engine"]["gpu_memory_utilization"]
  assert vllm["n_bud"] == 8192 and vllm["n_max"] == 1024  # >= 70 GiB, not an A100.
  assert engine_rules.settings("vllm", a100)["n_max"] == 256  # The A100's smaller default.
  trt = engine_rules.settings("trtllm", h100)
  assert trt["x_free"] == 1 and trt["reserve_full"] == 1 and trt["u_mem"] == 0.9
  assert engine_rules.settings("nim", h100) == trt  # NIM runs TensorRT-LLM.
  # SGLang's mem_fraction_static: reserved MiB = 512 + 1.5 * 8192 + 2 * 512 + 1024 * 8 / 8
  # = 14848 on an 8-way H200 (over its 10240 floor), of 141e9 / 2**20 MiB.
  sglang = engine_rules.settings("sglang", load_accelerator("h200"), tp=8)
  total = 141e9 / 2**20
  assert sglang["u_mem"] == round((total - 14848) / total, 3)


def test_a_runs_own_settings_override_the_defaults():
  mi300x = load_accelerator("mi300x")
  run = engine_rules.settings("vllm", mi300x, source="rocm-vllm-0.7.3", requests=3200)
  assert run["n_bud"] == 131072 and run["n_max"] == 3200
  # A setting the source states for one model's runs (its derivation: --mem-frac 0.87).
  h200 = load_accelerator("h200")
  by_model = {
      m: engine_rules.settings("sglang", h200, tp=8, source="datacrunch-sglang-h200", model=m)
      for m in ("llama-3.1-405b", "llama-3.1-70b")
  }
  with open(published.WHOLE_SYSTEM, encoding="utf-8") as f:
    derivations = [
        row["derivation"] for row in csv.DictReader(f)
        if row["source_id"] == "datacrunch-sglang-h200" and "405b" in row["model"]
    ]
  assert derivations and all("--mem-frac 0.87" in d for d in derivations)
  assert by_model["llama-3.1-405b"]["u_mem"] == 0.87
  assert by_model["llama-3.1-70b"] == engine_rules.settings("sglang", h200, tp=8)
  with pytest.raises(InputError, match="engine"):
    engine_rules.settings("tgi", mi300x)
