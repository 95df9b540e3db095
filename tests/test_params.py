"""Parameter counts against published totals, and bytes per weight.

Published figures: the issue's (Llama-3-8B 8.03B; Mixtral-8x7B 46.7B total,
12.9B active; DeepSeek-V3 671B total, about 37B active) and the model cards
cited in each config's `_jaxroof_source`.
"""

import json

import pytest

from jaxroof.specs import parameters as params
from jaxroof.errors import InputError
from jaxroof.specs.models import MODELS_DIR, load_model
from jaxroof.specs.parameters import parameter_counts

B_ = 1e9


@pytest.mark.parametrize("name, published", [
    ("llama-3-8b", 8.03 * B_),
    ("mixtral-8x7b", 46.7 * B_),
    ("deepseek-v3", 671 * B_),
    ("llama-2-7b", 6.74 * B_),
    ("mistral-7b", 7.24 * B_),
    ("qwen2.5-7b", 7.61 * B_),
    ("qwen3-30b-a3b", 30.5 * B_),
    ("gemma-2-9b", 9.24 * B_),
    ("gemma-3-1b", 1.0 * B_),
    ("gpt-oss-20b", 20.91 * B_),
    ("llama-3.1-70b", 70.55 * B_),
    ("llama-3.1-405b", 405.85 * B_),
    ("tinyllama-1.1b", 1.1 * B_),
    ("mamba-2.8b", 2.77 * B_),
])
def test_totals_within_one_percent_of_published(name, published):
  assert parameter_counts(load_model(name)).total == pytest.approx(published, rel=0.01)


@pytest.mark.parametrize(
    "name, published, rel",
    [
        ("mixtral-8x7b", 12.9 * B_, 0.01),
        ("qwen3-30b-a3b", 3.3 * B_, 0.02),  # Published as "3.3B", two digits.
        ("deepseek-v3", 37 * B_, 0.02),  # "About 37B" (the paper rounds).
    ])
def test_active_per_token_against_published(name, published, rel):
  assert parameter_counts(load_model(name)).active == pytest.approx(published, rel=rel)


@pytest.mark.parametrize(
    "name, published",
    [
        ("deepseek-v3", 36.6 * B_),  # README_WEIGHTS: activated, embedding excluded.
        ("gpt-oss-20b", 3.61 * B_),  # Model card: active, embedding excluded.
    ])
def test_active_without_the_embedding_lookup(name, published):
  assert parameter_counts(load_model(name)).active_matmul == pytest.approx(published, rel=0.01)


def test_dense_models_are_wholly_active():
  counts = parameter_counts(load_model("llama-3-8b"))
  assert counts.active == counts.total
  assert counts.active_matmul == counts.total - counts.embeddings


def test_llama3_8b_count_from_the_config_fields():
  c = json.loads((MODELS_DIR / "llama-3-8b.json").read_text())
  h, i, n, v = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
  kv = c["num_key_value_heads"] * h // c["num_attention_heads"]
  per_block = h * h * 2 + h * kv * 2 + 3 * h * i + 2 * h
  expected = n * per_block + 2 * v * h + h
  assert parameter_counts(load_model("llama-3-8b")).total == expected


def test_mixtral_active_is_shared_plus_top2_of_8_experts():
  counts = parameter_counts(load_model("mixtral-8x7b"))
  expert = 3 * 4096 * 14336
  assert counts.routed_expert == expert
  assert counts.experts_routed == 32 * 8 * expert
  assert counts.total - counts.active == 32 * 6 * expert


def test_activation_widths_are_each_blocks_hidden_and_active_mlp_widths():
  """A_w, what an engine's elementwise kernels scale with per token, by hand from the
  published configs: Llama-3-8B 32 x (4096 + 14336); Mixtral-8x7B 32 x (4096 + 2 x 14336),
  the two experts a token takes; DeepSeek-V3 61 x 7168 hidden, 3 dense blocks of 18432 and
  58 MoE blocks of 8 routed experts and 1 shared, each 2048 wide."""
  assert params.activation_widths(load_model("llama-3-8b")) == 32 * (4096 + 14336)
  assert params.activation_widths(load_model("mixtral-8x7b")) == 32 * (4096 + 2 * 14336)
  assert params.activation_widths(load_model("deepseek-v3")) == (61 * 7168 + 3 * 18432 + 58 *
                                                                 (8 + 1) * 2048)


