"""The referee check's terminal output (`experiments.referee`): tables, no arithmetic."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxroof.report import table
from jaxroof.report.calibration_tables import error_cells


def text(result: Mapping[str, Any]) -> str:
  """Errors by engine and overall beside the targets and each profile's own held-out error,
  the bound's ratio, the worst points and those not predicted."""
  rows = []
  for name, row in result["engines"].items():
    own = row["profile_loso"]
    rows.append([
        name, row["profile"] or "-",
        str(row["points"]), *error_cells(row), " / ".join(error_cells(own)),
        {True: "yes", False: "NO", None: "n/a"}[row["loso_within_1.5x"]]
    ])
  rows.append(["all", "", str(result["points"]), *error_cells(result), "", ""])
  targets = " / ".join(error_cells(result["targets"]))
  lines = [
      "Referee: shipped engine profiles predicting published points they were never fitted on "
      f"(targets median / p90 / max: {targets})",
      table.format_table(("engine", "profile", "points", "median", "p90", "max",
                          "profile's own held-out (med / p90 / max)", "within 1.5x"), rows),
      f"analytic bound: measured / bound (times) or bound / measured (rates) from "
      f"{result['bound_ratio']['min']:.2f} (median {result['bound_ratio']['median']:.2f}); "
      f"{result['bound_ratio']['violations']} points where the bound is faster than measured",
      "worst points:"
  ]
  lines.append(
      table.format_table(
          ("point", "engine", "accelerator", "model", "metric", "mode", "measured", "predicted",
           "error"), [[
               r["point_id"], r["engine"], r["accelerator"], r["model"], r["metric"], r["mode"],
               f"{r['measured']:.4g}", f"{r['predicted']:.4g}", f"{100 * r['rel_error']:.0f}%"
           ] for r in result["worst"]]))
  skipped = result["not_predicted"]
  if skipped:
    reasons: dict[str, int] = {}
    for why in skipped.values():
      reasons[why.split(":")[0]] = reasons.get(why.split(":")[0], 0) + 1
    lines.append(f"not predicted ({len(skipped)}): " +
                 "; ".join(f"{n} x {why}" for why, n in reasons.items()))
  lines += [f"assumes: {a}" for a in result["assumptions"]]
  return "\n".join(lines)
