"""The declared schemas of the files we read: a model config (`config_schema`, wired
into `hf_config`), an accelerator entry or file (`accelerator_schema`, wired into
`what_if.load_accelerator_file`) and a serving-benchmark result (`vllm_result_schema`,
declared; its reader is wired in part 2). Every file we ship passes, and the faults
issue 53 reported (and their neighbours) are refused in one line naming the field."""

from __future__ import annotations

import copy
import glob
import json
import math
import pathlib

import pytest

from jaxroof import schema
from jaxroof.errors import InputError
from jaxroof.engines import vllm_engine
from jaxroof.measure import vllm_result_schema
from jaxroof.specs import accelerator_schema
from jaxroof.specs import hf_config
from jaxroof.specs import models
from jaxroof.specs import parameters
from jaxroof.specs import what_if
from jaxroof.specs.readers import config_schema

ROOT = pathlib.Path(__file__).resolve().parent.parent
TABLE = json.loads((ROOT / "jaxroof/specs/data/accelerators.json").read_text())
H100 = TABLE["accelerators"]["h100-sxm"]
FIXTURE = json.loads((ROOT / "tests/data/vllm_cpu_detailed_fixture.json").read_text())


def _config(name: str) -> dict:
  return json.loads((models.MODELS_DIR / f"{name}.json").read_text())


def _refused(spec, doc, *needles: str) -> str:
  with pytest.raises(InputError) as caught:
    schema.check(spec, doc, where="f.json")
  message = str(caught.value)
  assert "\n" not in message and len(message) < 400, message
  for needle in needles:
    assert needle in message, message
  return message


# Model configs.


def test_every_shipped_config_passes_the_schema():
  for name in models.shipped_models():
    schema.check(config_schema.CONFIG, _config(name), where=name)


def test_the_schema_declares_every_field_the_readers_read():
  """Each field name a reader passes to `Fields` or reads with `config.get` is declared,
  so a wrong type of it is refused before the reader (a field added to a reader and not
  to the schema fails here)."""
  import re
  text = "".join(p.read_text() for p in (ROOT / "jaxroof/specs/readers").glob("*.py")
                 if p.name != "config_schema.py")
  used = set(re.findall(r'f\.(?:int|nullable_int|optional_int|bool|int_list)\(\s*"(\w+)"', text))
  used |= set(re.findall(r'f\.(?:int|bool)\(\s*"\w+",\s*"(\w+)"', text))
  used |= set(re.findall(r'config\.get\(\s*"(\w+)"', text))
  used |= {"max_position_embeddings", "n_layer", "d_model"}
  declared = set(config_schema.FIELDS) | {"text_config", "ssm_cfg"}
  declared |= set(config_schema.FIELDS["quantization_config"].fields)
  undeclared = {k for k in used - declared if not k.startswith("{")}
  assert not undeclared, sorted(undeclared)


@pytest.mark.parametrize("name, change, needles", [
    ("llama-3-8b", {"max_position_embeddings": "8192"}, ["max_position_embeddings='8192'"]),
    ("llama-3-8b", {"max_position_embeddings": 8192.5}, ["max_position_embeddings=8192.5"]),
    ("llama-3-8b", {"max_position_embeddings": True}, ["max_position_embeddings=true"]),
    ("llama-3-8b", {"max_position_embeddings": math.nan}, ["max_position_embeddings=nan"]),
    ("gpt-oss-20b", {"quantization_config": [1]}, ["quantization_config=[1]", "JSON object"]),
    ("gpt-oss-20b", {"quantization_config": {"quant_method": "gptq", "bits": "four"}
                    }, ["quantization_config.bits='four'"]),
    ("gpt-oss-20b", {"quantization_config": {"quant_method": "gptq", "bits": 0}
                    }, ["quantization_config.bits=0"]),
    ("gpt-oss-20b", {"quantization_config": {"bits": 4}
                    }, ["lacks quantization_config.quant_method"]),
    ("deepseek-v3", {"quantization_config": {"quant_method": "fp8", "weight_block_size": ["a"]}
                    }, ["weight_block_size[0]='a'"]),
    ("gpt-oss-20b", {"experts_per_token": 64, "num_experts_per_tok": 64},
     ["num_experts_per_tok=64 with num_local_experts=32", "at most num_local_experts"]),
    ("gpt-oss-20b", {"experts_per_token": 64}, ["num_experts_per_tok=4 with experts_per_token=64"]),
    ("deepseek-v3", {"num_experts_per_tok": 300}, ["num_experts_per_tok=300 with n_routed_experts"
                                                  ]),
    ("llama-3-8b", {"torch_dtype": ["bfloat16"]}, ["torch_dtype=['bfloat16']"]),
    ("llama-3-8b", {"num_key_value_heads": 3
                   }, ["num_attention_heads=32 with num_key_value_heads=3"]),
    ("llama-4-scout-17b-16e", {"text_config": {"num_experts_per_tok": 17, "num_local_experts": 16}},
     ["text_config.num_experts_per_tok=17 with text_config.num_local_experts=16"]),
    ("mamba-2.8b", {"ssm_cfg": {"d_state": -16}}, ["ssm_cfg.d_state=-16"]),
])
def test_a_reported_config_fault_is_refused_naming_the_field(tmp_path, name, change, needles):
  config = _config(name)
  for key, value in change.items():
    if key in ("text_config", "ssm_cfg"):  # Changed inside.
      config[key] = {**(config.get(key) or {}), **value}
    else:
      config[key] = value
  path = tmp_path / "config.json"
  path.write_text(json.dumps(config))
  models._load.cache_clear()
  with pytest.raises(InputError) as caught:
    models.load_model(str(path))
  message = str(caught.value)
  assert "\n" not in message and message.startswith(str(path)), message
  for needle in needles:
    assert needle in message, message


