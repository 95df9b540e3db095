"""Readers of Hugging Face `config.json` files, one per supported model_type.

Each reader turns a config dict into a `ModelSpec`: the layer schedule (which
blocks use full, sliding-window, latent or recurrent attention; which have
routed experts) and the dimensions. A field the hub's configs often omit gets
the default of the Hugging Face config class, and the spec records it in
`defaults_used`; a field with no such default must be present, or the reader
raises an `InputError` naming it.

Layer schedules follow transformers: an explicit `layer_types` list wins;
otherwise Mistral windows every block (when `sliding_window` is set), Qwen2/3
window blocks from `max_window_layers` on (when `use_sliding_window`), Gemma 2
and gpt-oss window the even blocks, and Gemma 3 makes every
`sliding_window_pattern`-th block global.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from jaxroof import errors
from jaxroof.specs.model_spec import (FULL, MLA, RECURRENT, SLIDING, AttentionSpec,
                                MLASpec, ModelSpec, MoESpec, SSMSpec)

_MISSING = object()
_LAYER_TYPES = {"full_attention": FULL, "sliding_attention": SLIDING}


class _Fields:
  """Typed access to one config dict; remembers the defaults it filled in."""

  def __init__(self, config: Mapping[str, Any], *, model_type: str, source: str):
    self.config = config
    self.model_type = model_type
    self.source = source
    self.defaults_used: list[str] = []
    self.notes: list[str] = []

  def _lookup(self, keys: tuple[str, ...]) -> tuple[str, Any]:
    for key in keys:
      if key in self.config:
        return key, self.config[key]
    return keys[0], _MISSING

  def _default(self, key: str, default: Any) -> Any:
    if default is _MISSING:
      raise errors.InputError(
          f"{self.source}: config.json (model_type {self.model_type!r}) has no "
          f"{key!r} field, which is needed to size the model."
      )
    value = default() if callable(default) else default
    self.defaults_used.append(f"{key}={value!r}")
    return value

  def _check_int(self, key: str, value: Any, minimum: int) -> int:
    if (isinstance(value, bool) or not isinstance(value, (int, float))
        or value != int(value) or value < minimum):
      raise errors.InputError(
          f"{self.source}: config field {key}={value!r} is not allowed: it must "
          f"be a whole number >= {minimum}."
      )
    return int(value)

  def int(self, *keys: str, default: Any = _MISSING, minimum: int = 1) -> int:
    """A whole number; null or absent takes `default` (a value or callable)."""
    key, value = self._lookup(keys)
    if value is _MISSING or value is None:
      value = self._default(key, default)
    return self._check_int(key, value, minimum)

  def nullable_int(self, *keys: str, default: Any) -> int | None:
    """A whole number or an explicit null; only an absent key takes `default`."""
    key, value = self._lookup(keys)
    if value is _MISSING:
      value = self._default(key, default)
    return None if value is None else self._check_int(key, value, 1)

  def bool(self, *keys: str, default: bool) -> bool:
    key, value = self._lookup(keys)
    if value is _MISSING or value is None:
      return self._default(key, default)
    if not isinstance(value, bool):
      raise errors.InputError(
          f"{self.source}: config field {key}={value!r} is not allowed: it must "
          "be true or false."
      )
    return value

  def int_list(self, key: str, default: list[int]) -> list[int]:
    value = self.config.get(key)
    if value is None:
      return list(default)
    if not isinstance(value, list):
      raise errors.InputError(
          f"{self.source}: config field {key}={value!r} is not allowed: it must "
          "be a list of layer indices."
      )
    return [self._check_int(key, v, 0) for v in value]


def _schedule(f: _Fields, n: int, rule: Callable[[int], str]) -> tuple[str, ...]:
  """Attention kind per block: `layer_types` if given, else `rule(i)`."""
  types = f.config.get("layer_types")
  if types is None:
    return tuple(rule(i) for i in range(n))
  if not isinstance(types, list) or len(types) != n:
    raise errors.InputError(
        f"{f.source}: config field layer_types={types!r} is not allowed: it must "
        f"list one type per block ({n} blocks)."
    )
  for t in types:
    if t not in _LAYER_TYPES:
      raise errors.InputError(
          f"{f.source}: layer type {t!r} in layer_types is not supported; "
          f"supported: {', '.join(_LAYER_TYPES)}."
      )
  return tuple(_LAYER_TYPES[t] for t in types)


def _attention(f: _Fields, *, window: int | None, heads: Any = _MISSING,
               kv_heads: Any = None, head_dim: Any = None,
               **flags: bool) -> AttentionSpec:
  """Grouped-query attention dims; head_dim defaults to hidden/heads."""
  hidden = f.int("hidden_size")
  num_heads = f.int("num_attention_heads", default=heads)
  num_kv = f.int("num_key_value_heads",
                 default=num_heads if kv_heads is None else kv_heads)
  if head_dim is None and hidden % num_heads == 0:
    head_dim = hidden // num_heads
  dim = f.int("head_dim", default=_MISSING if head_dim is None else head_dim)
  if num_heads % num_kv:
    raise errors.InputError(
        f"{f.source}: num_attention_heads={num_heads} is not a multiple of "
        f"num_key_value_heads={num_kv}."
    )
  return AttentionSpec(num_heads=num_heads, num_kv_heads=num_kv, head_dim=dim,
                       sliding_window=window, **flags)


def _spec(f: _Fields, *, name: str, layer_kinds: tuple[str, ...],
          moe_layers: tuple[bool, ...] | None = None, vocab: Any = _MISSING,
          intermediate: Any = _MISSING, tie: bool = False,
          **parts: Any) -> ModelSpec:
  """The fields every reader fills the same way.

  `intermediate` is the default of `intermediate_size` (the dense MLP width),
  or None for a model without dense MLP blocks.
  """
  if intermediate is not None:
    intermediate = f.int("intermediate_size", default=intermediate)
  if moe_layers is None:
    moe_layers = (False,) * len(layer_kinds)
  return ModelSpec(
      name=name,
      model_type=f.model_type,
      hidden_size=f.int("hidden_size"),
      vocab_size=f.int("vocab_size", default=vocab),
      layer_kinds=layer_kinds,
      moe_layers=moe_layers,
      intermediate_size=intermediate or 0,
      tie_word_embeddings=f.bool("tie_word_embeddings", "tie_embeddings",
                                 default=tie),
      max_position_embeddings=f.config.get("max_position_embeddings"),
      torch_dtype=f.config.get("torch_dtype", f.config.get("dtype")),
      source=f.source,
      defaults_used=tuple(f.defaults_used),
      notes=tuple(f.notes),
      **parts,
  )


def _windowed_llama(f: _Fields, name: str, *, window_default: int | None,
                    kv_heads: Any = None) -> ModelSpec:
  """Llama and Mistral: every block full, or every block windowed."""
  n = f.int("num_hidden_layers")
  window = None
  if window_default or "sliding_window" in f.config:
    window = f.nullable_int("sliding_window", default=window_default)
  kinds = _schedule(f, n, lambda i: SLIDING if window else FULL)
  bias = f.bool("attention_bias", default=False)
  attention = _attention(f, window=window, kv_heads=kv_heads, qkv_bias=bias,
                         o_bias=bias)
  return _spec(f, name=name, layer_kinds=kinds, attention=attention,
               mlp_bias=f.bool("mlp_bias", default=False))


def _llama(f: _Fields, name: str) -> ModelSpec:
  return _windowed_llama(f, name, window_default=None)


def _mistral(f: _Fields, name: str) -> ModelSpec:
  return _windowed_llama(f, name, window_default=4096, kv_heads=8)


def _mixtral(f: _Fields, name: str) -> ModelSpec:
  n = f.int("num_hidden_layers")
  window = f.nullable_int("sliding_window", default=None)
  kinds = _schedule(f, n, lambda i: SLIDING if window else FULL)
  attention = _attention(f, window=window, kv_heads=8)
  moe = MoESpec(
      num_experts=f.int("num_local_experts", default=8),
      experts_per_token=f.int("num_experts_per_tok", default=2),
      expert_intermediate_size=f.int("intermediate_size"),
  )
  return _spec(f, name=name, layer_kinds=kinds, moe_layers=(True,) * n,
               intermediate=None, attention=attention, moe=moe)


def _qwen_schedule(f: _Fields, n: int, first_windowed: int = 28
                   ) -> tuple[tuple[str, ...], int | None]:
  """Qwen2/3: windowed from `max_window_layers` on, if `use_sliding_window`."""
  window = None
  if f.bool("use_sliding_window", default=False):
    window = f.nullable_int("sliding_window", default=4096)
  first = n
  if window:
    first = f.int("max_window_layers", default=first_windowed, minimum=0)
  return _schedule(f, n, lambda i: SLIDING if window and i >= first else FULL), window


def _qwen2(f: _Fields, name: str) -> ModelSpec:
  n = f.int("num_hidden_layers")
  kinds, window = _qwen_schedule(f, n)
  attention = _attention(f, window=window, qkv_bias=True)
  return _spec(f, name=name, layer_kinds=kinds, attention=attention)


def _qwen3_attention(f: _Fields, window: int | None, head_dim: int | None) -> AttentionSpec:
  bias = f.bool("attention_bias", default=False)
  return _attention(f, window=window, head_dim=head_dim, qkv_bias=bias, o_bias=bias,
                    qk_norm=True)


def _qwen3(f: _Fields, name: str) -> ModelSpec:
  n = f.int("num_hidden_layers")
  kinds, window = _qwen_schedule(f, n)
  return _spec(f, name=name, layer_kinds=kinds,
               attention=_qwen3_attention(f, window, head_dim=128))


def _qwen3_moe(f: _Fields, name: str) -> ModelSpec:
  n = f.int("num_hidden_layers")
  kinds, window = _qwen_schedule(f, n, first_windowed=0)  # No such field: all.
  experts = f.int("num_experts", "num_local_experts", default=128, minimum=0)
  step = f.int("decoder_sparse_step", default=1)
  dense_only = set(f.int_list("mlp_only_layers", []))
  moe_layers = tuple(experts > 0 and i not in dense_only and (i + 1) % step == 0
                     for i in range(n))
  moe = None
  if any(moe_layers):
    moe = MoESpec(
        num_experts=experts,
        experts_per_token=f.int("num_experts_per_tok", default=8),
        expert_intermediate_size=f.int("moe_intermediate_size", default=768),
    )
  intermediate = _MISSING if not all(moe_layers) else None
  return _spec(f, name=name, layer_kinds=kinds, moe_layers=moe_layers,
               intermediate=intermediate,
               attention=_qwen3_attention(f, window, head_dim=None),
               moe=moe)


def _gemma2(f: _Fields, name: str) -> ModelSpec:
  n = f.int("num_hidden_layers")
  window = f.nullable_int("sliding_window", default=4096)
  kinds = _schedule(f, n, lambda i: SLIDING if window and i % 2 == 0 else FULL)
  bias = f.bool("attention_bias", default=False)
  attention = _attention(f, window=window, heads=8, kv_heads=4, head_dim=256,
                         qkv_bias=bias, o_bias=bias)
  return _spec(f, name=name, layer_kinds=kinds, vocab=256000, intermediate=9216,
               tie=True, norms_per_layer=4, attention=attention)


def _gemma3_text(f: _Fields, name: str) -> ModelSpec:
  n = f.int("num_hidden_layers")
  window = f.nullable_int("sliding_window", default=4096)
  pattern = 1
  if f.config.get("layer_types") is None:
    pattern = f.int("sliding_window_pattern", "_sliding_window_pattern", default=6)
  kinds = _schedule(f, n, lambda i: SLIDING if window and (i + 1) % pattern else FULL)
  bias = f.bool("attention_bias", default=False)
  attention = _attention(f, window=window, heads=8, kv_heads=4, head_dim=256,
                         qkv_bias=bias, o_bias=bias, qk_norm=True)
  return _spec(f, name=name, layer_kinds=kinds, vocab=262208, intermediate=9216,
               tie=True, norms_per_layer=4, attention=attention)


def _gemma3(f: _Fields, name: str) -> ModelSpec:
  """The multimodal Gemma 3 config: its `text_config` is the decoder."""
  text = f.config.get("text_config")
  if not isinstance(text, dict):
    raise errors.InputError(
        f"{f.source}: config.json (model_type 'gemma3') has no 'text_config' "
        "object, which holds the decoder's sizes."
    )
  inner = _Fields({**text, "model_type": "gemma3_text"}, model_type="gemma3_text",
                  source=f.source)
  inner.notes.append("vision tower and projector not counted (decoder only)")
  return _gemma3_text(inner, name)


def _gpt_oss(f: _Fields, name: str) -> ModelSpec:
  n = f.int("num_hidden_layers", default=36)
  window = f.nullable_int("sliding_window", default=128)
  kinds = _schedule(f, n, lambda i: SLIDING if window and (i + 1) % 2 else FULL)
  bias = f.bool("attention_bias", default=True)
  attention = _attention(f, window=window, heads=64, kv_heads=8, head_dim=64,
                         qkv_bias=bias, o_bias=bias, sinks=True)
  moe = MoESpec(
      num_experts=f.int("num_local_experts", "num_experts", default=128),
      experts_per_token=f.int("num_experts_per_tok", "experts_per_token", default=4),
      expert_intermediate_size=f.int("intermediate_size", default=2880),
      expert_bias=True,
      router_bias=True,
  )
  return _spec(f, name=name, layer_kinds=kinds, moe_layers=(True,) * n,
               vocab=201088, intermediate=None, attention=attention, moe=moe)


def _deepseek(f: _Fields, name: str) -> ModelSpec:
  v3 = f.model_type == "deepseek_v3"
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
  moe_layers = tuple(experts > 0 and i >= first_dense and i % freq == 0
                     for i in range(n))
  moe = None
  if any(moe_layers):
    expert_size = f.int("moe_intermediate_size")
    moe = MoESpec(
        num_experts=experts,
        experts_per_token=f.int("num_experts_per_tok"),
        expert_intermediate_size=expert_size,
        num_shared_experts=f.nullable_int("n_shared_experts", default=1) or 0,
        shared_intermediate_size=expert_size,
        router_score_bias=f.config.get("topk_method", "noaux_tc" if v3 else
                                       "greedy") == "noaux_tc",
    )
  mtp = f.config.get("num_nextn_predict_layers") or 0
  if mtp:
    f.notes.append(f"{mtp} multi-token-prediction block(s) not counted "
                   "(not used by ordinary decoding)")
  intermediate = None if all(moe_layers) else _MISSING
  return _spec(f, name=name, layer_kinds=(MLA,) * n, moe_layers=moe_layers,
               intermediate=intermediate, mla=mla, moe=moe)


def _mamba(f: _Fields, name: str) -> ModelSpec:
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
  return _spec(f, name=name, layer_kinds=(RECURRENT,) * n, vocab=50280,
               intermediate=None, tie=True, norms_per_layer=1, ssm=ssm)


def _mamba_ssm(config: Mapping[str, Any], name: str, source: str) -> ModelSpec:
  """The original `mamba_ssm` config (d_model, n_layer, ssm_cfg; no model_type).

  Renamed to the Hugging Face fields, with the vocabulary padded as the
  checkpoint pads it (`pad_vocab_size_multiple`).
  """
  cfg = config.get("ssm_cfg") or {}
  layer = cfg.get("layer", "Mamba1")
  if layer != "Mamba1":
    raise errors.InputError(
        f"{source}: ssm_cfg layer {layer!r} is not supported; supported: Mamba1."
    )
  f = _Fields(config, model_type="mamba", source=source)
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
  names = {"d_state": "state_size", "d_conv": "conv_kernel", "expand": "expand",
           "dt_rank": "time_step_rank", "bias": "use_bias",
           "conv_bias": "use_conv_bias"}
  renamed.update({names[k]: v for k, v in cfg.items() if k in names})
  g = _Fields(renamed, model_type="mamba", source=source)
  if padded != vocab:
    g.notes.append(f"vocab_size {vocab} padded to {padded} "
                   f"(pad_vocab_size_multiple {multiple})")
  return _mamba(g, name)


READERS: dict[str, Callable[[_Fields, str], ModelSpec]] = {
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
    "mamba": _mamba,
}
SUPPORTED_TYPES: tuple[str, ...] = tuple(READERS)


def spec_from_config(config: Mapping[str, Any], *, name: str,
                     source: str = "config.json") -> ModelSpec:
  """A `ModelSpec` from a parsed `config.json` dict.

  Raises:
    InputError: unsupported `model_type`, or a needed field missing or invalid.
  """
  model_type = config.get("model_type")
  if model_type is None and "d_model" in config and "n_layer" in config:
    return _mamba_ssm(config, name, source)
  if model_type is None:
    raise errors.InputError(
        f"{source}: config.json has no 'model_type' field; supported types: "
        f"{', '.join(SUPPORTED_TYPES)}."
    )
  if model_type not in READERS:
    try:
      errors.require_choice("model_type", str(model_type), SUPPORTED_TYPES)
    except errors.InputError as e:
      raise errors.InputError(f"{source}: {e} (not supported)") from None
  fields = _Fields(config, model_type=model_type, source=source)
  return READERS[model_type](fields, name)
