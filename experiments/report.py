"""The main job: lesson, crossovers, sweeps, models, devices, calibration, as a folder.

Writes `<out_dir>/README.md` (a Markdown summary) and its PNG plots:

  python -m experiments.report --out_dir=report

The sections live in `jaxroof.report.document` (`SECTIONS`). Every number is
labelled: analytic bound, calibrated prediction or measurement.
"""

from __future__ import annotations

from absl import flags

from experiments import _cli
from jaxroof.measure import calibration_job
from jaxroof.measure import records
from jaxroof.report import document

_OUT_DIR = flags.DEFINE_string("out_dir", "report", "Folder for README.md and the PNG plots.")
_CALIBRATION_BUDGET_S = flags.DEFINE_float(
    "calibration_budget_s", 60.0, "Seconds for the short calibration on this device "
    "(measure, fit, plot); 0 skips it. Below ~25 s there are too few points to fit.",
    lower_bound=0.0)


def main(argv: list[str]) -> None:
  del argv  # Unused.
  if _CALIBRATION_BUDGET_S.value:
    calibration_job.check_budget("--calibration_budget_s", _CALIBRATION_BUDGET_S.value)
  records.keep_allocations()  # Before any timing; see jaxroof.measure.records.
  path = document.build(document.Context(
      out_dir=_OUT_DIR.value, calibration_budget_s=_CALIBRATION_BUDGET_S.value))
  print(f"wrote {path}")


if __name__ == "__main__":
  _cli.run(main)
