"""The schema of a file of cost terms (`calibrate --engine_terms=FILE.json`).

Three forms are read (`calibrate.engine_fit.read_terms`): an object NAME: VALUE,
the same under "terms", or an earlier vLLM-run fit's result (`kind`
engine_calibration), whose `factors` and `fixed` terms are taken. Every value is
a registered cost term (`jaxroof.symbolic.terms`, the core's and every engine's),
a JSON number within its term's bounds; an unknown name, a missing or
non-numeric value, nan, inf or a value out of bounds is one line naming the file,
the term, the value and what is allowed:

  engine_terms='fit.json' field factors.eta_w=0 is not allowed: a finite number
  > 0 and <= 1.

The schema is built when first used, after every engine registered its terms.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from jaxroof import engines  # noqa: F401  (registers every engine's terms)
from jaxroof import schema
from jaxroof.schema import Anything, Number, Object, Text
from jaxroof.symbolic import terms

MAX_DEPTH = 8  # A fit's result nests 5 levels (runs, cdfs); a terms file 2.
RESULT_KIND = "engine_calibration"  # The `kind` of a vLLM-run fit's result.


def term_number(term: terms.Term, *, null: bool = False) -> Number:
  """A term's value as a schema `Number`: its bounds, its unit when it has one."""
  low, high = term.bounds
  unit = "" if term.unit == "1" else term.unit
  return Number(low=low, high=high, low_open=term.low_open, null=null, unit=unit)


@functools.cache
def _terms_object(null: bool) -> Object:
  """An object of registered terms by name (no other name), each within its bounds."""
  return Object({n: term_number(t, null=null) for n, t in terms.registered().items()}, extra=None)


def terms_object(*, null: bool = False) -> Object:
  """Registered cost terms by name, each a number within its bounds (null: also null)."""
  return _terms_object(null)


def _form(data: Any) -> schema.Spec:
  """The form a document is read as (see the module docstring)."""
  if isinstance(data, dict) and data.get("kind") == RESULT_KIND:
    return Object(
        {
            "kind": Text(choices=(RESULT_KIND,)),
            "factors": terms_object(),
            "fixed": Object(terms_object().fields, extra=None, null=True),
        }, required=("kind", "factors"), extra=Anything())
  if isinstance(data, dict) and "terms" in data:
    return Object({"terms": terms_object()}, required=("terms",))
  if isinstance(data, dict) and ("kind" in data or "hosts" in data):
    return Anything()  # Another kind of file: the reader says which forms it takes.
  return terms_object()


SCHEMA = schema.Switch(_form)
KIND = schema.FileKind(what="cost-term file", schema=SCHEMA, max_depth=MAX_DEPTH)


def load(field: str, path: str | os.PathLike[str]) -> Any:
  """The file, read with its size and nesting bounded and checked (`schema.load`)."""
  return schema.load(KIND, field, path)
