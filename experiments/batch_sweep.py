"""Decode batch sweep: step time and both token rates against batch size.

Analytic bounds from the symbolic step model (jaxroof.symbolic.formulas):

  traffic = weights + B * KV per sequence;  step = max(traffic/BW, 2*N*B/F)
  aggregate rate = B / step;  per-sequence rate = 1 / step

Give either raw numbers or a shipped model and accelerator
(`--model=llama-3-8b --accelerator=h100-sxm --context=4096`), in which case
batches whose weights, K/V and workspace do not fit the device are marked.

Defaults are the lesson's example (16 GB of BF16 weights, 0.25 GB of K/V per
sequence, 2 TB/s):

  python -m experiments.batch_sweep --batch_sizes=1,8,32,64 \
      --json_out=/tmp/sweep.json --plot_out=/tmp/sweep.png
"""

from __future__ import annotations

from absl import flags
from absl import logging

from experiments import _cli
from experiments import _layout_flags
from jaxroof import files
from jaxroof.errors import InputError
from jaxroof.measure import profiles
from jaxroof.parallel import layout_sweep as parallel_sweep
from jaxroof.report import plots
from jaxroof.report import table
from jaxroof.serving import elasticity
from jaxroof.specs import accelerators
from jaxroof.specs import kv_sizing
from jaxroof.specs import models
from jaxroof.specs import parameters
from jaxroof.symbolic import sweep as sweep_lib
from jaxroof.symbolic.step_model import StepModel

# Weights.
_WEIGHTS_GB = flags.DEFINE_float(
    "weights_gb", 16.0, "Weight bytes read per step, in GB (1e9 B). > 0.")
_BYTES_PER_WEIGHT = flags.DEFINE_float(
    "bytes_per_weight", 2.0, "Bytes per weight (2 = BF16); sets N = bytes / this. > 0.")
# K/V per sequence: either directly, or per token times the context.
_KV_GB_PER_SEQ = flags.DEFINE_float(
    "kv_gb_per_seq", None,
    "K/V bytes each sequence reads per step, in GB. > 0. Default 0.25 unless "
    "--kv_bytes_per_token and --context are given.")
_KV_BYTES_PER_TOKEN = flags.DEFINE_float(
    "kv_bytes_per_token", None, "K/V bytes per retained token (all layers). > 0.")
_CONTEXT = flags.DEFINE_integer(
    "context", None, "Retained tokens per sequence (with --kv_bytes_per_token). >= 1.")
# Device.
_BANDWIDTH_TBPS = flags.DEFINE_float(
    "bandwidth_tbps", 2.0, "Sustained memory bandwidth, TB/s (1e12 B/s). > 0.")
_TFLOPS = flags.DEFINE_float(
    "tflops", None, "Sustained FLOP rate, TFLOP/s (1e12). > 0. Omit for memory only.")
# Or: a model on an accelerator, in place of the raw numbers above.
_MODEL = flags.DEFINE_string(
    "model", None, "Shipped model name (see jaxroof/specs/data/models) or a path to a "
    "Hugging Face config.json (or its folder). Needs --accelerator and --context.")
_ACCELERATOR = flags.DEFINE_string(
    "accelerator", None, "Accelerator slug, e.g. h100-sxm (see jaxroof/specs/data/accelerators.json).")
_WEIGHT_DTYPE = flags.DEFINE_enum("weight_dtype", "bf16", list(parameters.WEIGHT_DTYPES),
                                  "Weight dtype with --model.")
_KV_DTYPE = flags.DEFINE_enum("kv_dtype", "bf16", list(kv_sizing.KV_DTYPES),
                              "K/V dtype with --model (independent of weights).")
# Sweep and output.
_BATCH_SIZES = flags.DEFINE_list(
    "batch_sizes", "1,2,4,8,16,32,64,128,256,512,1024",
    "Comma-separated batch sizes (sequences), each a whole number >= 1.")
# Calibration.
_PROFILE = flags.DEFINE_string(
    "profile", None, "Profile JSON from `python -m experiments.calibrate`: the rows become "
    "calibrated predictions (fitted efficiency factors and fixed costs). With raw numbers it "
    "predicts for the profiled device unless --bandwidth_tbps/--tflops are given; with "
    "--accelerator it scales that device's datasheet figures.")
_WHAT_IF = flags.DEFINE_bool(
    "what_if", False, "Allow --profile fitted on another device kind than --accelerator "
    "(its factors applied as a what-if).")
_LAYERS = flags.DEFINE_integer(
    "layers", None, "Blocks of the model, for the profile's per-layer fixed cost (raw "
    "numbers only; --model knows its own). >= 1.", lower_bound=1)
_TOKEN_GAP_MS = flags.DEFINE_float(
    "token_gap_ms", None, "Optional target: longest gap between one user's tokens, ms. "
    "> 0. Rows say whether they meet it; the summary gives the largest batch that does.")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Write the sweep as JSON here.")
