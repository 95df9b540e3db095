"""Decode batch sweep: step time and both token rates against batch size.

Analytic bounds from the symbolic step model (jaxroof.symbolic.formulas):

  traffic = weights + B * KV per sequence;  step = max(traffic/BW, 2*N*B/F)
  aggregate rate = B / step;  per-sequence rate = 1 / step

Give either raw numbers or a shipped model and accelerator
(`--model=llama-3-8b --accelerator=h100-sxm --context=4096`), in which case
batches whose weights, K/V and workspace do not fit the device are marked.
With --model, --bandwidth_tbps, --tflops and --memory_gb replace the
datasheet's figures (a labelled what-if), and --weight_dtype, --kv_dtype
and --context take comma-separated lists: every combination in one table
and one figure, each JSON row naming its own weight_dtype, kv_dtype and
context (one combination keeps the single sweep's JSON). Model rows also
give the rates per chip, per kW of TDP and, with --price_per_hour, tokens
per dollar:

  python -m experiments.batch_sweep --model=llama-3-8b --accelerator=h100-sxm \
      --weight_dtype=bf16,fp8 --kv_dtype=bf16,fp8 --context=4096,32768 \
      --price_per_hour=2.5 --json_out=/tmp/cmp.json --plot_out=/tmp/cmp.png

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
from experiments import _model_flags
from experiments import _model_notes
from jaxroof import files
from jaxroof.errors import InputError
from jaxroof.measure import profiles
from jaxroof.parallel import variants
from jaxroof.report import accuracy
from jaxroof.report import plots
from jaxroof.report import table
from jaxroof.serving import elasticity
from jaxroof.specs import models
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
_CONTEXT = flags.DEFINE_list(
    "context", None, "Retained tokens per sequence (with --kv_bytes_per_token, one value; "
    "with --model, one or several comma-separated). Whole numbers >= 1.")
# Device.
_BANDWIDTH_TBPS = flags.DEFINE_float(
    "bandwidth_tbps", 2.0, "Sustained memory bandwidth, TB/s (1e12 B/s). > 0.")
_TFLOPS = flags.DEFINE_float(
    "tflops", None, "Sustained FLOP rate, TFLOP/s (1e12). > 0. Omit for memory only. With "
    "--model: a what-if replacing the datasheet's dense rate.")
# Or: a model on an accelerator, in place of the raw numbers above (shared flags).
_SHARED = _model_flags.define("model", "accelerator", "accelerator_file", "weight_dtype",
                              "kv_dtype", "block_size", "workspace_fraction", "max_new_tokens",
                              "group_size", "memory_gb", *_model_flags.COST,
                              lists=("weight_dtype", "kv_dtype"))
_MODEL, _ACCELERATOR = _SHARED.model, _SHARED.accelerator
_WEIGHT_DTYPE, _KV_DTYPE = _SHARED.weight_dtype, _SHARED.kv_dtype
_MODEL_ONLY = (_SHARED.accelerator_file, _SHARED.block_size, _SHARED.workspace_fraction,
               _SHARED.max_new_tokens, _SHARED.group_size, _SHARED.memory_gb)
_PRICE_PER_HOUR = flags.DEFINE_float(
    "price_per_hour", None, "With --model: price of one chip for an hour (any currency); "
    "adds tokens_per_dollar to the rows. > 0.")
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
                       (_KV_BYTES_PER_TOKEN, "bytes/token"),
                       (_BANDWIDTH_TBPS, "TB/s"), (_TFLOPS, "TFLOP/s"),
                       (_TOKEN_GAP_MS, "ms"), (_PRICE_PER_HOUR, "per chip-hour")):
  _cli.require_positive(_holder, _unit)
_cli.require_positive_int_list(_BATCH_SIZES, "sequences")
flags.register_validator(
    _CONTEXT.name, lambda values: values is None or (
        bool(values) and all(v.isdigit() and 1 <= int(v) <= 10**8 for v in values)),
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


_RAW_FLAGS = (_WEIGHTS_GB, _BYTES_PER_WEIGHT, _KV_GB_PER_SEQ, _KV_BYTES_PER_TOKEN,
              _BANDWIDTH_TBPS, _TFLOPS)
_WHAT_IF_FLAGS = (_BANDWIDTH_TBPS, _TFLOPS)  # With --model: replace the datasheet's figures.


@flags.multi_flags_validator(
    (_MODEL.name, _ACCELERATOR.name, _SHARED.accelerator_file.name, _CONTEXT.name,
     _WEIGHT_DTYPE.name, _KV_DTYPE.name) + tuple(h.name for h in _RAW_FLAGS),
    message="--model needs --accelerator (or --accelerator_file) and --context, and "
    "replaces --weights_gb, --bytes_per_weight, --kv_* and --layers (the model knows its "
    "own blocks) (--bandwidth_tbps, --tflops and "
    "--memory_gb become what-ifs); --weight_dtype, --kv_dtype, --block_size, "
    "--workspace_fraction, --max_new_tokens, --group_size, --memory_gb, --accelerator_file "
    "and --price_per_hour apply only with --model",
)
def _model_flags_consistent(values: dict) -> bool:
  device = values[_ACCELERATOR.name] is not None or values[_SHARED.accelerator_file.name]
  if values[_MODEL.name] is None and not device:
    return not any(flags.FLAGS[h.name].present
                   for h in (_WEIGHT_DTYPE, _KV_DTYPE, _PRICE_PER_HOUR) + _MODEL_ONLY)
  raw_given = any(flags.FLAGS[h.name].present for h in _RAW_FLAGS + (_LAYERS,)
                  if h.name not in {w.name for w in _WHAT_IF_FLAGS})
  return (values[_MODEL.name] is not None and bool(device)
          and values[_CONTEXT.name] is not None and not raw_given)


def raw_inputs() -> dict:
  """The sweep's inputs in SI units, from the raw-number flags."""
  if _KV_BYTES_PER_TOKEN.value is not None:
    if len(_CONTEXT.value) != 1:
      raise InputError(f"--context={','.join(_CONTEXT.value)} is not allowed with raw numbers: "
                       "give one context (lists compare dtypes and contexts with --model).")
    T, k = float(_CONTEXT.value[0]), _KV_BYTES_PER_TOKEN.value
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
  lines += [f"note: {n}" for n in summary["notes"] + summary.get("rate_notes", [])]
  return lines


