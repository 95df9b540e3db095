"""Progress bars for long runs: tqdm on stderr with the time left, or nothing.

A bar shows only when stderr is a terminal, the caller has not turned it off
(the experiments pass their progress switch as `requested`) and the environment
variable `JAXROOF_NO_PROGRESS` is unset or empty, so tests, pipes and logs stay
clean. The bar's `[elapsed<remaining]` field is tqdm's estimate of the time
left, from the mean rate so far.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any, TextIO

import tqdm

ENV_OFF = "JAXROOF_NO_PROGRESS"


def enabled(requested: bool = True, stream: TextIO | None = None) -> bool:
  """Whether a bar would show: requested, not turned off by env, on a terminal."""
  stream = sys.stderr if stream is None else stream
  if not requested or os.environ.get(ENV_OFF):
    return False
  isatty = getattr(stream, "isatty", None)
  return bool(isatty and isatty())


def bar(iterable: Iterable[Any] | None = None, *, desc: str, total: int | None = None,
        unit: str = "it", requested: bool = True, stream: TextIO | None = None) -> tqdm.tqdm:
  """A tqdm bar over `iterable` (or a manual one with `total`), silent when not `enabled`.

  The bar is cleared when done (`leave=False`): the run's own output follows.
  """
  stream = sys.stderr if stream is None else stream
  return tqdm.tqdm(iterable, desc=desc, total=total, unit=unit, leave=False, file=stream,
                   disable=not enabled(requested, stream), dynamic_ncols=True)
