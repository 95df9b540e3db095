"""An engine as the load model, the planner and the simulator drive it.

An engine named to the serving answer, the simulator or the planner makes their headline
figures that engine's predictions. Three things change, each taken from where it lives once:

- the step: the entry's calibrated `StepModel` (`engines.engine_profiles.step_model`),
  the one cost model with the entry's fitted terms substituted, as the iteration
  experiment evaluates an engine's;
- the scheduling and the running cap: the engine's defaults (`engines.engine_rules`):
  chunked prefill with its token budget, or whole prompts; at most `n_max` sequences;
- the memory: the engine's reservation rule (`symbolic.reservation.kv_memory`), the K/V
  bytes one chip keeps beside its weights, its workspace and its graphs, in place of a
  flat workspace fraction.

`Drive` holds them for one engine on one accelerator; `label_fields` is what every
prediction carries (its engine, entry and held-out error: median, p90, max).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxroof import errors
from jaxroof.engines import engine_profiles as profiles
from jaxroof.engines import engine_rules
from jaxroof.specs.accelerators import Accelerator
from jaxroof.symbolic import reservation
from jaxroof.symbolic.step_model import StepModel

BOUND = profiles.BOUND
_CAP = 1 << 20  # A running count no replica reaches (an engine its memory alone caps).


@dataclasses.dataclass(frozen=True)
class Drive:
  """One engine on one accelerator: its calibrated step, scheduler defaults and memory rule."""

  entry: profiles.Entry
  model: StepModel
  settings: Mapping[str, float]  # `engine_rules.settings`: n_max, n_bud, chunked, u_mem, ...

  @property
  def scheduler(self) -> str:
    """The engine's own prefill scheduling: chunked (with its budget) or whole prompts."""
    return "chunked" if self.settings["chunked"] > 0 else "iteration"

  @property
  def token_budget(self) -> int | None:
    return int(self.settings["n_bud"]) if self.scheduler == "chunked" else None

  @property
  def max_running(self) -> int:
    """The engine's cap on running sequences (its K/V memory may cap it further)."""
    return int(min(self.settings["n_max"], _CAP))

  def label_fields(self) -> dict[str, Any]:
    """What a prediction of this engine carries, in the JSON."""
    e = self.entry
    return {
        "kind": "calibrated",
        "engine": e.engine,
        "engine_profile": e.profile,
        "engine_label": e.label,
        "derived_entry": e.derived,
        "entry_rule": e.rule,
        "heldout_error": dict(e.heldout_error),  # median, p90, max: as `iteration` writes.
        "engine_rules": engine_rules.NOTES.get(e.profile, ""),
        "engine_settings": dict(self.settings)
    }


def drive(engine: str, device: Accelerator, *, tp: int = 1, pp: int = 1) -> Drive | None:
  """`engine` on `device` (None for the bound); one InputError for an unknown engine or an
  accelerator it has no entry for and no rule to derive one."""
  name = profiles.check_engine(engine)
  if name == BOUND:
    return None
  entry = profiles.entry(name, device.name)
  return Drive(entry, profiles.step_model(entry),
               engine_rules.settings(name, device, tp=int(tp), pp=int(pp)))


def drives(engine: str, devices: Sequence[Accelerator]) -> tuple[dict[str, Drive], list[str]]:
  """`engine` on each device it has an entry or a rule for (each with its entry's terms),
  and a line for each device left out (`({}, [])` for the bound); none left is one
  line."""
  if profiles.check_engine(engine) == BOUND:
    return {}, []
  found, left = {}, []
  for device in devices:
    try:
      found[device.name] = drive(engine, device)
    except errors.InputError as e:
      if len(devices) == 1:
        raise
      left.append(f"{device.name} left out: {e}")
  if not found:
    raise errors.InputError(
        f"engine={engine!r} has no entry or rule for any accelerator searched "
        f"({left[0]}).", field="engine")
  return found, left


def replica_sequences(settings: Mapping[str, Any], *, capacity: Any, chip_weights: Any,
                      chip_kv: Any, width: float, ep: Any = 1.0) -> np.ndarray:
  """Sequences a replica runs under the engine's reservation (`reservation.kv_memory` on
  each chip beside its resident weights `chip_weights`, `chip_kv` K/V bytes a sequence
  holds there), pooled over the `ep` groups and capped by its `n_max`; 0 where none fits."""
  out = reservation.evaluator()(C=capacity, W_res=chip_weights, n_bud=settings["n_bud"], D=width,
                                u_mem=settings["u_mem"], m_act=settings["m_act"],
                                m_graph=settings["m_graph"], x_free=settings["x_free"], s=chip_kv,
                                n_max=np.inf)
  per_group = np.maximum(np.asarray(out["running"], dtype=float), 0.0)
  return np.minimum(per_group * np.asarray(ep, dtype=float), min(settings["n_max"], _CAP))


def kv_bytes(settings: Mapping[str, Any], *, capacity: float, chip_weights: float,
             width: float) -> float:
  """K/V bytes one chip keeps under the engine's reservation (<= 0: none)."""
  out = reservation.evaluator()(C=capacity, W_res=chip_weights, n_bud=settings["n_bud"], D=width,
                                u_mem=settings["u_mem"], m_act=settings["m_act"],
                                m_graph=settings["m_graph"], x_free=settings["x_free"], s=1.0,
                                n_max=np.inf)
  return float(out["kv_bytes"])


def memory_note(d: Drive) -> str:
  """The memory and scheduling an engine's run assumes, one line."""
  s = d.settings
  return (f"{d.entry.engine}'s scheduler and memory rule: {d.scheduler} prefill"
          f"{f' ({d.token_budget}-token budget)' if d.token_budget else ''}, at most "
          f"{d.max_running} running, K/V in {s['u_mem']:g} of "
          f"{'the memory weights and workspace leave' if s['x_free'] else 'the device'} "
          f"({engine_rules.NOTES.get(d.entry.profile, '')})")
