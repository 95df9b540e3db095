"""`--engine`: the analytic bound, or an engine's calibrated prediction (one shared flag).

`bound` (the default) is the analytic model. An engine name (`jaxroof.engines.engine_profiles`)
makes the headline figures that engine's predictions on the accelerator, from its shipped
profile fitted on published measurements, the bound kept beside each and every prediction
labelled with its engine and its held-out error. An experiment adds it with
`_model_flags.define(..., "engine")` (or `define()` here) and reads it with `entry`.
"""

from __future__ import annotations

from typing import Any

from absl import flags

from jaxroof.errors import InputError

from jaxroof.engines import engine_profiles as profiles
from jaxroof.parallel import engine_drive


def define() -> flags.FlagHolder:
  return flags.DEFINE_string(
      "engine", profiles.BOUND, "bound (default): the analytic model; or an engine, whose "
      f"profile fitted on published measurements predicts: {', '.join(profiles.ENGINES)} "
      "(python -m experiments.list shows the accelerators each was measured on). With an "
      "engine the headline figures are its predictions, the bound beside them.")


def entry(holder: flags.FlagHolder, accelerator: str) -> profiles.Entry | None:
  """The engine's entry on `accelerator`, or None for the bound; a name that is no engine,
  or an accelerator the engine has no entry for and no rule to derive, is one line."""
  name = profiles.check_engine(holder.value)
  return None if name == profiles.BOUND else profiles.entry(name, accelerator)


def drive(holder: flags.FlagHolder, device, layout=None) -> engine_drive.Drive | None:
  """--engine on `device` (None: raw numbers were given) and the layout's tp and pp, or
  None for the bound; one line where it cannot predict."""
  if profiles.check_engine(holder.value) == profiles.BOUND:
    return None
  if not device:
    raise InputError(f"--engine={holder.value} predicts for an accelerator: give --model and "
                     "--accelerator.")
  return engine_drive.drive(holder.value, device, tp=getattr(layout, "tp", 1),
                            pp=getattr(layout, "pp", 1))


def bound_beside(calibrated: list[dict], bound: list[dict]) -> None:
  """Puts each bound sweep row's step beside the engine's row of the same batch and
  combination (`bound_step_s`), for the table and the JSON."""
  for each, other in zip(calibrated, bound):
    for row, b in zip(each["rows"], other["rows"]):
      row["bound_step_s"] = b["step_s"]


def entries(holder: flags.FlagHolder, devices) -> tuple[dict, list, list[str]]:
  """--engine's entry on each device, and the devices it has no rule for left out, each
  with its one line (one device alone: its error). Each entry carries its accelerator's
  terms (an accelerator's kernel-fitted ones, or the engine's)."""
  found, kept, left = {}, [], []
  for device in devices:
    try:
      found[device.name] = entry(holder, device.name)
      kept.append(device)
    except InputError as e:
      if len(devices) == 1:
        raise
      left.append(f"{device.name}: {e}")
  if not kept:
    raise InputError(f"--engine={holder.value}: no accelerator compared has an entry or a "
                     f"rule ({left[0]}).")
  return found, kept, left


def comparison_beside(result: dict[str, Any], bound: dict[str, Any], entries: dict[str,
                                                                                   Any]) -> None:
  """An engine's comparison: each row's bound step beside it (`bound_step_s`), each
  accelerator's entry label and held-out error, and the assumption lines said for an
  engine (the rows are its predictions, not a profile's factors scaled)."""
  steps = {(e["name"], r["batch"]): r["step_s"] for e in bound["accelerators"] for r in e["rows"]}
  for e in result["accelerators"]:
    found = entries[e["name"]]
    e.update(engine=found.engine, engine_label=found.label, derived_entry=found.derived,
             heldout_error=dict(found.heldout_error))
    for row in e["rows"]:
      row["bound_step_s"] = steps[(e["name"], row["batch"])]
  result["assumptions"] = [a for a in result["assumptions"] if not a.startswith("calibrated:")]
  result["assumptions"].append("calibrated: each accelerator's entry of the engine's profile "
                               "(fitted on published measurements) on its datasheet figures; "
                               "crossovers and max batch stay analytic bounds")
