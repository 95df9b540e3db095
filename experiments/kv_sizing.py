"""KV-cache sizing of a real model: per layer kind, payload vs allocation, fit.

Analytic bounds from the model's config.json (jaxroof.specs.kv_sizing):

  python -m experiments.kv_sizing --model=gemma-2-9b --context=8192 --batch=8 \
      --accelerator=h100-sxm --max_new_tokens=1024 --json_out=/tmp/kv.json

--model takes a shipped name (see jaxroof/specs/data/models/) or a path to a
Hugging Face config.json, or the folder holding one. An unsupported
model_type is refused unless --assume_llama_like reads it as Llama (labelled).
Hybrids (Qwen3-Next, Jamba, Nemotron-H) also get vLLM's hybrid page policy:

  python -m experiments.kv_sizing --model=qwen3-next-80b-a3b --context=262144 \
      --state_dtype=bf16
"""

from __future__ import annotations

import dataclasses

from absl import flags
from absl import logging

from experiments import _cli
from experiments import _model_flags
from experiments import _model_notes
from experiments import _layout_flags
from jaxroof.errors import InputError
from jaxroof.parallel import layout as layout_lib
from jaxroof import files
from jaxroof.specs import kv_sizing
from jaxroof.specs import parameters as params
from jaxroof.report import kv_sizing_lines
from jaxroof.specs.model_spec import ModelSpec
from jaxroof.specs.models import load_model
from jaxroof.specs.parameters import parameter_counts

_cli.key_flags(*_cli.MODEL_KEYS[:4], "tp", "block_size", "memory_gb")

# Model, workload, allocation and device fit: the shared vocabulary.
_SHARED = _model_flags.define("model", "accelerator", "accelerator_file", "weight_dtype",
                              "kv_dtype", "block_size", "workspace_fraction", "max_new_tokens",
                              "group_size", "memory_gb")
_MODEL, _ACCELERATOR, _WEIGHT_DTYPE, _KV_DTYPE = (_SHARED.model, _SHARED.accelerator,
                                                  _SHARED.weight_dtype, _SHARED.kv_dtype)
_BLOCK_SIZE, _WORKSPACE, _MAX_NEW_TOKENS, _GROUP_SIZE = (_SHARED.block_size,
                                                         _SHARED.workspace_fraction,
                                                         _SHARED.max_new_tokens, _SHARED.group_size)
_CONTEXT = flags.DEFINE_integer("context", None,
                                "Tokens each sequence retains now (holding K/V). >= 1.",
                                lower_bound=1)
_BATCH = flags.DEFINE_integer("batch", 1, "Sequences. >= 1.", lower_bound=1)
_STATE_DTYPE = flags.DEFINE_enum(
    "state_dtype", None, list(kv_sizing.KV_DTYPES),
    "Recurrent-state matrix dtype. Default: the config's mamba_ssm_cache_dtype, else "
    "--kv_dtype for Mamba-1 and fp32 for Mamba-2 and Gated DeltaNet.")
_ASSUME_LLAMA_LIKE = flags.DEFINE_bool(
    "assume_llama_like", False,
    "Read an unsupported model_type as Llama (its fields must be Llama's); labelled.")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Write inputs, results and units as JSON here.")

UNITS = {
    "kv_bytes_per_token": "B/token",
    "bytes_per_token": "B/token",
    "state_bytes": "B/sequence",
    "payload_bytes": "B",
    "allocated_bytes": "B",
    "allocated_bytes_windowed_as_full": "B",
    "*_per_sequence": "B/sequence",
    "retained_tokens": "tokens",
    "context": "tokens",
    "block_size": "tokens",
    "max_new_tokens": "tokens",
    "params_*": "weights",
    "memory_capacity_bytes": "B",
    "weight_bytes": "B",
    "usable_bytes": "B",
    "max_batch": "sequences",
}


def _print_sizing(spec: ModelSpec, sizing: kv_sizing.KVSizing) -> None:
  print("\n".join(kv_sizing_lines.sizing_lines(spec, sizing, parameter_counts(spec))))
  retained = sizing.context + sizing.max_new_tokens
  warned = _model_notes.say(spec, [retained])  # Defaults, and WARNING past the limit.
  for line in kv_sizing_lines.note_lines(spec, sizing, warned):
    print(line)


