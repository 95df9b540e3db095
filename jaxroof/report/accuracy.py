"""The error beside every calibrated number: a profile's held-out error, in words.

A calibrated prediction is only as good as its profile's held-out error, so
every table, footnote and JSON row that shows one carries that error
(`jaxroof.measure.profiles.step_model` puts it in the model's provenance,
which sweeps copy into their JSON as "profile"). Where the profile's held-out
error is larger than the analytic bound's on the same data, the bound is the
better estimate: callers show it first (`bound_first`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ROW_FIELD = "profile_heldout_median_rel_error"
HEADER = "calibrated error (held-out median)"


def _pct(value: float | None) -> str:
  return "unknown" if value is None else f"{value:.1%}"


def fields(provenance: Mapping[str, Any]) -> dict[str, Any]:
  """The error fields a calibrated row or entry carries (JSON)."""
  cal = provenance.get("heldout_median_rel_error")
  bound = provenance.get("bound_heldout_median_rel_error")
  return {
      ROW_FIELD: cal, "profile_heldout_max_rel_error": provenance.get("heldout_max_rel_error"),
      "profile_heldout_by": provenance.get("heldout_by",
                                           "model"), "bound_heldout_median_rel_error": bound,
      "worse_than_bound": bool(cal is not None and bound is not None and cal > bound)
  }


def bound_first(provenance: Mapping[str, Any]) -> bool:
  """Whether the profile's held-out error is larger than the bound's on its data."""
  return fields(provenance)["worse_than_bound"]


def cell(provenance: Mapping[str, Any]) -> str:
  """A short table cell: "±26.0% (max 167%)"."""
  f = fields(provenance)
  text = f"±{_pct(f[ROW_FIELD])}"
  if f["profile_heldout_max_rel_error"] is not None:
    text += f" (max {f['profile_heldout_max_rel_error']:.0%})"
  return text


def sentence(provenance: Mapping[str, Any]) -> str:
  """One sentence: the held-out error, how it was held out, the bound's beside it."""
  f = fields(provenance)
  by = ("on whole models the fit never saw" if f["profile_heldout_by"] == "model" else
        "on held-out rows of the one model measured (another model is a carry-over "
        "of unknown error)")
  text = (f"calibrated prediction's held-out error: median {_pct(f[ROW_FIELD])}" +
          ("" if f["profile_heldout_max_rel_error"] is None else
           f", max {_pct(f['profile_heldout_max_rel_error'])}") + f", {by}")
  if f["bound_heldout_median_rel_error"] is not None:
    text += f"; the analytic bound's on the same data: {_pct(f['bound_heldout_median_rel_error'])}"
  return text


def footnote_lines(provenance: Mapping[str, Any]) -> list[str]:
  """The footnote under a calibrated table, with a warning where the bound is better."""
  lines = [sentence(provenance)]
  if bound_first(provenance):
    lines.append(
        "WARNING: this profile's held-out error is larger than the analytic bound's on the "
        "same data: the bound is the better estimate (shown first)")
  return lines
