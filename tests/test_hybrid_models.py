"""Hybrid and newer model types (issue 16): readers, parameter totals against
published figures, K/V and recurrent state recomputed from raw config fields,
published K/V figures, vLLM's hybrid page rule, and bad input.

Sources named where used. K/V per token and states for every shipped config
are also recomputed from raw fields in `tests/test_kv_sizing.py`
(`independent_hybrid_kv`).
"""

import json
import math

import pytest
import sympy as sp

from jaxroof.errors import InputError
from jaxroof.specs import hf_config, kv_sizing, step_inputs
from jaxroof.specs.model_spec import (CHUNKED, FULL, LINEAR_ATTENTION, MAMBA2, NO_MIXER, RECURRENT,
                                      SLIDING)
from jaxroof.specs.models import MODELS_DIR, load_model
from jaxroof.specs.parameters import parameter_counts
from jaxroof.symbolic import architecture as af
from jaxroof.symbolic.symbols import P

GiB = 2**30


def _raw(name):
  return json.loads((MODELS_DIR / f"{name}.json").read_text())


def _rounds_to(value, published, unit):
  """The published figure is `value` rounded to whole `unit`s."""
  return abs(value - published * unit) <= unit / 2


# --- Parameter totals against published figures ----------------------------


def test_qwen3_next_parameters_match_the_published_80b_and_3b_active():
  # HF transformers docs, model_doc/qwen3_next: "80B total parameters, only 3B
  # active" (Qwen counts active parameters without embeddings and LM head).
  c = parameter_counts(load_model("qwen3-next-80b-a3b"))
  assert _rounds_to(c.total, 80, 1e9)
  assert _rounds_to(c.active - c.embeddings - c.lm_head, 3, 1e9)


@pytest.mark.parametrize("name, total", [("llama-4-scout-17b-16e", 109),
                                         ("llama-4-maverick-17b-128e", 402)])
def test_llama4_text_decoder_is_the_published_total_less_the_vision_tower(name, total):
  # HF transformers docs model_doc/llama4 and the HF llama4-release blog:
  # "17B active parameters out of ~109B total" (Scout); the family "comes in two
  # flavors: 109B, and 402B parameters" (Maverick),
  # both with the vision tower, which jaxroof does not count (and says so).
  spec = load_model(name)
  c = parameter_counts(spec)
  assert 0.97 * total * 1e9 < c.total < total * 1e9
  assert _rounds_to(c.active, 17, 1e9)
  assert any("vision tower" in n for n in spec.notes)


def test_nemotron_h_56b_and_jamba_and_kimi_k2_totals():
  # arXiv 2504.03624 (Nemotron-H): 56B. arXiv 2403.19887 (Jamba): "12B-active /
  # 52B-available". MoonshotAI/Kimi-K2 README @c6157be: 1T total, 32B activated
  # (activated without the embedding table, as DeepSeek-V3's 37B).
  assert _rounds_to(parameter_counts(load_model("nemotron-h-56b")).total, 56, 1e9)
  jamba = parameter_counts(load_model("jamba-v0.1"))
  assert _rounds_to(jamba.total, 52, 1e9) and _rounds_to(jamba.active, 12, 1e9)
  kimi = parameter_counts(load_model("kimi-k2"))
  assert _rounds_to(kimi.total, 1, 1e12) and _rounds_to(kimi.active_matmul, 32, 1e9)


def test_qwen3_next_blocks_recounted_from_the_module_dump():
  # Module dump of the real model (FACTS.md §1): q_proj 2048->8192 (query and
  # gate), in_proj_qkvz 2048->12288, in_proj_ba 2048->64, conv1d 8192 channels.
  spec = load_model("qwen3-next-80b-a3b")
  h = 2048
  attention = h * 8192 + 2 * h * 512 + 4096 * h + 2 * 256
  gdn = h * 12288 + h * 64 + 8192 * 4 + 2 * 32 + 128 + 4096 * h
  c = parameter_counts(spec)
  assert c.attention == 12 * attention
  assert c.recurrent == 36 * gdn


