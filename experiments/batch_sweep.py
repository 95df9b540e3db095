"""Decode batch sweep: step time and both token rates against batch size.

Analytic bounds from the symbolic step model (jaxroof.symbolic.formulas):

  traffic = weights + B * KV per sequence;  step = max(traffic/BW, 2*N*B/F)
  aggregate rate = B / step;  per-sequence rate = 1 / step

Give either raw numbers or a shipped model and accelerator
(`--model=llama-3-8b --accelerator=h100-sxm --context=4096`): batches that do not fit
are marked; --bandwidth_tbps, --tflops and --memory_gb are labelled what-ifs on the
datasheet; --weight_dtype, --kv_dtype and --context take lists (every combination in
one table, each JSON row naming its own); rows give the rates per chip, per kW and,
with --price_per_hour, tokens per dollar. --engine=NAME makes the steps that engine's
calibrated predictions (its published-measurement profile), the bound's step beside:

  python -m experiments.batch_sweep --model=llama-3-8b --accelerator=h100-sxm \
      --weight_dtype=bf16,fp8 --kv_dtype=bf16,fp8 --context=4096,32768 \
      --price_per_hour=2.5 --json_out=/tmp/cmp.json --plot_out=/tmp/cmp.png

Defaults: the lesson's example (16 GB of BF16 weights, 0.25 GB of K/V per sequence, 2 TB/s):
`python -m experiments.batch_sweep --batch_sizes=1,8,32,64 --json_out=/tmp/sweep.json`.
"""

from __future__ import annotations

from absl import flags
from absl import logging

from experiments import _cli
from experiments import _engine_flags
from experiments import _layout_flags
from experiments import _model_flags
from experiments import _model_notes
from jaxroof import files
from jaxroof.errors import InputError
from jaxroof.parallel import variants
from jaxroof.report import accuracy
from jaxroof.report import sweep_table
from jaxroof.serving import elasticity
from jaxroof.serving import raw_inputs as raw_inputs_lib
from jaxroof.specs import models
from jaxroof.symbolic import sweep as sweep_lib

_cli.key_flags(*_cli.MODEL_KEYS, "tp")
# Raw numbers (the lesson's by default), or a model on an accelerator; either with a profile.
_SHARED = _model_flags.define("model", "accelerator", "accelerator_file", "weight_dtype",
                              "kv_dtype", "block_size", "workspace_fraction", "max_new_tokens",
                              "group_size", "memory_gb", *_model_flags.COST, *_model_flags.RAW,
                              "profile", "what_if", "engine", lists=("weight_dtype", "kv_dtype"))
_MODEL, _ACCELERATOR = _SHARED.model, _SHARED.accelerator
_WEIGHT_DTYPE, _KV_DTYPE = _SHARED.weight_dtype, _SHARED.kv_dtype
_KV_GB_PER_SEQ, _KV_BYTES_PER_TOKEN, _LAYERS = (_SHARED.kv_gb_per_seq, _SHARED.kv_bytes_per_token,
                                                _SHARED.layers)
_MODEL_ONLY = (_SHARED.accelerator_file, _SHARED.block_size, _SHARED.workspace_fraction,
               _SHARED.max_new_tokens, _SHARED.group_size, _SHARED.memory_gb)
_CONTEXT = flags.DEFINE_list(
    "context", None, "Retained tokens per sequence (with --kv_bytes_per_token, one value; "
    "with --model, one or several comma-separated). Whole numbers >= 1.")
_PRICE_PER_HOUR = flags.DEFINE_float(
    "price_per_hour", None, "With --model: price of one chip for an hour (any currency); "
    "adds tokens_per_dollar to the rows. > 0.")
_BATCH_SIZES = flags.DEFINE_list(
    "batch_sizes", "1,2,4,8,16,32,64,128,256,512,1024",
    "Comma-separated batch sizes (sequences), each a whole number >= 1.")
