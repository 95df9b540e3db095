"""An engine's profile refitted from the shipped published points, with honest errors.

`refit(engine)` is what the calibrate experiment's published source runs:

  1. the training points (`split == train`) of the engines the profile covers
     (`COVERS`: NIM's points are TensorRT-LLM's), those the predictor can take
     (`published_setups.why_not`);
  2. a pooled fit of every engine's training points, the prior each engine's terms are
     pulled toward (`published_fit.PRIOR_ENGINE`);
  3. the engine's fit (`published_fit.design_for`): its terms and each measured
     accelerator's, the kernel-fitted terms (`published_kernels`) held on the
     accelerators its backend has kernel rows for where its design names them;
  4. its error leaving out one whole source at a time (that source out of the pooled
     prior too), and leaving out one whole accelerator (its points out of both fits: the
     error of an entry derived for an accelerator not measured).

An engine with no training point it can take (SGLang: its one source gives no prompt
lengths) gets the pooled terms, and the error of the pooled fit on an engine left out
whole. Deterministic: the same data gives the same profile.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from collections.abc import Sequence

import numpy as np

from jaxroof.calibrate import published_fit as fit_lib
from jaxroof.calibrate import published_kernels as kernels_lib
from jaxroof.calibrate import published_setups as setups_lib
from jaxroof.calibrate.published_setups import Stacked
from jaxroof.engines import engine_rules
from jaxroof.engines import published
from jaxroof.engines.published import Point
from jaxroof.specs import accelerators
from jaxroof.symbolic import calibrated
from jaxroof.symbolic import terms as terms_lib

COVERS: dict[str, tuple[str, ...]] = {
    "trtllm": ("trtllm", "nim"), "vllm": ("vllm",), "sglang": ("sglang",), "gpt-fast": ("gpt-fast",)
}
PROFILES: tuple[str, ...] = tuple(COVERS)
DERIVATION_RULE = ("an accelerator the engine was not measured on, of a vendor it was: the "
                   "engine's terms, fitted over all its accelerators (efficiencies as shares "
                   "of the new device's datasheet ceilings, fixed costs in seconds as they "
                   "are); its error measured by leaving out one whole accelerator at a time")


def training_points(points: Sequence[Point] | None = None) -> tuple[Point, ...]:
  """The training points the predictor can take."""
  points = published.read_points() if points is None else points
  return tuple(p for p in points if p.split == "train" and setups_lib.why_not(p) is None)


def skipped(points: Sequence[Point] | None = None) -> dict[str, str]:
  """point_id -> why it is not predicted, over every point."""
  points = published.read_points() if points is None else points
  return {p.point_id: why for p in points if (why := setups_lib.why_not(p))}


def _without(stacked: Stacked, settings, drop: np.ndarray):
  keep = ~drop
  return stacked.take(keep), {n: v[keep] for n, v in settings.items()}


class _Pooled:
  """Pooled fits of every engine's training points, without a source, an accelerator or
  an engine where asked (memoised: the refit asks each several times)."""

  def __init__(self, stacked: Stacked, design: fit_lib.Design):
    self.stacked, self.design = stacked, design
    self.settings = fit_lib.held(stacked)

  @functools.cache
  def fit(self, key: str = "", value: str = "") -> fit_lib.EngineFit:
    drop = np.asarray([bool(key) and _field(p, key) == value for p in self.stacked.points])
    return fit_lib.fit(*_without(self.stacked, self.settings, drop), self.design)


def _field(point: Point, key: str) -> str:
  return engine_rules.canonical(point.engine) if key == "engine" else getattr(point, key)


def _errors_by(labels: np.ndarray, errors: np.ndarray, name: str) -> list[dict]:
  out = []
  for label in sorted(set(labels)):
    row = fit_lib.summary(errors[labels == label])
    if row["points"]:
      out.append({name: str(label), **row})
  return out


def _rounded(values: dict[str, float]) -> dict[str, float]:
  return {n: float(f"{v:.6g}") for n, v in sorted(values.items())}


def _with_factors(values: Mapping[str, float]) -> dict[str, float]:
  """Fitted terms and every step-model factor the design leaves out, at its default
  (absent: a fixed cost of 0), so a profile drives the step model whole."""
  return {**{n: terms_lib.get(n).default for n in calibrated.FACTOR_NAMES}, **values}


def refit(engine: str, *, design: fit_lib.Design | None = None,
          points: Sequence[Point] | None = None) -> dict:
  """The profile of `engine` (a `PROFILES` name) as JSON (see the module docstring)."""
  design = design or fit_lib.design_for(engine)
  train = training_points(points)
  # The pooled prior: every engine's points, no kernel terms (those are one backend's).
  pooled = _Pooled(setups_lib.stack(train), dataclasses.replace(design, kernels=()))
  mine = [p for p in train if p.engine in COVERS[engine]]
  result: dict = {
      "kind": "engine_profile",
      "engine": engine,
      "covers": list(COVERS[engine]),
      "design": {
          "fitted": list(design.fitted), "per_accelerator": list(design.per_accelerator),
          **({"kernels": list(design.kernels)} if design.kernels else {})
      },
      "rules": engine_rules.NOTES.get(engine, ""),
      "data": {
          "whole_system": "jaxroof/engines/data/published/whole_system.csv", "split": "train",
          "sources": sorted({p.source for p in mine})
      },
      "points_used": len(mine),
  }
  if not mine:
    return _pooled_only(engine, result, pooled)
  stacked = setups_lib.stack(mine)
  settings = fit_lib.held(stacked)
  kernel_terms = kernels_lib.held_terms(engine, design.kernels)
  fitted = fit_lib.fit(stacked, settings, design, pooled.fit(), kernel_terms)
  sources = np.asarray([p.source for p in mine])
  loso = fit_lib.leave_out(stacked, settings, sources, design, lambda s: pooled.fit("source", s),
                           kernel_terms)
  accs = np.asarray([p.accelerator for p in mine])
  # An accelerator left out has no entry, so it is predicted with the engine's terms; the
  # others keep their kernel-fitted ones.
  loao = fit_lib.leave_out(stacked, settings, accs, design, lambda a: pooled.fit("accelerator", a),
                           kernel_terms)
  kernel_notes = kernels_lib.provenance(engine, design.kernels)
  entries = {}
  for acc in sorted(set(accs)):
    device = accelerators.load_accelerator(acc)
    entries[acc] = {
        "terms": _rounded(fitted.by_accelerator.get(acc, {})),
        "points_used": int(np.sum(accs == acc)),
        "sources": sorted(set(sources[accs == acc])),
        "heldout_error": fit_lib.summary(loso[accs == acc]),
        "settings": engine_rules.settings(engine, device),
        **({"kernel_fit": kernel_notes[acc]} if acc in kernel_notes else {}),
    }
  result.update(
      terms=_rounded(_with_factors(fitted.terms)), accelerators=entries,
      vendors=sorted({accelerators.load_accelerator(a).vendor for a in entries}),
      heldout_by_source=_errors_by(sources, loso, "source"), **fit_lib.summary(loso),
      heldout_method="leave one whole source out (the pooled prior refitted without it too)",
      derived={
          "rule": DERIVATION_RULE, **fit_lib.summary(loao),
          "heldout_by_accelerator": _errors_by(accs, loao, "accelerator")
      })
  return result


def _pooled_only(engine: str, result: dict, pooled: _Pooled) -> dict:
  """An engine with no training point it can take: the pooled terms, and the error of
  the pooled fit on each other engine left out whole."""
  stacked, settings = pooled.stacked, pooled.settings
  engines = np.asarray([engine_rules.canonical(p.engine) for p in stacked.points])
  errors = fit_lib.leave_out(stacked, settings, engines, pooled.design)
  result.update(
      terms=_rounded(_with_factors(pooled.fit().terms)), accelerators={}, heldout_by_source=[],
      vendors=sorted({accelerators.load_accelerator(p.accelerator).vendor for p in stacked.points}),
      median_rel_error=None, p90_rel_error=None, max_rel_error=None,
      heldout_method="none of its own: no training point gives the lengths a prediction "
      "needs", derived={
          "rule": "no published point of this engine can be predicted (lengths not given): "
                  "every engine's pooled terms with this engine's scheduler and memory "
                  "rules; its error is the pooled fit's on an engine left out whole",
          **fit_lib.summary(errors), "heldout_by_engine": _errors_by(engines, errors, "engine")
      })
  return result