def _fit(spec: ModelSpec, sizing: kv_sizing.KVSizing) -> dict:
  """Checks the fit on --accelerator, prints it, and returns it for the JSON."""
  device = _model_flags.device(_SHARED)
  fmt = params.weight_format(spec, _WEIGHT_DTYPE.value, _GROUP_SIZE.value)
  weights = fmt.resident_bytes(parameter_counts(spec))
  fit = kv_sizing.capacity(sizing, weight_bytes=weights,
                           memory_capacity_bytes=device.memory_capacity_bytes,
                           workspace_fraction=_WORKSPACE.value)
  print(kv_sizing_lines.fit_line(device, fmt, weights, sizing, _WORKSPACE.value, fit))
  what_ifs = _model_flags.what_ifs(device)
  for line in what_ifs:
    print(line)
  return {"accelerator": device.name, "what_if": what_ifs, **dataclasses.asdict(fit)}


def _chip_fit(spec: ModelSpec, sizing: kv_sizing.KVSizing) -> dict:
  """The per-chip memory fit of the --tp/--pp/--ep/--dp layout, printed and returned."""
  device = _model_flags.device(_SHARED)
  layout = layout_lib.validate(_layout_flags.layout(_ACCELERATOR.value), spec, device)
  fmt = params.weight_format(spec, _WEIGHT_DTYPE.value, _GROUP_SIZE.value)
  memory = layout_lib.chip_memory(
      layout, spec, device, weight_format=fmt,
      kv_allocated_bytes_per_sequence=sizing.allocated_bytes_per_sequence,
      workspace_fraction=_WORKSPACE.value)
  per_chip_kv = memory.kv_allocated_bytes_per_sequence * sizing.batch / layout.ep
  chip = {
      "layout": layout.as_dict(), "fits": bool(sizing.batch <= memory.max_batch_per_replica),
      **dataclasses.asdict(memory), "kv_bytes_per_chip": per_chip_kv,
      "kv_rule": layout_lib.model_terms(spec).kv_rule
  }
  print(kv_sizing_lines.chip_fit_line(device, chip))
  return chip


def main(argv: list[str]) -> None:
  del argv  # Unused.
  _cli.require_flags(_MODEL, _CONTEXT)
  spec = load_model(_MODEL.value, assume_llama_like=_ASSUME_LLAMA_LIKE.value)
  sizing = kv_sizing.size_kv(spec, context=_CONTEXT.value, batch=_BATCH.value,
                             kv_dtype=_KV_DTYPE.value, block_size=_BLOCK_SIZE.value,
                             max_new_tokens=_MAX_NEW_TOKENS.value, state_dtype=_STATE_DTYPE.value)
  _print_sizing(spec, sizing)
  counts = parameter_counts(spec)
  fmt = params.weight_format(spec, _WEIGHT_DTYPE.value, _GROUP_SIZE.value)
  print(f"weight dtype: {fmt.label}: {fmt.describe()}")
  result = {
      "kind": "bound",
      "inputs": {
          "model": _MODEL.value, "context": sizing.context, "batch": sizing.batch,
          "kv_dtype": sizing.kv_dtype, "block_size": sizing.block_size,
          "max_new_tokens": sizing.max_new_tokens, "accelerator": _ACCELERATOR.value,
          "weight_dtype": fmt.dtype, "weight_format": fmt.describe(),
          "group_size": _GROUP_SIZE.value, "workspace_fraction": _WORKSPACE.value
      },
      "units": UNITS,
      "model": {
          "name": spec.name, "model_type": spec.model_type, "source": spec.source,
          "blocks": spec.num_layers, "defaults_used": list(spec.defaults_used),
          "notes": list(spec.notes)
      },
      **_model_notes.json_fields(spec, [sizing.context + sizing.max_new_tokens]),
      "params_total": counts.total,
      "params_active": counts.active,
      "params_active_matmul": counts.active_matmul,
      "params_breakdown": counts.breakdown(),
      **sizing.to_dict(),
  }
  if _STATE_DTYPE.value:
    result["inputs"]["state_dtype"] = _STATE_DTYPE.value
  if spec.assumed_llama_like:
    result["inputs"]["assume_llama_like"] = True
    result["assumed_llama_like"] = True
    result["model_notes"] = list(spec.notes)
  if _ACCELERATOR.value or _SHARED.accelerator_file.value:
    result["capacity"] = _fit(spec, sizing)
    result["fits"] = result["capacity"]["fits"]
    if not _layout_flags.layout(_ACCELERATOR.value).is_single_chip:
      result["per_chip"] = _chip_fit(spec, sizing)
  elif not _layout_flags.layout().is_single_chip:
    raise InputError("--tp/--pp/--ep/--dp/--chips need --accelerator: the per-chip fit is "
                     "against its memory.")
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, result)
    logging.info("wrote %s", _JSON_OUT.value)


if __name__ == "__main__":
  _cli.run(main)