_TOKEN_GAP_MS = flags.DEFINE_float(
    "token_gap_ms", None, "Optional target: longest gap between one user's tokens, ms. "
    "> 0. Rows say whether they meet it; the summary gives the largest batch that does.")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Write the sweep as JSON here.")
_PLOT_OUT = flags.DEFINE_string("plot_out", None, "Write a PNG of both rates here.")

for _holder, _unit in ((_TOKEN_GAP_MS, "ms"), (_PRICE_PER_HOUR, "per chip-hour")):
  _cli.require_positive(_holder, _unit)
_cli.require_positive_int_list(_BATCH_SIZES, "sequences")
flags.register_validator(
    _CONTEXT.name, lambda values: values is None or
    (bool(values) and all(v.isdigit() and 1 <= int(v) <= 10**8 for v in values)),
    message="must be comma-separated whole numbers in [1, 1e8] (tokens)")


@flags.multi_flags_validator(
    (_KV_GB_PER_SEQ.name, _KV_BYTES_PER_TOKEN.name, _CONTEXT.name),
    message="give either --kv_gb_per_seq, or both --kv_bytes_per_token and --context",
)
def _kv_flags_consistent(values: dict) -> bool:
  per_token = values[_KV_BYTES_PER_TOKEN.name] is not None
  context = values[_CONTEXT.name] is not None
  if per_token and not context:
    return False
  if context and not per_token and not flags.FLAGS[_MODEL.name].present:
    return False
  return not (per_token and values[_KV_GB_PER_SEQ.name] is not None)


_RAW_FLAGS = (_SHARED.weights_gb, _SHARED.bytes_per_weight, _KV_GB_PER_SEQ, _KV_BYTES_PER_TOKEN,
              _SHARED.bandwidth_tbps, _SHARED.tflops)


def _check_flags() -> None:
  """--model on a device with --context, or raw numbers, as one-line errors."""
  _model_flags.check_model_or_raw(
      _SHARED, model_only=(_WEIGHT_DTYPE, _KV_DTYPE, _PRICE_PER_HOUR) + _MODEL_ONLY,
      raw=_RAW_FLAGS[:4] + (_LAYERS,))
  if _MODEL.value:
    _cli.require_flags(_CONTEXT)


def raw_inputs() -> dict:
  """The sweep's inputs in SI units, from the raw-number flags."""
  context = _CONTEXT.value
  if _KV_BYTES_PER_TOKEN.value is not None and len(context) != 1:
    raise InputError(f"--context={','.join(context)} is not allowed with raw numbers: "
                     "give one context (lists compare dtypes and contexts with --model).")
  return raw_inputs_lib.sweep_inputs(**_model_flags.raw_numbers(_SHARED),
                                     context=int(context[0]) if context else None)


def model_sweeps(batch_sizes: list[int], gap_s: float | None,
                 bound: bool = False) -> tuple[list[dict], list[str]]:
  """One sweep per (weight dtype, K/V dtype, context) for --model on the device, with
  the memory fit of each batch; and the what-if notes (datasheet figures replaced)."""
  device = _model_flags.what_if_device(_SHARED)
  what_ifs = _model_flags.what_ifs(device)
  sweeps = variants.variant_sweeps(
      models.load_model(_MODEL.value), device, contexts=[int(c) for c in _CONTEXT.value],
      weight_dtypes=_WEIGHT_DTYPE.value, kv_dtypes=_KV_DTYPE.value, batch_sizes=batch_sizes,
      model=_model_flags.step_model(_SHARED, accelerator=_ACCELERATOR.value or device.name,
                                    use_profile_ceilings=False, bound=bound), token_gap_s=gap_s,
      layout=_layout_flags.layout(_ACCELERATOR.value), price_per_hour=_PRICE_PER_HOUR.value,
      block_size=_SHARED.block_size.value, workspace_fraction=_SHARED.workspace_fraction.value,
      group_size=_SHARED.group_size.value, max_new_tokens=_SHARED.max_new_tokens.value,
      comm_overlap=_SHARED.comm_overlap.value)
  for sweep in sweeps:
    sweep["inputs"]["what_if"] = what_ifs
    sweep["assumptions"] = list(sweep["assumptions"]) + what_ifs
  return sweeps, what_ifs


