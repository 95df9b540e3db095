"""Engine profiles: an engine's fitted cost terms per accelerator, shipped as data.

`data/profiles/<engine>.json` holds, for one engine (vLLM, SGLang, TensorRT-LLM, ...):
the terms fitted on its published points (`calibrate.published_fit`), the engine's own
(its derivation rule for an accelerator it was not measured on) and each measured
accelerator's; the scheduler and memory rules it is driven with (`engine_rules`); the
points it was fitted on; and its held-out error, leaving out one whole source at a time
(median, p90, max) and, for a derived entry, leaving out one whole accelerator.
The calibrate experiment's published source writes it (`calibrate.published_profile`).

`entry(engine, accelerator)` is what a prediction uses: the terms by registry name and
the error to print beside it. An accelerator the engine was not measured on takes the
engine's terms when one of the same vendor was measured (with the leave-one-accelerator-
out error, wider), else it is refused in one line; a bound is never passed off as a
prediction.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import os
from collections.abc import Mapping
from typing import Any

from jaxroof import errors
from jaxroof import files
from jaxroof.engines import engine_rules
from jaxroof.specs import accelerators
from jaxroof.symbolic import calibrated
from jaxroof.symbolic import terms as terms_lib
from jaxroof.symbolic.step_model import StepModel

DIRECTORY = os.path.join(os.path.dirname(__file__), "data", "profiles")
BOUND = "bound"
# The engines a user may name: a profile each, NIM through TensorRT-LLM's.
ENGINES: tuple[str, ...] = ("vllm", "sglang", "trtllm", "nim", "gpt-fast")
ERROR_KEYS: tuple[str, ...] = ("median_rel_error", "p90_rel_error", "max_rel_error")


@dataclasses.dataclass(frozen=True)
class Entry:
  """One engine on one accelerator: what a prediction takes and says."""

  engine: str  # As the user named it.
  profile: str  # The profile it reads (NIM: trtllm).
  accelerator: str
  terms: Mapping[str, float]  # Registry names, SI.
  heldout_error: Mapping[str, float | None]  # The profile's, by source (derived: by device).
  derived: bool  # No measurement on this accelerator: the engine's terms, wider error.
  rule: str  # How the entry was obtained, one line.

  @property
  def label(self) -> str:
    """`calibrated (ENGINE, held-out median X%, p90 Y%, max Z%)` for a table or a line."""
    e = self.heldout_error
    shown = ", ".join(f"{k.split('_')[0]} {_percent(e.get(k))}" for k in ERROR_KEYS)
    how = "derived entry" if self.derived else "measured"
    return f"calibrated ({self.engine} on {self.accelerator}, {how}; held-out {shown})"


def _percent(value: float | None) -> str:
  return "unknown" if value is None else f"{100 * value:.0f}%"


def known() -> tuple[str, ...]:
  """The engine names a prediction takes: `bound` and every engine."""
  return (BOUND,) + ENGINES


def check_engine(name: str, field: str = "engine") -> str:
  """`name` if it is an engine or `bound`, else one InputError with "did you mean"."""
  if name in known():
    return name
  close = difflib.get_close_matches(name, known(), n=1)
  hint = f" Did you mean {close[0]!r}?" if close else ""
  raise errors.InputError(
      f"engine={name!r} is not known.{hint} Known: {', '.join(known())} "
      "(python -m experiments.list shows each engine's accelerators).", field=field)


def path(engine: str) -> str:
  return os.path.join(DIRECTORY, f"{engine_rules.canonical(engine)}.json")


def _check_terms(values: Any, where: str, field: str, empty: bool = False) -> dict[str, float]:
  if not isinstance(values, Mapping) or not (values or empty):
    raise errors.InputError(
        f"{where}: 'terms' is missing or empty: give each fitted term "
        "by its registry name.", field=field)
  out = {}
  for name, value in values.items():
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
      raise errors.InputError(f"{where}: term {name}={value!r} is not a finite number.",
                              field=field)
    if value < 0:
      raise errors.InputError(f"{where}: term {name}={value!r} is negative.", field=field)
    out[name] = terms_lib.get(name, field, f"{where}: ").check(value, field, f"{where}: ")
  return out


def check(data: Any, where: str, field: str = "engine") -> dict:
  """A profile's JSON, its every term present, finite, non-negative and in its bounds."""
  if not isinstance(data, Mapping) or data.get("kind") != "engine_profile":
    raise errors.InputError(f"{where} is not an engine profile (kind 'engine_profile').",
                            field=field)
  design = data.get("design", {})
  fitted = design.get("fitted", []) if isinstance(design, Mapping) else []
  engine_terms = _check_terms(data.get("terms"), where, field)
  missing = [n for n in fitted if n not in engine_terms]
  if missing:
    raise errors.InputError(f"{where}: fitted terms {missing} are missing from 'terms'.",
                            field=field)
  entries = data.get("accelerators", {})
  if not isinstance(entries, Mapping):
    raise errors.InputError(f"{where}: 'accelerators' must map names to entries.", field=field)
  for name, entry in entries.items():
    _check_terms(
        entry.get("terms") if isinstance(entry, Mapping) else None, f"{where} accelerator {name!r}",
        field, empty=True)
  return dict(data)