def test_dense_variants_differences():
  granite, phi4 = load_model("granite-3.1-8b"), load_model("phi-4-mini")
  assert granite.tie_word_embeddings and phi4.tie_word_embeddings
  assert parameter_counts(granite).lm_head == 0
  phi3 = load_model("phi-3-mini-4k")
  assert set(phi3.layer_kinds) == {SLIDING} and phi3.attention.sliding_window == 2047
  olmo = load_model("olmo-2-13b")
  plain = parameter_counts(
      hf_config.spec_from_config({**_raw("olmo-2-13b"), "model_type": "llama"}, name="x"))
  # OLMo 2's q/k norms span all heads: (40 + 40) x 128 weights per block.
  assert parameter_counts(olmo).attention - plain.attention == 40 * 80 * 128


# --- K/V and state from raw fields; published K/V figures --------------------


def test_jamba_paper_kv_table():
  # Jamba paper (arXiv 2403.19887), Table 1: K/V cache at 256K tokens, 16-bit:
  # Jamba 4GB, Mixtral 32GB, Llama-2 7B 128GB. The figures are binary GB (GiB):
  # 4 attention blocks x 2 x 8 KV heads x 128 x 2 B x 262144 = 4 x 2**30 exactly.
  ctx = 256 * 1024

  def kv(name):
    sizing = kv_sizing.size_kv(load_model(name), context=ctx, block_size=1)
    return sum(k.payload_bytes for k in sizing.kinds if not k.state_dtype)

  assert kv("jamba-v0.1") == 4 * GiB
  assert kv("mixtral-8x7b") == 32 * GiB
  assert kv("llama-2-7b") == 128 * GiB


def test_jamba_kv_is_8x_smaller_than_all_attention():
  # "8x smaller KV cache compared to a vanilla Transformer" (Jamba post,
  # ssawant.github.io): 1 attention block in 8.
  c = _raw("jamba-v0.1")
  all_attention = c["num_hidden_layers"] * 2 * c["num_key_value_heads"] * 128 * 2
  assert kv_sizing.size_kv(load_model("jamba-v0.1"), context=1).kv_bytes_per_token * 8 \
      == all_attention


def test_llama4_chunked_blocks_are_capped_at_the_chunk():
  # 36 RoPE blocks attend within chunks of attention_chunk_size tokens, 12 NoPE
  # blocks keep everything (transformers' default no_rope_layers).
  t = _raw("llama-4-scout-17b-16e")["text_config"]
  per_block = 2 * t["num_key_value_heads"] * t["head_dim"] * 2
  chunk = t["attention_chunk_size"]
  for ctx in (1000, chunk, 1_048_576):
    sizing = kv_sizing.size_kv(load_model("llama-4-scout-17b-16e"), context=ctx, block_size=1)
    kinds = {k.kind: k for k in sizing.kinds}
    assert kinds[CHUNKED].layers == 36 and kinds[FULL].layers == 12
    assert kinds[CHUNKED].payload_bytes == 36 * per_block * min(ctx, chunk)
    assert sizing.payload_bytes_per_sequence == per_block * (12 * ctx + 36 * min(ctx, chunk))
  # At 1M tokens, chunking keeps under a quarter of all-global attention's bytes.
  assert sizing.payload_bytes_per_sequence < 48 * per_block * 1_048_576 / 3.9


def test_chunked_attended_span_restarts_every_chunk():
  assert af.chunked_attended_tokens(8192, 8192) == 8192
  assert af.chunked_attended_tokens(8193, 8192) == 1


def test_nemotron_h_schedule_and_state():
  c = _raw("nemotron-h-56b")
  spec = load_model("nemotron-h-56b")
  assert spec.layers_of(MAMBA2) == 54 and spec.layers_of(FULL) == 10
  assert spec.layers_of(NO_MIXER) == 54
  assert [i for i, k in enumerate(spec.layer_kinds) if k == FULL
         ] == [7, 18, 29, 40, 51, 62, 73, 84, 95, 106]
  sizing = kv_sizing.size_kv(spec, context=8192, block_size=1)
  mamba = next(k for k in sizing.kinds if k.kind == MAMBA2)
  heads, dim, ds = c["mamba_num_heads"], c["mamba_head_dim"], c["ssm_state_size"]
  conv_channels = heads * dim + 2 * c["n_groups"] * ds
  assert mamba.state_dtype == "fp32"  # vLLM's NemotronH default.
  assert mamba.state_bytes == 54 * (heads * dim * ds * 4 + conv_channels * 4 * 2)
  bf16 = kv_sizing.size_kv(spec, context=8192, state_dtype="bf16")
  assert next(k for k in bf16.kinds if k.kind == MAMBA2).state_bytes == 54 * (heads * dim * ds * 2 +
                                                                              conv_channels * 4 * 2)


