"""Reading Hugging Face config.json files into a ModelSpec: schedules and errors.

Layer schedules are checked against the rules transformers documents for each
model type, written out here; configs of types not shipped are small
hand-made dicts with the field names real hub files use.
"""

import json

import pytest

from jaxroof.specs import hf_config
from jaxroof.errors import InputError
from jaxroof.specs.model_spec import FULL, MLA, RECURRENT, SLIDING
from jaxroof.specs.models import load_model, shipped_models
from jaxroof.specs.parameters import parameter_counts

REQUIRED = {
    "llama-2-7b", "llama-3-8b", "llama-3.1-70b", "llama-3.1-405b", "mistral-7b", "mixtral-8x7b",
    "qwen2.5-7b", "qwen3-30b-a3b", "gemma-2-9b", "deepseek-v3", "tinyllama-1.1b", "mamba-2.8b",
    "lesson-toy"
}

LLAMA = {
    "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 100
}


def spec_of(config, name="test"):
  return hf_config.spec_from_config(config, name=name, source="test.json")


def test_every_required_model_is_shipped_and_loads():
  assert REQUIRED <= set(shipped_models())
  for name in shipped_models():
    spec = load_model(name)
    assert spec.name == name
    assert spec.num_layers == len(spec.moe_layers) > 0


def test_shipped_configs_carry_their_source():
  from jaxroof.specs.models import MODELS_DIR, SOURCE_KEY
  for path in MODELS_DIR.glob("*.json"):
    source = json.loads(path.read_text())[SOURCE_KEY]
    assert source["config_url"] and source["published"], path.name


def test_names_are_case_insensitive_and_paths_work(tmp_path):
  assert load_model("Llama-3-8B").name == "llama-3-8b"
  (tmp_path / "my-model").mkdir()
  (tmp_path / "my-model" / "config.json").write_text(json.dumps(LLAMA))
  by_folder = load_model(str(tmp_path / "my-model"))
  by_file = load_model(str(tmp_path / "my-model" / "config.json"))
  assert by_folder.name == by_file.name == "my-model"
  assert by_folder.layer_kinds == (FULL,) * 4


@pytest.mark.parametrize(
    "name, schedule",
    [
        ("llama-3-8b", {FULL: 32}),
        ("mistral-7b", {SLIDING: 32}),
        ("qwen2.5-7b", {FULL: 28}),  # use_sliding_window is false.
        ("gemma-2-9b", {SLIDING: 21, FULL: 21}),
        ("gemma-3-1b", {SLIDING: 22, FULL: 4}),
        ("gpt-oss-20b", {SLIDING: 12, FULL: 12}),
        ("deepseek-v3", {MLA: 61}),
        ("mamba-2.8b", {RECURRENT: 64}),
    ])
def test_layer_schedules(name, schedule):
  spec = load_model(name)
  assert {k: spec.layers_of(k) for k in set(spec.layer_kinds)} == schedule


def test_gemma2_windows_even_blocks_and_gemma3_every_sixth_is_global():
  gemma2 = load_model("gemma-2-9b")
  assert gemma2.layer_kinds[:4] == (SLIDING, FULL, SLIDING, FULL)
  gemma3 = load_model("gemma-3-1b")
  assert [i for i, k in enumerate(gemma3.layer_kinds) if k == FULL] == [5, 11, 17, 23]
  assert gemma3.attention.sliding_window == 512


def test_gemma3_layer_types_and_nested_text_config_agree():
  base = {
      "model_type": "gemma3_text", "hidden_size": 1152, "num_hidden_layers": 12,
      "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
      "intermediate_size": 6912, "vocab_size": 262144, "sliding_window": 512
  }
  by_pattern = spec_of({**base, "sliding_window_pattern": 6})
  types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(12)]
  by_types = spec_of({**base, "layer_types": types})
  nested = spec_of({
      "model_type": "gemma3",
      "text_config": {**base, "model_type": None, "sliding_window_pattern": 6}
  })
  assert by_pattern.layer_kinds == by_types.layer_kinds == nested.layer_kinds
  assert by_pattern.layer_kinds.count(FULL) == 2
  assert parameter_counts(nested).total == parameter_counts(by_pattern).total
  assert any("vision" in n for n in nested.notes)


