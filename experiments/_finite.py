"""No non-finite result exits 0: the guard every experiment runs under.

`install()`, called by `_cli.run` before an experiment's `main`, makes two
things stop the run instead of passing:

- a JSON document holding nan or inf (`files.write_json` after
  `files.require_finite_json()`): the line names its field, e.g.
  `fit.factors.eta_w`, and the file is not written (null was written before);
- a printed nan or inf (a number formatted as `nan`, `inf`, `-inf`, `nan%`):
  the line quotes the printed line, which is not printed.

Both raise `errors.NonFiniteResult`, an `InputError`: `_cli.run` prints it as
one `error:` line and exits 2. Words that contain the letters (`infinite`,
`nanoseconds`, `info`) are not numbers and pass, and so does a request rate
of inf (a benchmark's setting, `rate inf`).
"""

from __future__ import annotations

import re
import sys
from typing import Any, TextIO

from jaxroof import files
from jaxroof.errors import NonFiniteResult

# A printed non-finite number: the token alone, as Python formats one. A request
# rate of inf (vLLM's `--request-rate inf`: every request at once) is a setting
# read from a file, not a result, and passes ("rate inf", "rate=inf").
NONFINITE = re.compile(r"(?<![\w.])(?<!rate )(?<!rate=)[-+]?(nan|inf|infinity)(?![\w])",
                       re.IGNORECASE)


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


def install() -> None:
  """Guards this process's JSON results and standard output (idempotent)."""
  files.require_finite_json(True)
  if not isinstance(sys.stdout, _FiniteOut):
    sys.stdout = _FiniteOut(sys.stdout)
