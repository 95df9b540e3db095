"""KV and state sizing: per-token bytes from each config's own fields, windows,
MLA, paging, reservation and capacity.

Expected K/V bytes are computed here from the raw config.json fields with
the textbook formulas (2 x KV heads x head_dim x bytes per full-attention
block, (kv_lora_rank + qk_rope_head_dim) x bytes per MLA block, Mamba's
d_inner x (d_state + d_conv) state), and checked against the published
figures in shared/data/facts.md and the lesson.
"""

import dataclasses
import json

import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxroof.symbolic import architecture as af
from jaxroof.symbolic import formulas
from jaxroof.specs import kv_sizing
from jaxroof.errors import InputError
from jaxroof.specs.models import MODELS_DIR, load_model, shipped_models
from jaxroof.specs.parameters import parameter_counts
from jaxroof.symbolic.symbols import T

BF16 = 2


def _raw(name):
  return json.loads((MODELS_DIR / f"{name}.json").read_text())


FP32 = 4


def independent_hybrid_kv(c):
  """The same triple for the hybrid types, from their raw fields (issue 16).

  States: the matrix in fp32 (Mamba-2, Gated DeltaNet; Mamba-1 in the K/V
  dtype), the convolution window of kernel taps in bf16.
  """
  kind = c["model_type"]
  if kind == "llama4":
    t = c["text_config"]
    n = t["num_hidden_layers"]
    per_block = 2 * t["num_key_value_heads"] * t["head_dim"] * BF16
    nope = sum((i + 1) % 4 == 0 for i in range(n))  # Global NoPE blocks.
    return per_block * nope, per_block * (n - nope), 0
  n = c["num_hidden_layers"]
  if kind == "qwen3_next":
    full = n // c["full_attention_interval"]
    per_block = 2 * c["num_key_value_heads"] * c["head_dim"] * BF16
    hk, hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
    conv = (2 * hk * dk + hv * dv) * c["linear_conv_kernel_dim"] * BF16
    return per_block * full, 0, (n - full) * (hv * dk * dv * FP32 + conv)
  if kind == "nemotron_h":
    pattern = c["hybrid_override_pattern"]
    head_dim = c.get("attention_head_dim") or c["head_dim"]
    per_block = 2 * c["num_key_value_heads"] * head_dim * BF16
    heads, dim, ds = c["mamba_num_heads"], c["mamba_head_dim"], c["ssm_state_size"]
    conv = (heads * dim + 2 * c["n_groups"] * ds) * c["conv_kernel"] * BF16
    return per_block * pattern.count("*"), 0, pattern.count("M") * (heads * dim * ds * FP32 + conv)
  if kind == "jamba":
    attn = sum(i % c["attn_layer_period"] == c["attn_layer_offset"] for i in range(n))
    head_dim = c["hidden_size"] // c["num_attention_heads"]
    per_block = 2 * c["num_key_value_heads"] * head_dim * BF16
    inner = c["mamba_expand"] * c["hidden_size"]
    state = inner * (c["mamba_d_state"] + c["mamba_d_conv"]) * BF16
    return per_block * attn, 0, (n - attn) * state
  return None


