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


# Extensions an output may have, by kind (matplotlib writes these formats).
EXTENSIONS: dict[str, tuple[str, ...]] = {
    "json": (".json",),
    "plot": (".png", ".svg", ".pdf"),
    "text": (".md", ".txt"),
}


def check_output_path(name: str, path: str | os.PathLike[str], kind: str) -> str:
  """Checks, before any work, that `path` can take an output of `kind`.

  Refused, naming the parameter and the path: an empty path, a folder (or a
  trailing slash), a special file (device, FIFO, socket), an extension not
  in `EXTENSIONS[kind]`, a parent folder that is missing or not writable.
  Returns the path as a string.
  """
  path = os.fspath(path)
  allowed = EXTENSIONS[kind]
  where = f"{name}={path!r}"
  if not path.strip():
    raise InputError(f"{name} is empty: give a file path ending in {' or '.join(allowed)}.")
  if path.endswith(os.sep) or os.path.isdir(path):
    raise InputError(f"{where} is a folder: give a file path ending in {' or '.join(allowed)}.")
  if os.path.lexists(path) and not os.path.isfile(path):
    raise InputError(f"{where} exists and is not a regular file: it will not be replaced.")
  if os.path.splitext(path)[1].lower() not in allowed:
    raise InputError(f"{where} has an unknown extension: use {' or '.join(allowed)}.")
  parent = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(parent):
    raise InputError(f"{where}: the folder {parent!r} does not exist.")
  if not os.access(parent, os.W_OK):
    raise InputError(f"{where}: the folder {parent!r} is not writable.")
  return path


def check_distinct(paths: dict[str, str | None]) -> None:
  """Refuses two outputs that name the same file."""
  seen: dict[str, str] = {}
  for name, path in paths.items():
    if not path:
      continue
    key = os.path.realpath(path)
    if key in seen:
      raise InputError(f"{name} and {seen[key]} name the same file {path!r}: give "
                       "each output its own path.")
    seen[key] = name


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[str]:
  """Yields a temporary path beside `path`; renames it onto `path` on success.

  On an exception the temporary file is removed and `path` is left untouched.
  Only a regular file (or nothing) is ever replaced; an OS error names `path`,
  never the temporary file.
  """
  path = os.fspath(path)
  if os.path.isdir(path):
    raise InputError(f"output path {path!r} is a directory: give a file path.")
  if os.path.lexists(path) and not os.path.isfile(path):
    raise InputError(f"output path {path!r} is not a regular file: it will not be replaced.")
  directory = os.path.dirname(os.path.abspath(path))
  suffix = os.path.splitext(path)[1]  # Keeps savefig's format inference.
  try:
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=suffix)
  except OSError as e:
    raise InputError(f"output path {path!r} cannot be written: {e.strerror}.") from None
  os.close(fd)
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; outputs are ordinary files.
  try:
    yield tmp
    os.replace(tmp, path)
  except OSError as e:
    raise InputError(f"output path {path!r} cannot be written: {e.strerror or e}.") from None
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
