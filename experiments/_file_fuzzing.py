"""Malformed input files, made field by field from valid ones, fed to the experiments.

Each file kind (`KINDS`) names a valid file we ship, the experiment and flags
that read it, and its schema. From the valid file, `cases` makes one file per
field and fault: a wrong type, the field missing, nan, inf, negative, zero,
huge, a fraction where a whole number goes; and per file: the valid file
itself (which must run: a stale flag in a kind shows there), nesting beyond the
kind's bound and beyond Python's recursion, a file over the size bound, a
wrong top-level type, bytes that are not UTF-8. A table (measurements as CSV
or JSONL) is mutated cell by cell in `table_rows`, and as a whole: a header
only, more rows than its limit, a JSONL line nested past recursion, a line
that is not JSON. A case must be refused when
its file's schema refuses it (`must_refuse`); every case must keep the
contract of `experiments._fuzzing` (a clean line or a correct result; no
traceback, no nan or inf, nothing half-written, no hang), and is run and
judged the same way: one process imports the experiment once and forks a
child per case.

  python -m experiments._file_fuzzing KIND LIMIT TIMEOUT_S   # one JSON line per case
"""

from __future__ import annotations

import csv
import dataclasses
import io
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
from jaxroof.measure import engine_terms_schema
from jaxroof.measure import profile_schema
from jaxroof.measure import user_measurements
from jaxroof.measure import vllm_result_schema
from jaxroof.serving import arrivals
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
  bounds: schema.FileKind | None  # Size and nesting (None: a table's own bounds).
  skip: tuple[str, ...] = ()  # Top-level fields not mutated (provenance, texts).
  oversized: bool = True  # Write a file over the size bound (not for 256 MiB bounds).
  focus: tuple[str, ...] = ()  # Fields (and below) a sample takes first: the reported faults.
  only: tuple[str, ...] = ()  # When given, the only top-level fields mutated.
  skip_below: tuple[str, ...] = ()  # Paths (and below) not mutated: fields no reader reads.
  fmt: str = "json"  # json, or a table: csv, jsonl (`table_rows` rows mutated).
  table_rows: tuple[int, ...] = ()  # A table's rows (0-based) mutated cell by cell.
  max_rows: int | None = user_measurements.MAX_ROWS  # A table's limit (None: not written).
  nest_column: str = "batch"  # The JSONL column a nested value replaces.

  @property
  def suffix(self) -> str:
    return f".{self.fmt}"


def _check_config(doc: Any) -> None:
  schema.check(config_schema.CONFIG, doc, where="config")


def _check_accelerator(doc: Any) -> None:
  schema.check(accelerator_schema.FILE, doc, where="accelerator file")


def _check_vllm(doc: Any) -> None:
  vllm_result_schema.check_run(doc, "result")


def _check_terms(doc: Any) -> None:
  schema.check(engine_terms_schema.SCHEMA, doc, where="terms")


def _check_profile(doc: Any) -> None:
  profile_schema.check(doc, "profile")


def _check_rows(suffix: str) -> Callable[[Any], None]:
  """A table's check: every row as `user_measurements.parse_row` reads it."""

  def check(rows: Any) -> None:
    for line, record in enumerate(rows, start=2 if suffix == ".csv" else 1):
      user_measurements.parse_row(f"m{suffix}", line, record)

  return check


def _check_trace(suffix: str) -> Callable[[Any], None]:
  """A trace's check: the rows written as the kind's file and read by `arrivals.load_trace`."""

  def check(rows: Any) -> None:
    with tempfile.TemporaryDirectory() as folder:
      path = os.path.join(folder, f"trace{suffix}")
      with open(path, "wb") as f:
        f.write(serialize(KINDS[f"trace_{suffix[1:]}"], rows))
      arrivals.load_trace(path)

  return check


def _data(*parts: str) -> str:
  """A shipped file's absolute path (a case runs in its own temporary folder)."""
  return os.path.join(_ROOT, *parts)