def test_valid_variants_of_a_config_read_as_the_original():
  """A null size reads as absent (the reader's default), a whole float as its int, a null
  quantization_config as none: the same spec as the shipped file, or the default's."""
  base = hf_config.spec_from_config(_config("llama-3-8b"), name="x")
  for change in ({"max_position_embeddings": 8192.0}, {"quantization_config": None},
                 {"num_attention_heads": 32.0}):
    spec = hf_config.spec_from_config({**_config("llama-3-8b"), **change}, name="x")
    assert spec == base, change
  spec = hf_config.spec_from_config({**_config("llama-3-8b"), "max_position_embeddings": None},
                                    name="x")
  assert spec.max_position_embeddings is None and spec.defaults_used == base.defaults_used
  oss = hf_config.spec_from_config(_config("gpt-oss-20b"), name="x")
  assert parameters.published_format(oss).dtype == "mxfp4"


# Accelerator files.


def test_the_shipped_table_and_every_accelerator_file_we_wrote_pass():
  schema.check(accelerator_schema.TABLE, TABLE, where="accelerators.json")
  written = [
      path for folder in ("results", "tests/data")
      for path in glob.glob(str(ROOT / folder / "**" / "accelerator*.json"), recursive=True)
  ]
  assert written
  for path in written:
    schema.check(accelerator_schema.FILE, json.loads(pathlib.Path(path).read_text()), where=path)


def test_rate_dtypes_match_the_reader():
  assert accelerator_schema.RATE_DTYPES == what_if.RATE_DTYPES


@pytest.mark.parametrize("path, value, needle", [
    (("scale_up", "unidirectional_gb_s"), math.nan, "scale_up.unidirectional_gb_s=nan"),
    (("scale_up", "unidirectional_gb_s"), -450, "scale_up.unidirectional_gb_s=-450"),
    (("scale_up", "unidirectional_gb_s"), 0, "scale_up.unidirectional_gb_s=0"),
    (("scale_up", "per_link_unidirectional_gb_s"), "25",
     "scale_up.per_link_unidirectional_gb_s='25'"),
    (("scale_up", "topology"), 7, "scale_up.topology=7"),
    (("scale_up_domain", "chips"), 0, "scale_up_domain.chips=0"),
    (("hop_latency", "value_us"), 0, "hop_latency.value_us=0"),
    (("hop_latency", "modeling_assumptions", "nccl_ring_per_step_us", "LL"), "fast",
     "hop_latency.modeling_assumptions.nccl_ring_per_step_us.LL='fast'"),
    (("hop_latency", "modeling_assumptions"), [1], "hop_latency.modeling_assumptions=[1]"),
    (("scale_out", "per_chip_unidirectional_gb_s"), -50,
     "scale_out.per_chip_unidirectional_gb_s=-50"),
    (("on_chip",), [1], "on_chip=[1]"),
    (("interconnect",), 450, "interconnect=450"),
    (("interconnect", "unidirectional_gb_s"), math.inf, "interconnect.unidirectional_gb_s=inf"),
    (("dense_tflops", "bf16"), None, "dense_tflops.bf16=null"),
    (("tdp_w",), -700, "tdp_w=-700"),
])
def test_a_reported_accelerator_fault_is_refused_before_use(tmp_path, path, value, needle):
  entry = copy.deepcopy(H100)
  target = entry
  for part in path[:-1]:
    target = target[part]
  target[path[-1]] = value
  file = tmp_path / "a.json"
  file.write_text(json.dumps(entry))
  with pytest.raises(InputError) as caught:
    what_if.load_accelerator_file(file)
  message = str(caught.value)
  assert message.startswith(f"accelerator_file='{file}' field {needle} is not allowed"), message
  assert caught.value.field == "accelerator_file" and "\n" not in message


