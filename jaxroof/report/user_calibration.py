"""Calibration from users' measurements, displayed: held-out and carry-over errors.

Reads the result files the calibrate experiment wrote from a CSV of measured step
times (in the results folder it is given) and shows calibrated prediction vs analytic bound, both
against the measurements named in the files; then the layout carry-over (its layouts
source, each layout predicted from the others) and the serving-benchmark fits (its
vllm source, through the simulator), where present.
"""

from __future__ import annotations

import glob
import os
from typing import Any

from jaxroof import files
from jaxroof.report import paths
from jaxroof.report import table

CARRY_OVER = "carry_over_trtllm_0.9.0.json"
USER_CALIBRATIONS = "user_calibration_*_trtllm_0.9.0.json"
LAYOUT_CARRY_OVERS = "layout_carry_over_*.json"
ENGINE_CALIBRATIONS = "engine_calibration_*.json"


def _load(path: str) -> dict[str, Any]:
  return files.read_json("results", path)


def _versus_bound(calibrated: float | None, bound: float | None) -> str:
  """A calibrated error, marked where the bound's on the same rows is smaller."""
  text = table.percent(calibrated)
  if calibrated is not None and bound is not None and calibrated > bound:
    text += " (worse than the bound)"
  return text


def heldout_rows(results: list[dict[str, Any]]) -> list[list[str]]:
  """One display row per device: held-out error of the bound, then of the calibrated."""
  return [[
      r["accelerator"],
      str(r["rows_used"]),
      r.get("heldout_by", "model"), ", ".join(r["free_factors"]),
      table.percent(r["bound_heldout_median_rel_error"]),
      _versus_bound(r["heldout_median_rel_error"], r["bound_heldout_median_rel_error"]),
      table.percent(r["heldout_max_rel_error"])
  ] for r in results]


def carry_over_rows(result: dict[str, Any]) -> list[list[str]]:
  """One display row per (device, fitted model, predicted model): the bound's median
  error first, then the calibrated one's, marked where it is the worse."""
  return [[
      p["accelerator"], p["fit_model"], p["target"], ", ".join(p["relation"]),
      table.percent(p["bound"]["median_rel_error"]),
      _versus_bound(p["calibrated"]["median_rel_error"], p["bound"]["median_rel_error"])
  ] for p in result["pairs"] if "skipped" not in p]


def layout_rows(result: dict[str, Any]) -> list[list[str]]:
  """One display row per (study, held-out layout), then the study's total."""
  out = []
  for study, block in result["studies"].items():
    parts = list(block["by_heldout_layout"].items()) + [("all held out", block)]
    out += [[
        study.replace("_", " "), key,
        str(summary["calibrated"]["points"]),
        table.percent(summary["calibrated"]["median_rel_error"]),
        table.percent(summary["ideal_split_calibrated"]["median_rel_error"]),
        table.percent(summary["bound"]["median_rel_error"])
    ] for key, summary in parts]
  return out


def _run_label(run: str) -> str:
  """A run's file as the repository names it: the shipped examples live in tests/data."""
  shipped = os.path.join("tests", "data", os.path.basename(run.split(":")[0]))
  return f"`{shipped}`" if os.path.exists(shipped) else run.rsplit(".", 1)[0]


def engine_rows(result: dict[str, Any]) -> list[list[str]]:
  """One display row per (run, metric): measured, simulated calibrated and bound."""
  out = []
  for run in result["runs"]:
    for name, cal in run["calibrated"].items():
      bound = run["bound"][name]
      out.append([
          _run_label(run["run"]),
          name.removesuffix("_s"), f"{cal['measured_s'] * 1e3:.1f}",
          "n/a" if cal["simulated_s"] is None else f"{cal['simulated_s'] * 1e3:.1f}",
          table.percent(cal["rel_error"]),
          table.percent(bound["rel_error"])
      ])
  return out


