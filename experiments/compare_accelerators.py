"""One model on several accelerators: crossovers, memory fit, rates per batch.

Analytic bounds from datasheet figures (jaxroof.specs.comparison):

  python -m experiments.compare_accelerators --model=llama-3-8b --context=4096 \
      --batch_sizes=1,8,32,128 --accelerators=h100-sxm,mi300x,tpu-v6e \
      --json_out=/tmp/compare.json --plot_out=/tmp/compare.png

`*` marks the best of each column (see jaxroof/specs/comparison.py for what "best"
means per column); batches that do not fit in device memory are marked. With
`--engine=NAME` the rows are that engine's calibrated predictions (its profile fitted on
published measurements; each accelerator labelled measured or derived, with its held-out
error), the bound's step beside; an accelerator the engine has no rule for is left out.
"""

from __future__ import annotations

from absl import flags
from absl import logging

import functools

from experiments import _cli
from experiments import _engine_flags
from experiments import _model_flags
from experiments import _model_notes
from experiments import _layout_flags
from jaxroof.errors import InputError
from jaxroof.parallel import layout_sweep as parallel_sweep
from jaxroof.parallel import layout as layout_lib
from jaxroof.specs import comparison
from jaxroof import files
from jaxroof import progress
from jaxroof.engines import engine_profiles
from jaxroof.measure import profiles
from jaxroof.report import device_comparison as comparison_report
from jaxroof.report import accuracy
from jaxroof.report import table
from jaxroof.specs.accelerators import known_accelerators, load_accelerators
from jaxroof.specs.models import load_model
from jaxroof.specs.parameters import parameter_counts
from jaxroof.symbolic.step_model import StepModel

_cli.key_flags("model", "tp", "weight_dtype", "kv_dtype")  # --helpshort lists them.

_SHARED = _model_flags.define("model", "weight_dtype", "kv_dtype", "block_size", "group_size",
                              "workspace_fraction", "max_new_tokens", *_model_flags.COST, "engine")
_MODEL, _WEIGHT_DTYPE, _KV_DTYPE = _SHARED.model, _SHARED.weight_dtype, _SHARED.kv_dtype
_BLOCK_SIZE, _GROUP_SIZE, _WORKSPACE = (_SHARED.block_size, _SHARED.group_size,
                                        _SHARED.workspace_fraction)
_PROGRESS = _cli.define_progress()
_CONTEXT = flags.DEFINE_integer("context", None,
                                "Tokens each sequence retains (holding K/V). >= 1.", lower_bound=1)
_BATCH_SIZES = flags.DEFINE_list(
    "batch_sizes", "1,8,32,128,512",
    "Comma-separated batch sizes (sequences), each a whole number >= 1.")
_ACCELERATORS = flags.DEFINE_string(
    "accelerators", "all",
    f"Comma-separated accelerators, or 'all': {', '.join(known_accelerators())}.")
_PROFILE = flags.DEFINE_string(
    "profile", None, "Profile JSON from `python -m experiments.calibrate`: rows become "
    "calibrated predictions (its factors applied to each device's datasheet figures).")
_WHAT_IF = flags.DEFINE_bool(
    "what_if", False, "Allow --profile fitted on another device kind than an accelerator "
    "compared (its factors applied as a what-if).")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Write inputs, results and units as JSON here.")
_PLOT_OUT = flags.DEFINE_string(
    "plot_out", None, "Write a PNG here: both rates at one batch, a sorted bar per accelerator.")
_PLOT_BATCH = flags.DEFINE_integer("plot_batch", None,
                                   "The swept batch the plot shows (default: the largest). >= 1.",
                                   lower_bound=1)
_TOP_N = flags.DEFINE_integer("top_n", 12, "Accelerators the plot shows, best first. >= 1.",
                              lower_bound=1)

_cli.require_positive_int_list(_BATCH_SIZES, "sequences")


def _profile_model(devices) -> StepModel:
  """--profile's calibrated model, refused for other device kinds without --what_if."""
  prof = profiles.load_profile(_PROFILE.value)
  notes = [
      note for device in devices
      for note in profiles.check_applies(prof, device.name, what_if=_WHAT_IF.value)
  ]
  return profiles.step_model(prof, use_profile_ceilings=False, notes=tuple(notes))