def test_nano_config_state_dtype_is_read():
  spec = load_model("nemotron-3-nano-30b-a3b")
  assert spec.state_dtype == "fp32"  # "mamba_ssm_cache_dtype": "float32".
  assert spec.num_moe_layers == 23


def test_qwen3_next_state_per_sequence():
  c = _raw("qwen3-next-80b-a3b")
  spec = load_model("qwen3-next-80b-a3b")
  kinds = [i for i, k in enumerate(spec.layer_kinds) if k == FULL]
  assert kinds == list(range(3, 48, 4))
  matrix = c["linear_num_value_heads"] * c["linear_key_head_dim"] * c["linear_value_head_dim"]
  conv = (2 * 16 * 128 + 32 * 128) * 4
  for dtype, b in (("fp32", 4), ("bf16", 2)):
    sizing = kv_sizing.size_kv(spec, context=32768, state_dtype=dtype)
    state = next(k for k in sizing.kinds if k.kind == LINEAR_ATTENTION)
    assert state.state_bytes == 36 * (matrix * b + conv * 2)
    assert state.payload_bytes == state.allocated_bytes == state.state_bytes
  assert sizing.kv_bytes_per_token == 12 * 2 * 2 * 256 * 2  # 24 KiB.


# --- vLLM's hybrid page rule --------------------------------------------------


def _vllm_block(attn_per_token, state):
  """vllm config.py @0144dd5 HybridAttentionMambaModelConfig: 16*cdiv(state, 16*attn)."""
  return 16 * -(-state // (16 * attn_per_token))


@pytest.mark.parametrize(
    "name, state_dtype, state_elements, conv_elements, per_token, block",
    [
        # Per layer, vLLM shapes (conv keeps kernel - 1 taps), FACTS.md §11 worked results.
        ("qwen3-next-80b-a3b", "bf16", 32 * 128 * 128, 8192 * 3, 2 * 2 * 256 * 2, 544),
        ("jamba-v0.1", None, 8192 * 16, 8192 * 3, 2 * 8 * 128 * 2, 80),
        ("nemotron-h-56b", None, 256 * 64 * 256, 20480 * 3, 2 * 8 * 128 * 2, 4128),
        ("nemotron-3-nano-30b-a3b", None, 64 * 64 * 128,
         (64 * 64 + 2 * 8 * 128) * 3, 2 * 2 * 128 * 2, 2096),
    ])
def test_vllm_hybrid_page_size(name, state_dtype, state_elements, conv_elements, per_token, block):
  spec = load_model(name)
  b_state = 2 if (state_dtype == "bf16" or spec.model_type == "jamba") else 4
  state = state_elements * b_state + conv_elements * 2
  assert _vllm_block(per_token, state) == block
  pages = kv_sizing.size_kv(spec, context=4096, state_dtype=state_dtype).hybrid_pages
  assert pages.block_size == block and pages.state_bytes_per_layer == state
  assert pages.page_bytes == block * per_token >= state
  assert pages.allocated_bytes_per_sequence >= pages.payload_bytes_per_sequence


def test_no_hybrid_pages_without_both_parts():
  assert kv_sizing.size_kv(load_model("llama-3-8b"), context=10).hybrid_pages is None
  assert "hybrid_pages" not in kv_sizing.size_kv(load_model("llama-3-8b"), context=10).to_dict()


# --- Downstream: the decode step and the fit carry the state ----------------


def test_decode_step_reads_the_state_once_per_sequence():
  spec = load_model("qwen3-next-80b-a3b")
  device = step_inputs.load_accelerator("h200")
  ctx = 4096
  inputs = step_inputs.decode_step_inputs(spec, device, context=ctx, batch_sizes=[1, 8])
  sizing = kv_sizing.size_kv(spec, context=ctx)
  state = sum(k.state_bytes for k in sizing.kinds)
  assert state > 0
  assert math.isclose(inputs.k * ctx, sizing.kv_bytes_per_token * ctx + state)
  assert any("recurrent state" in a for a in inputs.assumptions)
  fit = kv_sizing.capacity(
      sizing,
      weight_bytes=40e9,  # e.g. 4-bit weights.
      memory_capacity_bytes=device.memory_capacity_bytes)
  assert fit.max_batch == (device.memory_capacity_bytes * 0.9 - 40e9) // (
      sizing.kv_bytes_per_token * ctx + state)  # Pages of 16 divide 4096: no rounding.


