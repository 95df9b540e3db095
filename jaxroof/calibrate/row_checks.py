"""Users' rows against their analytic bound before a fit; a fit's result after it.

Each row of a measurements file passed its own schema (`user_measurements.COLUMNS`:
finite, in range). Two checks need the cost model, so they live here:

- before a fit, `refuse_impossible`: a row more than `IMPOSSIBLY_FAST` times faster
  than its analytic bound (at the datasheet's bandwidth and FLOP rate) cannot be one
  step of that model on that device, and one more than `IMPOSSIBLY_SLOW` times slower
  is not a step of it either: a time in another unit (ms or us written as seconds), or
  a wrong model, device, dtype, batch, context or tp. It is refused in one line naming
  the file, the line, the time and its bound. (Rows within these limits but faster than
  the bound or over 20x slower are `user_fit.suspicious_rows`: kept with a warning, or
  left out.)
- after a fit, `finite_result`: a result holding nan or inf (a factor, an error) is
  refused with one `NonFiniteResult` line naming the field and the rows that drove it
  (rows whose own numbers are not finite, else the rows furthest from their bound).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxroof import errors
from jaxroof import files
from jaxroof.calibrate import row_fit
from jaxroof.measure import user_measurements as um

IMPOSSIBLY_FAST = 10.0  # Measured / bound below 1/this: not a step of this model here.
IMPOSSIBLY_SLOW = 500.0  # Measured / bound above this: not a step of it either.
_SHOWN_ROWS = 3  # Rows named as driving a non-finite fit.


def _times(x: float) -> str:
  """A ratio as messages write it: 12.5x, 1,000x."""
  return f"{x:,.0f}x" if x >= 100 else f"{x:.3g}x"


def _where(path: str, line: int) -> str:
  return f"{path} line {line}, column time_s"


def refuse_impossible(path: str, rows: Sequence[um.Row], *,
                      inputs: row_fit.InputsFn = row_fit.ideal_split_inputs) -> None:
  """Raises one InputError at the first row whose time its bound makes impossible."""
  if not rows:
    return
  bound = row_fit.bound_rows(rows, inputs=inputs)
  for row, b in zip(rows, bound):
    if not (math.isfinite(b) and b > 0):
      raise errors.NonFiniteResult(
          f"{path} line {row.line}: the analytic bound of this row is {b!r}, not a finite "
          "time: check its model, batch, context and tp.")
    ratio = row.time_s / b
    if ratio < 1 / IMPOSSIBLY_FAST or ratio > IMPOSSIBLY_SLOW:
      side = f"{_times(1 / ratio)} faster" if ratio < 1 else f"{_times(ratio)} slower"
      raise errors.InputError(
          f"{_where(path, row.line)}={row.time_s:g} is not allowed: {side} than its analytic "
          f"bound ({b:.4g} s at the datasheet's bandwidth and FLOP rate); a step is at most "
          f"{IMPOSSIBLY_FAST:g}x faster and {IMPOSSIBLY_SLOW:g}x slower than its bound: a "
          "time in another unit (ms or us as s), or a wrong model, accelerator, dtype, batch, "
          "context or tp?")


def _lines_not_finite(result: Any) -> list[int]:
  """Lines of the per-row entries (dicts with a `line`) that hold nan or inf."""
  out: list[int] = []
  stack = [result]
  while stack:
    node = stack.pop()
    if isinstance(node, dict):
      if isinstance(node.get("line"), int) and files.nonfinite_at(node):
        out.append(node["line"])
        continue
      stack.extend(node.values())
    elif isinstance(node, (list, tuple)):
      stack.extend(node)
  return sorted(set(out))


def _furthest_from_bound(rows: Sequence[um.Row], inputs: row_fit.InputsFn) -> list[int]:
  """Lines of the rows whose time is furthest (in log) from the rows' typical ratio."""
  try:
    log_ratio = np.log([r.time_s for r in rows]) - np.log(row_fit.bound_rows(rows, inputs=inputs))
  except (errors.InputError, FloatingPointError, ValueError):
    return []
  spread = np.abs(log_ratio - np.nanmedian(log_ratio))
  order = np.argsort(-np.nan_to_num(spread, nan=np.inf))
  return sorted(rows[i].line for i in order[:_SHOWN_ROWS])


def finite_result(path: str, rows: Sequence[um.Row], result: Any, *,
                  inputs: row_fit.InputsFn = row_fit.ideal_split_inputs) -> Any:
  """`result` when it holds no nan or inf; else one NonFiniteResult naming the field
  and the rows that drove it."""
  found = files.nonfinite_at(result)
  if found is None:
    return result
  field, value = found
  lines = _lines_not_finite(result)
  why = "their own numbers are not finite"
  if not lines:
    lines, why = _furthest_from_bound(rows, inputs), "the furthest from their bound"
  named = ", ".join(str(n) for n in lines[:_SHOWN_ROWS]) or "(none found)"
  more = f" and {len(lines) - _SHOWN_ROWS} more" if len(lines) > _SHOWN_ROWS else ""
  raise errors.NonFiniteResult(
      f"{path}: the fit gives {field} = {value}, not a finite number; the rows that drove it "
      f"({why}): line {named}{more}. Check them, or leave them out; nothing was written.",
      field="measurements")
