"""Reading a Hugging Face `config.json` into a `ModelSpec`, one reader per model_type.

The readers live in `jaxroof.specs.readers` by family (`classic`: the first
supported types; `dense`: Llama relatives and Llama 4; `hybrid`: models that
mix attention with linear-attention or Mamba blocks). A field the hub's
configs often omit gets the default of the Hugging Face config class, and the
spec records it in `defaults_used`; a field with no such default must be
present, or the reader raises an `InputError` naming it.

An unknown `model_type` is refused with the list of supported ones, unless the
caller asks for the Llama fallback (`assume_llama_like=True`): then a config
with Llama's fields is read as Llama, and the spec says so in its notes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import dataclasses

from jaxroof import errors
from jaxroof import schema
from jaxroof.specs.model_spec import ModelSpec
from jaxroof.specs.readers import classic, config_schema, dense, hybrid
from jaxroof.specs.readers.fields import Fields

READERS: dict[str, Callable[[Fields, str],
                            ModelSpec]] = {**classic.READERS, **dense.READERS, **hybrid.READERS}
SUPPORTED_TYPES: tuple[str, ...] = tuple(READERS)
NOT_SUPPORTED = {
    "falcon_h1": "Mamba-2 and attention side by side in every block",
}
LLAMA_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "vocab_size")


def _llama_like(config: Mapping[str, Any], name: str, source: str) -> ModelSpec:
  """An unknown model_type read as Llama, labelled as such."""
  missing = [k for k in LLAMA_FIELDS if k not in config]
  model_type = config.get("model_type")
  if missing:
    raise errors.InputError(f"{source}: model_type {model_type!r} cannot be read as Llama-like: no "
                            f"{', '.join(missing)} field(s).")
  fields = Fields(config, model_type=str(model_type), source=source)
  fields.notes.append(
      f"ASSUMED Llama-like: model_type {model_type!r} is not supported and was read "
      "as Llama (assume_llama_like); fields Llama does not have were ignored")
  spec = READERS["llama"](fields, name)
  return dataclasses.replace(spec, assumed_llama_like=True)


def spec_from_config(config: Mapping[str, Any], *, name: str, source: str = "config.json",
                     assume_llama_like: bool = False) -> ModelSpec:
  """A `ModelSpec` from a parsed `config.json` dict.

  Args:
    config: the parsed file.
    name: the model's name in output.
    source: where it came from, for messages.
    assume_llama_like: read an unknown `model_type` as Llama (labelled in
      the spec's notes) instead of refusing it.

  Raises:
    InputError: unsupported `model_type`, a needed field missing, or any
      field the readers use of the wrong type or range, or inconsistent with
      another (`config_schema`), checked before any reader runs.
  """
  if not isinstance(config, Mapping):
    raise errors.InputError(f"{source} is not a config.json: expected a JSON object, got "
                            f"{type(config).__name__}.")
  model_type = config.get("model_type")
  if model_type is not None and not isinstance(model_type, str):
    raise errors.InputError(
        f"{source}: config field model_type={str(model_type)[:40]!r} is not a name; "
        f"supported: {', '.join(SUPPORTED_TYPES)}.")
  schema.check(config_schema.CONFIG, config, where=source)
  if model_type is None and "d_model" in config and "n_layer" in config:
    return classic.mamba_ssm(config, name, source)
  if model_type is None:
    raise errors.InputError(f"{source}: config.json has no 'model_type' field; supported types: "
                            f"{', '.join(SUPPORTED_TYPES)}.")
  if model_type not in READERS:
    if assume_llama_like and model_type not in NOT_SUPPORTED:
      return _llama_like(config, name, source)
    why = NOT_SUPPORTED.get(model_type)
    hint = (f" ({why}, which jaxroof does not model)"
            if why else "; if its fields are Llama's, assume_llama_like reads it as Llama")
    raise errors.InputError(
        f"{source}: model_type={model_type!r} is not supported{hint}; supported: "
        f"{', '.join(SUPPORTED_TYPES)}.")
  fields = Fields(config, model_type=model_type, source=source)
  return READERS[model_type](fields, name)
