"""Readers of dense Llama relatives (Phi-3, Granite, OLMo 2, Cohere 2) and Llama 4.

What differs from Llama, and what of it changes sizing:
  phi3     fused `qkv_proj` and `gate_up_proj` checkpoint tensors (the same
           weights, split here); `sliding_window` windows every block;
           `partial_rotary_factor` (Phi-4-mini: RoPE on 3/4 of each head) and
           long-RoPE scaling change neither bytes nor FLOPs.
  granite  scalar multipliers (embeddings x12, residual x0.22, softmax scale
           1/128, logits /16): elementwise, no weights; tied embeddings.
  olmo2    q/k RMSNorms over the flattened projections (all heads at once),
           and norms after each sublayer instead of before.
  cohere2  three sliding-window blocks then one global block without
           positional encoding; one norm per block (attention and MLP in
           parallel); tied embeddings.
  llama4   chunked local attention on RoPE blocks (`attention_chunk_size`),
           global NoPE attention every fourth block, MoE every
           `interleave_moe_layer_step`-th block with one shared expert.
"""

from __future__ import annotations

from jaxroof import errors
from jaxroof.specs.model_spec import CHUNKED, FULL, SLIDING, ModelSpec, MoESpec
from jaxroof.specs.readers.fields import Fields, attention, schedule, spec


def _phi3(f: Fields, name: str) -> ModelSpec:
  n = f.int("num_hidden_layers")
  window = f.nullable_int("sliding_window", default=None)
  kinds = schedule(f, n, lambda i: SLIDING if window else FULL)
  bias = f.bool("attention_bias", default=False)
  f.notes.append("fused qkv_proj and gate_up_proj counted as separate q, k, v, gate "
                 "and up projections (the same weights)")
  rotary = f.config.get("partial_rotary_factor")
  if rotary not in (None, 1, 1.0):
    f.notes.append(f"partial_rotary_factor {rotary}: RoPE on part of each head "
                   "(no change to bytes or FLOPs)")
  return spec(f, name=name, layer_kinds=kinds, attention=attention(f, window=window, qkv_bias=bias,
                                                                   o_bias=bias),
              mlp_bias=f.bool("mlp_bias", default=False))


def _granite(f: Fields, name: str) -> ModelSpec:
  n = f.int("num_hidden_layers")
  bias = f.bool("attention_bias", default=False)
  multipliers = [
      k for k in ("embedding_multiplier", "residual_multiplier", "attention_multiplier",
                  "logits_scaling") if k in f.config
  ]
  if multipliers:
    f.notes.append(f"scalar multipliers ({', '.join(multipliers)}) are elementwise: "
                   "no weights, no change to bytes")
  return spec(f, name=name, layer_kinds=(FULL,) * n, tie=True,
              attention=attention(f, window=None, qkv_bias=bias,
                                  o_bias=bias), mlp_bias=f.bool("mlp_bias", default=False))


def _olmo2(f: Fields, name: str) -> ModelSpec:
  n = f.int("num_hidden_layers")
  bias = f.bool("attention_bias", default=False)
  f.notes.append("q/k RMSNorm over the flattened projections; post-sublayer norms")
  return spec(
      f, name=name, layer_kinds=(FULL,) * n,
      attention=attention(f, window=None, qkv_bias=bias, o_bias=bias, qk_norm=True,
                          qk_norm_flat=True))


def _cohere2(f: Fields, name: str) -> ModelSpec:
  n = f.int("num_hidden_layers")
  window = f.nullable_int("sliding_window", default=4096)
  pattern = 1
  if f.config.get("layer_types") is None:
    pattern = f.int("sliding_window_pattern", default=4)
  kinds = schedule(f, n, lambda i: SLIDING if window and (i + 1) % pattern else FULL)
  bias = f.bool("attention_bias", default=False)
  f.notes.append("global blocks use no positional encoding (NoPE)")
  return spec(f, name=name, layer_kinds=kinds, tie=True, norms_per_layer=1,
              attention=attention(f, window=window, qkv_bias=bias, o_bias=bias))


def _chunk_size(f: Fields) -> int:
  value = f.config.get("attention_chunk_size")
  if value is not None and (isinstance(value, bool) or not isinstance(value,
                                                                      (int, float)) or value <= 0):
    raise errors.InputError(
        f"{f.source}: config field attention_chunk_size={value!r} is not allowed: it "
        "must be a whole number >= 1 (or null for no chunking).")
  return f.nullable_int("attention_chunk_size", default=8192)


def _flags(f: Fields, key: str, n: int, default: list[int]) -> list[int]:
  """A per-block 0/1 list (`no_rope_layers`); [] or absent means the default."""
  value = f.config.get(key)
  if not value:
    return default
  if not isinstance(value, list) or len(value) != n or any(v not in (0, 1) for v in value):
    raise errors.InputError(
        f"{f.source}: config field {key}={value!r} is not allowed: it must list "
        f"0 or 1 for each of the {n} blocks.")
  return list(value)


def _llama4_text(f: Fields, name: str) -> ModelSpec:
  n = f.int("num_hidden_layers")
  chunk = _chunk_size(f)
  rope = _flags(f, "no_rope_layers", n, [int((i + 1) % 4 != 0) for i in range(n)])
  kinds = tuple(CHUNKED if rope[i] and chunk else FULL for i in range(n))
  step = f.int("interleave_moe_layer_step", default=1)
  moe_ids = set(f.int_list("moe_layers", list(range(step - 1, n, step))))
  moe_layers = tuple(i in moe_ids for i in range(n))
  expert_size = f.int("intermediate_size", default=8192)
  moe = MoESpec(num_experts=f.int("num_local_experts", default=16),
                experts_per_token=f.int("num_experts_per_tok",
                                        default=1), expert_intermediate_size=expert_size,
                num_shared_experts=1, shared_intermediate_size=expert_size)
  f.notes.append(f"{rope.count(0)} global blocks without RoPE (NoPE); the others "
                 f"attend within chunks of {chunk} tokens"
                 if chunk else f"{rope.count(0)} blocks without RoPE (NoPE)")
  if f.config.get("use_qk_norm"):
    f.notes.append("use_qk_norm: a weightless L2 norm of q and k on RoPE blocks")
  bias = f.bool("attention_bias", default=False)
  dense = None if all(moe_layers) else 16384
  return spec(
      f, name=name, layer_kinds=kinds, moe_layers=moe_layers, intermediate=dense,
      intermediate_key="intermediate_size_mlp",
      attention=attention(f, window=None, heads=40, kv_heads=8, head_dim=128, qkv_bias=bias,
                          o_bias=bias, chunk_size=chunk), moe=moe)


def _llama4(f: Fields, name: str) -> ModelSpec:
  """The multimodal Llama 4 config: its `text_config` is the decoder."""
  text = f.config.get("text_config")
  if not isinstance(text, dict):
    raise errors.InputError(
        f"{f.source}: config.json (model_type 'llama4') has no 'text_config' object, "
        "which holds the decoder's sizes.")
  inner = Fields({**text, "model_type": "llama4_text"}, model_type="llama4_text", source=f.source)
  inner.notes.append("vision tower and projector not counted (text decoder only; "
                     "they make up the rest of the published total)")
  return _llama4_text(inner, name)


READERS = {
    "phi3": _phi3,
    "granite": _granite,
    "olmo2": _olmo2,
    "cohere2": _cohere2,
    "llama4_text": _llama4_text,
    "llama4": _llama4,
}