def _layout_and_engine_lines(results_dir: str) -> list[str]:
  lines = []
  for path in sorted(glob.glob(os.path.join(results_dir, LAYOUT_CARRY_OVERS))):
    result = _load(path)
    lines += [
        "", f"Layout carry-over (`{paths.in_repository(path)}`, rows of "
        f"`{result['file']}`): factors with the collective efficiency eta_comm, fitted on "
        "some tensor-parallel layouts, predict the others on the same device; beside them "
        "the ideal-split fit (no communication) and the analytic bound. Median relative "
        "error vs the measurement.", "",
        table.markdown_table(("study", "held-out layout", "rows", "calibrated (eta_comm)",
                              "calibrated (ideal split)", "bound"), layout_rows(result))
    ]
  for path in sorted(glob.glob(os.path.join(results_dir, ENGINE_CALIBRATIONS))):
    result = _load(path)
    source = result["source"]
    lines += [
        "", f"Serving benchmark through the simulator (`{paths.in_repository(path)}`: "
        f"{', '.join(source['engines'])} runs of {source['model']} on {source['tp']}x "
        f"{source['accelerator']}): factors " + ", ".join(
            f"{n} = {table.factor_value(n, result['factors'][n])}" for n in result["searched"]) +
        f"; held out ({result['heldout_method']}): median "
        f"{table.percent(result['heldout_median_rel_error'])}.", "",
        table.markdown_table(
            ("run", "metric", "measured ms", "simulated ms (calibrated)", "error", "bound error"),
            engine_rows(result))
    ]
  return lines


def report_section(results_dir: str, fit_command: str | None = None) -> str:
  """Markdown of the committed user-calibration results (none: a pointer to
  `fit_command`, the caller's command line that fits a CSV, or to the experiment)."""
  lines = ["## Calibration from published measurements", ""]
  found = sorted(glob.glob(os.path.join(results_dir, USER_CALIBRATIONS)))
  carry_path = os.path.join(results_dir, CARRY_OVER)
  extra = _layout_and_engine_lines(results_dir)
  if not found and not os.path.exists(carry_path) and not extra:
    return "\n".join(lines + [
        f"No results yet: `{fit_command}`." if fit_command else
        "No results yet: the calibrate experiment fits a CSV of measured step times."
    ])
  if found:
    results = [_load(p) for p in found]
    lines += [
        f"Measured step times: {results[0]['source']['engine']} rows of "
        f"`{results[0]['source']['file']}` (see `tests/data/SOURCES.md`). Held out by "
        "model (leave-one-model-out) where the rows hold several models, by rows (k-fold) "
        "where they hold one; analytic bound and calibrated prediction, relative to the "
        "measurement.", "",
        table.markdown_table(
            ("accelerator", "rows", "held out by", "fitted factors", "held-out median (bound)",
             "held-out median (calibrated)", "held-out max (calibrated)"), heldout_rows(results)),
        ""
    ]
    for r in results:  # Suspicious rows and other warnings of each fit (newer results).
      lines += [f"- {r['accelerator']}: {w}." for w in r.get("warnings", [])]
    if any(r.get("warnings") for r in results):
      lines.append("")
  if os.path.exists(carry_path):
    result = _load(carry_path)
    lines += [
        "Carry-over: factors fitted on one model's rows predict another model on the "
        f"same device (`{paths.in_repository(carry_path)}`). All predicted rows: calibrated median "
        f"{table.percent(result['median_rel_error'])}, bound median "
        f"{table.percent(result['bound_median_rel_error'])}; targets (median <= 10%, twice "
        f"as accurate as the bound) met: {'yes' if result['meets_targets'] else 'no'}. "
        "The bound comes first; a calibrated error larger than the bound's is marked, and "
        "there the bound is the better estimate.", "",
        table.markdown_table(("accelerator", "fitted on", "predicted", "relation", "bound median",
                              "calibrated median"), carry_over_rows(result))
    ]
  return "\n".join(lines + extra)
