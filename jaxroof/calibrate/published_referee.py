"""The referee check: shipped engine profiles against published points they never saw.

`referee()` predicts every `referee` point of `whole_system.csv` with the shipped
profile of its engine (`engines.engine_profiles.entry`: NIM through TensorRT-LLM's; an
accelerator the engine was not measured on through the derivation rule), and reports
the absolute relative error by engine and overall (median, p90, max), the worst points,
the points not predicted and why (a value the predictor cannot give, such as the TTFT of
an open loop offered more than the replica serves, is listed there with its reason and
left null in `predictions`, never NaN), and the bound's ratio to each measurement. `bounds()`
checks over every point, training and referee, that the analytic bound is never faster
than the measurement (ratio >= 1). Nothing here is fitted.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from jaxroof import errors
from jaxroof.calibrate import published_fit as fit_lib
from jaxroof.calibrate import published_points as points_lib
from jaxroof.calibrate import published_profile as profile_lib
from jaxroof.calibrate import published_setups as setups_lib
from jaxroof.engines import engine_profiles as profiles
from jaxroof.engines import published
from jaxroof.engines.published import Point

TARGETS = {"median_rel_error": 0.15, "p90_rel_error": 0.35, "max_rel_error": 0.60}
WORST = 12


def predict_points(
    points: Sequence[Point]) -> tuple[setups_lib.Stacked, np.ndarray, list, list[str | None]]:
  """The points the predictor takes, their predictions with the shipped profiles, the
  entries used (one per point), and why a point has no prediction (None where it has one;
  its prediction then NaN)."""
  stacked = setups_lib.stack(points)
  entries = []
  for p in stacked.points:
    try:
      entries.append(profiles.entry(p.engine, p.accelerator))
    except errors.InputError:
      entries.append(None)
  terms = fit_lib.terms_per_point(stacked, lambda i: entries[i].terms if entries[i] else {})
  values = {**terms, **fit_lib.held(stacked)}
  out = points_lib.predict(stacked, values)
  reasons = [
      _why_no_value(p, e, v, o)
      for p, e, v, o in zip(stacked.points, entries, out["value"], out["overloaded"])
  ]
  predicted = np.where([r is None for r in reasons], out["value"], np.nan)
  return stacked, predicted, entries, reasons


OVERLOADED = ("an open loop offered more requests per second than the profile predicts the "
              "replica serves: its TTFT grows with the run's length, which the source's "
              "finite run fixes and the predictor does not know")


def _why_no_value(point: Point, entry, value: float, overloaded: bool) -> str | None:
  if entry is None:
    return f"no profile entry for engine {point.engine!r} on {point.accelerator!r}"
  if np.isfinite(value) and value > 0:
    return None
  if overloaded and point.metric == "ttft_s":
    return f"past capacity: {OVERLOADED}"
  return "the predictor gives no finite value"


def _finite(x: float) -> float | None:
  """A JSON number, or null where there is none (never NaN)."""
  return float(x) if np.isfinite(x) else None


def bounds(points: Sequence[Point] | None = None) -> dict:
  """The bound's ratio to every predictable point (>= 1: never faster), and the
  violations."""
  points = published.read_points() if points is None else points
  stacked = setups_lib.stack([p for p in points if setups_lib.why_not(p) is None])
  ratio = points_lib.bound_ratio(stacked, points_lib.predict(stacked, {}, kind="bound")["value"])
  given = np.isfinite(ratio)  # An open loop past even the bound's capacity has no TTFT.
  return {
      "points": int(np.sum(given)), "min_ratio": float(np.min(ratio[given])),
      "median_ratio": float(np.median(ratio[given])), "max_ratio": float(np.max(ratio[given])),
      "violations": [{"point_id": p.point_id, "ratio": float(r)}
                     for p, r in zip(stacked.points, ratio) if r < 1]
  }


def referee(points: Sequence[Point] | None = None) -> dict:
  """The referee figures (see the module docstring) as JSON."""
  points = published.read_points() if points is None else points
  refs = [p for p in points if p.split == "referee"]
  why = {p.point_id: setups_lib.why_not(p) for p in refs}
  stacked, predicted, entries, reasons = predict_points(
      [p for p in refs if why[p.point_id] is None])
  rel = points_lib.relative_errors(stacked, predicted)
  bound = points_lib.predict(stacked, {}, kind="bound")["value"]
  ratio = points_lib.bound_ratio(stacked, bound)
  engines = np.asarray([p.engine for p in stacked.points])
  rows = []
  for i, p in enumerate(stacked.points):
    entry = entries[i]
    rows.append({
        "point_id": p.point_id, "engine": p.engine, "accelerator": p.accelerator, "model": p.model,
        "metric": p.metric, "mode": points_lib.mode_of(p), "measured": p.value,
        "predicted": _finite(predicted[i]), "bound": _finite(bound[i]),
        "rel_error": _finite(rel[i]), "bound_ratio": _finite(ratio[i]), "not_predicted": reasons[i],
        "derived_entry": bool(entry and entry.derived
                             ), "profile_heldout": dict(entry.heldout_error) if entry else None
    })
  finite = np.isfinite(rel)
  order = [i for i in np.argsort(np.where(finite, -rel, np.inf)) if finite[i]][:WORST]
  by_engine = {}
  for name in sorted(set(engines)):
    mask = engines == name
    summary = fit_lib.summary(rel[mask])
    entry = next((e for e, m in zip(entries, mask) if m and e), None)
    own = profiles.load(name) if entry else {}
    if own and own.get("median_rel_error") is None:  # No points of its own: its derived error.
      own = own.get("derived", {})
    by_engine[name] = {
        **summary, "profile": entry.profile if entry else None,
        "profile_loso": {k: own.get(k) for k in profiles.ERROR_KEYS},
        "loso_within_1.5x": _within(own.get("median_rel_error"), summary["median_rel_error"])
    }
  return {
      "kind": "referee", "what": "shipped engine profiles predicting published points never "
                                 "fitted on (split = referee)", **fit_lib.summary(rel),
      "targets": TARGETS, "engines": by_engine, "bound_ratio": {
          "min": float(np.nanmin(ratio)), "median": float(np.nanmedian(ratio)),
          "violations": int(np.sum(ratio < 1))
      }, "worst": [rows[i] for i in order],
      "not_predicted": {k: v for k, v in why.items() if v} |
                       {rows[i]["point_id"]: r for i, r in enumerate(reasons) if r},
      "predictions": rows, "assumptions": list(setups_lib.ASSUMPTIONS),
      "profiles": sorted({e.profile for e in entries if e})
  }


def _within(loso: float | None, referee_median: float | None) -> bool | None:
  """Whether a profile's own held-out median is within 1.5x of the referee's (either way)."""
  if loso is None or referee_median is None or loso <= 0 or referee_median <= 0:
    return None
  return bool(max(loso, referee_median) / min(loso, referee_median) <= 1.5)


PROFILE_ENGINES = profile_lib.PROFILES