def test_prefill_of_recurrent_blocks_is_linear_in_the_prompt():
  recurrent = af.recurrent_prefill_flops()
  attention = af.attention_prefill_flops()
  assert sp.diff(recurrent, P, 2) == 0 and sp.diff(recurrent, P) != 0
  assert sp.diff(attention, P, 2) != 0
  assert af.attention_prefill_flops(1, 1, 1) == 4  # One pair: QK and PV, 2 FLOPs each.


# --- Readers and bad input ----------------------------------------------------


def _nemotron(**changes):
  c = {k: v for k, v in _raw("nemotron-h-56b").items() if k != "_jaxroof_source"}
  return {**c, **changes}


@pytest.mark.parametrize("config, words", [
    (_nemotron(hybrid_override_pattern="M-X*" + "M" * 114), ["hybrid_override_pattern", "X"]),
    (_nemotron(hybrid_override_pattern="M-*"), ["hybrid_override_pattern", "118"]),
    (_nemotron(ssm_state_size=0), ["ssm_state_size"]),
    (_nemotron(mamba_num_heads=float("nan")), ["mamba_num_heads"]),
    (_nemotron(hidden_size=float("inf")), ["hidden_size"]),
])
def test_bad_nemotron_configs(config, words):
  with pytest.raises(InputError) as e:
    hf_config.spec_from_config(config, name="x")
  message = str(e.value)
  assert "\n" not in message and all(w in message for w in words), message


def _qwen3_next(**changes):
  c = {k: v for k, v in _raw("qwen3-next-80b-a3b").items() if k != "_jaxroof_source"}
  return {**c, **changes}


@pytest.mark.parametrize("config, words", [
    (_qwen3_next(full_attention_interval=5), ["full_attention_interval", "48"]),
    (_qwen3_next(linear_key_head_dim=0), ["linear_key_head_dim"]),
    (_qwen3_next(linear_conv_kernel_dim=0), ["linear_conv_kernel_dim"]),
    ({
        **_raw("llama-4-scout-17b-16e"),
        "text_config": {**_raw("llama-4-scout-17b-16e")["text_config"], "attention_chunk_size": 0}
    }, ["attention_chunk_size"]),
    ({
        **_raw("llama-4-scout-17b-16e"),
        "text_config": {**_raw("llama-4-scout-17b-16e")["text_config"], "attention_chunk_size": -8}
    }, ["attention_chunk_size"]),
    ({**_raw("jamba-v0.1"), "attn_layer_offset": 8}, ["attn_layer_offset"]),
    ({**_raw("jamba-v0.1"), "mamba_d_state": 0}, ["mamba_d_state"]),
])
def test_bad_hybrid_configs(config, words):
  with pytest.raises(InputError) as e:
    hf_config.spec_from_config(config, name="x")
  message = str(e.value)
  assert "\n" not in message and all(w in message for w in words), message


def test_layer_types_override_the_interval():
  types = ["linear_attention"] * 5 + ["full_attention"] * 2
  spec = hf_config.spec_from_config(
      _qwen3_next(num_hidden_layers=7, full_attention_interval=5, layer_types=types), name="x")
  assert spec.layers_of(FULL) == 2 and spec.layers_of(LINEAR_ATTENTION) == 5