def _token_gap_s() -> float | None:
  return None if _TOKEN_GAP_MS.value is None else _TOKEN_GAP_MS.value / 1e3


def _step_model(*, scale_given_ceilings: bool, accelerator: str | None = None,
                bound: bool = False) -> StepModel:
  """The bound, or with --profile its calibrated model (checked against the device)."""
  if _PROFILE.value is None or bound:
    return StepModel.bound(_SHARED.bound.value)
  prof = profiles.load_profile(_PROFILE.value)
  notes = (profiles.check_applies(prof, accelerator, what_if=_WHAT_IF.value)
           if accelerator else [])
  return profiles.step_model(prof, use_profile_ceilings=not scale_given_ceilings,
                             notes=tuple(notes))


def _what_if(holder: flags.FlagHolder) -> float | None:
  return holder.value if flags.FLAGS[holder.name].present else None


def model_sweeps(batch_sizes: list[int], bound: bool = False) -> tuple[list[dict], list[str]]:
  """One sweep per (weight dtype, K/V dtype, context) for --model on the device, with
  the memory fit of each batch; and the what-if notes (datasheet figures replaced)."""
  device = _model_flags.device(_SHARED, bandwidth_tbps=_what_if(_BANDWIDTH_TBPS),
                               tflops=_what_if(_TFLOPS))
  what_ifs = [d for d in device.decisions if d.startswith("what-if")]
  sweeps = variants.variant_sweeps(
      models.load_model(_MODEL.value), device,
      contexts=[int(c) for c in _CONTEXT.value], weight_dtypes=_WEIGHT_DTYPE.value,
      kv_dtypes=_KV_DTYPE.value, batch_sizes=batch_sizes,
      model=_step_model(scale_given_ceilings=True,
                        accelerator=_ACCELERATOR.value or device.name, bound=bound),
      token_gap_s=_token_gap_s(),
      layout=_layout_flags.layout(_ACCELERATOR.value), price_per_hour=_PRICE_PER_HOUR.value,
      block_size=_SHARED.block_size.value, workspace_fraction=_SHARED.workspace_fraction.value,
      max_new_tokens=_SHARED.max_new_tokens.value, group_size=_SHARED.group_size.value,
      comm_overlap=_SHARED.comm_overlap.value)
  for sweep in sweeps:
    sweep["inputs"]["what_if"] = what_ifs
    sweep["assumptions"] = list(sweep["assumptions"]) + what_ifs
  return sweeps, what_ifs


