"""Checking a name against a list of known ones, with helpful suggestions."""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from jaxroof import errors


def require_known(param: str, value: str, known: Sequence[str], *, otherwise: str = "") -> str:
  """Returns `value` if it is in `known`; otherwise raises `InputError`.

  The message suggests the known names that contain `value` (so "h100" finds
  "h100-pcie" and "h100-sxm"), else the closest by spelling, and lists all;
  `otherwise` ends the message (e.g. "Or give a path to a config.json.").
  """
  if value in known:
    return value
  matches = [name for name in known if value and value in name]
  matches = matches or difflib.get_close_matches(value, known, n=1)
  hint = f" Did you mean {' or '.join(repr(m) for m in matches)}?" if matches else ""
  tail = f" {otherwise}" if otherwise else ""
  raise errors.InputError(f"{param}={value!r} is unknown.{hint} Known: {', '.join(known)}.{tail}",
                          field=param)