_ROWS = "tests/data/user_llama2_7b_a100_5pts.csv"  # The measurements.
_ROW_ARGS = ("--fit_steps=10",)
_CARRIED = ("tests", "data", "vllm_cpu")
_TRACE = "tests/data/trace_small.csv"
_TRACE_ARGS = ("--arrival=trace", "--model=llama-3-8b", "--accelerator=h100-sxm", "--context=4096")

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
    # Measured step times: the five rows, the third (its 1e-300 s) cell by cell.
    "measurements_csv": FileKind("measurements_csv", _ROWS, "calibrate", "--from_csv", _ROW_ARGS,
                                 _check_rows(".csv"), None, oversized=False, fmt="csv",
                                 table_rows=(2,), focus=("[2].time_s", "[2].batch", "[2].context")),
    "measurements_jsonl": FileKind("measurements_jsonl", _ROWS, "calibrate", "--from_csv",
                                   _ROW_ARGS, _check_rows(".jsonl"), None, oversized=False,
                                   fmt="jsonl", table_rows=(2,),
                                   focus=("[2].time_s", "[2].batch", "[2].context")),
    # Request traces (simulate --arrival=trace), the middle request cell by cell; a trace's
    # 10^6 + 1 rows are refused in tests/test_bad_input_part3.py, not written per case here.
    **{
        f"trace_{fmt}": FileKind(f"trace_{fmt}", _TRACE, "simulate", "--trace", _TRACE_ARGS,
                                 _check_trace(f".{fmt}"), None, oversized=False, fmt=fmt,
                                 table_rows=(2,), max_rows=None, nest_column="prompt_tokens",
                                 focus=("[2].prompt_tokens", "[2].output_tokens",
                                        "[2].arrival_s")) for fmt in ("csv", "jsonl")
    },
    # An earlier vLLM-run fit carried to another run: its factors and held terms.
    "engine_terms": FileKind(
        "engine_terms",
        "/".join(_CARRIED + ("calibration_pass5_predicts_pass6_engine_kernels.json",)), "calibrate",
        "--engine_terms", (f"--heldout_vllm={_data(*_CARRIED, 'tiny_vllm_rate4_in128_out32.json')}",
                           f"--model={_data(*_CARRIED, 'models', 'tiny-llama')}",
                           f"--accelerator_file={_data(*_CARRIED, 'accelerator_pass5.json')}",
                           "--server=scheduler=vllm"), _check_terms, engine_terms_schema.KIND,
        oversized=False, only=("kind", "factors", "fixed"),
        focus=("factors.eta_w", "fixed.m_pass", "factors")),
    # A toy profile measured here (factors, terms, ceilings, toy configs), applied to raw numbers.
    "profile": FileKind(
        "profile", "results/profile_cpu.json", "batch_sweep", "--profile",
        ("--batch_sizes=1,32", "--bandwidth_tbps=2", "--token_gap_ms=20"), _check_profile,
        profile_schema.KIND, oversized=False,
        only=("kind", "version", "factors", "regime_factors", "ceilings", "fit", "model", "dtype",
              "device_kind", "accelerator", "prefill_factors"),
        skip_below=("fit.basis", "fit.attention_layout_floor", "fit.operations", "fit.targets",
                    "fit.load", "model.step_inputs"),
        focus=("factors.eta_w", "ceilings.bandwidth_Bps", "regime_factors.r_pack",
               "model.configs.calibration.width")),
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


def base_document(kind: FileKind) -> Any:
  """The valid file a kind's cases are made from (`path#slug`: one entry of a table);
  a table's rows as records (CSV: text cells; JSONL: JSON numbers where numbers go)."""
  path, _, slug = kind.base.partition("#")
  with open(os.path.join(_ROOT, path), encoding="utf-8") as f:
    if kind.fmt != "json":
      rows = list(csv.DictReader(f))
      return rows if kind.fmt == "csv" else [{k: _typed(v) for k, v in r.items()} for r in rows]
    doc = json.load(f)
  return doc["accelerators"][slug] if slug else doc


