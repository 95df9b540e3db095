"""Safe input and atomic output.

Every input file is read through `read_input`/`read_text` (a FIFO, socket or
device is refused before it is opened, and a read is bounded; `read_json`
bounds the nesting too); every output is written atomically, so a reader
never sees a half-written JSON file or plot.

Outputs are checked before any work: `check_output_path` (a file of a kind,
with its siblings, e.g. `sim_kv.png` beside `sim.png`), `check_output_folder`
(a folder to create or fill) and `check_outputs` (a set of them at once, each
its own path). Each is probed by creating and removing a file where the output
will go, and a full disk is refused. `atomic_paths` writes a file and its
siblings all or none; `output_folder` removes a folder it created when the
work fails. `require_finite_json` makes `write_json` refuse nan and inf
(`errors.NonFiniteResult`, naming the field) instead of writing null.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from jaxroof.errors import InputError, NonFiniteResult

# Extensions an output may have, by kind (matplotlib writes these formats).
EXTENSIONS: dict[str, tuple[str, ...]] = {
    "json": (".json",),
    "plot": (".png", ".svg", ".pdf"),
    "text": (".md", ".txt"),
    "rows": (".csv", ".jsonl"),
}
FOLDER = "folder"  # The kind of a folder output in `check_outputs`.
# Free space below which an output's folder is refused before the work (a full
# disk would otherwise fail only at the end).
MIN_FREE_BYTES = 1 << 20


def sibling_path(path: str | os.PathLike[str], suffix: str) -> str:
  """A file written beside `path`: `sibling_path("a/sim.png", "_kv")` is `a/sim_kv.png`."""
  stem, ext = os.path.splitext(os.fspath(path))
  return f"{stem}{suffix}{ext}"


def check_output_path(name: str, path: str | os.PathLike[str], kind: str, *,
                      siblings: Sequence[str] = (), min_free_bytes: int = MIN_FREE_BYTES) -> str:
  """Checks, before any work, that `path` can take an output of `kind`.

  Refused, naming the parameter and the path: an empty path, a folder (or a
  trailing slash), a special file (device, FIFO, socket), an extension not
  in `EXTENSIONS[kind]`, a parent folder that is missing, not writable (a
  file is created and removed there to know) or full. `siblings` are the
  suffixes of files written beside it (`sibling_path`), each checked as a
  file. Returns the path as a string.
  """
  path = _check_output_file(name, path, kind)
  parent = os.path.dirname(os.path.abspath(path))
  where = f"{name}={path!r}"
  _probe(name, where, parent)
  _require_space(name, where, parent, min_free_bytes)
  for suffix in siblings:
    _check_output_file(name, sibling_path(path, suffix), kind)
  return path


def _check_output_file(name: str, path: str | os.PathLike[str], kind: str) -> str:
  """The checks of one output file that need no write."""
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
  return path


def check_output_folder(name: str, path: str | os.PathLike[str], *,
                        min_free_bytes: int = MIN_FREE_BYTES) -> str:
  """Checks, before any work, that `path` can be (or be made) a folder of outputs.

  Refused, naming the parameter: an empty path, an existing path that is
  not a folder (a regular file, a FIFO), a missing folder below a file, a
  folder that cannot be written (a file is created and removed in it, or
  in the nearest existing folder above a missing one) or that is full.
  Nothing is created. Returns the path as a string.
  """
  path = os.fspath(path)
  where = f"{name}={path!r}"
  if not path.strip():
    raise InputError(f"{name} is empty: give a folder.", field=name)
  if os.path.lexists(path) and not os.path.isdir(path):
    what = "a file" if os.path.isfile(path) else "not a folder"
    raise InputError(f"{where} is {what}: give a folder (it is created if missing).", field=name)
  existing = os.path.abspath(path)
  while not os.path.lexists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise InputError(f"{where}: {existing!r} is a file, not a folder: give a path in a folder.",
                     field=name)
  _probe(name, where, existing)
  _require_space(name, where, existing, min_free_bytes)
  return path


def check_outputs(outputs: Mapping[str, tuple[str | os.PathLike[str] | None, str]], *,
                  siblings: Mapping[str, Sequence[str]] | None = None) -> dict[str, str]:
  """Checks a set of outputs at once, before any work: each one as its kind
  (`EXTENSIONS`' kinds, or `FOLDER`), and no two naming the same path (a
  file's `siblings` included: a rows output equal to a JSON output, a plot's
  `_kv` sibling equal to another output, a file equal to a folder).

  Args:
    outputs: parameter -> (path or None when not given, kind).
    siblings: parameter -> suffixes of the files written beside it.

  Returns:
    parameter -> path, for the outputs given.
  """
  siblings = siblings or {}
  given: dict[str, str] = {}
  named: dict[str, str] = {}
  for name, (path, kind) in outputs.items():
    if path is None:
      continue
    if kind == FOLDER:
      given[name] = check_output_folder(name, path)
    else:
      given[name] = check_output_path(name, path, kind, siblings=siblings.get(name, ()))
    named[name] = given[name]
    for suffix in siblings.get(name, ()):
      named[f"{name} ({suffix} beside it)"] = sibling_path(given[name], suffix)
  check_distinct(named)
  return given


def _probe(name: str, where: str, folder: str) -> None:
  """Creates and removes a file in `folder`: the one sure test that it takes outputs."""
  try:
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-probe-")
  except OSError as e:
    raise InputError(f"{where}: the folder {folder!r} is not writable: {e.strerror or e}.",
                     field=name) from None
  os.close(fd)
  os.remove(tmp)


def _require_space(name: str, where: str, folder: str, min_free_bytes: int) -> None:
  if min_free_bytes <= 0:
    return
  try:
    info = os.statvfs(folder)
  except (OSError, AttributeError):  # No statvfs (Windows): the write will say.
    return
  blocks = info.f_bfree if hasattr(os, "geteuid") and os.geteuid() == 0 else info.f_bavail
  free = blocks * info.f_frsize
  if free < min_free_bytes:
    raise InputError(
        f"{where}: the folder {folder!r} has {free:,} bytes free, under the "
        f"{min_free_bytes:,} an output needs: free some space or give another path.", field=name)


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


# Bound on the nesting of a JSON input (objects and lists): real files of ours
# nest a few levels; a deeper one is wrong or hostile.
MAX_JSON_DEPTH = 64


def read_json(name: str, path: str | os.PathLike[str], *, max_bytes: int = MAX_INPUT_BYTES,
              max_depth: int = MAX_JSON_DEPTH) -> Any:
  """A JSON input file, parsed (Python's reader); malformed JSON, or JSON nested
  deeper than `max_depth`, is an `InputError`."""
  text = read_text(name, path, max_bytes=max_bytes)
  return parse_json(name, os.fspath(path), text, max_depth=max_depth)


def parse_json(name: str, path: str, text: str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
  """`text` (the file `path` given by parameter `name`) parsed as JSON, its nesting
  bounded by `max_depth`; every way it can fail is one `InputError`."""
  where = f"{name}={path!r}"
  try:
    data = json.loads(text)
  except json.JSONDecodeError as e:
    raise InputError(
        f"{where} is not valid JSON: {e.msg} at line {e.lineno}, column "
        f"{e.colno}.", field=name) from None
  except RecursionError:
    raise InputError(f"{where} is nested too deeply to be read.", field=name) from None
  except ValueError as e:  # E.g. an integer of over 4,300 digits.
    raise InputError(f"{where} cannot be read as JSON: {str(e).splitlines()[0][:120]}.",
                     field=name) from None
  deepest = json_depth(data, max_depth)
  if deepest > max_depth:
    raise InputError(
        f"{where} is nested over {max_depth} levels deep (objects and lists), "
        "deeper than this input can be: give the right file.", field=name)
  return data


def json_depth(value: Any, limit: int) -> int:
  """Nesting depth of a parsed JSON value (a scalar: 0), counted up to `limit` + 1."""
  deepest, stack = 0, [(value, 0)]
  while stack:
    node, level = stack.pop()
    if isinstance(node, (dict, list)):
      level += 1
      if level > deepest:
        deepest = level
        if deepest > limit:
          return deepest
      stack.extend((v, level) for v in (node.values() if isinstance(node, dict) else node))
  return deepest


def json_path(parts: Sequence[str | int]) -> str:
  """A JSON path as messages write it: `scale_up.unidirectional_gb_s`, `itls[3][0]`."""
  out = ""
  for part in parts:
    if isinstance(part, int):
      out += f"[{part}]"
    elif re.fullmatch(r"[A-Za-z_][\w\-]*", part):
      out += f".{part}" if out else part
    else:
      out += f"[{part!r}]"
  return out


def read_records(name: str, path: str | os.PathLike[str], *, columns: Sequence[str],
                 required: Sequence[str] = (), json_suffixes: Sequence[str] = (".jsonl",),
                 max_rows: int | None = None,
                 max_depth: int = MAX_JSON_DEPTH) -> list[tuple[int, dict[str, Any]]]:
  """(line, record) pairs of a table: JSONL (one object per line, by its suffix) or CSV.

  A CSV's header is line 1 and must name `required`; one without a header is
  refused naming `columns`. Blank JSONL lines are skipped; each line's nesting
  is bounded by `max_depth`. A table of more than `max_rows` rows is refused
  before any row is returned. Errors name the parameter, the file and the line.
  """
  path = os.fspath(path)
  text = read_text(name, path)
  where = f"{name}={path!r}"

  def too_many(line: int) -> InputError:
    return InputError(
        f"{where} holds more than {max_rows:,} rows (line {line}): give at most "
        f"{max_rows:,} rows per file (split it, or keep the rows a fit needs).", field=name)

  if path.endswith(tuple(json_suffixes)):
    out = []
    for line, chunk in enumerate(text.splitlines(), start=1):
      if not chunk.strip():
        continue
      if max_rows is not None and len(out) == max_rows:
        raise too_many(line)
      try:
        record = json.loads(chunk)
      except json.JSONDecodeError as e:
        raise InputError(f"{where} line {line}: not valid JSON ({e.msg}).", field=name) from None
      except (RecursionError, ValueError):  # Nested past the stack; a 4,300-digit integer.
        record = None
      if record is None or json_depth(record, max_depth) > max_depth:
        raise InputError(
            f"{where} line {line}: not one JSON object of at most {max_depth} levels "
            "(objects and lists) with readable values.", field=name)
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
      rows = []
      for record in reader:
        if max_rows is not None and len(rows) == max_rows:
          raise too_many(reader.line_num)
        rows.append((reader.line_num, {k: v for k, v in record.items() if k is not None}))
      return rows
  except csv.Error as e:
    raise InputError(f"{where} is not readable CSV: {e}.", field=name) from None


def check_distinct(paths: Mapping[str, str | None]) -> None:
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


def _new_temp(path: str) -> str:
  """A new empty temporary file beside `path` (same folder, same extension, so
  a plot's format is inferred), with an ordinary file's permissions."""
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
  return tmp


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[str]:
  """Yields a temporary path beside `path`; renames it onto `path` on success.

  On an exception the temporary file is removed and `path` is left untouched.
  Only a regular file (or nothing) is ever replaced; an OS error names `path`,
  never the temporary file.
  """
  with atomic_paths([path]) as (tmp,):
    yield tmp


@contextlib.contextmanager
def atomic_paths(paths: Sequence[str | os.PathLike[str]]) -> Iterator[list[str]]:
  """`atomic_path` for a file and its siblings (a plot and its `_kv.png`): yields
  one temporary path for each; all are renamed into place only when every one
  was written, so on any failure none is, and no temporary file is left."""
  paths = [os.fspath(p) for p in paths]
  temps: list[str] = []
  current = ""
  try:
    for current in paths:
      temps.append(_new_temp(current))
    current = "' and '".join(paths)
    yield list(temps)
    for tmp, current in zip(temps, paths):
      os.replace(tmp, current)
  except OSError as e:
    raise InputError(f"output path '{current}' cannot be written: {e.strerror or e}.") from None
  finally:
    for tmp in temps:
      if os.path.exists(tmp):
        os.remove(tmp)


@contextlib.contextmanager
def output_folder(name: str, path: str | os.PathLike[str]) -> Iterator[str]:
  """Creates the folder `path` (and missing folders above it) for the work
  inside the block; if the work fails, the folders this call created are
  removed with what was written in them (a folder that existed is kept)."""
  path = os.fspath(path)
  created = None
  folder = os.path.abspath(path)
  while not os.path.lexists(folder):
    created, folder = folder, os.path.dirname(folder)
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise InputError(f"{name}={path!r} cannot be created: {e.strerror or e}.", field=name) from None
  try:
    yield path
  except BaseException:
    if created is not None:
      shutil.rmtree(created, ignore_errors=True)
    raise


_FINITE_JSON = False  # `write_json` refuses nan and inf (see `require_finite_json`).


def require_finite_json(on: bool = True) -> None:
  """From now on, `write_json` refuses a document holding nan or inf (a
  `NonFiniteResult` naming its field) instead of writing null. The
  experiments turn this on for their whole run (`experiments/_finite.py`)."""
  global _FINITE_JSON
  _FINITE_JSON = on


def nonfinite_at(obj: Any) -> tuple[str, float] | None:
  """(JSON path, value) of the first nan or inf in `obj` (dicts, lists, numpy
  arrays and scalars), or None."""
  stack: list[tuple[Any, tuple]] = [(obj, ())]
  while stack:
    node, path = stack.pop()
    if hasattr(node, "tolist") and not isinstance(node, (str, bytes)):
      node = node.tolist()
    if isinstance(node, float):
      if not math.isfinite(node):
        return json_path(path) or "(the whole result)", node
    elif isinstance(node, dict):
      stack.extend((v, path + (str(k),)) for k, v in reversed(list(node.items())))
    elif isinstance(node, (list, tuple)):
      stack.extend((v, path + (i,)) for i, v in reversed(list(enumerate(node))))
  return None


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
  """Writes `obj` as indented JSON atomically; non-finite floats become null,
  or are refused after `require_finite_json()`."""
  if _FINITE_JSON:
    found = nonfinite_at(obj)
    if found:
      raise NonFiniteResult(f"the result holds {found[1]} at {found[0]}, not a finite number: "
                            f"{os.fspath(path)!r} not written.")
  text = json.dumps(to_jsonable(obj), indent=2, allow_nan=False)
  with atomic_path(path) as tmp:
    with open(tmp, "w", encoding="utf-8") as f:
      f.write(text + "\n")


def write_text(path: str | os.PathLike[str], text: str) -> None:
  """Writes a text file atomically."""
  with atomic_path(path) as tmp:
    with open(tmp, "w", encoding="utf-8") as f:
      f.write(text)
