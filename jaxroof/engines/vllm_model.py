"""A model folder a real vLLM engine can serve with no download.

`write_model_folder` writes `config.json` (a named tiny preset, or a shipped
or user config scaled down) and a word-level tokenizer built here as JSON in
the `tokenizers` library's format: id i is the word `w<i>`, split on
whitespace, decoded by joining with spaces. Decoding then re-encoding gives
the same ids, so `vllm bench serve --dataset-name random` sends exactly the
input lengths it reports. Weights are not written: the server runs
`--load-format dummy` (random weights), which costs the same time per step.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from jaxroof import errors
from jaxroof import files
from jaxroof.specs import models

_LLAMA_BASE = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_act": "silu",
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
    "max_position_embeddings": 4096, "vocab_size": 8192, "attention_bias": False, "mlp_bias": False
}
# Named presets: small enough that a 2-core CPU serves them at several requests/s.
PRESETS: dict[str, dict[str, Any]] = {
    # The facts file's model (hidden 512, 4 layers, 8 heads of 64).
    "tiny-llama": {
        **_LLAMA_BASE, "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 64
    },
    # A larger, grouped-query sibling: a model size a fit on tiny-llama never saw.
    "small-llama": {
        **_LLAMA_BASE, "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 6,
        "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 64
    },
    # MoE (8 experts, top 2); whether vLLM's CPU backend serves it is checked by running it.
    "tiny-mixtral": {
        **_LLAMA_BASE, "model_type": "mixtral", "architectures": ["MixtralForCausalLM"],
        "hidden_size": 512, "intermediate_size": 704, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 64, "num_local_experts": 8,
        "num_experts_per_tok": 2, "router_aux_loss_coef": 0.0
    },
}
# Scaling flags -> config.json keys.
SCALABLE = {
    "num_layers": "num_hidden_layers", "hidden_size": "hidden_size",
    "num_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads",
    "intermediate_size": "intermediate_size"
}
MAX_VOCAB = 262_144
SPECIAL = ("w0", "w1", "w2")  # unk, bos, eos: left out of vLLM's random prompts.


def base_config(model: str) -> tuple[dict[str, Any], str]:
  """(config dict, where it came from) for a preset name, a shipped name or a path."""
  if model in PRESETS:
    return dict(PRESETS[model]), f"jaxroof preset {model!r} (jaxroof.engines.vllm_model)"
  spec = models.load_model(model)  # Refuses unknown names and bad files, one line each.
  path = models.MODELS_DIR / f"{spec.name}.json"
  if not path.is_file():
    candidate = model if model.endswith(".json") else os.path.join(model, "config.json")
    path = candidate
  with open(path, encoding="utf-8") as f:
    config = json.load(f)
  config.pop(models.SOURCE_KEY, None)
  return config, f"config of {model!r}, scaled down by the given flags"


def scaled_config(model: str, overrides: Mapping[str, int | None]) -> tuple[dict, str]:
  """The config with `SCALABLE` overrides applied (None: keep) and a checked shape.

  Raises:
    InputError: an unknown override, or heads that do not divide the width.
  """
  config, source = base_config(model)
  for flag, value in overrides.items():
    if flag not in SCALABLE:
      raise errors.InputError(f"{flag}={value!r} is not a model size: give "
                              f"{', '.join(SCALABLE)}.")
    if value is not None:
      config[SCALABLE[flag]] = errors.require_positive_int(flag, value)
  config.setdefault("num_key_value_heads", config.get("num_attention_heads"))
  heads, kv_heads = config.get("num_attention_heads"), config.get("num_key_value_heads")
  width = config.get("hidden_size")
  if not all(isinstance(v, int) and v > 0 for v in (heads, kv_heads, width)):
    raise errors.InputError(f"model={model!r} lacks hidden_size or attention heads: give a "
                            "Llama-like config.json.")
  if heads % kv_heads:
    raise errors.InputError(f"num_kv_heads={kv_heads} does not divide num_heads={heads}.")
  if any(k in overrides and overrides[k] is not None for k in ("hidden_size", "num_heads")) \
      or "head_dim" not in config:
    if width % heads:
      raise errors.InputError(f"num_heads={heads} does not divide hidden_size={width}.")
    config["head_dim"] = width // heads
  vocab = config.get("vocab_size")
  if not isinstance(vocab, int) or not 8 <= vocab <= MAX_VOCAB:
    raise errors.InputError(f"vocab_size={vocab!r} is not allowed: the word-level "
                            f"tokenizer needs 8 to {MAX_VOCAB:,} ids.")
  config.update({"bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"})
  config.pop("quantization_config", None)  # Dummy weights are bf16.
  return config, source


def tokenizer_json(vocab_size: int) -> dict[str, Any]:
  """A WordLevel tokenizer (`tokenizers` JSON format): id i <-> word `w<i>`."""
  return {
      "version": "1.0",
      "truncation": None,
      "padding": None,
      "added_tokens": [{
          "id": i, "content": w, "single_word": False, "lstrip": False, "rstrip": False,
          "normalized": False, "special": True
      } for i, w in enumerate(SPECIAL)],
      "normalizer": None,
      "pre_tokenizer": {"type": "WhitespaceSplit"},
      "post_processor": None,
      "decoder": None,
      "model": {
          "type": "WordLevel", "vocab": {f"w{i}": i for i in range(vocab_size)},
          "unk_token": SPECIAL[0]
      },
  }


def tokenizer_config(max_length: int) -> dict[str, Any]:
  return {
      "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": SPECIAL[0],
      "bos_token": SPECIAL[1], "eos_token": SPECIAL[2], "add_bos_token": False,
      "add_eos_token": False, "model_max_length": max_length, "clean_up_tokenization_spaces": False
  }


def write_model_folder(folder: str, model: str,
                       overrides: Mapping[str, int | None] | None = None) -> dict[str, Any]:
  """Writes config.json, tokenizer.json, tokenizer_config.json (atomically).

  Returns:
    {"model_dir", "config", "source"}.
  """
  config, source = scaled_config(model, overrides or {})
  os.makedirs(folder, exist_ok=True)
  files.write_json(os.path.join(folder, "config.json"), config)
  files.write_json(os.path.join(folder, "tokenizer.json"), tokenizer_json(config["vocab_size"]))
  files.write_json(os.path.join(folder, "tokenizer_config.json"),
                   tokenizer_config(int(config.get("max_position_embeddings", 4096))))
  files.write_json(os.path.join(folder, "generation_config.json"),
                   {"bos_token_id": 1, "eos_token_id": 2})
  return {"model_dir": os.path.abspath(folder), "config": config, "source": source}