def test_gemma3_text_config_with_hub_defaults():
  # The text_config of google/gemma-3-4b-it names only these fields; the rest
  # are Gemma3TextConfig defaults (8 heads, 4 KV heads, head_dim 256, pattern 6).
  spec = spec_of({
      "model_type": "gemma3", "text_config": {
          "hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
          "num_hidden_layers": 34, "sliding_window": 1024
      }
  })
  assert (spec.attention.num_heads, spec.attention.num_kv_heads, spec.attention.head_dim) == (8, 4,
                                                                                              256)
  assert spec.layers_of(FULL) == 34 // 6
  assert any(d.startswith("num_attention_heads=") for d in spec.defaults_used)


def test_qwen2_windows_from_max_window_layers_when_enabled():
  config = {
      **LLAMA, "model_type": "qwen2", "use_sliding_window": True, "sliding_window": 32,
      "max_window_layers": 2
  }
  assert spec_of(config).layer_kinds == (FULL, FULL, SLIDING, SLIDING)
  assert spec_of({**config, "use_sliding_window": False}).layer_kinds == (FULL,) * 4


def test_qwen3_moe_dense_layers_follow_mlp_only_layers_and_sparse_step():
  config = {
      **LLAMA, "model_type": "qwen3_moe", "head_dim": 8, "num_experts": 8, "num_experts_per_tok": 2,
      "moe_intermediate_size": 16, "mlp_only_layers": [0], "decoder_sparse_step": 1
  }
  assert spec_of(config).moe_layers == (False, True, True, True)
  assert spec_of({**config, "mlp_only_layers": [],
                  "decoder_sparse_step": 2}).moe_layers == (False, True, False, True)


def test_deepseek_first_dense_layers_and_mtp_note():
  spec = load_model("deepseek-v3")
  assert spec.moe_layers[:3] == (False,) * 3 and all(spec.moe_layers[3:])
  assert spec.moe.num_shared_experts == 1
  assert any("multi-token" in n for n in spec.notes)


def test_mamba_ssm_format_matches_the_hf_format():
  original = {
      "d_model": 2560, "n_layer": 64, "vocab_size": 50277, "ssm_cfg": {}, "rms_norm": True,
      "residual_in_fp32": True, "fused_add_norm": True, "pad_vocab_size_multiple": 8
  }
  spec = spec_of(original)
  hf = load_model("mamba-2.8b")
  assert spec.vocab_size == 50280  # Padded to a multiple of 8.
  assert spec.ssm == hf.ssm
  assert parameter_counts(spec).total == parameter_counts(hf).total


@pytest.mark.parametrize("config, needles", [
    ({"model_type": "bert", "hidden_size": 8}, ["bert", "not supported", "llama"]),
    ({"model_type": "lama"}, ["lama", "llama"]),
    ({"hidden_size": 8}, ["model_type"]),
    ({**LLAMA, "num_attention_heads": None}, ["num_attention_heads"]),
    ({k: v for k, v in LLAMA.items() if k != "hidden_size"}, ["hidden_size", "llama"]),
    ({**LLAMA, "num_hidden_layers": 0}, ["num_hidden_layers=0"]),
    ({**LLAMA, "num_key_value_heads": 3}, ["num_key_value_heads=3"]),
    ({**LLAMA, "layer_types": ["full_attention"] * 3}, ["layer_types", "4 blocks"]),
    ({**LLAMA, "layer_types": ["chunked_attention"] * 4}, ["chunked_attention"]),
    ({**LLAMA, "layer_types": ["sliding_attention"] * 4}, ["sliding_window"]),
    ({
        "model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 2, "vocab_size": 10
    }, ["kv_lora_rank"]),
    ({"d_model": 8, "n_layer": 2, "vocab_size": 10, "ssm_cfg": {"layer": "Mamba2"}}, ["Mamba2"]),
])
def test_bad_configs_name_the_type_or_field(config, needles):
  with pytest.raises(InputError) as e:
    spec_of(config)
  for needle in needles:
    assert needle in str(e.value)


def test_bad_names_and_files(tmp_path):
  with pytest.raises(InputError, match="llama-3-8b.*Known: .*tinyllama-1.1b"):
    load_model("llama3-8b")
  with pytest.raises(InputError, match="no such file"):
    load_model(str(tmp_path / "missing.json"))
  with pytest.raises(InputError, match="without a config.json"):
    load_model(str(tmp_path))
  broken = tmp_path / "broken.json"
  broken.write_text('{"model_type": "llama",')
  with pytest.raises(InputError, match="not valid JSON.*line 1"):
    load_model(str(broken))
  listed = tmp_path / "list.json"
  listed.write_text("[1, 2]")
  with pytest.raises(InputError, match="JSON object"):
    load_model(str(listed))