@functools.cache
def load(engine: str, where: str | None = None) -> dict:
  """The shipped profile of `engine` (NIM: TensorRT-LLM's), checked; or the file `where`."""
  check_engine(engine)
  if engine == BOUND:
    raise errors.InputError("engine='bound' has no profile: it is the analytic model.",
                            field="engine")
  source = where or path(engine)
  return check(files.read_json("engine", source), os.path.basename(source))


def measured(engine: str) -> tuple[str, ...]:
  """The accelerators `engine`'s profile has measured data for."""
  return tuple(sorted(load(engine).get("accelerators", {})))


def _vendor(name: str) -> str:
  return accelerators.load_accelerator(name).vendor


def entry(engine: str, accelerator: str, *, profile: Mapping[str, Any] | None = None) -> Entry:
  """`engine` on `accelerator` (see the module docstring); one InputError when the engine
  has no entry for it and no rule to derive one."""
  data = profile if profile is not None else load(engine)
  name = data.get("engine", engine_rules.canonical(engine))
  own = data.get("accelerators", {}).get(accelerator)
  if own is not None:
    return Entry(engine, name, accelerator, {**data["terms"], **own["terms"]}, _errors(data), False,
                 f"fitted on {own.get('points_used', 0)} published points on {accelerator}")
  vendors = set(data.get("vendors") or {_vendor(a) for a in data.get("accelerators", {})})
  vendor = _vendor(accelerator)
  if vendor not in vendors:
    raise errors.InputError(
        f"engine={engine!r} has no entry for accelerator={accelerator!r} and no rule to derive "
        f"one: it was measured on {', '.join(sorted(data.get('accelerators', {}))) or 'none'} "
        f"({', '.join(sorted(vendors)) or 'no vendor'}), not on {vendor} devices. Use "
        "engine 'bound' for the analytic bound.", field="engine")
  derived = data.get("derived", {})
  return Entry(engine, name, accelerator, dict(data["terms"]), _errors(derived), True,
               derived.get("rule", "the engine's terms (its measured accelerators')"))


def _errors(source: Mapping[str, Any]) -> dict[str, float | None]:
  return {k: source.get(k) for k in ERROR_KEYS}


def step_model(e: Entry) -> StepModel:
  """The calibrated step model of an entry: its six factors and every other term by name,
  with the entry's engine, accelerator and held-out error as provenance."""
  factors = {n: e.terms[n] for n in calibrated.FACTOR_NAMES}
  others = {n: v for n, v in e.terms.items() if n not in factors}
  return StepModel.calibrated(
      factors, terms=others, provenance={
          "engine": e.engine, "profile": e.profile, "accelerator": e.accelerator,
          "heldout_by": "source", "derived": e.derived, "rule": e.rule, "label": e.label,
          "heldout_median_rel_error": e.heldout_error.get("median_rel_error"),
          "heldout_p90_rel_error": e.heldout_error.get("p90_rel_error"),
          "heldout_max_rel_error": e.heldout_error.get("max_rel_error")
      }, notes=(f"{e.label}: {e.rule}",))


def summary() -> list[dict]:
  """Every engine: the profile it reads, the accelerators it was measured on, its held-out
  error by source (median / p90 / max) in words."""
  out = []
  for name in ENGINES:
    data = load(name)
    shown = (", ".join(f"{k.split('_')[0]} {_percent(data.get(k))}" for k in ERROR_KEYS)
             if data.get("median_rel_error") is not None else "no points of its own; derived: " +
             ", ".join(f"{k.split('_')[0]} {_percent(data.get('derived', {}).get(k))}"
                       for k in ERROR_KEYS))
    out.append({
        "engine": name, "profile": data["engine"], "accelerators": list(measured(name)),
        "heldout": shown, "points_used": data.get("points_used", 0)
    })
  return out