_PLOT_OUT = flags.DEFINE_string("plot_out", None, "Write a PNG of both rates here.")

for _holder, _unit in ((_WEIGHTS_GB, "GB"), (_BYTES_PER_WEIGHT, "bytes/weight"),
                       (_KV_GB_PER_SEQ, "GB per sequence"),
                       (_KV_BYTES_PER_TOKEN, "bytes/token"), (_CONTEXT, "tokens"),
                       (_BANDWIDTH_TBPS, "TB/s"), (_TFLOPS, "TFLOP/s"),
                       (_TOKEN_GAP_MS, "ms")):
  _cli.require_positive(_holder, _unit)
_cli.require_positive_int_list(_BATCH_SIZES, "sequences")


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


_RAW_FLAGS = (_WEIGHTS_GB, _BYTES_PER_WEIGHT, _KV_GB_PER_SEQ, _KV_BYTES_PER_TOKEN,
              _BANDWIDTH_TBPS, _TFLOPS)


@flags.multi_flags_validator(
    (_MODEL.name, _ACCELERATOR.name, _CONTEXT.name, _WEIGHT_DTYPE.name, _KV_DTYPE.name)
    + tuple(h.name for h in _RAW_FLAGS),
    message="--model needs --accelerator and --context, and replaces the raw-number "
    "flags (--weights_gb, --bytes_per_weight, --kv_*, --bandwidth_tbps, --tflops); "
    "--weight_dtype and --kv_dtype apply only with --model",
)
def _model_flags_consistent(values: dict) -> bool:
  if values[_MODEL.name] is None and values[_ACCELERATOR.name] is None:
    return not any(flags.FLAGS[h.name].present for h in (_WEIGHT_DTYPE, _KV_DTYPE))
  raw_given = any(flags.FLAGS[h.name].present for h in _RAW_FLAGS)
  return (values[_MODEL.name] is not None and values[_ACCELERATOR.name] is not None
          and values[_CONTEXT.name] is not None and not raw_given)


def raw_inputs() -> dict:
  """The sweep's inputs in SI units, from the raw-number flags."""
  if _KV_BYTES_PER_TOKEN.value is not None:
    T, k = float(_CONTEXT.value), _KV_BYTES_PER_TOKEN.value
  else:
    # Only the product T*k matters here: fold the context into k.
    T, k = 1.0, (0.25 if _KV_GB_PER_SEQ.value is None else _KV_GB_PER_SEQ.value) * 1e9
  weight_bytes = _WEIGHTS_GB.value * 1e9
  return {
      "N": weight_bytes / _BYTES_PER_WEIGHT.value,
      "q": _BYTES_PER_WEIGHT.value,
      "T": T,
      "k": k,
      "BW": _BANDWIDTH_TBPS.value * 1e12,
      "F": None if _TFLOPS.value is None else _TFLOPS.value * 1e12,
  }


_CEILING_SOURCES = {"profile": "the profile's measured ceilings",
                    "given": "the given datasheet or flag figures"}


def summary_lines(summary: dict) -> list[str]:
  """Human-readable summary of a sweep's solved quantities."""
  lines = []
  if "answer_binds" in summary:
    gap_ms = summary["token_gap_s"] * 1e3
    limit = {"token_gap": f"the {gap_ms:g} ms token gap",
             "memory_capacity": "memory capacity"}[summary["answer_binds"]]
    if summary["answer_batch"] is None:
      lines.append(f"ANSWER: no batch meets a {gap_ms:g} ms token gap (limited by {limit})")
    else:
      lines.append(f"ANSWER: largest batch for a {gap_ms:g} ms token gap: "
                   f"B = {summary['answer_batch']:,}, limited by {limit} "
                   f"(step {summary['answer_step_s'] * 1e3:,.2f} ms, "
                   f"{summary['answer_step_bound']}-bound)")
  lines += [
      f"weight/KV crossover: B = {summary['weight_kv_crossover_batch']:,.1f} sequences",
      f"memory-limited rate (B -> oo): {summary['memory_limit_tokens_per_s']:,.1f} tokens/s",
  ]
  if summary["compute_crossover_batch"] is not None:
    lines.append(f"compute crossover: B = {summary['compute_crossover_batch']:,.1f} sequences")
  if "token_gap_s" in summary:
    gap_ms = summary["token_gap_s"] * 1e3
    best = summary["largest_swept_batch_meeting_token_gap"]
    lines.append(f"largest swept batch with a token gap <= {gap_ms:g} ms"
                 + (" (and fitting in memory)" if "max_batch_in_memory" in summary else "")
                 + f": {best if best is not None else 'none'}")
    if summary.get("max_batch_for_token_gap") is not None:
      lines.append(f"largest batch for that gap (solved): B = "
                   f"{summary['max_batch_for_token_gap']:,.1f}")
  if "max_batch_in_memory" in summary:
    lines.append(f"largest batch that fits in memory: {summary['max_batch_in_memory']:,}")
  lines += [f"note: {n}" for n in summary["notes"]]
  return lines


