"""What an experiment says about the model it was given, in one place: the
config.json fields that fell back to a default, and a context beyond the
model's `max_position_embeddings` (a labelled warning; the run goes on)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from jaxroof.specs.model_spec import ModelSpec


def lines(spec: ModelSpec, contexts: Iterable[int] = ()) -> list[str]:
  """Lines to print: each default of a user's config ("assumes: ..."), then a
  warning per context beyond the model's limit."""
  out = [f"assumes: {line}" for line in spec.default_assumptions]
  for context in sorted(set(contexts)):
    warning = spec.context_warning(context)
    if warning:
      out.append(warning)
  return out


def say(spec: ModelSpec, contexts: Iterable[int] = ()) -> list[str]:
  """Prints `lines` and returns them."""
  said = lines(spec, contexts)
  for line in said:
    print(line)
  return said


def json_fields(spec: ModelSpec, contexts: Iterable[int] = ()) -> dict[str, Any]:
  """`defaults_applied` (every default the config reader filled in) and any
  context warnings, for an experiment's JSON."""
  warnings = [w for c in sorted(set(contexts)) if (w := spec.context_warning(c))]
  return {
      "defaults_applied": list(spec.defaults_applied),
      **({"warnings": warnings} if warnings else {})
  }
