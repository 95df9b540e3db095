"""Users' measured step times (CSV or JSONL): read, validate, map to model inputs.

One row is one measured decode step or prefill:

  required  model         shipped name (e.g. llama-2-7b) or a config.json path
            accelerator   shipped slug (e.g. h100-sxm)
            phase         decode | prefill
            batch         sequences in the step (1 to 10^6)
            time_s        measured seconds per step (decode) or per prefill of
                          the whole batch (prefill), 1e-7 to 1e5
  decode    context       tokens each sequence retains (1 to 10^7)
  prefill   prompt_tokens tokens in each prompt (1 to 10^7)
  optional  weight_dtype  bf16 (default), fp16, fp8, int8, int4
            kv_dtype      bf16 (default), fp16, fp8, int8, fp32
            tp            tensor-parallel chips (default 1; at most 4096)
            pp, ep        pipeline stages and expert-parallel groups (default 1;
                          fitted only through `jaxroof.calibrate.layout_fit`)
            source        free text: where the number comes from

A `.jsonl` file holds one JSON object per line with the same keys (numbers as
JSON numbers); any other extension is read as CSV with a header row. A file
holds at most `MAX_ROWS` (10,000) rows, refused before any is read. Every row
is checked against `COLUMNS` (type, finiteness, range), and an error names the
file, the line and the column, the value and what is allowed.

Rows become the calibrated models' inputs through the specs layer
(`jaxroof.specs.step_inputs.decode_step_inputs` for decode). Here tensor
parallelism is an ideal split: with tp chips, each chip reads N/tp weights
and k/tp K/V bytes per token and does 1/tp of the FLOPs; communication is not
modelled, so its cost lands in the fitted fixed costs (`TP_ASSUMPTION`,
stated in every result). The parallel layer's `jaxroof.calibrate.layout_fit`
models each layout properly (K/V replication, communication, eta_comm).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Sequence

import numpy as np

from jaxroof import errors
from jaxroof import files
from jaxroof import schema
from jaxroof.specs import accelerators
from jaxroof.specs import kv_sizing
from jaxroof.specs import models
from jaxroof.specs import parameters
from jaxroof.specs import step_inputs
from jaxroof.specs.model_spec import FULL, SLIDING
from jaxroof.schema import Number, Text, Whole

PHASES = ("decode", "prefill")
REQUIRED = ("model", "accelerator", "phase", "batch", "time_s")
OPTIONAL = ("context", "prompt_tokens", "weight_dtype", "kv_dtype", "tp", "pp", "ep", "source")
DEFAULT_DTYPE = "bf16"

# Bounds of a file of rows: far above any real measurement, so that a typo (a batch
# of 1e30, a 400-digit context, a time of 1e-300 s) is refused naming its line and
# column before anything is computed from it.
MAX_ROWS = 10_000  # Rows in one file (a fit of 10^4 rows already takes minutes).
MAX_BATCH = 10**6  # Sequences in one step.
MAX_TOKENS = 10**7  # Context or prompt of one sequence: above any model's.
MAX_CHIPS = 4096  # tp, pp or ep of one layout.
TIME_S = (1e-7, 1e5)  # One step or prefill: 100 ns (below any kernel launch) to 27 h.
COLUMNS: dict[str, schema.Spec] = {
    "model": Text(max_len=4096),
    "accelerator": Text(max_len=256),
    "phase": Text(choices=PHASES),
    "batch": Whole(1, MAX_BATCH, unit="sequences"),
    "time_s": Number(low=TIME_S[0], high=TIME_S[1], unit="s"),
    "context": Whole(1, MAX_TOKENS, null=True, unit="tokens"),
    "prompt_tokens": Whole(1, MAX_TOKENS, null=True, unit="tokens"),
    "weight_dtype": Text(choices=tuple(parameters.WEIGHT_DTYPES), null=True),
    "kv_dtype": Text(choices=tuple(kv_sizing.KV_DTYPES), null=True),
    **{c: Whole(1, MAX_CHIPS, null=True, unit="chips") for c in ("tp", "pp", "ep")},
    "source": Text(null=True, empty=True),
}
TP_ASSUMPTION = ("tensor parallelism as an ideal split in this fit: with tp chips each reads "
                 "N/tp weights and k/tp K/V bytes per token and does 1/tp of the FLOPs; "
                 "communication is not modelled and lands in the fitted fixed costs (the layout "
                 "fit with communication and eta_comm: jaxroof.calibrate.layout_fit)")


@dataclasses.dataclass(frozen=True)
class Row:
  """One validated measurement; `line` is its line in the file (1-based)."""

  line: int
  model: str
  accelerator: str
  phase: str
  batch: int
  time_s: float
  context: int | None
  prompt_tokens: int | None
  weight_dtype: str
  kv_dtype: str
  tp: int
  source: str
  pp: int = 1
  ep: int = 1

  def to_json(self) -> dict[str, object]:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Measurements:
  """The rows of one file, and what the file was."""

  path: str
  rows: tuple[Row, ...]
  engine: str  # Engines named in the rows' `source` (best effort), or "".

  def accelerators(self) -> list[str]:
    return sorted({r.accelerator for r in self.rows})


def _where(path: str, line: int, column: str) -> str:
  return f"{path} line {line}, {'field' if path.endswith('.jsonl') else 'column'} {column}"


@functools.cache
def _model(name: str):
  return models.load_model(name)


def _check(path: str, line: int, column: str, check, *args):
  """Runs a check; its InputError gains the file, the line and the column."""
  try:
    return check(*args)
  except errors.InputError as e:
    said = str(e)
    joined = said if said.startswith(f"{column}=") else f"{column}: {said}"
    raise errors.InputError(f"{_where(path, line, joined)}") from None


def _blank(value) -> bool:
  return value is None or (isinstance(value, str) and not value.strip())


_LOWERED = ("accelerator", "phase", "weight_dtype", "kv_dtype")  # Case does not matter.
_WHOLE = ("batch", "context", "prompt_tokens", "tp", "pp", "ep")  # JSON may write 8.0.


def parse_row(path: str, line: int, record: dict, *, csv: bool | None = None) -> Row:
  """Validates one record (column -> value) against `COLUMNS`; errors name the
  file, the line and the column, the value and what is allowed.

  `csv`: the record's cells are text (numbers parsed); default: when `path`
  is not `.jsonl` (a JSONL record's numbers must be JSON numbers).
  """
  for column in REQUIRED:
    if _blank(record.get(column)):
      raise errors.InputError(f"{_where(path, line, column)}: missing; every row needs "
                              f"{', '.join(REQUIRED)}.")
  unknown = sorted(set(record) - set(REQUIRED) - set(OPTIONAL))
  if unknown:
    raise errors.InputError(f"{_where(path, line, unknown[0])}: unknown column; allowed: "
                            f"{', '.join(REQUIRED + OPTIONAL)}.")
  record = {
      k: v.strip().lower() if k in _LOWERED and isinstance(v, str) else v
      for k, v in record.items()
  }
  csv = not path.endswith(".jsonl") if csv is None else csv
  typed = schema.check_record(COLUMNS, record, where=path, line=line, csv=csv)
  model = typed["model"].strip()
  _check(path, line, "model", _model, model)
  accelerator = typed["accelerator"]
  _check(path, line, "accelerator", accelerators.load_accelerator, accelerator)
  phase = typed["phase"]
  needed = "context" if phase == "decode" else "prompt_tokens"
  if typed.get(needed) is None:
    raise errors.InputError(f"{_where(path, line, needed)}: missing; a {phase} row needs {needed} "
                            "(a whole number >= 1).")
  whole = {c: None if typed.get(c) is None else int(typed[c]) for c in _WHOLE}
  tp, pp, ep = (whole[c] or 1 for c in ("tp", "pp", "ep"))
  return Row(line=line, model=model, accelerator=accelerator, phase=phase, batch=whole["batch"],
             time_s=float(typed["time_s"]), context=whole["context"] if phase == "decode" else None,
             prompt_tokens=whole["prompt_tokens"] if phase == "prefill" else None,
             weight_dtype=typed.get("weight_dtype") or DEFAULT_DTYPE,
             kv_dtype=typed.get("kv_dtype") or DEFAULT_DTYPE, tp=tp, source=typed.get("source") or
             "", pp=pp, ep=ep)


def _records(path: str) -> list[tuple[int, dict]]:
  """(line, record) pairs of a CSV or JSONL file: at most `MAX_ROWS` rows (refused
  before any row is checked), each JSONL line an object of plain values."""
  return files.read_records("measurements", path, columns=REQUIRED + OPTIONAL, max_rows=MAX_ROWS,
                            max_depth=2)


_ENGINES = ("TensorRT-LLM", "vLLM", "SGLang", "NIM", "llama.cpp", "TGI", "gpt-fast")


def read_measurements(path: str | os.PathLike[str], *, accelerator: str | None = None,
                      several_devices: bool = False) -> Measurements:
  """Reads and validates a file of measured step times.

  Args:
    path: CSV (header row) or `.jsonl`.
    accelerator: keep only this device's rows; None requires the file to
      hold one device only (a fit is per device kind), unless
    several_devices: the caller fits each device apart (the carry-over study).

  Raises:
    InputError: a bad row (file, line, column named), an empty selection, or
      several devices without `accelerator`.
  """
  path = os.fspath(path)
  rows = [parse_row(path, line, record) for line, record in _records(path)]
  if not rows:
    raise errors.InputError(f"measurements={path!r} holds no rows.")
  if accelerator is not None:
    slug = accelerators.load_accelerator(accelerator).name
    kept = [r for r in rows if r.accelerator == slug]
    if not kept:
      raise errors.InputError(f"accelerator={accelerator!r}: {path} has no rows for it (it has "
                              f"{', '.join(sorted({r.accelerator for r in rows}))}).")
    rows = kept
  elif not several_devices:
    found = sorted({r.accelerator for r in rows})
    if len(found) > 1:
      first = next(r for r in rows if r.accelerator != rows[0].accelerator)
      raise errors.InputError(
          f"{_where(path, first.line, 'accelerator')}: {path} mixes devices "
          f"({', '.join(found)}); a fit is per device kind: give "
          "accelerator=SLUG to choose one.", field="accelerator")
  text = " ".join(r.source for r in rows).lower()
  engine = ", ".join(e for e in _ENGINES if e.lower() in text)
  return Measurements(path=path, rows=tuple(rows), engine=engine)


def _ideal_split_only(row: Row) -> None:
  """Pipeline and expert layouts need the parallel layer's per-chip model."""
  for column in ("pp", "ep"):
    if getattr(row, column) > 1:
      raise errors.InputError(
          f"line {row.line}, column {column!r}: {getattr(row, column)} needs the layout "
          "fit (jaxroof.calibrate.layout_fit); this fit splits by tp only.", field=column)


def decode_inputs(rows: Sequence[Row]) -> dict[str, np.ndarray]:
  """`jaxroof.symbolic.calibrated.INPUT_NAMES` -> one value per decode row.

  Rows of one model, device, dtypes and context share one `decode_step_inputs`
  call over their batch sizes (a file of 10^4 rows costs one call per context,
  not per row)."""
  for row in rows:
    _ideal_split_only(row)
  groups: dict[tuple, list[int]] = {}
  for i, row in enumerate(rows):
    key = (row.model, row.accelerator, row.weight_dtype, row.kv_dtype, row.context)
    groups.setdefault(key, []).append(i)
  names = ("B", "T", "N", "q", "k", "BW", "F", "N_act", "L")
  cols = {n: np.empty(len(rows), dtype=np.float64) for n in names}
  for (model, accelerator, weight_dtype, kv_dtype, context), members in groups.items():
    spec = _model(model)
    batches = sorted({rows[i].batch for i in members})
    step = step_inputs.decode_step_inputs(spec, _device(accelerator), context=context,
                                          batch_sizes=batches, weight_dtype=weight_dtype,
                                          kv_dtype=kv_dtype)
    at = {b: j for j, b in enumerate(batches)}
    q = np.broadcast_to(np.asarray(step.q, dtype=np.float64), (len(batches),))
    for i in members:
      row, j = rows[i], at[rows[i].batch]
      values = {
          "B": row.batch, "T": row.context, "N": float(step.N[j]) / row.tp, "q": q[j],
          "k": step.k / row.tp, "BW": step.BW, "F": step.F, "N_act": step.N_act / row.tp,
          "L": spec.num_layers
      }
      for name, value in values.items():
        cols[name][i] = float(value)
  return cols


@functools.cache
def _counts(name: str):
  return parameters.parameter_counts(_model(name))


@functools.cache
def _device(slug: str):
  return accelerators.load_accelerator(slug)


def prefill_inputs(rows: Sequence[Row]) -> dict[str, np.ndarray]:
  """`jaxroof.symbolic.calibrated.PREFILL_INPUT_NAMES` -> one value per prefill row.

  The weights read are those a batch of B*P tokens touches (MoE: nearly every
  expert); attention runs over the blocks with full or sliding attention
  (a window longer than the prompt is full attention; shorter is not modelled).
  """
  cols: dict[str, list[float]] = {
      n: [] for n in ("B", "P", "N", "q", "BW", "F", "N_act", "L", "L_attn", "H", "d")
  }
  for row in rows:
    _ideal_split_only(row)
    spec = _model(row.model)
    device = _device(row.accelerator)
    counts = _counts(row.model)
    tokens = row.batch * row.prompt_tokens
    attention = spec.attention
    heads = attention.num_heads if attention else 0
    head_dim = attention.head_dim if attention else 0
    values = {
        "B": row.batch, "P": row.prompt_tokens,
        "N": float(parameters.weights_read_per_step(counts, [tokens])[0]) / row.tp,
        "q": parameters.bytes_per_weight(row.weight_dtype),
        "BW": device.memory_bandwidth_bytes_per_s, "F": device.flops(row.weight_dtype),
        "N_act": float(counts.active_matmul) / row.tp, "L": spec.num_layers,
        "L_attn": spec.layers_of(FULL) + spec.layers_of(SLIDING), "H": heads / row.tp, "d": head_dim
    }
    for name, value in values.items():
      cols[name].append(float(value))
  return {n: np.asarray(v, dtype=np.float64) for n, v in cols.items()}