def test_breakdown_sums_to_total_and_tied_models_have_no_head():
  for name in ("gemma-2-9b", "deepseek-v3", "mamba-2.8b", "gpt-oss-20b"):
    counts = parameter_counts(load_model(name))
    assert sum(counts.breakdown().values()) == counts.total
  gemma = parameter_counts(load_model("gemma-2-9b"))
  assert gemma.tied and gemma.lm_head == 0 and gemma.embeddings == 256000 * 3584
  assert parameter_counts(load_model("mamba-2.8b")).recurrent > 0


@pytest.mark.parametrize(
    "dtype, group, expected",
    [
        ("bf16", None, 2.0),
        ("fp16", None, 2.0),
        ("fp8", None, 1.0),
        ("int8", None, 1.0),
        ("int8", 128, 1.0 + 2 / 128),
        ("int4", None, 0.5 + 2 / 128),  # Default groups of 128, 2-byte scales.
        ("int4", 32, 0.5 + 2 / 32),
    ])
def test_bytes_per_weight_with_group_scales(dtype, group, expected):
  assert params.bytes_per_weight(dtype, group) == pytest.approx(expected)


def test_weight_bytes_scale_with_the_dtype():
  counts = parameter_counts(load_model("llama-3-8b"))
  bf16 = params.weight_bytes(counts, "bf16")
  int4 = params.weight_bytes(counts, "int4", scale_bytes=0)
  assert bf16["total_bytes"] == pytest.approx(2 * counts.total)
  assert int4["total_bytes"] == pytest.approx(bf16["total_bytes"] / 4)


def test_bad_dtypes_and_groups():
  with pytest.raises(InputError, match="weight_dtype='int3'.*int4"):
    params.bytes_per_weight("int3")
  with pytest.raises(InputError, match="group_size"):
    params.bytes_per_weight("bf16", 128)
  with pytest.raises(InputError, match="group_size=0"):
    params.bytes_per_weight("int4", 0)


def test_a_users_tied_llama_config():
  # meta-llama/Llama-3.2-1B's config.json fields; published: 1.24B parameters.
  from jaxroof.specs import hf_config
  spec = hf_config.spec_from_config(
      {
          "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
          "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
          "head_dim": 64, "vocab_size": 128256, "tie_word_embeddings": True
      }, name="user")
  counts = parameter_counts(spec)
  assert counts.total == pytest.approx(1.24e9, rel=0.01)
  assert counts.lm_head == 0 and counts.active_matmul == counts.total  # Head multiplies.


@pytest.mark.parametrize(
    "dtype, bits_per_weight",
    [
        # OCP MX v1.0: E2M1 + one 8-bit E8M0 scale per 32 (gpt-oss card: "4.25 bits").
        ("mxfp4", 4 + 8 / 32),
        # NVFP4: E2M1 + one FP8 E4M3 scale per 16 (NVIDIA: 3.5x smaller than FP16).
        ("nvfp4", 4 + 8 / 16),
    ])
def test_fp4_formats_store_their_block_scales(dtype, bits_per_weight):
  assert params.bytes_per_weight(dtype) == pytest.approx(bits_per_weight / 8)


def test_nvfp4_matches_nvidias_stated_ratios():
  """NVIDIA: NVFP4 reduces memory ~3.5x versus FP16 and ~1.8x versus FP8."""
  nvfp4 = params.bytes_per_weight("nvfp4")
  assert params.bytes_per_weight("fp16") / nvfp4 == pytest.approx(3.5, abs=0.1)
  assert params.bytes_per_weight("fp8") / nvfp4 == pytest.approx(1.8, abs=0.05)


