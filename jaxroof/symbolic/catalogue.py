"""Every derived quantity of the decode model, by name, as a closed form.

`closed_forms()` lists them with their units; `evaluate(values)` substitutes
numbers given by symbol name and reports the symbols still missing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import sympy as sp

from jaxroof import errors
from jaxroof.symbolic import formulas
from jaxroof.symbolic import solved
from jaxroof.symbolic.symbols import BY_NAME, with_dense_default


@dataclasses.dataclass(frozen=True)
class Derived:
  name: str
  expression: Callable[[], sp.Expr]
  unit: str
  meaning: str
  method: str = "formula"


CATALOGUE: tuple[Derived, ...] = (
    Derived("weight_traffic", formulas.weight_traffic, "B", "weight bytes read per step"),
    Derived("linear_flops", formulas.linear_flops, "FLOP", "linear-layer FLOPs per step"),
    Derived("weight_only_intensity", formulas.weight_only_intensity, "FLOP/B",
            "linear FLOPs per weight byte"),
    Derived("ridge_point", formulas.ridge_point, "FLOP/B", "device FLOPs per byte"),
    Derived("ridge_batch", solved.ridge_batch, "sequences",
            "batch where weight-only intensity reaches the ridge R", "sympy.solve"),
    Derived("kv_bytes_per_position", formulas.kv_bytes_per_position, "B/position",
            "K/V bytes per processed position (full attention)"),
    Derived("positions_with_kv", formulas.positions_with_kv, "positions",
            "positions holding K/V after P prompt tokens and g outputs"),
    Derived("retained_kv_bytes", formulas.retained_kv_bytes, "B", "K/V bytes read per step"),
    Derived("step_traffic", formulas.step_traffic, "B", "bytes read per decode step"),
    Derived("memory_time", formulas.memory_time, "s", "time to move the step's bytes"),
    Derived("compute_time", formulas.compute_time, "s", "linear-layer compute time"),
    Derived("step_floor", formulas.step_floor, "s", "optimistic step time"),
    Derived("aggregate_rate", formulas.aggregate_rate, "tokens/s", "tokens/s over the batch"),
    Derived("per_sequence_rate", formulas.per_sequence_rate, "tokens/s", "tokens/s one user sees"),
    Derived("weight_kv_crossover_batch", solved.weight_kv_crossover_batch, "sequences",
            "batch where K/V reads equal weight reads", "sympy.solve"),
    Derived("compute_crossover_batch", solved.compute_crossover_batch, "sequences",
            "batch where compute time equals memory time (<= 0: never)", "sympy.solve"),
    Derived("memory_limit_rate", solved.memory_limit_rate, "tokens/s",
            "aggregate rate as B -> oo, memory-bound", "sympy.limit"),
    Derived("max_batch_for_token_gap", solved.max_batch_for_token_gap, "sequences",
            "largest batch whose step stays within the token-gap target t_gap", "sympy.solve"),
    Derived("prefill_time", formulas.prefill_time, "s", "optimistic prefill of a P-token prompt"),
    Derived("time_to_first_token", formulas.time_to_first_token, "s",
            "queueing wait + batching window + prefill"),
)

NAMES: tuple[str, ...] = tuple(item.name for item in CATALOGUE)
# Symbols for which zero is a meaningful value: no queueing wait, no batching
# window, no outputs emitted yet. Every other symbol must be > 0.
ZERO_ALLOWED = frozenset({"t_queue", "t_window", "g"})


def parse_values(pairs: list[str]) -> dict[str, float]:
  """Parses `NAME=NUMBER` pairs; names must be model symbols, numbers > 0
  (>= 0 for the waits and counts in `ZERO_ALLOWED`)."""
  values = {}
  for pair in pairs:
    name, sep, number = pair.partition("=")
    name = name.strip()
    if not sep:
      raise errors.InputError(f"values entry {pair!r} is not NAME=NUMBER.", field="values")
    try:
      errors.require_choice("symbol", name, sorted(BY_NAME))
      check = errors.require_non_negative if name in ZERO_ALLOWED else errors.require_positive
      values[name] = check(name, number)
    except errors.InputError as error:
      raise errors.InputError(f"values entry {pair!r}: {error}", field="values") from None
  return values


def closed_forms() -> list[dict[str, Any]]:
  """Each quantity's expression as text, pretty-printed text and LaTeX."""
  out = []
  for item in CATALOGUE:
    expr = item.expression()
    out.append({
        "name": item.name,
        "meaning": item.meaning,
        "unit": item.unit,
        "derived_by": item.method,
        "expression": str(expr),
        "pretty": sp.pretty(expr, use_unicode=True),
        "latex": sp.latex(expr),
        "symbols": sorted(str(s) for s in expr.free_symbols),
    })
  return out


_BELOW_ONE = {
    "compute_crossover_batch": "compute binds at every batch (crossover below one sequence)",
    "max_batch_for_token_gap": "no batch meets the token gap: the weights alone take longer",
    "weight_kv_crossover_batch": "K/V reads exceed the weights from the first sequence",
    "ridge_batch": "the ridge is reached at batch one",
}


def _batch_note(name: str, value: float | None) -> str:
  """Why a solved batch has no usable value ('' if it has one)."""
  if value is None or name not in _BELOW_ONE:
    return ""
  if name == "compute_crossover_batch" and value <= 0:
    return "denominator <= 0: memory binds at every batch"
  return _BELOW_ONE[name] if value < 1 else ""


def require_names(names: list[str], field: str = "only") -> tuple[str, ...]:
  """The named quantities, each checked against `NAMES` (one-line error naming `field`)."""
  chosen = [n.strip() for n in names if n.strip()]
  if not chosen:
    raise errors.InputError(f"{field} is empty: give one or more of {', '.join(NAMES)}.",
                            field=field)
  for name in chosen:
    if name not in NAMES:
      raise errors.InputError(
          f"{field}={name!r} is not a quantity: give one or more of "
          f"{', '.join(NAMES)}.", field=field)
  return tuple(dict.fromkeys(chosen))


def evaluate(values: Mapping[str, float],
             only: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
  """Closed forms plus their numbers at `values` (None where symbols are missing).

  A solved batch below one sequence is reported as None with a note saying
  what that means (e.g. a compute crossover <= 0: memory binds at every batch).
  """
  values = with_dense_default(dict(values))
  out = []
  for item, form in zip(CATALOGUE, closed_forms()):
    if only is not None and item.name not in only:
      continue
    expr = item.expression()
    subs = {BY_NAME[n].symbol: sp.Float(v) for n, v in values.items()}
    number = expr.subs(subs)
    missing = sorted(str(s) for s in number.free_symbols)
    value = None if missing else float(number)
    note = _batch_note(item.name, value)
    if note:
      value = None
    out.append({**form, "value": value, "missing_symbols": missing, "note": note})
  return out
