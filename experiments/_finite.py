"""No non-finite result exits 0: the guard every experiment runs under.

`install()`, called by `_cli.run` before an experiment's `main`, makes a
printed nan or inf (a number formatted as `nan`, `inf`, `-inf`, `nan%`) stop
the run instead of passing: the error line quotes the printed line, which is
not printed. It raises `errors.NonFiniteResult`, an `InputError`: `_cli.run`
prints it as one `error:` line and exits 2. Words that contain the letters
(`infinite`, `nanoseconds`, `info`) are not numbers and pass. A benchmark run
at a request rate of inf is labelled "all at once", never "rate inf".

The JSON a run writes is guarded the same way (`STRICT_JSON`, on:
`files.require_finite_json`): a document holding nan or inf is refused,
naming its field, e.g. `fit.factors.eta_w`, and is not written. A value
that is undefined on purpose (a calibrated sweep's rate limit with no FLOP
rate) is written as None (JSON null), never as nan.
"""

from __future__ import annotations

import re
import sys
from typing import Any, TextIO

from jaxroof import files
from jaxroof.errors import NonFiniteResult

# A printed non-finite number: the token alone, as Python formats one.
# A name such as `inf.json` is not a number: a dot before a word character continues it.
NONFINITE = re.compile(r"(?<![\w.])[-+]?(nan|inf|infinity)(?![\w])(?!\.\w)", re.IGNORECASE)


def nonfinite_in(text: str) -> str | None:
  """The first line of `text` that prints a nan or inf, or None."""
  if not NONFINITE.search(text):
    return None
  return next(line for line in text.splitlines() or [text] if NONFINITE.search(line))


class _FiniteOut:
  """A text stream that refuses to print a non-finite number (see the module)."""

  def __init__(self, stream: TextIO):
    self._stream = stream

  def write(self, text: str) -> int:
    line = nonfinite_in(text) if isinstance(text, str) else None
    if line is not None:
      shown = line.strip()
      shown = shown if len(shown) <= 120 else f"{shown[:100]}...{shown[-15:]}"
      raise NonFiniteResult(f"the result is not a finite number: it would print "
                            f"{NONFINITE.search(line).group(0)!r} in {shown!r}.")
    return self._stream.write(text)

  def __getattr__(self, name: str) -> Any:
    return getattr(self._stream, name)


STRICT_JSON = True  # See the module docstring.


def install(strict_json: bool | None = None) -> None:
  """Guards this process's standard output, and its JSON results where
  `strict_json` (default `STRICT_JSON`) is on (idempotent)."""
  if STRICT_JSON if strict_json is None else strict_json:
    files.require_finite_json(True)
  if not isinstance(sys.stdout, _FiniteOut):
    sys.stdout = _FiniteOut(sys.stdout)
