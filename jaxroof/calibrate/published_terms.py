"""Which terms the published data asks for: the held-out error with and without each.

A term stays in the shipped design (`published_fit.DESIGN`) only where leaving it out
raises the error of the engine profiles leaving out one whole source at a time. `table()`
refits every profile that has training points (TensorRT-LLM with NIM, vLLM, gpt-fast)
under each variant (`VARIANTS`: a term dropped, one the shipped design leaves out added,
the memory reservation or the pooled prior taken away) and reports the
leave-one-source-out error over all their points, and per profile. Slow (every variant refits each profile once per source, the
pooled prior too): `experiments.profile_terms` runs it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

import numpy as np

from jaxroof.calibrate import published_fit as fit_lib
from jaxroof.calibrate import published_kernels as kernels_lib
from jaxroof.calibrate import published_profile as profile_lib
from jaxroof.calibrate import published_setups as setups_lib

# The bound's memory in place of an engine's reservation: every byte the weights leave,
# no cap on running sequences (what the analytic model assumes).
NO_RESERVATION = {"u_mem": 1.0, "m_act": 0.0, "m_graph": 0.0, "x_free": 0.0, "n_max": 1e6}


@dataclasses.dataclass(frozen=True)
class Variant:
  design: fit_lib.Design
  settings: tuple[tuple[str, float], ...] = ()  # Held settings replaced.
  prior: bool = True  # Each engine pulled toward the pooled fit.
  # Kernel families each profile holds (None: each engine's shipped ones,
  # `published_fit.KERNELS_BY_ENGINE`).
  kernels: tuple[str, ...] | None = None

  def design_for(self, engine: str) -> fit_lib.Design:
    kernels = fit_lib.KERNELS_BY_ENGINE.get(engine, ()) if self.kernels is None else self.kernels
    return dataclasses.replace(self.design, kernels=kernels)


def _variants() -> dict[str, Variant]:
  d = fit_lib.DESIGN
  out = {"shipped design (every term below)": Variant(d)}
  for name in d.fitted:
    if name not in ("eta_w", "eta_f"):
      out[f"without {name}"] = Variant(d.without(name))
  for name in ("t0_step",):  # Candidates the shipped design leaves out.
    if name not in d.fitted:
      out[f"with {name}"] = Variant(fit_lib.Design(d.fitted + (name,), d.per_accelerator))
  out["with per-accelerator eta_w, eta_f"] = Variant(fit_lib.Design(d.fitted, ("eta_w", "eta_f")))
  out["without the engines' memory reservation"] = Variant(d, tuple(NO_RESERVATION.items()))
  out["without the pooled prior"] = Variant(d, prior=False)
  out["without kernel-fitted terms"] = Variant(d, kernels=())
  out["with kernel-fitted terms"] = Variant(d, kernels=tuple(kernels_lib.FAMILIES))
  for family in kernels_lib.FAMILIES:
    out[f"with kernel-fitted {family} terms"] = Variant(d, kernels=(family,))
  return out


VARIANTS: dict[str, Variant] = _variants()


@functools.cache
def _training() -> tuple[setups_lib.Stacked, dict]:
  stacked = setups_lib.stack(profile_lib.training_points())
  return stacked, fit_lib.held(stacked)


def _settings(base: Mapping[str, np.ndarray], replaced) -> dict[str, np.ndarray]:
  out = dict(base)
  for name, value in replaced:
    out[name] = np.full_like(out[name], value)
  return out


def loso(variant: Variant, profiles=None) -> dict:
  """Leave-one-source-out errors of every profile with training points (or of those named)
  under `variant`: over all their points, and per profile."""
  stacked, base = _training()
  settings = _settings(base, variant.settings)
  cache: dict[str, fit_lib.EngineFit] = {}

  def pooled(source: str) -> fit_lib.EngineFit:
    if source not in cache:
      keep = np.asarray([p.source != source for p in stacked.points])
      cache[source] = fit_lib.fit(stacked.take(keep), {n: v[keep] for n, v in settings.items()},
                                  variant.design)
    return cache[source]

  errors = np.full(len(stacked), np.nan)
  per_profile = {}
  for engine, covers in profile_lib.COVERS.items():
    mask = np.asarray([p.engine in covers for p in stacked.points])
    if profiles is not None and engine not in profiles:
      continue
    if not mask.any():
      continue
    mine = stacked.take(mask)
    design = variant.design_for(engine)
    e = fit_lib.leave_out(mine, {n: v[mask] for n, v in settings.items()},
                          [p.source for p in mine.points], design,
                          pooled if variant.prior else None,
                          kernels_lib.held_terms(engine, design.kernels))
    errors[mask] = e
    per_profile[engine] = fit_lib.summary(e)
  return {**fit_lib.summary(errors), "profiles": per_profile}


def table(names=None, profiles=None) -> dict[str, dict]:
  """`loso` of each named variant (default: all), in order."""
  return {name: loso(VARIANTS[name], profiles) for name in (names or VARIANTS)}
