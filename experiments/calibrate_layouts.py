"""Calibrates from measured step times on parallel layouts (tp, pp, ep), with eta_comm.

Rows are the documented CSV/JSONL of `jaxroof.measure.user_measurements`
(with `tp`, `pp`, `ep` columns); each is modelled as one chip's share plus
the analytic communication of its layout, and the fit adds the collective
efficiency eta_comm (`jaxroof.parallel.layout_fit`):

  python -m experiments.calibrate_layouts \
      --from_csv=tests/data/gptfast_a100_tp_steps.csv --accelerator=a100-80gb \
      --profile_out=results/profile_a100_gptfast.json \
      --json_out=results/user_calibration_layouts_a100-80gb_gptfast.json
  python -m experiments.calibrate_layouts --carry_over \
      --from_csv=tests/data/gptfast_a100_tp_steps.csv \
      --json_out=results/layout_carry_over_gptfast_a100.json

Every number printed is labelled: measured (the file's rows), calibrated
prediction, or analytic bound.
"""

from __future__ import annotations

from absl import flags

from experiments import _cli
from jaxroof import errors
from jaxroof import files
from jaxroof.measure import profiles
from jaxroof.measure import user_measurements
from jaxroof.parallel import layout_fit
from jaxroof.report import table

_FROM_CSV = flags.DEFINE_string(
    "from_csv", None, "Measured step times, CSV or .jsonl (columns: "
    "jaxroof.measure.user_measurements), with tp/pp/ep layout columns.")
_ACCELERATOR = flags.DEFINE_string(
    "accelerator", None, "Fit this device's rows only (needed when the file mixes devices, "
    "except with --carry_over).")
_CARRY_OVER = flags.DEFINE_bool(
    "carry_over", False, "Fit on some layouts, predict the others (per device).")
_FIT_STEPS = flags.DEFINE_integer("fit_steps", 3000, "Adam steps per fit (>= 100).",
                                  lower_bound=100)
_PROFILE_OUT = flags.DEFINE_string("profile_out", None, "Write the fitted profile here.")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Write the result JSON here.")



def fit(measurements: user_measurements.Measurements) -> None:
  prof, result = layout_fit.calibrate_layouts(measurements, accelerator=_ACCELERATOR.value,
                                              steps=_FIT_STEPS.value)
  print(f"Calibration of {result['accelerator']} from {result['rows_used']} measured rows "
        f"of {measurements.path} on layouts {', '.join(result['layouts'])}.")
  print(table.factor_table(result))
  print(table.heldout_line(result, "held-out (leave-one-model-out)"))
  if _PROFILE_OUT.value:
    profiles.save_profile(prof, _PROFILE_OUT.value)
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, result)


def carry_over(measurements: user_measurements.Measurements) -> None:
  result = layout_fit.layout_carry_over(measurements, steps=_FIT_STEPS.value)
  cells = []
  for study, block in result["studies"].items():
    for key, summary in block["by_heldout_layout"].items():
      cells.append([study, key, summary["calibrated"]["points"],
                    table.percent(summary["calibrated"]["median_rel_error"]),
                    table.percent(summary["ideal_split_calibrated"]["median_rel_error"]),
                    table.percent(summary["bound"]["median_rel_error"])])
    cells.append([study, "all held out", block["calibrated"]["points"],
                  table.percent(block["calibrated"]["median_rel_error"]),
                  table.percent(block["ideal_split_calibrated"]["median_rel_error"]),
                  table.percent(block["bound"]["median_rel_error"])])
  print(f"Layout carry-over from {measurements.path} (engine: {measurements.engine}); "
        "median relative error vs the measurement:")
  print(table.format_table(("study", "held-out layout", "rows", "calibrated (eta_comm)",
                            "calibrated (ideal split)", "bound"), cells))
  for block in result["studies"].values():
    for fold in block["folds"]:
      if "skipped" in fold:
        print(f"skipped {fold['accelerator']} {fold['fold']}: {fold['skipped']}")
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, result)


def main(argv: list[str]) -> None:
  del argv  # Unused.
  if not _FROM_CSV.value:
    raise errors.InputError("--from_csv is required: the measurements CSV.")
  accelerator = None if _CARRY_OVER.value else _ACCELERATOR.value
  measurements = user_measurements.read_measurements(
      _FROM_CSV.value, accelerator=accelerator, several_devices=_CARRY_OVER.value)
  if _CARRY_OVER.value:
    carry_over(measurements)
  else:
    fit(measurements)


if __name__ == "__main__":
  _cli.run(main)