def main(argv: list[str]) -> None:
  del argv  # Unused.
  _cli.require_flags(_MODEL, _CONTEXT)
  model = load_model(_MODEL.value)
  devices = load_accelerators(_ACCELERATORS.value)
  if _PLOT_BATCH.value is not None and _PLOT_BATCH.value not in _cli.int_list(_BATCH_SIZES):
    raise InputError(f"--plot_batch={_PLOT_BATCH.value} is not in --batch_sizes: plot a "
                     "swept batch.")
  layout = _layout_flags.layout()
  refused = []
  if not layout.is_single_chip:
    kept = []
    for device in devices:
      try:
        layout_lib.validate(layout, model, device)
        kept.append(device)
      except InputError as e:
        if len(devices) == 1:
          raise
        refused.append(f"{device.name}: {e}")
    if not kept:
      raise InputError(f"--tp/--pp/--ep: no accelerator takes this layout ({refused[0]}).")
    devices = kept

  def compare(step_model) -> dict:  # A StepModel, one per accelerator's name, or None.
    return comparison.compare(
        model, progress.bar(devices, desc="accelerators", unit="device",
                            requested=_PROGRESS.value), context=_CONTEXT.value,
        batch_sizes=_cli.int_list(_BATCH_SIZES), weight_dtype=_WEIGHT_DTYPE.value,
        kv_dtype=_KV_DTYPE.value, group_size=_GROUP_SIZE.value, block_size=_BLOCK_SIZE.value,
        workspace_fraction=_WORKSPACE.value, max_new_tokens=_SHARED.max_new_tokens.value,
        step_model=step_model or StepModel.bound(_SHARED.bound.value),
        sweeper=functools.partial(parallel_sweep.layout_sweep, layout=layout,
                                  comm_overlap=_SHARED.comm_overlap.value))

  entries = {}
  if _SHARED.engine.value != engine_profiles.BOUND:
    if _PROFILE.value:
      raise InputError("--engine and --profile name two calibrations: give one.")
    entries, devices, left = _engine_flags.entries(_SHARED.engine, devices)
    refused += left
  # An engine's entries each carry their accelerator's terms (kernel-fitted ones included).
  steps = {name: engine_profiles.step_model(e) for name, e in entries.items()}
  calibrated = (_profile_model(devices)
                if _PROFILE.value else next(iter(steps.values())) if steps else None)
  result = compare(steps or calibrated)
  if entries:  # The bound's step beside each prediction; each device's own label.
    _engine_flags.comparison_beside(result, compare(None), entries)
  result["inputs"]["layout"] = layout.as_dict()
  result["refused"] = refused
  counts = parameter_counts(model)
  heading = (f"{model.name}: {counts.total / 1e9:,.2f}B weights ({counts.active / 1e9:,.2f}B "
             f"active), context {_CONTEXT.value} tokens, "
             f"{result['inputs']['weight_dtype_label']} weights, {_KV_DTYPE.value} K/V")
  if calibrated is not None and accuracy.bound_first(calibrated.provenance):
    bound = compare(None)
    print(f"{heading} (bound: datasheet figures, shown first: the profile's held-out error "
          "is larger than the bound's on the same data; GB = 1e9 B; * = best of column)")
    print(
        table.format_table(comparison_report.SUMMARY_HEADERS,
                           comparison_report.summary_rows(bound)))
    print()
    print(table.format_table(comparison_report.ROW_HEADERS, comparison_report.batch_rows(bound)))
    print()
  print(f"{heading} ({result['kind']}: datasheet figures"
        f"{' scaled by the profile' if _PROFILE.value else ''}; GB = 1e9 B; "
        "* = best of column)")
  print(
      table.format_table(comparison_report.SUMMARY_HEADERS, comparison_report.summary_rows(result)))
  print()
  headers, cells = comparison_report.ROW_HEADERS, comparison_report.batch_rows(result)
  if entries:
    headers, cells = comparison_report.engine_columns(headers, cells, result)
  elif calibrated is not None:  # The error beside every calibrated number.
    headers = tuple(headers) + (accuracy.HEADER,)
    cells = [list(c) + [accuracy.cell(calibrated.provenance)] for c in cells]
  print(table.format_table(headers, cells))
  if calibrated is not None and not entries:
    for line in accuracy.footnote_lines(calibrated.provenance):
      print(line)
  for line in result["assumptions"]:
    print(f"assumes: {line}")
  if not layout.is_single_chip:
    for entry in result["accelerators"]:
      comm = ", ".join(
          f"B={r['batch']}: {r['comm_s'] * 1e3:.3f} ms ({r['bound']})" for r in entry["rows"])
      print(f"communication on {entry['name']}: {comm}")
  for line in refused:
    print(f"left out: {line}")
  result.update(_model_notes.json_fields(model, [_CONTEXT.value + _SHARED.max_new_tokens.value]))
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, result)
    logging.info("wrote %s", _JSON_OUT.value)
  if _PLOT_OUT.value:
    comparison_report.plot(result, _PLOT_OUT.value, batch=_PLOT_BATCH.value, top_n=_TOP_N.value)
    logging.info("wrote %s", _PLOT_OUT.value)


if __name__ == "__main__":
  _cli.run(main)
