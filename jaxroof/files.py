"""Atomic output: a reader never sees a half-written JSON file or plot."""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Iterator
from typing import Any

from jaxroof.errors import InputError


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[str]:
  """Yields a temporary path beside `path`; renames it onto `path` on success.

  On an exception the temporary file is removed and `path` is left untouched.
  """
  path = os.fspath(path)
  if os.path.isdir(path):
    raise InputError(f"output path {path!r} is a directory: give a file path.")
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  suffix = os.path.splitext(path)[1]  # Keeps savefig's format inference.
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=suffix)
  os.close(fd)
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; outputs are ordinary files.
  try:
    yield tmp
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def to_jsonable(obj: Any) -> Any:
  """Converts numpy scalars/arrays and non-finite floats (-> None) for JSON."""
  if isinstance(obj, dict):
    return {str(k): to_jsonable(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [to_jsonable(v) for v in obj]
  if hasattr(obj, "tolist"):  # numpy / jax arrays and scalars.
    return to_jsonable(obj.tolist())
  if isinstance(obj, float) and not math.isfinite(obj):
    return None
  return obj


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
  """Writes `obj` as indented JSON atomically; non-finite floats become null."""
  text = json.dumps(to_jsonable(obj), indent=2, allow_nan=False)
  with atomic_path(path) as tmp:
    with open(tmp, "w", encoding="utf-8") as f:
      f.write(text + "\n")


def write_text(path: str | os.PathLike[str], text: str) -> None:
  """Writes a text file atomically."""
  with atomic_path(path) as tmp:
    with open(tmp, "w", encoding="utf-8") as f:
      f.write(text)
