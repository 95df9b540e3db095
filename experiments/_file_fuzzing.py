"""Malformed input files, made field by field from valid ones, fed to the experiments.

Each file kind (`KINDS`) names a valid file we ship, the experiment and flags
that read it, and its schema. From the valid file, `cases` makes one file per
field and fault: a wrong type, the field missing, nan, inf, negative, zero,
huge, a fraction where a whole number goes; and per file: nesting beyond the
kind's bound and beyond Python's recursion, a file over the size bound, a
wrong top-level type, bytes that are not UTF-8. A case must be refused when
its file's schema refuses it (`must_refuse`); every case must keep the
contract of `experiments._fuzzing` (a clean line or a correct result; no
traceback, no nan or inf, nothing half-written, no hang), and is run and
judged the same way: one process imports the experiment once and forks a
child per case.

  python -m experiments._file_fuzzing KIND LIMIT TIMEOUT_S   # one JSON line per case
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from experiments import _fuzzing
from jaxroof import schema
from jaxroof.errors import InputError
from jaxroof.measure import vllm_result_schema
from jaxroof.specs import accelerator_schema
from jaxroof.specs.readers import config_schema

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEEP = 100  # Levels: beyond every kind's bound, within Python's JSON reader.
DEEPER = 100_000  # Levels: beyond Python's recursion limit.


@dataclasses.dataclass(frozen=True)
class FileKind:
  """A kind of input file: a valid one, who reads it, and its schema."""

  name: str
  base: str  # A valid file we ship, relative to the repository root.
  experiment: str  # The module under experiments/ that reads it.
  flag: str  # The flag that takes the file.
  args: tuple[str, ...]  # The other flags of a short valid run.
  check: Callable[[Any], None]  # Raises InputError where the schema refuses a document.
  bounds: schema.FileKind
  skip: tuple[str, ...] = ()  # Top-level fields not mutated (provenance, texts).
  oversized: bool = True  # Write a file over the size bound (not for 256 MiB bounds).
  focus: tuple[str, ...] = ()  # Fields (and below) a sample takes first: the reported faults.


def _check_config(doc: Any) -> None:
  schema.check(config_schema.CONFIG, doc, where="config")


def _check_accelerator(doc: Any) -> None:
  schema.check(accelerator_schema.FILE, doc, where="accelerator file")


def _check_vllm(doc: Any) -> None:
  vllm_result_schema.check_run(doc, "result")


KINDS: dict[str, FileKind] = {
    "model_config": FileKind(
        "model_config", "jaxroof/specs/data/models/gpt-oss-20b.json", "kv_sizing", "--model",
        ("--context=4096",), _check_config, config_schema.KIND,
        skip=("_jaxroof_source", "architectures", "rope_scaling"),
        focus=("max_position_embeddings", "quantization_config", "num_local_experts")),
    "accelerator_file": FileKind("accelerator_file", "tests/data/vllm_cpu/accelerator_pass5.json",
                                 "iteration", "--accelerator_file",
                                 ("--model=llama-3-8b", "--decode_rows=8", "--decode_context=1024"),
                                 _check_accelerator, accelerator_schema.KIND,
                                 skip=("sources", "measured")),
    "accelerator_links":  # A datasheet entry with every link figure, at tp=8.
        FileKind(
            "accelerator_links", "jaxroof/specs/data/accelerators.json#h100-sxm", "iteration",
            "--accelerator_file", ("--model=llama-3-8b", "--decode_rows=8", "--tp=8"),
            _check_accelerator, accelerator_schema.KIND, skip=("sources", "decisions"),
            focus=("scale_up.unidirectional_gb_s", "hop_latency.value_us",
                   "scale_out.per_chip_unidirectional_gb_s")),
    "vllm_result": FileKind("vllm_result", "tests/data/vllm_cpu_detailed_fixture.json", "calibrate",
                            "--from_vllm",
                            ("--source=vllm", "--model=tinyllama-1.1b", "--accelerator=h100-sxm",
                             "--search=max_simulations=10"), _check_vllm, vllm_result_schema.KIND,
                            skip=("_source", "generated_texts", "errors", "date"), oversized=False,
                            focus=("itls", "input_lens[0]", "completed")),
}


@dataclasses.dataclass(frozen=True)
class FileCase:
  """One malformed file: its id (`kind:path:fault`), its bytes, whether it must be refused."""

  kind: str
  path: str  # The JSON path mutated ("" for the whole file).
  fault: str
  data: bytes
  must_refuse: bool

  @property
  def id(self) -> str:
    return f"{self.kind}:{self.path or '<file>'}:{self.fault}"


def base_document(kind: FileKind) -> dict[str, Any]:
  """The valid file a kind's cases are made from (`path#slug`: one entry of a table)."""
  path, _, slug = kind.base.partition("#")
  with open(os.path.join(_ROOT, path), encoding="utf-8") as f:
    doc = json.load(f)
  return doc["accelerators"][slug] if slug else doc


def _faults(value: Any) -> Iterator[tuple[str, Any]]:
  """(fault, replacement) for one value, from its type."""
  if isinstance(value, bool):
    yield "type", "yes"
    return
  if isinstance(value, (int, float)):
    yield "type", str(value)
    yield "nan", math.nan
    yield "inf", math.inf
    yield "negative", -abs(value) if value else -1
    yield "zero", 0
    yield "huge", 1e30
    if isinstance(value, int):
      yield "fraction", value + 0.5
      yield "huge_int", 10**400
    return
  if isinstance(value, str):
    yield "type", 7
    return
  if isinstance(value, list):
    yield "type", {"a": 1}
    if value and isinstance(value[0], list):
      yield "flat", [v[0] if v else 0 for v in value]  # `itls` as a flat list.
    return
  if isinstance(value, dict):
    yield "type", [1]


