"""The error beside every calibrated number: a profile's held-out error, in words.

A calibrated prediction is only as good as its profile's held-out error, so
every table, footnote and JSON row that shows one carries that error
(`jaxroof.measure.profiles.step_model` puts it in the model's provenance,
which sweeps copy into their JSON as "profile"). The words say what was held
out: whole models the fit never saw, other rows of the one model measured, or
serving runs (of models the fit also saw, or of models it never saw). An error
measured only on the fitted models is not an error on another model: there the
cell says the error was not measured (the provenance's `applied_to` names the
model a caller predicts). Where the profile's held-out error is larger than the
analytic bound's on the same data, the bound is the better estimate: callers
show it first (`bound_first`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

ROW_FIELD = "profile_heldout_median_rel_error"
HEADER = "calibrated error (held-out median)"
NOT_MEASURED = "not measured on this model"


def _pct(value: float | None) -> str:
  return "unknown" if value is None else f"{value:.1%}"


def model_name(model: str) -> str:
  """A model as a reader knows it: a shipped name, or the folder of a config path."""
  path = str(model).rstrip("/\\")
  if os.path.basename(path) == "config.json":
    path = os.path.dirname(path)
  return os.path.basename(path)


def _unique(names: Sequence[str]) -> list[str]:
  return list(dict.fromkeys(model_name(n) for n in names if n))


def held_out(provenance: Mapping[str, Any]) -> dict[str, Any]:
  """What the profile's held-out error was measured on.

  Returns `{"by", "measured_on", "unseen", "seen"}`: by "model" (whole models
  left out in turn), "rows" (other rows of the one model measured) or "runs"
  (serving runs replayed through the simulator); the models of the held-out
  points, those the fit never saw and those it also fitted.
  """
  source = provenance.get("source") or {}
  if provenance.get("heldout_by") == "source":  # An engine profile (`engines.engine_profiles`).
    return {"by": "source", "measured_on": [], "unseen": [], "seen": []}
  if "fit_models" in source:  # A serving-benchmark fit (`calibrate.engine_fit`).
    fitted = _unique(source["fit_models"])
    if source.get("heldout_files"):
      held = _unique([m or source.get("model", "") for m in source.get("heldout_models", [])])
    else:  # Leave-one-run-out over the fitted runs.
      held = fitted
    return {
        "by": "runs", "measured_on": held, "unseen": [m for m in held if m not in fitted],
        "seen": [m for m in held if m in fitted]
    }
  models = _unique(provenance.get("models") or source.get("models") or [])
  if provenance.get("heldout_by") == "rows":
    return {"by": "rows", "measured_on": models, "unseen": [], "seen": models}
  return {"by": "model", "measured_on": models, "unseen": models, "seen": []}


def held_out_words(held: Mapping[str, Any]) -> str:
  """`held_out`'s answer in words: "on whole models the fit never saw", ..."""
  if held["by"] == "model":
    return "on whole models the fit never saw"
  if held["by"] == "source":
    return "leaving out whole published sources the fit never saw"
  if held["by"] == "rows":
    named = f" ({', '.join(held['seen'])})" if held["seen"] else ""
    return (f"k-fold over the rows of the one model measured{named}, not held out: the "
            "error on other models is unknown")
  parts = []
  if held["seen"]:
    parts.append(f"held-out runs of models the fit also saw ({', '.join(held['seen'])})")
  if held["unseen"]:
    parts.append(f"whole models the fit never saw ({', '.join(held['unseen'])})")
  return "on " + " and ".join(parts or ["held-out runs"])


def measured_on_model(provenance: Mapping[str, Any]) -> bool | None:
  """Whether the held-out error applies to the model predicted (`applied_to`): it does
  where that model's own points were held out, or where whole unseen models were (the
  same kind of carry-over); not where only the fitted models' other points were. None:
  no model named."""
  target = provenance.get("applied_to")
  if not target:
    return None
  held = held_out(provenance)
  if held["by"] in ("model", "source"):  # Whole models or sources the fit never saw.
    return True
  if not held["measured_on"]:  # Which models is not recorded: no claim either way.
    return None
  return model_name(target) in held["measured_on"] or bool(held["unseen"])


def fields(provenance: Mapping[str, Any]) -> dict[str, Any]:
  """The error fields a calibrated row or entry carries (JSON)."""
  cal = provenance.get("heldout_median_rel_error")
  bound = provenance.get("bound_heldout_median_rel_error")
  held = held_out(provenance)
  return {
      ROW_FIELD: cal, "profile_heldout_max_rel_error": provenance.get("heldout_max_rel_error"),
      "profile_heldout_by": held["by"], "profile_heldout_on": held_out_words(held),
      "error_measured_on_this_model": measured_on_model(provenance),
      "bound_heldout_median_rel_error": bound, "worse_than_bound": bool(cal is not None and
                                                                        bound is not None and
                                                                        cal > bound)
  }


def row_error(provenance: Mapping[str, Any]) -> float | None:
  """The held-out median a calibrated row carries: None where it was not measured on the
  model predicted."""
  if measured_on_model(provenance) is False:
    return None
  return provenance.get("heldout_median_rel_error")


def bound_first(provenance: Mapping[str, Any]) -> bool:
  """Whether the profile's held-out error is larger than the bound's on its data."""
  return fields(provenance)["worse_than_bound"]


def cell(provenance: Mapping[str, Any]) -> str:
  """A short table cell: "±26.0% (max 167%)", or that it was not measured on this model."""
  f = fields(provenance)
  if f["error_measured_on_this_model"] is False:
    return NOT_MEASURED
  text = f"±{_pct(f[ROW_FIELD])}"
  if f["profile_heldout_max_rel_error"] is not None:
    text += f" (max {f['profile_heldout_max_rel_error']:.0%})"
  return text


def sentence(provenance: Mapping[str, Any]) -> str:
  """One sentence: the held-out error, what was held out, the bound's beside it, and
  whether it applies to the model predicted."""
  f = fields(provenance)
  kind = ("within-model (k-fold) error"
          if provenance.get("heldout_by") == "rows" else "held-out error")
  text = (f"calibrated prediction's {kind}: median {_pct(f[ROW_FIELD])}" +
          ("" if f["profile_heldout_max_rel_error"] is None else
           f", max {_pct(f['profile_heldout_max_rel_error'])}") + f", {f['profile_heldout_on']}")
  if f["bound_heldout_median_rel_error"] is not None:
    text += f"; the analytic bound's on the same data: {_pct(f['bound_heldout_median_rel_error'])}"
  if f["error_measured_on_this_model"] is False:
    text += (f"; {model_name(provenance['applied_to'])} is none of those models: its error "
             "was not measured (a carry-over of unknown error)")
  elif f["profile_heldout_by"] == "rows":
    text += " (another model would be a carry-over of unknown error)"
  return text


def footnote_lines(provenance: Mapping[str, Any]) -> list[str]:
  """The footnote under a calibrated table, with a warning where the bound is better."""
  lines = [sentence(provenance)]
  if bound_first(provenance):
    lines.append(
        "WARNING: this profile's held-out error is larger than the analytic bound's on the "
        "same data: the bound is the better estimate (shown first)")
  return lines