def _typed(cell: str) -> Any:
  """A CSV cell as a JSONL file writes it: a number where it reads as one."""
  for kind in (int, float):
    try:
      return kind(cell)
    except ValueError:
      pass
  return cell


def serialize(kind: FileKind, doc: Any) -> bytes:
  """A document as the kind's file: JSON, CSV with a header row, or JSONL."""
  if kind.fmt == "json":
    return json.dumps(doc).encode()
  if kind.fmt == "jsonl":
    return "".join(json.dumps(r) + "\n" for r in doc).encode()
  columns = list(dict.fromkeys(c for r in doc for c in r))
  out = io.StringIO()
  writer = csv.DictWriter(out, fieldnames=columns, restval="", lineterminator="\n")
  writer.writeheader()
  writer.writerows(doc)
  return out.getvalue().encode()


def _cell_faults(value: str) -> Iterator[tuple[str, str]]:
  """(fault, replacement) for one CSV cell, as text."""
  if not isinstance(_typed(value), (int, float)):
    yield "type", "7"
    return
  yield "type", "fast"
  yield "nan", "nan"
  yield "inf", "inf"
  yield "negative", f"-{value}"
  yield "zero", "0"
  yield "huge", "1e30"
  yield "tiny", "1e-300"
  yield "fraction", f"{value}.5" if "." not in value else f"{value}5e-1"
  yield "huge_int", "9" * 400


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


def _table_paths(kind: FileKind, doc: list[dict]) -> Iterator[tuple]:
  """A table's cells to mutate: every column of the `table_rows`."""
  for row in kind.table_rows:
    for column in doc[row]:
      yield (row, column)


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
  if kind.fmt != "json":
    paths = _table_paths(kind, doc)
  else:
    skip = kind.skip + tuple(k for k in doc if kind.only and k not in kind.only)
    paths = (p for p in _paths(doc, skip)
             if not kind.skip_below or not schema.path_text(p).startswith(kind.skip_below))
  for path in paths:
    where = schema.path_text(path)
    value = _get(doc, path)
    variants = list(_cell_faults(value) if kind.fmt == "csv" else _faults(value))
    if isinstance(path[-1], str):
      variants.append(("missing", _DELETE))
    for fault, replacement in variants:
      mutated = _replace(doc, path, replacement)
      out.append(FileCase(name, where, fault, serialize(kind, mutated), _refused(kind, mutated)))
  if kind.fmt != "json":
    return out + _table_cases(kind, doc)
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


def _table_cases(kind: FileKind, doc: list[dict]) -> list[FileCase]:
  """Whole-table faults: each must be refused, but the valid table."""
  text = serialize(kind, doc)
  header, _, body = text.partition(b"\n")
  first = body.split(b"\n")[0] if kind.fmt == "csv" else text.split(b"\n")[0]
  whole = [
      ("valid", text),
      ("header_only", header + b"\n" if kind.fmt == "csv" else b"\n"),
      ("not_utf8", b"\xff\xfe" + text),
  ]
  if kind.max_rows is not None:
    many = (header + b"\n" if kind.fmt == "csv" else b"") + (first + b"\n") * (kind.max_rows + 1)
    whole.append(("too_many_rows", many))
  if kind.fmt == "jsonl":
    whole += [
        ("top_list_line", text + b"[1, 2]\n"),
        ("not_json_line", text + b"{not json\n"),
        ("deep_line", text + b"[" * DEEPER + b"]" * DEEPER + b"\n"),
        ("nested_value", text + json.dumps({**doc[0], kind.nest_column: [[[8]]]}).encode() + b"\n"),
    ]
  else:
    whole += [("no_header", body), ("ragged_row", text + b"llama-2-7b,a100-80gb\n")]
  return [FileCase(kind.name, "", fault, data, fault != "valid") for fault, data in whole]


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
      path = os.path.join(folder, f"case{i}{kind.suffix}")
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