def _token_gap_s() -> float | None:
  return None if _TOKEN_GAP_MS.value is None else _TOKEN_GAP_MS.value / 1e3


def _step_model(*, scale_given_ceilings: bool, accelerator: str | None = None
                ) -> StepModel:
  """The bound, or with --profile its calibrated model (checked against the device)."""
  if _PROFILE.value is None:
    return StepModel.bound()
  prof = profiles.load_profile(_PROFILE.value)
  notes = (profiles.check_applies(prof, accelerator, what_if=_WHAT_IF.value)
           if accelerator else [])
  return profiles.step_model(prof, use_profile_ceilings=not scale_given_ceilings,
                             notes=tuple(notes))


def model_sweep(batch_sizes: list[int]) -> dict:
  """The sweep for --model on --accelerator, with the memory fit of each batch."""
  return parallel_sweep.layout_sweep(
      models.load_model(_MODEL.value), accelerators.load_accelerator(_ACCELERATOR.value),
      context=_CONTEXT.value, batch_sizes=batch_sizes, weight_dtype=_WEIGHT_DTYPE.value,
      kv_dtype=_KV_DTYPE.value,
      model=_step_model(scale_given_ceilings=True, accelerator=_ACCELERATOR.value),
      token_gap_s=_token_gap_s(), layout=_layout_flags.layout(_ACCELERATOR.value))


def main(argv: list[str]) -> None:
  del argv  # Unused.
  batch_sizes = _cli.int_list(_BATCH_SIZES)
  if _MODEL.value:
    sweep = model_sweep(batch_sizes)
    title = f"{sweep['inputs']['model']} on {sweep['inputs']['accelerator']}, context {_CONTEXT.value}"
  else:
    if not _layout_flags.layout().is_single_chip:
      raise InputError("--tp/--pp/--ep/--dp/--chips apply with --model and --accelerator "
                       "only: the raw-number sweep is one chip.")
    inputs = raw_inputs()
    given = any(flags.FLAGS[h.name].present for h in (_BANDWIDTH_TBPS, _TFLOPS))
    sweep = sweep_lib.sweep(_step_model(scale_given_ceilings=given), batch_sizes,
                            layers=_LAYERS.value, token_gap_s=_token_gap_s(), **inputs)
    for row in sweep["rows"]:  # One chip: no communication.
      row["comm_s"], row["chips"] = 0.0, 1
    sweep["inputs"] = {"flags": {h.name: h.value for h in _RAW_FLAGS + (_CONTEXT,)},
                       "si": inputs, "batch_sizes": batch_sizes}
    title = "Decode batch sweep"
  scale_given = bool(_MODEL.value) or any(flags.FLAGS[h.name].present for h in (_BANDWIDTH_TBPS, _TFLOPS))
  layers = models.load_model(_MODEL.value).num_layers if _MODEL.value else _LAYERS.value
  elasticity.annotate_sweep(sweep, _step_model(scale_given_ceilings=scale_given), layers=layers,
                            **sweep["inputs"]["si"])
  if sweep["kind"] == "calibrated":
    prof = sweep["profile"]
    print(f"{title} (calibrated prediction: profile of {prof['device_kind']}, "
          f"{prof['backend']}, {prof['dtype']}; held-out error median "
          f"{prof['heldout_median_rel_error']:.1%}, max {prof['heldout_max_rel_error']:.1%}; "
          f"scaling {_CEILING_SOURCES[sweep['ceilings']['source']]}; GB = 1e9 B)")
  else:
    print(f"{title} (analytic bound; GB = 1e9 B)")
  headers, cells = table.SWEEP_HEADERS, table.sweep_rows(sweep["rows"])
  if any(row.get("comm_s") for row in sweep["rows"]):
    headers = headers + ("comm ms", "chips")
    cells = [c + [f"{r['comm_s'] * 1e3:,.3f}", f"{r['chips']}"]
             for c, r in zip(cells, sweep["rows"])]
  headers, cells = headers + ("moved by",), [c + [r["moved_by"]] for c, r in zip(cells, sweep["rows"])]
  print(table.format_table(headers, cells))
  print("\n".join(summary_lines(sweep["summary"])))
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, sweep)
    logging.info("wrote %s", _JSON_OUT.value)
  if _PLOT_OUT.value:
    plots.plot_sweep(sweep, _PLOT_OUT.value, title)
    logging.info("wrote %s", _PLOT_OUT.value)


if __name__ == "__main__":
  _cli.run(main)
