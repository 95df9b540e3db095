"""Safe input and atomic output.

Every input file is read through `read_input`/`read_text` (a FIFO, socket or
device is refused before it is opened, and a read is bounded); every output is
written atomically, so a reader never sees a half-written JSON file or plot.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import stat
import tempfile
from collections.abc import Iterator, Sequence
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
    raise InputError(f"{name} is empty: give a file path ending in {' or '.join(allowed)}.",
                     field=name)
  if path.endswith(os.sep) or os.path.isdir(path):
    raise InputError(f"{where} is a folder: give a file path ending in {' or '.join(allowed)}.",
                     field=name)
  if os.path.lexists(path) and not os.path.isfile(path):
    raise InputError(f"{where} exists and is not a regular file: it will not be replaced.",
                     field=name)
  if os.path.splitext(path)[1].lower() not in allowed:
    raise InputError(f"{where} has an unknown extension: use {' or '.join(allowed)}.", field=name)
  parent = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(parent):
    above = _file_above(parent)
    if above is not None:
      raise InputError(f"{where}: {above!r} is a file, not a folder: give a path in a "
                       "folder.", field=name)
    raise InputError(f"{where}: the folder {parent!r} does not exist.", field=name)
  if not os.access(parent, os.W_OK):
    raise InputError(f"{where}: the folder {parent!r} is not writable.", field=name)
  return path


def _file_above(folder: str) -> str | None:
  """The nearest existing path at or above `folder`, if it is not a folder."""
  while folder and not os.path.lexists(folder):
    up = os.path.dirname(folder)
    if up == folder:
      return None
    folder = up
  return folder if folder and os.path.lexists(folder) and not os.path.isdir(folder) else None


# Bound on an input file read whole (configs, profiles, CSV/JSONL measurements,
# traces, benchmark results): far above any real one, so a wrong file is refused
# instead of filling memory.
MAX_INPUT_BYTES = 256 * 2**20


def read_input(name: str, path: str | os.PathLike[str], *,
               max_bytes: int = MAX_INPUT_BYTES) -> bytes:
  """The bytes of a user's input file, read without blocking and with a bound.

  The file's kind is checked before it is opened: a folder, a FIFO, a socket
  or a device is refused (a FIFO nobody writes would block the read forever).
  It is opened non-blocking and checked again (the path may have changed), and
  at most `max_bytes` are read. Every failure is an `InputError` naming
  `name` and the path.
  """
  path = os.fspath(path)
  where = f"{name}={path!r}"
  if not path.strip():
    raise InputError(f"{name} is empty: give a path to a file.", field=name)
  try:
    info = os.stat(path)
  except (FileNotFoundError, NotADirectoryError):
    above = _file_above(os.path.dirname(os.path.abspath(path)))
    if above is not None:
      raise InputError(f"{where} does not exist: {above!r} is a file, not a folder.",
                       field=name) from None
    raise InputError(f"{where} does not exist.", field=name) from None
  except OSError as e:
    raise InputError(f"{where} cannot be read: {e.strerror or e}.", field=name) from None
  _require_regular(name, where, info.st_mode)
  if info.st_size > max_bytes:
    raise InputError(
        f"{where} is {info.st_size:,} bytes, over the {max_bytes:,}-byte "
        "limit for this input: give the right file.", field=name)
  flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
  try:
    fd = os.open(path, flags)
  except OSError as e:
    raise InputError(f"{where} cannot be read: {e.strerror or e}.", field=name) from None
  try:
    _require_regular(name, where, os.fstat(fd).st_mode)
    chunks, size = [], 0
    while size <= max_bytes:
      chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
      if not chunk:
        break
      chunks.append(chunk)
      size += len(chunk)
  except OSError as e:
    raise InputError(f"{where} cannot be read: {e.strerror or e}.", field=name) from None
  finally:
    os.close(fd)
  if size > max_bytes:
    raise InputError(
        f"{where} is over the {max_bytes:,}-byte limit for this input: give "
        "the right file.", field=name)
  return b"".join(chunks)


def _require_regular(name: str, where: str, mode: int) -> None:
  if stat.S_ISDIR(mode):
    raise InputError(f"{where} is a folder: give a file.", field=name)
  if not stat.S_ISREG(mode):
    kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a file")
    raise InputError(f"{where} is {kind}, not a regular file: give a file.", field=name)


def read_text(name: str, path: str | os.PathLike[str], *, max_bytes: int = MAX_INPUT_BYTES) -> str:
  """`read_input` decoded as UTF-8 (a BOM is dropped); not UTF-8 is an `InputError`."""
  data = read_input(name, path, max_bytes=max_bytes)
  try:
    return data.decode("utf-8-sig")
  except UnicodeDecodeError as e:
    raise InputError(
        f"{name}={os.fspath(path)!r} is not UTF-8 text (byte {e.start}): give "
        "a text file.", field=name) from None


def read_json(name: str, path: str | os.PathLike[str], *, max_bytes: int = MAX_INPUT_BYTES) -> Any:
  """A JSON input file, parsed (Python's reader); malformed JSON is an `InputError`."""
  text = read_text(name, path, max_bytes=max_bytes)
  where = f"{name}={os.fspath(path)!r}"
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    raise InputError(
        f"{where} is not valid JSON: {e.msg} at line {e.lineno}, column "
        f"{e.colno}.", field=name) from None
  except RecursionError:
    raise InputError(f"{where} is nested too deeply to be read.", field=name) from None


def read_records(
    name: str, path: str | os.PathLike[str], *, columns: Sequence[str],
    required: Sequence[str] = (), json_suffixes: Sequence[str] = (".jsonl",)
) -> list[tuple[int, dict[str, Any]]]:
  """(line, record) pairs of a table: JSONL (one object per line, by its suffix) or CSV.

  A CSV's header is line 1 and must name `required`; one without a header is
  refused naming `columns`. Blank JSONL lines are skipped. Errors name the
  parameter, the file and the line.
  """
  path = os.fspath(path)
  text = read_text(name, path)
  where = f"{name}={path!r}"
  if path.endswith(tuple(json_suffixes)):
    out = []
    for line, chunk in enumerate(text.splitlines(), start=1):
      if not chunk.strip():
        continue
      try:
        record = json.loads(chunk)
      except json.JSONDecodeError as e:
        raise InputError(f"{where} line {line}: not valid JSON ({e.msg}).", field=name) from None
      if not isinstance(record, dict):
        raise InputError(f"{where} line {line}: not a JSON object.", field=name)
      out.append((line, record))
    return out
  try:
    with io.StringIO(text, newline="") as f:
      reader = csv.DictReader(f)
      if not reader.fieldnames:
        raise InputError(f"{where} line 1: no header row; columns: {', '.join(columns)}.",
                         field=name)
      missing = [c for c in required if c not in reader.fieldnames]
      if missing:
        raise InputError(
            f"{where} line 1: the header lacks columns {missing} (needs "
            f"{list(required)}).", field=name)
      # Line numbers count the header as line 1 (rows without embedded newlines).
      return [
          (reader.line_num, {k: v for k, v in record.items() if k is not None}) for record in reader
      ]
  except csv.Error as e:
    raise InputError(f"{where} is not readable CSV: {e}.", field=name) from None


def check_distinct(paths: dict[str, str | None]) -> None:
  """Refuses two outputs that name the same file."""
  seen: dict[str, str] = {}
  for name, path in paths.items():
    if not path:
      continue
    key = os.path.realpath(path)
    if key in seen:
      raise InputError(
          f"{name} and {seen[key]} name the same file {path!r}: give "
          "each output its own path.", field=name)
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