def _tagged_cells(sweeps: list[dict], cells: list[list[str]]) -> list[list[str]]:
  """Table cells with the combination's weight dtype, K/V dtype and context in front."""
  rows = [row for sweep in sweeps for row in sweep["rows"]]
  return [[r["weight_dtype_label"], r["kv_dtype"], f"{r['context']:,}"] + c
          for r, c in zip(rows, cells)]


def _compute(batch_sizes: list[int], bound: bool = False
             ) -> tuple[list[dict], dict, str, list[str]]:
  """The sweeps (one per combination; [] for raw numbers), the first, a title, what-ifs."""
  sweeps, what_ifs = [], []
  if _MODEL.value:
    sweeps, what_ifs = model_sweeps(batch_sizes, bound=bound)
    sweep = sweeps[0]
    title = f"{sweep['inputs']['model']} on {sweep['inputs']['accelerator']}" + (
        f", context {sweep['inputs']['context']}, {sweep['inputs']['weight_dtype_label']} weights, "
        f"{sweep['inputs']['kv_dtype']} K/V" if len(sweeps) == 1 else "")
    if what_ifs:
      title += " (what-if)"
  else:
    if not _layout_flags.layout().is_single_chip:
      raise InputError("--tp/--pp/--ep/--dp/--chips apply with --model and --accelerator "
                       "only: the raw-number sweep is one chip.")
    inputs = raw_inputs()
    given = any(flags.FLAGS[h.name].present for h in (_BANDWIDTH_TBPS, _TFLOPS))
    sweep = sweep_lib.sweep(_step_model(scale_given_ceilings=given, bound=bound), batch_sizes,
                            layers=_LAYERS.value, token_gap_s=_token_gap_s(), **inputs)
    for row in sweep["rows"]:  # One chip: no communication.
      row["comm_s"], row["chips"] = 0.0, 1
    sweep["inputs"] = {"flags": {h.name: h.value for h in _RAW_FLAGS + (_CONTEXT,)},
                       "si": inputs, "batch_sizes": batch_sizes}
    title = "Decode batch sweep"
  scale_given = bool(_MODEL.value) or any(flags.FLAGS[h.name].present for h in (_BANDWIDTH_TBPS, _TFLOPS))
  layers = models.load_model(_MODEL.value).num_layers if _MODEL.value else _LAYERS.value
  for each in sweeps or [sweep]:
    elasticity.annotate_sweep(each, _step_model(scale_given_ceilings=scale_given, bound=bound),
                              layers=layers, **each["inputs"]["si"])
  return sweeps, sweep, title, what_ifs