def _compute(batch_sizes: list[int],
             bound: bool = False) -> tuple[list[dict], dict, str, list[str]]:
  """The sweeps (one per combination; [] for raw numbers), the first, a title, what-ifs."""
  sweeps, what_ifs = [], []
  gap_s = None if _TOKEN_GAP_MS.value is None else _TOKEN_GAP_MS.value / 1e3
  model = _model_flags.step_model(_SHARED, accelerator=_ACCELERATOR.value, bound=bound,
                                  use_profile_ceilings=not _model_flags.figures_given(_SHARED))
  if _MODEL.value:
    sweeps, what_ifs = model_sweeps(batch_sizes, gap_s, bound=bound)
    sweep, title = sweeps[0], sweep_table.title(sweeps, what_ifs)
  else:
    if not _layout_flags.layout().is_single_chip:
      raise InputError("--tp/--pp/--ep/--dp/--chips apply with --model and --accelerator "
                       "only: the raw-number sweep is one chip.")
    inputs = raw_inputs()
    sweep = sweep_lib.sweep(model, batch_sizes, layers=_LAYERS.value, token_gap_s=gap_s, **inputs)
    for row in sweep["rows"]:  # One chip: no communication.
      row["comm_s"], row["chips"] = 0.0, 1
    sweep["inputs"] = {
        "flags": {h.name: h.value for h in _RAW_FLAGS + (_CONTEXT,)}, "si": inputs,
        "batch_sizes": batch_sizes
    }
    title = "Decode batch sweep"
  layers = models.load_model(_MODEL.value).num_layers if _MODEL.value else _LAYERS.value
  for each in sweeps or [sweep]:
    elasticity.annotate_sweep(each, model, layers=layers, **each["inputs"]["si"])
  return sweeps, sweep, title, what_ifs


def main(argv: list[str]) -> None:
  del argv  # Unused.
  _check_flags()
  batch_sizes = _cli.int_list(_BATCH_SIZES)
  sweeps, sweep, title, what_ifs = _compute(batch_sizes)
  priced = _PRICE_PER_HOUR.value is not None
  if sweep["kind"] == "calibrated" and "engine" in sweep["profile"]:  # The bound beside.
    bound_sweeps, bound_sweep, _, _ = _compute(batch_sizes, bound=True)
    _engine_flags.bound_beside(sweeps or [sweep], bound_sweeps or [bound_sweep])
  elif sweep["kind"] == "calibrated" and accuracy.bound_first(sweep["profile"]):
    bound_sweeps, bound_sweep, _, _ = _compute(batch_sizes, bound=True)
    print("\n".join(sweep_table.bound_first_lines(title, bound_sweeps, bound_sweep, priced)))
  print("\n".join([sweep_table.title_line(title, sweep)] + what_ifs))
  if _MODEL.value:
    spec = models.load_model(_MODEL.value)
    contexts = [int(c) + _SHARED.max_new_tokens.value for c in _CONTEXT.value]
    _model_notes.say(spec, contexts)
  print("\n".join(sweep_table.lines(sweeps, sweep, priced=priced)))
  if sweep["kind"] == "calibrated":
    print("\n".join(accuracy.footnote_lines(sweep["profile"])))
  document = variants.combined(sweeps) if len(sweeps) > 1 else sweep
  if _MODEL.value:
    document.update(_model_notes.json_fields(spec, contexts))
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, document)
    logging.info("wrote %s", _JSON_OUT.value)
  if _PLOT_OUT.value:
    sweep_table.plot(sweeps, sweep, _PLOT_OUT.value, title)
    logging.info("wrote %s", _PLOT_OUT.value)


if __name__ == "__main__":
  _cli.run(main)
