"""Declarative schemas for the files jaxroof reads, checked at the edge.

A schema is a tree of small, frozen specs: `Number`, `Text`, `Flag`,
`ListOf`, `Object` (known fields, required ones, rules between fields),
`MapOf` (any keys, or an allowed set, one value spec), `OneOf` and
`Anything`. `check(spec, value, where=...)` walks a parsed file and raises
one `InputError` at the first value that is wrong, in one line naming the
file, the field as a JSON path (`scale_up.unidirectional_gb_s`, `itls[3]`),
the value and what is allowed:

  accelerator_file='/tmp/a.json' field scale_up.unidirectional_gb_s=nan is
  not allowed: a finite number > 0 and <= 100,000 (GB/s).

Consistency between fields (top-k <= experts, two names of one field that
disagree) is a `Rule` of the object that holds them. A `FileKind` bundles a
schema with the file's bounds (bytes and nesting depth); `load` reads,
bounds and checks a file in one call. `check_record` checks one row of a
CSV or JSONL table (CSV cells are text: numbers are parsed), naming
`line 4, column time_s`.

Example:

  >>> RATE = Object({"bf16": Number(low=0, low_open=True, high=1e6)},
  ...               required=("bf16",))
  >>> check(RATE, {"bf16": 989.4}, where="x.json")
  >>> check(RATE, {"bf16": -1}, where="x.json")
  Traceback (most recent call last):
  ...
  jaxroof.errors.InputError: x.json field bf16=-1 is not allowed: a finite number > 0 and <= 1,000,000.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from typing import Any, Union

from jaxroof import files
from jaxroof.errors import InputError

# Bounds every file kind has unless it states its own: far above any real
# file of ours, so that a wrong or hostile file is refused before it is used.
MAX_DEPTH = 32  # Nesting of JSON objects and lists.
MAX_LIST = 10**6  # Items of one list.
MAX_TEXT = 10_000  # Characters of one string.
_SHOWN = 48  # Characters of a value quoted in a message.


def shown(value: Any) -> str:
  """A value as a message quotes it: short, one line (a long list by its length)."""
  if isinstance(value, _Raw):
    text = repr(value)
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN - 20]}... ({len(text):,} characters)"
  if value is None or isinstance(value, bool):
    return {None: "null", True: "true", False: "false"}[value]
  if isinstance(value, Mapping):
    return f"<object of {len(value):,} field(s)>" if len(repr(value)) > _SHOWN else repr(value)
  if isinstance(value, (list, tuple)) and len(repr(value)) > _SHOWN:
    return f"<list of {len(value):,} item(s)>"
  if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**_SHOWN:
    return f"<a {len(str(abs(value))):,}-digit number>"
  text = repr(value)
  return text if len(text) <= _SHOWN else f"{text[:_SHOWN - 8]}...{text[-5:]}"


def _number_text(x: float) -> str:
  """A bound as messages write it: 1,000,000 or 1e-09."""
  if isinstance(x, int) or float(x).is_integer() and abs(x) < 1e15:
    return f"{int(x):,}"
  return f"{x:g}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Number:
  """A number: finite, in [low, high] (`low_open`: > low), whole if `whole`;
  `infinite` also allows +Infinity (above `high`), `null` JSON null, `words`
  the strings given (`("inf",)` for a request rate); `unit` is said in
  messages. `problem` says why a value is refused ("missing", "bad"), or None."""

  low: float | None = None
  high: float | None = None
  low_open: bool = False
  whole: bool = False
  null: bool = False
  infinite: bool = False
  words: tuple[str, ...] = ()
  unit: str = ""

  def allowed(self) -> str:
    kind = "a whole number" if self.whole else "a finite number"
    if self.infinite:
      kind = kind.replace("a finite", "a") + " (Infinity allowed)"
    parts = []
    if self.low is not None:
      parts.append(f"{'>' if self.low_open else '>='} {_number_text(self.low)}")
    if self.high is not None:
      parts.append(f"<= {_number_text(self.high)}")
    text = f"{kind} {' and '.join(parts)}".strip()
    if self.unit:
      text += f" ({self.unit})"
    extra = [repr(w) for w in self.words] + (["null"] if self.null else [])
    return f"{text}, or {' or '.join(extra)}" if extra else text

  def problem(self, value: Any) -> str | None:
    if value is None:
      return None if self.null else "missing"
    if isinstance(value, str) and value in self.words:
      return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      return "bad"
    if isinstance(value, float) and math.isnan(value):
      return "bad"
    if isinstance(value, float) and math.isinf(value):
      return None if self.infinite and value > 0 else "bad"
    if self.whole and isinstance(value, float) and not value.is_integer():
      return "bad"
    if self.low is not None and (value <= self.low if self.low_open else value < self.low):
      return "bad"
    if self.high is not None and value > self.high:
      return "bad"
    return None


def Whole(low: int = 1, high: int | None = None, **kw: Any) -> Number:  # noqa: N802
  """A whole number in [low, high] (a `Number` with `whole=True`)."""
  return Number(low=low, high=high, whole=True, **kw)


def Positive(high: float | None = None, **kw: Any) -> Number:  # noqa: N802
  """A finite number > 0 (and <= high)."""
  return Number(low=0, low_open=True, high=high, **kw)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Text:
  """A string (not empty unless `empty`), one of `choices` when given."""

  choices: tuple[str, ...] = ()
  null: bool = False
  empty: bool = False
  max_len: int = MAX_TEXT

  def allowed(self) -> str:
    text = (f"one of {', '.join(map(repr, self.choices))}"
            if self.choices else f"a text of at most {self.max_len:,} characters")
    return text + (", or null" if self.null else "")

  def problem(self, value: Any) -> str | None:
    if value is None:
      return None if self.null else "missing"
    if not isinstance(value, str) or len(value) > self.max_len:
      return "bad"
    if self.choices and value not in self.choices:
      return "bad"
    return None if value.strip() or self.empty else "bad"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Flag:
  """true or false (or null when `null`)."""

  null: bool = False

  def allowed(self) -> str:
    return "true or false" + (", or null" if self.null else "")

  def problem(self, value: Any) -> str | None:
    if value is None:
      return None if self.null else "missing"
    return None if isinstance(value, bool) else "bad"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Anything:
  """Any value (a field we do not read); its nesting is still bounded by the kind."""

  def allowed(self) -> str:
    return "any value"

  def problem(self, value: Any) -> str | None:
    del value  # Unused.
    return None


@dataclasses.dataclass(frozen=True)
class Rule:
  """A consistency check between fields of one object: `ok(*values)` for the
  `fields` named (applied when all are present and not null); `allowed` says
  what must hold, e.g. "num_experts_per_tok <= num_local_experts"."""

  fields: tuple[str, ...]
  ok: Callable[..., bool]
  allowed: str
  show: Callable[[Any], str] | None = None  # How a value is quoted (default: `shown`).


def at_most(small: str, large: str, *, unless_zero: bool = False) -> Rule:
  """`small <= large` (e.g. experts per token and experts); `unless_zero`: a
  `large` of 0 (none) passes."""
  return Rule((small, large), lambda a, b: (unless_zero and b == 0) or a <= b,
              f"{small} must be at most {large}")


def agree(*names: str) -> Rule:
  """Names of one field (`num_experts_per_tok`, `experts_per_token`): given together,
  they must hold the same value."""
  return Rule(names, lambda *values: all(v == values[0] for v in values),
              f"{' and '.join(names)} name the same field and must agree")


def same_length(*names: str) -> Rule:
  """Lists that describe the same items (one entry per request) are as long."""
  return Rule(names, lambda *values: len({len(v) for v in values}) == 1,
              f"{', '.join(names)} must be lists of the same length",
              show=lambda v: f"<{len(v):,} items>")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ListOf:
  """A list of `item`s, between `min_len` and `max_len` long."""

  item: Spec = dataclasses.field(kw_only=False)
  min_len: int = 0
  max_len: int = MAX_LIST
  null: bool = False

  def allowed(self) -> str:
    size = (f"at least {self.min_len:,} and " if self.min_len else "") + f"at most {self.max_len:,}"
    return f"a list of {size} items, each {self.item.allowed()}" + (", or null"
                                                                    if self.null else "")

  def problem(self, value: Any) -> str | None:
    if value is None:
      return None if self.null else "missing"
    if not isinstance(value, list) or not self.min_len <= len(value) <= self.max_len:
      return "bad"
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Object:
  """A JSON object: `fields` by name (others: checked by `extra`, or refused
  when `extra` is None), `required` names, and `rules` between fields."""

  fields: Mapping[str, Spec] = dataclasses.field(default_factory=dict, kw_only=False)
  required: tuple[str, ...] = ()
  rules: tuple[Rule, ...] = ()
  extra: Spec | None = dataclasses.field(default_factory=Anything)
  null: bool = False

  def allowed(self) -> str:
    needs = f" with {', '.join(self.required)}" if self.required else ""
    return f"a JSON object{needs}" + (", or null" if self.null else "")

  def problem(self, value: Any) -> str | None:
    if value is None:
      return None if self.null else "missing"
    return None if isinstance(value, Mapping) else "bad"


@dataclasses.dataclass(frozen=True, kw_only=True)
class MapOf:
  """A JSON object whose values all follow `value`; `keys`, when given, are
  the only names allowed."""

  value: Spec = dataclasses.field(kw_only=False)
  keys: tuple[str, ...] = ()
  min_len: int = 0
  max_len: int = 10_000
  null: bool = False

  def allowed(self) -> str:
    keys = f" with keys among {', '.join(self.keys)}" if self.keys else ""
    if self.min_len == self.max_len:
      keys += f" of exactly {self.min_len:,} field(s)"
    elif self.min_len:
      keys += f" of {self.min_len:,} to {self.max_len:,} fields"
    return f"a JSON object{keys}, each value {self.value.allowed()}" + (", or null"
                                                                        if self.null else "")

  def problem(self, value: Any) -> str | None:
    if value is None:
      return None if self.null else "missing"
    if not isinstance(value, Mapping) or not self.min_len <= len(value) <= self.max_len:
      return "bad"
    return None


@dataclasses.dataclass(frozen=True)
class OneOf:
  """The first of `options` that accepts the value; `allowed` says them in words."""

  options: tuple[Spec, ...]
  allowed_text: str = ""

  def allowed(self) -> str:
    return self.allowed_text or " or ".join(o.allowed() for o in self.options)

  def problem(self, value: Any) -> str | None:
    if any(_errors(o, value, ()) is None for o in self.options):
      return None
    return "missing" if value is None else "bad"


@dataclasses.dataclass(frozen=True)
class Switch:
  """The spec `pick(value)` chooses by the value's shape (a file that is one
  entry or a table of them): its errors name the fields of the chosen one."""

  pick: Callable[[Any], Spec]

  def allowed(self) -> str:
    return "see the chosen form"

  def problem(self, value: Any) -> str | None:
    del value  # Unused: the chosen spec says.
    return None


Spec = Union[Number, Text, Flag, Anything, ListOf, Object, MapOf, OneOf, Switch]

path_text = files.json_path  # `scale_up.unidirectional_gb_s`, `itls[3][0]`.


def _errors(spec: Spec, value: Any, path: tuple[str | int, ...]) -> tuple[tuple, Any, str] | None:
  """(path, value, allowed) of the first wrong value under `spec`, or None.

  Iterative over lists (a long list of numbers costs one loop, not a recursion
  per item); nesting follows the schema, whose depth is bounded.
  """
  if isinstance(spec, Switch):
    return _errors(spec.pick(value), value, path)
  if spec.problem(value) is not None:
    return path, value, spec.allowed()
  if value is None:
    return None
  if isinstance(spec, ListOf):
    item = spec.item
    if isinstance(item, (Number, Text, Flag)):  # The common case: a flat list.
      for i, v in enumerate(value):
        if item.problem(v) is not None:
          return path + (i,), v, item.allowed()
      return None
    for i, v in enumerate(value):
      found = _errors(item, v, path + (i,))
      if found:
        return found
    return None
  if isinstance(spec, MapOf):
    for key, v in value.items():
      if spec.keys and key not in spec.keys:
        return path + (key,), v, f"a field among {', '.join(spec.keys)}"
      found = _errors(spec.value, v, path + (key,))
      if found:
        return found
    return None
  if isinstance(spec, Object):
    for name in spec.required:
      if name not in value:
        return path + (name,), _ABSENT, spec.fields[name].allowed()
    for key, v in value.items():
      field = spec.fields.get(key, spec.extra)
      if field is None:
        known = ", ".join(spec.fields)
        return path + (key,), v, f"not a known field (known: {known})"
      found = _errors(field, v, path + (key,))
      if found:
        return found
    for rule in spec.rules:
      values = [value.get(name) for name in rule.fields]
      if any(v is None for v in values):
        continue
      if not rule.ok(*values):
        given = " with ".join(f"{path_text(path + (n,))}={(rule.show or shown)(v)}"
                              for n, v in zip(rule.fields, values))
        return path, _Given(given), rule.allowed
  if isinstance(spec, OneOf):
    return None
  return None


class _Absent:

  def __repr__(self) -> str:
    return "absent"


_ABSENT = _Absent()


@dataclasses.dataclass(frozen=True)
class _Raw:
  """A CSV cell, quoted as the file has it (`time_s=1e-300`, not `1e-300` parsed)."""
  text: str

  def __repr__(self) -> str:
    return self.text.strip() or "(empty)"


@dataclasses.dataclass(frozen=True)
class _Given:
  """Several fields' values, quoted together by a rule's message."""
  text: str


def _message(where: str, path: tuple, value: Any, allowed: str, location: str = "") -> str:
  at = location or (f"field {path_text(path)}" if path else "")
  if isinstance(value, _Given):
    return f"{where}: {value.text} is not allowed: {allowed}."
  if value is _ABSENT:
    return f"{where} lacks {path_text(path)}: give {allowed}."
  if not at:
    return f"{where} holds {shown(value)}, which is not allowed: give {allowed}."
  return f"{where} {at}={shown(value)} is not allowed: {allowed}."


def check(spec: Spec, value: Any, *, where: str, field: str | None = None) -> None:
  """Raises one `InputError` at the first value of `value` that `spec` refuses.

  Args:
    spec: the schema.
    value: the parsed file (or part of it).
    where: the file, as messages name it (`accelerator_file='/tmp/a.json'`).
    field: the library parameter that gave the file (`InputError.field`).
  """
  found = _errors(spec, value, ())
  if found:
    raise InputError(_message(where, *found), field=field)


@dataclasses.dataclass(frozen=True, kw_only=True)
class FileKind:
  """A kind of file we read: its schema and bounds, and what it is in words."""

  what: str  # "accelerator file", "vLLM result", "model config".
  schema: Spec
  max_bytes: int = files.MAX_INPUT_BYTES
  max_depth: int = MAX_DEPTH


def load(kind: FileKind, name: str, path: str | os.PathLike[str]) -> Any:
  """A JSON file of `kind`: read with its size and nesting bounded, then checked.

  `name` is the parameter that gave the path (`accelerator_file`): errors
  carry it as their field and name the file as `name='path'`.
  """
  path = os.fspath(path)
  data = files.read_json(name, path, max_bytes=kind.max_bytes, max_depth=kind.max_depth)
  check(kind.schema, data, where=f"{name}={path!r}", field=name)
  return data


def check_record(columns: Mapping[str, Spec], record: Mapping[str, Any], *, where: str, line: int,
                 csv: bool, field: str | None = None) -> dict[str, Any]:
  """One row of a table (CSV or JSONL), checked and typed: errors name
  `line N, column C` (CSV) or `line N, field F` (JSONL).

  A CSV cell is text: an empty cell is null, a `Number` column is parsed
  (`1e-3`, `nan` refused as not finite), a `Flag` column reads true/false/1/0.
  Columns not in `columns` pass through unchanged. Returns the typed row.
  """
  out = dict(record)
  noun = "column" if csv else "field"
  for name, spec in columns.items():
    raw = value = record.get(name)
    if csv:
      value = _cell(spec, raw)
    found = _errors(spec, value, ())
    if found:
      location = f"line {line}, {noun} {path_text((name,) + found[0])}"
      shown_value = _Raw(raw) if csv and isinstance(raw, str) and not found[0] else found[1]
      raise InputError(_message(where, (), shown_value, found[2], location), field=field)
    out[name] = value
  return out


def _cell(spec: Spec, text: Any) -> Any:
  """A CSV cell as the value `spec` checks: '' is null; numbers and flags parsed."""
  if not isinstance(text, str):
    return text
  cell = text.strip()
  if not cell:
    return None
  if isinstance(spec, Number) and cell not in spec.words:
    try:
      number = float(cell)
    except ValueError:
      return text
    return int(number) if spec.whole and number.is_integer() and abs(number) < 2**63 else number
  if isinstance(spec, Flag):
    return {"true": True, "1": True, "false": False, "0": False}.get(cell.lower(), text)
  return cell