def independent_kv(c):
  """(bytes/token of blocks keeping every token, of windowed blocks, state bytes)."""
  hybrid = independent_hybrid_kv(c)
  if hybrid is not None:
    return hybrid
  n = c["num_hidden_layers"]
  kind = c["model_type"]
  if kind in ("deepseek_v3", "kimi_k2"):
    return (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * BF16 * n, 0, 0
  if kind == "mamba":
    return 0, 0, n * c["intermediate_size"] * (c["state_size"] + c["conv_kernel"]) * BF16
  head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
  per_block = 2 * c["num_key_value_heads"] * head_dim * BF16
  if "layer_types" in c:
    windowed = c["layer_types"].count("sliding_attention")
  elif kind == "gemma2":
    windowed = (n + 1) // 2  # Even-indexed blocks.
  elif kind == "gemma3_text":
    windowed = n - n // c["sliding_window_pattern"]
  elif kind in ("mistral", "phi3") and c.get("sliding_window"):
    windowed = n
  else:
    windowed = 0  # Llama, Mixtral; Qwen with use_sliding_window false.
  return per_block * (n - windowed), per_block * windowed, 0


@pytest.mark.parametrize("name", shipped_models())
def test_kv_per_token_from_the_config_fields(name):
  growing, windowed, state = independent_kv(_raw(name))
  sizing = kv_sizing.size_kv(load_model(name), context=1, block_size=1)
  assert sizing.kv_bytes_per_token == growing
  # At one retained token every block holds it (windows are >= 1 token).
  assert sizing.payload_bytes_per_sequence == growing + windowed + state


@pytest.mark.parametrize("name, published", [
    ("llama-2-7b", 524_288),
    ("llama-2-70b", 327_680),
    ("llama-3-8b", 131_072),
    ("llama-3.1-70b", 327_680),
    ("llama-3.1-405b", 516_096),
    ("mixtral-8x7b", 131_072),
    ("qwen2.5-7b", 57_344),
    ("qwen3-30b-a3b", 98_304),
    ("gemma-2-9b", 172_032),
    ("deepseek-v3", 70_272),
    ("tinyllama-1.1b", 22_528),
    ("mamba-2.8b", 0),
    ("lesson-toy", 32),
])
def test_kv_per_token_matches_published_figures(name, published):
  assert kv_sizing.size_kv(load_model(name), context=1).kv_bytes_per_token == published


def test_published_window_and_state_figures():
  mistral = kv_sizing.size_kv(load_model("mistral-7b"), context=32768, block_size=1)
  assert mistral.payload_bytes_per_sequence == 512 * 2**20  # 512 MiB per sequence.
  gemma = kv_sizing.size_kv(load_model("gemma-2-9b"), context=1)
  assert gemma.payload_bytes_per_sequence == 344_064  # All 42 blocks at T = 1.
  mamba = kv_sizing.size_kv(load_model("mamba-2.8b"), context=100_000)
  assert mamba.payload_bytes_per_sequence == 13_107_200  # Fixed, whatever T.


@pytest.mark.parametrize("context", [100, 4096, 4097, 50_000])
def test_windowed_blocks_are_capped_at_the_window(context):
  gemma = kv_sizing.size_kv(load_model("gemma-2-9b"), context=context, block_size=1)
  by_kind = {k.kind: k for k in gemma.kinds}
  assert by_kind["sliding"].retained_tokens == min(context, 4096)
  assert by_kind["full"].retained_tokens == context
  assert by_kind["sliding"].payload_bytes == 172_032 * min(context, 4096)
  assert gemma.payload_bytes_per_sequence == 172_032 * (context + min(context, 4096))


def test_windowed_closed_form():
  (sliding, full) = kv_sizing.kind_expressions(load_model("gemma-2-9b"))
  assert sp.simplify(sliding.payload - 172_032 * sp.Min(T, 4096)) == 0
  assert sp.simplify(full.payload - 172_032 * T) == 0


def test_mla_is_smaller_than_its_expanded_multi_head_equivalent():
  spec = load_model("deepseek-v3")
  latent = kv_sizing.size_kv(spec, context=1).kv_bytes_per_token
  expanded = kv_sizing.mla_expanded_bytes_per_token(spec)
  c = _raw("deepseek-v3")
  heads, layers = c["num_attention_heads"], c["num_hidden_layers"]
  qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
  assert expanded == layers * heads * (qk + c["v_head_dim"]) * BF16 == 4_997_120
  assert latent < expanded / 50


@settings(max_examples=40, deadline=None)
@given(context=st.integers(1, 20_000), block=st.integers(1, 256),
       name=st.sampled_from(["llama-3-8b", "gemma-2-9b", "deepseek-v3"]))
def test_paged_allocation_covers_payload_and_wastes_under_a_page(context, block, name):
  spec = load_model(name)
  z = kv_sizing.size_kv(spec, context=context, block_size=block)
  assert z.allocated_bytes_per_sequence >= z.payload_bytes_per_sequence
  # Under a page per block; a sliding window that is not page-aligned can
  # leave part of a page at each end.
  slack = sum(k.bytes_per_token * (2 if k.window else 1) for k in z.kinds)
  assert (z.allocated_bytes_per_sequence - z.payload_bytes_per_sequence < block * slack)
  assert z.allocated_bytes_windowed_as_full_per_sequence >= z.allocated_bytes_per_sequence


@pytest.mark.parametrize("name", ["llama-3-8b", "gemma-2-9b", "mistral-7b", "deepseek-v3"])
def test_allocation_equals_payload_when_the_block_size_divides(name):
  z = kv_sizing.size_kv(load_model(name), context=8192, block_size=16)
  assert z.allocated_bytes_per_sequence == z.payload_bytes_per_sequence


def test_reservation_allocates_for_the_maximum_output():
  spec = load_model("llama-3-8b")
  now = kv_sizing.size_kv(spec, context=1000, block_size=16)
  reserved = kv_sizing.size_kv(spec, context=1000, block_size=16, max_new_tokens=500)
  assert reserved.payload_bytes_per_sequence == now.payload_bytes_per_sequence
  assert reserved.allocated_bytes_per_sequence == 131_072 * 1504  # ceil(1500/16)*16.


def test_windowed_as_full_pages_the_whole_context():
  z = kv_sizing.size_kv(load_model("mistral-7b"), context=32768, block_size=16)
  assert z.allocated_bytes_per_sequence == 131_072 * 4096
  assert z.allocated_bytes_windowed_as_full_per_sequence == 131_072 * 32768
  dense = kv_sizing.size_kv(load_model("llama-3-8b"), context=999, block_size=16)
  assert dense.allocated_bytes_windowed_as_full == dense.allocated_bytes


def test_kv_dtype_is_independent_of_the_weights():
  spec = load_model("llama-3-8b")
  bf16 = kv_sizing.size_kv(spec, context=4096, kv_dtype="bf16").payload_bytes
  assert kv_sizing.size_kv(spec, context=4096, kv_dtype="fp8").payload_bytes == bf16 / 2
  assert kv_sizing.size_kv(spec, context=4096, kv_dtype="fp32").payload_bytes == bf16 * 2


def test_block_scaled_fp8_kv_counts_its_scales():
  """fp8_block: one 1-byte E8M0 scale per 32 values (OCP MX v1.0 MXFP8), so a
  Llama-3-8B token (2 x 32 layers x 8 KV heads x 128 = 65,536 values, from its
  config.json) takes 65,536 + 65,536 / 32 = 67,584 bytes; per-tensor fp8 65,536."""
  spec = load_model("llama-3-8b")
  per_token = {
      dtype: kv_sizing.size_kv(spec, context=1, kv_dtype=dtype, block_size=1).payload_bytes
      for dtype in ("fp8", "fp8_block")
  }
  assert per_token == {"fp8": 65_536, "fp8_block": 67_584}
  assert kv_sizing.kv_bytes_per_element("fp8_block") == 1 + 1 / 32
  mla = load_model("deepseek-v3")  # MLA latent: the same 1/32 overhead.
  ratio = (kv_sizing.size_kv(mla, context=4096, kv_dtype="fp8_block").payload_bytes /
           kv_sizing.size_kv(mla, context=4096, kv_dtype="fp8").payload_bytes)
  assert ratio == pytest.approx(1.03125)


def test_lesson_toy_counts():
  toy = load_model("lesson-toy")
  per_position = kv_sizing.size_kv(toy, context=1).kv_bytes_per_token
  assert per_position == 32  # 2 (K,V) x 2 blocks x 2 heads x 2 coordinates x 2 B.
  positions = int(formulas.positions_with_kv(3, 3))  # Prompt [1, 4, 6] + 3 outputs.
  assert positions == 5
  assert kv_sizing.size_kv(toy, context=positions, block_size=1).payload_bytes == 160
  doubled = dataclasses.replace(toy, layer_kinds=toy.layer_kinds * 2, moe_layers=toy.moe_layers * 2)
  assert kv_sizing.size_kv(doubled, context=1).kv_bytes_per_token == 64
  assert kv_sizing.size_kv(doubled, context=positions, block_size=1).payload_bytes == 320


def test_capacity_is_the_largest_batch_that_fits():
  spec = load_model("llama-3-8b")
  z = kv_sizing.size_kv(spec, context=4096, batch=1)
  capacity, weights, workspace = 80e9, 2 * parameter_counts(spec).total, 0.1
  fit = kv_sizing.capacity(z, weight_bytes=weights, memory_capacity_bytes=capacity,
                           workspace_fraction=workspace)
  expected = int((capacity * (1 - workspace) - weights) // z.allocated_bytes_per_sequence)
  assert fit.max_batch == expected
  at_max = kv_sizing.size_kv(spec, context=4096, batch=expected)
  over = kv_sizing.size_kv(spec, context=4096, batch=expected + 1)
  assert kv_sizing.capacity(at_max, weight_bytes=weights, memory_capacity_bytes=capacity).fits
  assert not kv_sizing.capacity(over, weight_bytes=weights, memory_capacity_bytes=capacity).fits
  no_room = kv_sizing.capacity(z, weight_bytes=100e9, memory_capacity_bytes=capacity)
  assert no_room.max_batch == 0 and not no_room.fits


def test_arch_formula_closed_forms():
  assert af.paged_tokens(17, 16) == 32 and af.paged_tokens(32, 16) == 32
  assert af.windowed_tokens(5000, 4096) == 4096
  assert sp.simplify(af.full_attention_kv_per_token() * sp.Symbol("L", positive=True) -
                     formulas.kv_bytes_per_position()) == 0
  assert af.capacity_sequences(100, sp.Rational(1, 10), 50, 8) == 5
  assert af.quantized_bytes_per_weight(4, 128, 2) == sp.Rational(33, 64)


@pytest.mark.parametrize("kwargs, needle", [
    ({"context": 0}, "context=0"),
    ({"context": 10, "block_size": 0}, "block_size=0"),
    ({"context": 10, "max_new_tokens": -1}, "max_new_tokens=-1"),
    ({"context": 10, "max_new_tokens": 1.5}, "max_new_tokens=1.5"),
    ({"context": 10, "kv_dtype": "fp4"}, "kv_dtype='fp4'"),
    ({"context": 10, "batch": 0}, "batch=0"),
])
def test_bad_inputs_are_named(kwargs, needle):
  with pytest.raises(InputError, match=needle.replace("(", r"\(")):
    kv_sizing.size_kv(load_model("llama-3-8b"), **kwargs)


def test_windowed_pages_count_every_page_the_window_touches():
  """Brute force: the pages holding any of the last min(T, W) tokens."""
  from jaxroof.symbolic import architecture as af
  for context, window, page in [(8192, 4096, 16), (8200, 4096, 16), (100, 4096, 16),
                                (4097, 4096, 16), (37, 10, 4), (9, 10, 4), (10, 10, 3), (23, 7, 5)]:
    pages = {t // page for t in range(max(0, context - window), context)}
    assert int(af.windowed_paged_tokens(context, window,
                                        page)) == len(pages) * page, (context, window, page)