def test_infinity_is_accepted_as_python_json_reads_it():
  text = (MODELS_DIR / "nemotron-h-56b.json").read_text()
  assert "Infinity" in text  # The published bare constant is kept.
  assert load_model("nemotron-h-56b").num_layers == 118


def test_cohere2_reader_windows_three_blocks_in_four():
  config = {
      "model_type": "cohere2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 8,
      "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "sliding_window": 16
  }
  spec = hf_config.spec_from_config(config, name="x")
  assert spec.layer_kinds == (SLIDING,) * 3 + (FULL,) + (SLIDING,) * 3 + (FULL,)
  assert spec.tie_word_embeddings


def test_unknown_type_is_refused_unless_assumed_llama_like(tmp_path):
  config = {
      "model_type": "my_llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
      "num_attention_heads": 4, "vocab_size": 100
  }
  path = tmp_path / "config.json"
  path.write_text(json.dumps(config))
  with pytest.raises(InputError) as e:
    load_model(str(path))
  assert all(w in str(e.value) for w in ("my_llama", "assume_llama_like", "qwen3_next"))
  spec = load_model(str(path), assume_llama_like=True)
  assert spec.assumed_llama_like and any("ASSUMED Llama-like" in n for n in spec.notes)
  reference = hf_config.spec_from_config({**config, "model_type": "llama"}, name="x")
  assert parameter_counts(spec).total == parameter_counts(reference).total
  with pytest.raises(InputError, match="falcon_h1"):
    hf_config.spec_from_config({**config, "model_type": "falcon_h1"}, name="x",
                               assume_llama_like=True)


def test_jamba_schedule():
  spec = load_model("jamba-v0.1")
  assert [i for i, k in enumerate(spec.layer_kinds) if k == FULL] == [4, 12, 20, 28]
  assert spec.layers_of(RECURRENT) == 28
  assert [i for i, m in enumerate(spec.moe_layers) if m] == list(range(1, 32, 2))


def test_kv_sizing_cli_labels_the_fallback_and_shows_hybrid_pages(tmp_path):
  import subprocess
  import sys
  root = MODELS_DIR.parents[3]
  config = tmp_path / "config.json"
  config.write_text(
      json.dumps({
          "model_type": "my_llama", "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100
      }))
  out = tmp_path / "kv.json"

  def run(*flags):
    return subprocess.run([sys.executable, "-m", "experiments.kv_sizing", *flags], cwd=root,
                          capture_output=True, text=True, timeout=120)

  refused = run(f"--model={config}", "--context=8")
  assert refused.returncode != 0 and "assume_llama_like" in refused.stderr
  assert "Traceback" not in refused.stderr
  proc = run(f"--model={config}", "--context=8", "--assume_llama_like", f"--json_out={out}")
  assert proc.returncode == 0, proc.stderr
  assert "ASSUMED Llama-like" in proc.stdout
  assert json.loads(out.read_text())["assumed_llama_like"] is True
  proc = run("--model=jamba-v0.1", "--context=262144", f"--json_out={out}")
  assert proc.returncode == 0, proc.stderr
  data = json.loads(out.read_text())
  assert data["hybrid_pages"]["block_size"] == 80
  assert {k["kind"] for k in data["kinds"]} == {"recurrent", "full"}
  assert "vLLM hybrid page policy" in proc.stdout


def test_kimi_k2_is_deepseek_v3_under_another_name():
  # MoonshotAI/Kimi-K2 README @c6157be, Model Summary: 61 layers with 1 dense
  # layer, 384 experts, 8 selected per token, 1 shared expert, MLA.
  spec = load_model("kimi-k2")
  assert spec.num_layers == 61 and spec.num_moe_layers == 60 and not spec.moe_layers[0]
  assert (spec.moe.num_experts, spec.moe.experts_per_token, spec.moe.num_shared_experts) == (384, 8,
                                                                                             1)
  # Same latent cache as DeepSeek-V3: (512 + 64) x 2 B x 61 blocks per token.
  per_token = kv_sizing.size_kv(spec, context=1).kv_bytes_per_token
  assert per_token == (512 + 64) * 2 * 61
  assert per_token == kv_sizing.size_kv(load_model("deepseek-v3"), context=1).kv_bytes_per_token