def _paths(doc: Any, skip: tuple[str, ...], prefix: tuple = ()) -> Iterator[tuple]:
  """Paths to mutate: every field, the first item of a list, two levels of objects below."""
  if isinstance(doc, dict):
    for key, value in doc.items():
      if not prefix and key in skip:
        continue
      yield prefix + (key,)
      if len(prefix) < 3:
        yield from _paths(value, skip, prefix + (key,))
  elif isinstance(doc, list) and doc:
    yield prefix + (0,)
    if len(prefix) < 3:
      yield from _paths(doc[0], skip, prefix + (0,))


def _replace(doc: Any, path: tuple, value: Any) -> Any:
  """A copy of `doc` with the value at `path` replaced (`_DELETE`: removed)."""
  if not path:
    return value
  head, rest = path[0], path[1:]
  copy = dict(doc) if isinstance(doc, dict) else list(doc)
  if not rest and value is _DELETE:
    del copy[head]
  else:
    copy[head] = _replace(doc[head], rest, value)
  return copy


_DELETE = object()


def _get(doc: Any, path: tuple) -> Any:
  for part in path:
    doc = doc[part]
  return doc


def _refused(kind: FileKind, doc: Any) -> bool:
  try:
    kind.check(doc)
  except InputError:
    return True
  return False


def cases(name: str) -> list[FileCase]:
  """Every case of one kind, in a stable order (ids are stable across runs)."""
  kind = KINDS[name]
  doc = base_document(kind)
  out = []
  for path in _paths(doc, kind.skip):
    where = schema.path_text(path)
    value = _get(doc, path)
    variants = list(_faults(value))
    if isinstance(path[-1], str):
      variants.append(("missing", _DELETE))
    for fault, replacement in variants:
      mutated = _replace(doc, path, replacement)
      out.append(FileCase(name, where, fault,
                          json.dumps(mutated).encode(), _refused(kind, mutated)))
  text = json.dumps(doc)
  whole = [
      ("valid", text.encode()),  # The base itself: must run (a stale flag fails here).
      ("top_list", json.dumps([doc]).encode()),
      ("top_number", b"42"),
      ("top_string", b'"config"'),
      ("not_utf8", b"\xff\xfe" + text.encode()),
      ("not_json", text[:len(text) // 2].encode()),
      ("deep", (text[:-1] + ', "_fuzz": ' + "[" * DEEP + "]" * DEEP + "}").encode()),
      ("deeper", (text[:-1] + ', "_fuzz": ' + "[" * DEEPER + "]" * DEEPER + "}").encode()),
  ]
  if kind.oversized:
    pad = kind.bounds.max_bytes + 1 - len(text)
    whole.append(("oversized", (text[:-1] + " " * max(pad, 0) + "}").encode()))
  out += [FileCase(name, "", fault, data, fault != "valid") for fault, data in whole]
  return out


def _in_focus(case: FileCase, focus: tuple[str, ...]) -> bool:
  return any(case.path == f or case.path.startswith((f"{f}.", f"{f}[")) for f in focus)


def sample(name: str, limit: int | None) -> list[FileCase]:
  """At most `limit` cases of a kind (deterministic): the whole-file faults, the
  focus fields' faults, then the other faults in turn, each over spread fields."""
  every = cases(name)
  if not limit or limit >= len(every):
    return every
  groups = [[c for c in every if c.path and _in_focus(c, (f,))] for f in KINDS[name].focus]
  picked = [c for c in every if not c.path]
  picked += [g[i] for i in range(len(every)) for g in groups if i < len(g)]  # In turn.
  by_fault: dict[str, list[FileCase]] = {}
  for case in every:
    if case not in picked:
      by_fault.setdefault(case.fault, []).append(case)
  for round_ in range(len(every)):
    for offset, group in enumerate(by_fault.values()):
      if round_ < len(group):
        picked.append(group[(round_ * 5 + offset * 3) % len(group)])
    if len(dict.fromkeys(picked)) >= limit:
      break
  return sorted(list(dict.fromkeys(picked))[:limit], key=every.index)


def run(name: str, limit: int | None, timeout_s: float) -> Iterator[dict[str, Any]]:
  """Runs a kind's cases (each file written, then the experiment forked on it);
  yields each outcome as `_fuzzing` writes it, with the case's `id`."""
  import importlib

  kind = KINDS[name]
  module_name = f"experiments.{kind.experiment}"
  importlib.import_module(module_name)
  with tempfile.TemporaryDirectory(prefix="file-fuzz-") as folder:
    for i, case in enumerate(sample(name, limit)):
      path = os.path.join(folder, f"case{i}.json")
      with open(path, "wb") as f:
        f.write(case.data)
      args = (*kind.args, f"{kind.flag}={path}")
      flag_case = _fuzzing.Case(f"file:{name}", args, case.must_refuse, case.fault)
      outcome = _fuzzing.run_case(module_name, flag_case, timeout_s).to_json()
      os.remove(path)
      yield {**outcome, "id": case.id, "args": [kind.flag + "=" + case.id]}


def main(argv: list[str]) -> None:
  """Worker: `python -m experiments._file_fuzzing KIND LIMIT TIMEOUT_S` prints one
  JSON outcome per line (one kind per process: absl flags are global)."""
  name, limit, timeout_s = argv[1], int(argv[2]), float(argv[3])
  for outcome in run(name, limit or None, timeout_s):
    print(json.dumps(outcome), flush=True)


if __name__ == "__main__":
  main(sys.argv)
