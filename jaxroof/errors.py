"""Errors for bad user input, and the checks that raise them.

Every message names the parameter, the value it got and what is allowed, so an
experiment can print it as one line instead of a traceback.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any


class InputError(ValueError):
  """A user-supplied value is out of range, malformed or unknown.

  `field` names the library parameter at fault (`"tp"`, `"comm_overlap"`), never a
  command-line flag: the experiments map fields to their flags (`experiments/_cli`).
  """

  def __init__(self, message: str, *, field: str | None = None):
    super().__init__(message)
    self.field = field


class NonFiniteResult(InputError):
  """A result (a fit, a step time, a JSON document) holds nan or inf.

  It is never printed or written as a number: the run stops with one line
  naming the field, and exits non-zero.
  """


def require_positive(name: str, value: Any) -> float:
  """Returns `value` as a float if it is a finite number > 0, else raises."""
  number = require_finite(name, value)
  if number <= 0:
    raise InputError(f"{name}={value!r} is not allowed: it must be > 0.", field=name)
  return number


def require_non_negative(name: str, value: Any) -> float:
  """Returns `value` as a float if it is a finite number >= 0, else raises."""
  number = require_finite(name, value)
  if number < 0:
    raise InputError(f"{name}={value!r} is not allowed: it must be >= 0.", field=name)
  return number


def require_finite(name: str, value: Any) -> float:
  """Returns `value` as a float if it is a finite real number, else raises."""
  try:
    number = float(value)
  except (TypeError, ValueError):
    raise InputError(f"{name}={value!r} is not a number: give a finite real number.",
                     field=name) from None
  if isinstance(value, bool) or not math.isfinite(number):
    raise InputError(f"{name}={value!r} is not allowed: give a finite number.", field=name)
  return number


def require_positive_int(name: str, value: Any) -> int:
  """Returns `value` as an int if it is a whole number >= 1, else raises."""
  number = require_positive(name, value)
  if number != int(number):
    raise InputError(f"{name}={value!r} is not allowed: it must be a whole number >= 1.",
                     field=name)
  return int(number)


def require_positive_ints(name: str, values: Iterable[Any]) -> list[int]:
  """Checks a non-empty list of whole numbers >= 1 (e.g. batch sizes)."""
  values = list(values)
  if not values:
    raise InputError(f"{name} is empty: give at least one whole number >= 1.", field=name)
  return [require_positive_int(f"{name}[{i}]", v) for i, v in enumerate(values)]


def require_choice(name: str, value: str, allowed: Sequence[str]) -> str:
  """Checks that `value` is one of `allowed`, suggesting the closest match."""
  if value in allowed:
    return value
  import difflib  # Only needed on the error path.

  close = difflib.get_close_matches(value, allowed, n=1)
  hint = f" Did you mean {close[0]!r}?" if close else ""
  raise InputError(f"{name}={value!r} is unknown.{hint} Known: {', '.join(allowed)}.", field=name)
