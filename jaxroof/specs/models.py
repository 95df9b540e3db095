"""Loading a `ModelSpec` by shipped name, `config.json` path or folder.

Shipped configs live in `jaxroof/specs/data/models/`, each with its source
under the `_jaxroof_source` key; `jaxroof.specs.hf_config` reads them.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path
from typing import Any

from jaxroof import errors
from jaxroof import files
from jaxroof.specs import hf_config
from jaxroof.specs import names
from jaxroof.specs.model_spec import ModelSpec
from jaxroof.specs.readers import config_schema

MODELS_DIR = Path(__file__).parent / "data" / "models"
SOURCE_KEY = "_jaxroof_source"  # Provenance inside each shipped config.json.


def shipped_models() -> tuple[str, ...]:
  """Slugs of the configs shipped in `jaxroof/specs/data/models/`."""
  return tuple(sorted(p.stem for p in MODELS_DIR.glob("*.json")))


def _read_json(path: Path) -> dict[str, Any]:
  """A config.json as a dict; every way a file can be wrong is one InputError.

  Its size and nesting are bounded (`config_schema.KIND`). Accepts what
  Python's JSON reader accepts (`Infinity` appears in real Nemotron-H
  configs); `hf_config` then checks the values against the schema.
  """
  where = f"model={str(path)!r}"
  config = files.read_json("model", path, max_bytes=config_schema.KIND.max_bytes,
                           max_depth=config_schema.KIND.max_depth)
  if not isinstance(config, dict):
    raise errors.InputError(f"{where} is not a config.json: expected a JSON object, got "
                            f"{type(config).__name__}.")
  return config


def _resolve(name_or_path: str) -> tuple[str, Path, bool]:
  """(name, config path, shipped?) for a slug, a file or a folder."""
  slug = name_or_path.strip().lower()
  if (MODELS_DIR / f"{slug}.json").is_file() and os.sep not in name_or_path:
    return slug, MODELS_DIR / f"{slug}.json", True
  path = Path(name_or_path).expanduser()
  if path.is_dir():
    if not (path / "config.json").is_file():
      raise errors.InputError(f"model={name_or_path!r} is a folder without a config.json in it.",
                              field="model")
    return path.resolve().name, path / "config.json", False
  if path.exists():
    name = path.parent.resolve().name if path.name == "config.json" else path.stem
    return name, path, False
  if path.suffix == ".json" or os.sep in name_or_path:
    raise errors.InputError(f"model={name_or_path!r}: no such file or folder.", field="model")
  names.require_known("model", slug, shipped_models(),
                      otherwise="Or give a path to a config.json or its folder.")
  raise AssertionError("unreachable: a shipped slug was matched above")


@functools.lru_cache(maxsize=64)
def _load(name_or_path: str, assume_llama_like: bool) -> ModelSpec:
  name, path, shipped = _resolve(name_or_path)
  config = _read_json(path)
  source = str(path)
  if shipped:
    url = config.get(SOURCE_KEY, {}).get("config_url")
    source = url or f"jaxroof/specs/data/models/{path.name}"
  spec = hf_config.spec_from_config(config, name=name, source=source,
                                    assume_llama_like=assume_llama_like)
  return dataclasses.replace(spec, shipped=True) if shipped else spec


def load_model(name_or_path: str, *, assume_llama_like: bool = False) -> ModelSpec:
  """A `ModelSpec` from a shipped slug, a `config.json` path or its folder.

  Raises:
    InputError: an unknown name (listing the shipped ones and the closest
      match), a missing or malformed file, an unsupported `model_type`, or a
      config missing a field that has no default.

  JSON is read as Python's `json` reads it, so the bare `Infinity` some
  published configs hold (Nemotron-H) is accepted; sizes must still be finite
  whole numbers. `assume_llama_like` reads an unknown `model_type` as Llama,
  labelled in the spec's notes (`hf_config.spec_from_config`).
  """
  if not isinstance(name_or_path, str) or not name_or_path.strip():
    raise errors.InputError(
        f"model={name_or_path!r} is not allowed: give a shipped name "
        f"({', '.join(shipped_models())}) or a path to a config.json.", field="model")
  return _load(name_or_path, bool(assume_llama_like))
