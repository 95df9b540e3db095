"""Readers of the model types supported first: Llama, Mistral, Mixtral,
Qwen2/3 (dense and MoE), Gemma 2/3, gpt-oss, DeepSeek-V2/V3 and Mamba.

Layer schedules follow transformers: an explicit `layer_types` list wins;
otherwise Mistral windows every block (when `sliding_window` is set), Qwen2/3
window blocks from `max_window_layers` on (when `use_sliding_window`), Gemma 2
and gpt-oss window the even blocks, and Gemma 3 makes every
`sliding_window_pattern`-th block global.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from jaxroof import errors
from jaxroof.specs.model_spec import (FULL, MLA, RECURRENT, SLIDING, AttentionSpec, MLASpec,
                                      ModelSpec, MoESpec, SSMSpec)
from jaxroof.specs.readers.fields import MISSING, Fields, schedule, spec
from jaxroof.specs.readers.fields import attention as gqa


def _windowed_llama(f: Fields, name: str, *, window_default: int | None,
                    kv_heads: Any = None) -> ModelSpec:
  """Llama and Mistral: every block full, or every block windowed."""
  n = f.int("num_hidden_layers")
  window = None
  if window_default or "sliding_window" in f.config:
    window = f.nullable_int("sliding_window", default=window_default)
  kinds = schedule(f, n, lambda i: SLIDING if window else FULL)
  bias = f.bool("attention_bias", default=False)
  attention = gqa(f, window=window, kv_heads=kv_heads, qkv_bias=bias, o_bias=bias)
  return spec(f, name=name, layer_kinds=kinds, attention=attention,
              mlp_bias=f.bool("mlp_bias", default=False))


def _llama(f: Fields, name: str) -> ModelSpec:
  return _windowed_llama(f, name, window_default=None)


def _mistral(f: Fields, name: str) -> ModelSpec:
  return _windowed_llama(f, name, window_default=4096, kv_heads=8)


def _mixtral(f: Fields, name: str) -> ModelSpec:
  n = f.int("num_hidden_layers")
  window = f.nullable_int("sliding_window", default=None)
  kinds = schedule(f, n, lambda i: SLIDING if window else FULL)
  attention = gqa(f, window=window, kv_heads=8)
  moe = MoESpec(
      num_experts=f.int("num_local_experts", default=8),
      experts_per_token=f.int("num_experts_per_tok", default=2),
      expert_intermediate_size=f.int("intermediate_size"),
  )
  return spec(f, name=name, layer_kinds=kinds, moe_layers=(True,) * n, intermediate=None,
              attention=attention, moe=moe)


def _qwen_schedule(f: Fields, n: int,
                   first_windowed: int = 28) -> tuple[tuple[str, ...], int | None]:
  """Qwen2/3: windowed from `max_window_layers` on, if `use_sliding_window`."""
  window = None
  if f.bool("use_sliding_window", default=False):
    window = f.nullable_int("sliding_window", default=4096)
  first = n
  if window:
    first = f.int("max_window_layers", default=first_windowed, minimum=0)
  return schedule(f, n, lambda i: SLIDING if window and i >= first else FULL), window


def _qwen2(f: Fields, name: str) -> ModelSpec:
  n = f.int("num_hidden_layers")
  kinds, window = _qwen_schedule(f, n)
  attention = gqa(f, window=window, qkv_bias=True)
  return spec(f, name=name, layer_kinds=kinds, attention=attention)


def _qwen3_attention(f: Fields, window: int | None, head_dim: int | None) -> AttentionSpec:
  bias = f.bool("attention_bias", default=False)
  return gqa(f, window=window, head_dim=head_dim, qkv_bias=bias, o_bias=bias, qk_norm=True)


def _qwen3(f: Fields, name: str) -> ModelSpec:
  n = f.int("num_hidden_layers")
  kinds, window = _qwen_schedule(f, n)
  return spec(f, name=name, layer_kinds=kinds, attention=_qwen3_attention(f, window, head_dim=128))


def qwen_moe_layers(f: Fields, n: int, experts: int) -> tuple[bool, ...]:
  """Qwen's MoE schedule: every `decoder_sparse_step`-th block routes, except
  the `mlp_only_layers`; none when the config has no experts."""
  step = f.int("decoder_sparse_step", default=1)
  dense_only = set(f.int_list("mlp_only_layers", []))
  return tuple(experts > 0 and i not in dense_only and (i + 1) % step == 0 for i in range(n))


def _qwen3_moe(f: Fields, name: str) -> ModelSpec:
  n = f.int("num_hidden_layers")
  kinds, window = _qwen_schedule(f, n, first_windowed=0)  # No such field: all.
  experts = f.int("num_experts", "num_local_experts", default=128, minimum=0)
  moe_layers = qwen_moe_layers(f, n, experts)
  moe = None
  if any(moe_layers):
    moe = MoESpec(
        num_experts=experts,
        experts_per_token=f.int("num_experts_per_tok", default=8),
        expert_intermediate_size=f.int("moe_intermediate_size", default=768),
    )
  intermediate = MISSING if not all(moe_layers) else None
  return spec(f, name=name, layer_kinds=kinds, moe_layers=moe_layers, intermediate=intermediate,
              attention=_qwen3_attention(f, window, head_dim=None), moe=moe)


def _gemma2(f: Fields, name: str) -> ModelSpec:
  n = f.int("num_hidden_layers")
  window = f.nullable_int("sliding_window", default=4096)
  kinds = schedule(f, n, lambda i: SLIDING if window and i % 2 == 0 else FULL)
  bias = f.bool("attention_bias", default=False)
  attention = gqa(f, window=window, heads=8, kv_heads=4, head_dim=256, qkv_bias=bias, o_bias=bias)
  return spec(f, name=name, layer_kinds=kinds, vocab=256000, intermediate=9216, tie=True,
              norms_per_layer=4, attention=attention)


def _gemma3_text(f: Fields, name: str) -> ModelSpec:
  n = f.int("num_hidden_layers")
  window = f.nullable_int("sliding_window", default=4096)
  pattern = 1
  if f.config.get("layer_types") is None:
    pattern = f.int("sliding_window_pattern", "_sliding_window_pattern", default=6)
  kinds = schedule(f, n, lambda i: SLIDING if window and (i + 1) % pattern else FULL)
  bias = f.bool("attention_bias", default=False)
  attention = gqa(f, window=window, heads=8, kv_heads=4, head_dim=256, qkv_bias=bias, o_bias=bias,
                  qk_norm=True)
  return spec(f, name=name, layer_kinds=kinds, vocab=262208, intermediate=9216, tie=True,
              norms_per_layer=4, attention=attention)


def _gemma3(f: Fields, name: str) -> ModelSpec:
  """The multimodal Gemma 3 config: its `text_config` is the decoder."""
  text = f.config.get("text_config")
  if not isinstance(text, dict):
    raise errors.InputError(f"{f.source}: config.json (model_type 'gemma3') has no 'text_config' "
                            "object, which holds the decoder's sizes.")
  inner = Fields({**text, "model_type": "gemma3_text"}, model_type="gemma3_text", source=f.source)
  inner.notes.append("vision tower and projector not counted (decoder only)")
  return _gemma3_text(inner, name)


def _gpt_oss(f: Fields, name: str) -> ModelSpec:
  n = f.int("num_hidden_layers", default=36)
  window = f.nullable_int("sliding_window", default=128)
  kinds = schedule(f, n, lambda i: SLIDING if window and (i + 1) % 2 else FULL)
  bias = f.bool("attention_bias", default=True)
  attention = gqa(f, window=window, heads=64, kv_heads=8, head_dim=64, qkv_bias=bias, o_bias=bias,
                  sinks=True)
  moe = MoESpec(
      num_experts=f.int("num_local_experts", "num_experts", default=128),
      experts_per_token=f.int("num_experts_per_tok", "experts_per_token", default=4),
      expert_intermediate_size=f.int("intermediate_size", default=2880),
      expert_bias=True,
      router_bias=True,
  )
  return spec(f, name=name, layer_kinds=kinds, moe_layers=(True,) * n, vocab=201088,
              intermediate=None, attention=attention, moe=moe)


def _deepseek(f: Fields, name: str) -> ModelSpec:
  v3 = f.model_type in ("deepseek_v3", "kimi_k2")  # Kimi K2: V3 under a new name.
  n = f.int("num_hidden_layers")
  mla = MLASpec(
      num_heads=f.int("num_attention_heads"),
      q_lora_rank=f.nullable_int("q_lora_rank", default=1536 if v3 else None),
      kv_lora_rank=f.int("kv_lora_rank"),
      qk_nope_head_dim=f.int("qk_nope_head_dim"),
      qk_rope_head_dim=f.int("qk_rope_head_dim"),
      v_head_dim=f.int("v_head_dim"),
  )
  experts = f.nullable_int("n_routed_experts", default=None) or 0
  first_dense = f.int("first_k_dense_replace", default=3 if v3 else 0, minimum=0)
  freq = f.int("moe_layer_freq", default=1)
  moe_layers = tuple(experts > 0 and i >= first_dense and i % freq == 0 for i in range(n))
  moe = None
  if any(moe_layers):
    expert_size = f.int("moe_intermediate_size")
    moe = MoESpec(
        num_experts=experts,
        experts_per_token=f.int("num_experts_per_tok"),
        expert_intermediate_size=expert_size,
        num_shared_experts=f.nullable_int("n_shared_experts", default=1) or 0,
        shared_intermediate_size=expert_size,
        router_score_bias=f.config.get("topk_method", "noaux_tc" if v3 else "greedy") == "noaux_tc",
    )
  mtp = f.config.get("num_nextn_predict_layers") or 0
  if mtp:
    f.notes.append(f"{mtp} multi-token-prediction block(s) not counted "
                   "(not used by ordinary decoding)")
  intermediate = None if all(moe_layers) else MISSING
  return spec(f, name=name, layer_kinds=(MLA,) * n, moe_layers=moe_layers,
              intermediate=intermediate, mla=mla, moe=moe)


def _mamba(f: Fields, name: str) -> ModelSpec:
  """Hugging Face `MambaConfig` (e.g. state-spaces/mamba-2.8b-hf)."""
  hidden = f.int("hidden_size")
  n = f.int("num_hidden_layers", "n_layer")
  expand = f.int("expand", default=2)
  rank = f.config.get("time_step_rank", "auto")
  ssm = SSMSpec(
      inner_size=f.int("intermediate_size", default=expand * hidden),
      state_size=f.int("state_size", default=16),
      conv_kernel=f.int("conv_kernel", default=4),
      dt_rank=math.ceil(hidden / 16) if rank == "auto" else f.int("time_step_rank"),
      proj_bias=f.bool("use_bias", default=False),
      conv_bias=f.bool("use_conv_bias", default=True),
  )
  return spec(f, name=name, layer_kinds=(RECURRENT,) * n, vocab=50280, intermediate=None, tie=True,
              norms_per_layer=1, ssm=ssm)


def mamba_ssm(config: Mapping[str, Any], name: str, source: str) -> ModelSpec:
  """The original `mamba_ssm` config (d_model, n_layer, ssm_cfg; no model_type).

  Renamed to the Hugging Face fields, with the vocabulary padded as the
  checkpoint pads it (`pad_vocab_size_multiple`).
  """
  cfg = config.get("ssm_cfg") or {}
  layer = cfg.get("layer", "Mamba1")
  if layer != "Mamba1":
    raise errors.InputError(
        f"{source}: ssm_cfg layer {layer!r} is not supported; supported: Mamba1.")
  f = Fields(config, model_type="mamba", source=source)
  hidden = f.int("d_model")
  vocab = f.int("vocab_size")
  multiple = f.int("pad_vocab_size_multiple", default=8)
  padded = -(-vocab // multiple) * multiple
  renamed = {
      "hidden_size": hidden,
      "num_hidden_layers": f.int("n_layer"),
      "vocab_size": padded,
  }
  names = {"tie_embeddings": "tie_word_embeddings"}
  renamed.update({names[k]: v for k, v in config.items() if k in names})
  names = {
      "d_state": "state_size", "d_conv": "conv_kernel", "expand": "expand",
      "dt_rank": "time_step_rank", "bias": "use_bias", "conv_bias": "use_conv_bias"
  }
  renamed.update({names[k]: v for k, v in cfg.items() if k in names})
  g = Fields(renamed, model_type="mamba", source=source)
  if padded != vocab:
    g.notes.append(f"vocab_size {vocab} padded to {padded} "
                   f"(pad_vocab_size_multiple {multiple})")
  return _mamba(g, name)


READERS = {
    "llama": _llama,
    "mistral": _mistral,
    "mixtral": _mixtral,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "qwen3_moe": _qwen3_moe,
    "gemma2": _gemma2,
    "gemma3_text": _gemma3_text,
    "gemma3": _gemma3,
    "gpt_oss": _gpt_oss,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "kimi_k2": _deepseek,
    "mamba": _mamba,
}