def test_a_user_file_of_a_datasheet_entry_reads_as_the_shipped_one(tmp_path):
  from jaxroof.specs import accelerators
  file = tmp_path / "h100-sxm.json"
  file.write_text(json.dumps(H100))
  mine = what_if.load_accelerator_file(file)
  shipped = accelerators.load_accelerator("h100-sxm")
  assert mine.links == shipped.links and mine.flops_per_s == shipped.flops_per_s
  table = tmp_path / "t.json"
  table.write_text(json.dumps({"accelerators": {"a": H100, "b": H100}}))
  with pytest.raises(InputError, match=r"field accelerators=.* of exactly 1 field"):
    what_if.load_accelerator_file(table)


# Serving-benchmark results (declared; `vllm_results` reads them through it in part 2).


def test_the_keys_match_the_engine_module():
  assert vllm_result_schema.DETAIL_KEYS == vllm_engine.DETAIL_KEYS
  assert vllm_result_schema.RUN_KEY == vllm_engine.RUN_KEY


def test_every_result_we_ship_passes():
  count = 0
  paths = glob.glob(str(ROOT / "results" / "vllm_cpu" / "**" / "*.json"), recursive=True)
  for path in paths + glob.glob(str(ROOT / "tests" / "data" / "**" / "*vllm*.json*"),
                                recursive=True):
    text = pathlib.Path(path).read_text()
    try:
      runs = [(None, json.loads(text))]
    except json.JSONDecodeError:  # JSONL: one run per line.
      runs = [(i, json.loads(line)) for i, line in enumerate(text.splitlines(), 1) if line.strip()]
    for line, run in runs:
      if isinstance(run, dict) and ("model_id" in run or "concurrency" in run):
        vllm_result_schema.check_run(run, path, line)
        count += 1
  assert count >= 5  # The runs tests/data ships (results/ keeps only fits).


@pytest.mark.parametrize("change, needle", [
    ({"itls": [0.005] * 6}, "field itls[0]=0.005"),
    ({"input_lens": [math.inf] + [64] * 5}, "field input_lens[0]=inf"),
    ({"input_lens": [1e30] + [64] * 5}, "field input_lens[0]=1e+30"),
    ({"completed": 10**12}, "field completed=1000000000000"),
    ({"ttfts": [math.nan] * 6}, "field ttfts[0]=nan"),
    ({"request_rate": -1}, "field request_rate=-1"),
    ({"median_itl_ms": "4.6"}, "field median_itl_ms='4.6'"),
    ({"output_lens": [8] * 5}, "input_lens=<6 items> with output_lens=<5 items>"),
    ({"jaxroof_engine_run": {"server": {"kv_blocks": "1024"}}
     }, "field jaxroof_engine_run.server.kv_blocks='1024'"),
    ({"jaxroof_engine_run": {"server": {"config": {"max_num_seqs": "32"}}}
     }, "jaxroof_engine_run.server.config.max_num_seqs='32'"),
])
def test_a_reported_result_fault_is_refused(change, needle):
  run = {**copy.deepcopy(FIXTURE), **change}
  with pytest.raises(InputError) as caught:
    vllm_result_schema.check_run(run, "r.json", field="from_vllm")
  assert needle in str(caught.value) and "\n" not in str(caught.value), str(caught.value)
  assert caught.value.field == "from_vllm"


def test_deep_nesting_and_size_are_bounded(tmp_path):
  path = tmp_path / "r.json"
  path.write_text(json.dumps({**FIXTURE, "extra": [[[[[[[[[1]]]]]]]]]}))
  with pytest.raises(InputError, match="nested over 8 levels"):
    schema.load(vllm_result_schema.KIND, "from_vllm", path)
  path.write_text(json.dumps(FIXTURE))
  assert schema.load(vllm_result_schema.KIND, "from_vllm", path)["completed"] == 6