# Published formats (issue 14 §5). gpt-oss model card (arXiv 2508.10925) Table 1:
# gpt-oss-20b's checkpoint is 12.8 GiB with its MoE weights in MXFP4 (4.25 bits)
# and the rest in bf16; its config.json's quantization_config says mxfp4 with
# self_attn, router, embed_tokens and lm_head not converted.
def test_gpt_oss_published_checkpoint_size_matches_the_model_card():
  spec = load_model("gpt-oss-20b")
  fmt = params.weight_format(spec, params.PUBLISHED)
  assert fmt.dtype == "mxfp4" and fmt.published and fmt.parts == ("experts_routed",)
  assert fmt.label == "mxfp4 (published)"
  assert fmt.resident_bytes(parameter_counts(spec)) / 2**30 == pytest.approx(12.8, rel=0.01)
  # Every weight in MXFP4 (the explicit dtype) is smaller than the checkpoint.
  uniform = params.weight_format(spec, "mxfp4")
  assert not uniform.published and uniform.parts is None
  assert uniform.resident_bytes(parameter_counts(spec)) < 0.9 * 12.8 * 2**30


def test_mixed_step_bytes_count_experts_at_mxfp4_and_the_rest_at_bf16():
  """At batch 1 a step reads every non-expert weight once (bf16, 2 B), one
  embedding row (bf16) and top-K = 4 experts per MoE block (0.53125 B)."""
  spec = load_model("gpt-oss-20b")
  counts = parameter_counts(spec)
  fmt = params.weight_format(spec, params.PUBLISHED)
  q = fmt.read_bytes_per_weight(counts, [1, 8, 64, 4096])
  n = params.weights_read_per_step(counts, [1, 8, 64, 4096])
  expected_b1 = ((counts.read_every_step + counts.hidden_size) * 2 +
                 counts.moe_layers * counts.experts_per_token * counts.routed_expert * 0.53125)
  assert q[0] * n[0] == pytest.approx(expected_b1, rel=1e-12)
  assert all(0.53125 < v < 2 for v in q)
  assert q[0] > q[1] > q[2]  # More experts read: a larger MXFP4 share (rows aside).


@pytest.mark.parametrize("name, dtype", [("llama-3-8b", "bf16"), ("llama-2-7b", "fp16"),
                                         ("mixtral-8x7b", "bf16"), ("deepseek-v3", "fp8"),
                                         ("kimi-k2", "fp8"), ("gpt-oss-20b", "mxfp4")])
def test_published_dtype_follows_the_config(name, dtype):
  """torch_dtype (bfloat16 / float16) or quantization_config.quant_method."""
  fmt = params.published_format(load_model(name))
  assert fmt.dtype == dtype and fmt.published


def test_float32_configs_are_served_in_bf16_and_say_so():
  fmt = params.published_format(load_model("gemma-2-9b"))  # torch_dtype float32
  assert fmt.dtype == "bf16" and not fmt.published and fmt.label == "bf16"
  assert "float32" in fmt.describe() and "served in bf16" in fmt.describe()


def test_deepseek_fp8_blocks_count_their_float32_scales():
  """DeepSeek-V3's config: fp8 e4m3 with weight_block_size [128, 128], one
  float32 scale per block: 1 + 4/16384 B per quantized weight; embeddings,
  LM head, router and norms stay bf16. So the checkpoint is just over one byte
  per weight and about half the bf16 size."""
  spec = load_model("deepseek-v3")
  counts = parameter_counts(spec)
  fmt = params.weight_format(spec, params.PUBLISHED)
  assert fmt.q == 1 + 4 / 16384 and fmt.group_size == 128 * 128
  assert "router" not in fmt.parts and "embeddings" not in fmt.parts
  resident = fmt.resident_bytes(counts)
  assert 1.0 * counts.total < resident < 1.01 * counts.total
  assert resident == pytest.approx(
      sum(n * (fmt.q if part in fmt.parts else 2) for part, n in counts.breakdown().items()))


def test_published_group_size_override_and_bad_values():
  spec = load_model("gpt-oss-20b")
  assert params.weight_format(spec, params.PUBLISHED, group_size=16).q == 0.5 + 1 / 16
  with pytest.raises(InputError, match="group_size"):
    params.weight_format(load_model("llama-3-8b"), params.PUBLISHED, group_size=32)
  with pytest.raises(InputError, match="weight_dtype"):
    params.weight_format(spec, "fp4")
