"""A plan of an engine's predictions with the bound's plan beside it.

`plan(spec, devices, engine=NAME, ...)` asks `planner.plan` the same question twice: once
with the engine (`engine_drive`: its calibrated step, scheduler defaults, running cap
and memory reservation), whose plans lead, and once as the analytic bound. Each engine
plan then carries the bound's figures for the same accelerator, layout, bytes and pools
(`bound_*` keys: None where the bound's list has no such plan), and the result the
bound's best plan (`bound`), so the chips a plan needs, its tokens/s per chip and its
cost are shown as prediction and bound side by side.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jaxroof.parallel import engine_drive
from jaxroof.parallel import planner
from jaxroof.specs.accelerators import Accelerator
from jaxroof.specs.model_spec import ModelSpec

# A plan's figures shown beside as the bound's (`bound_<key>`).
BESIDE: tuple[str, ...] = ("tokens_per_s_per_chip", "max_rate_per_replica_s", "max_running", "dp",
                           "chips", "step_s", "prefill_s", "loaded_token_gap_s", "ttft_p90_s",
                           "aggregate_tokens_per_s", "cost_per_hour", "cost_per_million_tokens")
BOUND_TOP = 100  # Bound plans listed to find each engine plan's layout among them.


def _key(p: dict[str, Any]) -> tuple:
  return (p["accelerator"], p["tp"], p["pp"], p["ep"], p["microbatches"], p["weight_dtype"],
          p["kv_dtype"], p["pools"]["kind"])


def _summary(p: dict[str, Any] | None) -> dict[str, Any] | None:
  if p is None:
    return None
  keep = ("accelerator", "tp", "pp", "ep", "microbatches", "weight_dtype", "kv_dtype", "scheduler",
          "token_budget")
  return {**{k: p[k] for k in keep}, "pools": p["pools"]["kind"], **{k: p[k] for k in BESIDE}}


def beside(result: dict[str, Any], bound: dict[str, Any]) -> None:
  """Puts the bound's figures beside each engine plan (`bound_*`), and the bound's best
  plan beside the result (`bound`), in place."""
  by: dict[tuple, dict[str, Any]] = {}
  for p in bound["plans"]:
    by.setdefault(_key(p), p)
  for p in result["plans"]:
    b = by.get(_key(p))
    for k in BESIDE:
      p["bound_" + k] = None if b is None else b[k]
  result["bound"] = {
      "kind": "bound", "best": _summary(bound["plans"][0] if bound["plans"] else None),
      "meeting": bound["meeting"], "searched": bound["searched"],
      "note": "the same question answered by the analytic bound (plan without an engine)"
  }


def plan(spec: ModelSpec, devices: Sequence[Accelerator], *, engine: str = engine_drive.BOUND,
         top: int = 20, **kw: Any) -> dict[str, Any]:
  """`planner.plan` with `engine`'s predictions leading and the bound's beside (the
  module docstring); the bound alone for `engine="bound"`."""
  result = planner.plan(spec, devices, engine=engine, top=top, **kw)
  if engine != engine_drive.BOUND:
    beside(result, planner.plan(spec, devices, top=max(top, BOUND_TOP), **kw))
  return result
