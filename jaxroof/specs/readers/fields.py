"""Typed access to a config.json and the parts every reader builds the same way.

`Fields` reads whole numbers and flags with the Hugging Face config class's
defaults (recording each default it fills in), `schedule` gives the per-block
attention kind, `attention` the grouped-query dims and `spec` the `ModelSpec`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from jaxroof import errors
from jaxroof.specs.model_spec import FULL, SLIDING, AttentionSpec, ModelSpec
from jaxroof.specs.readers.config_schema import MAX_LAYERS, MAX_SIZE

MISSING = object()
LAYER_TYPES = {"full_attention": FULL, "sliding_attention": SLIDING}


class Fields:
  """Typed access to one config dict; remembers the defaults it filled in."""

  def __init__(self, config: Mapping[str, Any], *, model_type: str, source: str):
    self.config = config
    self.model_type = model_type
    self.source = source
    self.defaults_used: list[str] = []
    self.defaults_applied: list[str] = []  # The same, in words.
    self.notes: list[str] = []
    self.rules: dict[str, str] = {}  # How a default is derived, by field.

  def _lookup(self, keys: tuple[str, ...]) -> tuple[str, Any]:
    for key in keys:
      if key in self.config:
        return key, self.config[key]
    return keys[0], MISSING

  def _default(self, key: str, default: Any) -> Any:
    if default is MISSING:
      raise errors.InputError(f"{self.source}: config.json (model_type {self.model_type!r}) has no "
                              f"{key!r} field, which is needed to size the model.")
    value = default() if callable(default) else default
    self.defaults_used.append(f"{key}={value!r}")
    rule = self.rules.get(key)
    self.defaults_applied.append(
        f"{key} missing from config.json: read as {rule + ' = ' if rule else ''}"
        f"{'null' if value is None else value!r}, as Hugging Face's "
        f"{self.model_type} config does")
    return value

  def _check_int(self, key: str, value: Any, minimum: int) -> int:
    limit = MAX_LAYERS if "layers" in key else MAX_SIZE
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or
        (isinstance(value, float) and not math.isfinite(value)) or not minimum <= value <= limit or
        value != int(value)):
      shown = repr(value) if len(repr(value)) < 40 else f"{repr(value)[:20]}..."
      raise errors.InputError(f"{self.source}: config field {key}={shown} is not allowed: it must "
                              f"be a whole number in [{minimum}, {limit:,}].")
    return int(value)

  def int(self, *keys: str, default: Any = MISSING, minimum: int = 1) -> int:
    """A whole number; null or absent takes `default` (a value or callable)."""
    key, value = self._lookup(keys)
    if value is MISSING or value is None:
      value = self._default(key, default)
    return self._check_int(key, value, minimum)

  def nullable_int(self, *keys: str, default: Any) -> int | None:
    """A whole number or an explicit null; only an absent key takes `default`."""
    key, value = self._lookup(keys)
    if value is MISSING:
      value = self._default(key, default)
    return None if value is None else self._check_int(key, value, 1)

  def optional_int(self, key: str) -> int | None:
    """A whole number >= 1, or None when absent or null (no default recorded)."""
    value = self.config.get(key)
    return None if value is None else self._check_int(key, value, 1)

  def bool(self, *keys: str, default: bool) -> bool:
    key, value = self._lookup(keys)
    if value is MISSING or value is None:
      return self._default(key, default)
    if not isinstance(value, bool):
      raise errors.InputError(
          f"{self.source}: config field {key}={value!r} is not allowed: it must "
          "be true or false.")
    return value

  def int_list(self, key: str, default: list[int]) -> list[int]:
    value = self.config.get(key)
    if value is None:
      return list(default)
    if not isinstance(value, list):
      raise errors.InputError(
          f"{self.source}: config field {key}={value!r} is not allowed: it must "
          "be a list of layer indices.")
    return [self._check_int(key, v, 0) for v in value]


def schedule(f: Fields, n: int, rule: Callable[[int], str]) -> tuple[str, ...]:
  """Attention kind per block: `layer_types` if given, else `rule(i)`."""
  types = f.config.get("layer_types")
  if types is None:
    return tuple(rule(i) for i in range(n))
  if not isinstance(types, list) or len(types) != n:
    raise errors.InputError(
        f"{f.source}: config field layer_types={types!r} is not allowed: it must "
        f"list one type per block ({n} blocks).")
  for t in types:
    if not isinstance(t, str) or t not in LAYER_TYPES:
      raise errors.InputError(f"{f.source}: layer type {t!r} in layer_types is not supported; "
                              f"supported: {', '.join(LAYER_TYPES)}.")
  return tuple(LAYER_TYPES[t] for t in types)


def attention(f: Fields, *, window: int | None, heads: Any = MISSING, kv_heads: Any = None,
              head_dim: Any = None, **flags: bool) -> AttentionSpec:
  """Grouped-query attention dims; head_dim defaults to hidden/heads."""
  hidden = f.int("hidden_size")
  num_heads = f.int("num_attention_heads", default=heads)
  if kv_heads is None:
    f.rules["num_key_value_heads"] = "num_attention_heads"
  num_kv = f.int("num_key_value_heads", default=num_heads if kv_heads is None else kv_heads)
  if head_dim is None and hidden % num_heads == 0:
    head_dim = hidden // num_heads
    f.rules["head_dim"] = "hidden_size / num_attention_heads"
  dim = f.int("head_dim", default=MISSING if head_dim is None else head_dim)
  if num_heads % num_kv:
    raise errors.InputError(f"{f.source}: num_attention_heads={num_heads} is not a multiple of "
                            f"num_key_value_heads={num_kv}.")
  return AttentionSpec(num_heads=num_heads, num_kv_heads=num_kv, head_dim=dim,
                       sliding_window=window, **flags)


def _quantization(config: Any) -> dict[str, Any]:
  """The published quantization a config declares (method, block, exclusions).

  Absent or null: not quantized. Its shape was checked by the schema
  (`config_schema`: an object with a `quant_method`), so a malformed one was
  refused before any reader ran.
  """
  if config is None:
    return {}
  return {
      "quant_method": config["quant_method"].strip().lower(),
      "quant_weight_block": tuple(int(v) for v in config.get("weight_block_size") or ()),
      "quant_not_converted": tuple(config.get("modules_to_not_convert") or ()),
  }


def spec(f: Fields, *, name: str, layer_kinds: tuple[str, ...],
         moe_layers: tuple[bool, ...] | None = None, vocab: Any = MISSING,
         intermediate: Any = MISSING, tie: bool = False,
         intermediate_key: str = "intermediate_size", **parts: Any) -> ModelSpec:
  """The fields every reader fills the same way.

  `intermediate` is the default of `intermediate_size` (the dense MLP width),
  or None for a model without dense MLP blocks.
  """
  if intermediate is not None:
    intermediate = f.int(intermediate_key, default=intermediate)
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
      tie_word_embeddings=f.bool("tie_word_embeddings", "tie_embeddings", default=tie),
      max_position_embeddings=f.optional_int("max_position_embeddings"),
      torch_dtype=f.config.get("torch_dtype", f.config.get("dtype")),
      **_quantization(f.config.get("quantization_config")),
      source=f.source,
      defaults_used=tuple(f.defaults_used),
      defaults_applied=tuple(f.defaults_applied),
      notes=tuple(f.notes),
      **parts,
  )