def _print_table(sweeps: list[dict], sweep: dict) -> None:
  """The sweep's table and, per combination, its summary lines."""
  rows = [row for each in sweeps or [sweep] for row in each["rows"]]
  headers, cells = table.SWEEP_HEADERS, table.sweep_rows(rows)
  if any(row.get("comm_s") for row in rows):
    headers = headers + ("comm ms", "chips")
    cells = [c + [f"{r['comm_s'] * 1e3:,.3f}", f"{r['chips']}"] for c, r in zip(cells, rows)]
  if sweeps:
    headers = headers + ("tok/s/chip", "tok/s/kW") + (
        ("tok/$",) if _PRICE_PER_HOUR.value else ())
    cells = [c + [f"{r['tokens_per_s_per_chip']:,.1f}",
                  "n/a" if r["tokens_per_s_per_kw"] is None else f"{r['tokens_per_s_per_kw']:,.1f}"]
             + ([f"{r['tokens_per_dollar']:,.0f}"] if _PRICE_PER_HOUR.value else [])
             for c, r in zip(cells, rows)]
  headers, cells = headers + ("moved by",), [c + [r["moved_by"]] for c, r in zip(cells, rows)]
  if sweep["kind"] == "calibrated":  # The error beside every calibrated number.
    headers = headers + (accuracy.HEADER,)
    cells = [c + [accuracy.cell(sweep["profile"])] for c in cells]
  if len(sweeps) > 1:
    headers, cells = ("weights", "K/V", "context") + headers, _tagged_cells(sweeps, cells)
  print(table.format_table(headers, cells))
  for each in sweeps if len(sweeps) > 1 else [sweep]:
    if len(sweeps) > 1:
      print(f"-- {each['inputs']['weight_dtype_label']} weights, {each['inputs']['kv_dtype']} K/V, "
            f"context {each['inputs']['context']:,}:")
    print("\n".join(summary_lines(each["summary"])))


def main(argv: list[str]) -> None:
  del argv  # Unused.
  batch_sizes = _cli.int_list(_BATCH_SIZES)
  sweeps, sweep, title, what_ifs = _compute(batch_sizes)
  if sweep["kind"] == "calibrated" and accuracy.bound_first(sweep["profile"]):
    bound_sweeps, bound_sweep, _, _ = _compute(batch_sizes, bound=True)
    print(f"{title} (analytic bound, shown first: the profile's held-out error is larger "
          "than the bound's on the same data; GB = 1e9 B)")
    _print_table(bound_sweeps, bound_sweep)
    print()
  if sweep["kind"] == "calibrated":
    prof = sweep["profile"]
    print(f"{title} (calibrated prediction: profile of {prof['device_kind']}, "
          f"{prof['backend']}, {prof['dtype']}; held-out error median "
          f"{table.percent(prof['heldout_median_rel_error'])}, max "
          f"{table.percent(prof['heldout_max_rel_error'])}; "
          f"scaling {_CEILING_SOURCES[sweep['ceilings']['source']]}; GB = 1e9 B)")
  else:
    print(f"{title} (analytic bound; GB = 1e9 B)")
  for line in what_ifs:
    print(line)
  if _MODEL.value:
    spec = models.load_model(_MODEL.value)
    contexts = [int(c) + _SHARED.max_new_tokens.value for c in _CONTEXT.value]
    _model_notes.say(spec, contexts)
  _print_table(sweeps, sweep)
  if sweep["kind"] == "calibrated":
    for line in accuracy.footnote_lines(sweep["profile"]):
      print(line)
  document = variants.combined(sweeps) if len(sweeps) > 1 else sweep
  if _MODEL.value:
    document.update(_model_notes.json_fields(spec, contexts))
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, document)
    logging.info("wrote %s", _JSON_OUT.value)
  if _PLOT_OUT.value:
    if len(sweeps) > 1:
      plots.plot_variants(sweeps, _PLOT_OUT.value, title)
    else:
      plots.plot_sweep(sweep, _PLOT_OUT.value, title)
    logging.info("wrote %s", _PLOT_OUT.value)


if __name__ == "__main__":
  _cli.run(main)
