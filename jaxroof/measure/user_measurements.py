"""Users' measured step times (CSV or JSONL): read, validate, map to model inputs.

One row is one measured decode step or prefill:

  required  model         shipped name (e.g. llama-2-7b) or a config.json path
            accelerator   shipped slug (e.g. h100-sxm)
            phase         decode | prefill
            batch         sequences in the step (>= 1)
            time_s        measured seconds per step (decode) or per prefill of
                          the whole batch (prefill), > 0
  decode    context       tokens each sequence retains (>= 1)
  prefill   prompt_tokens tokens in each prompt (>= 1)
  optional  weight_dtype  bf16 (default), fp16, fp8, int8, int4
            kv_dtype      bf16 (default), fp16, fp8, int8, fp32
            tp            tensor-parallel chips (default 1)
            pp, ep        pipeline stages and expert-parallel groups (default 1;
                          fitted only through `jaxroof.calibrate.layout_fit`)
            source        free text: where the number comes from

A `.jsonl` file holds one JSON object per line with the same keys; any other
extension is read as CSV with a header row. Every row is checked, and an
error names the file, the line and the column.

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
from jaxroof.specs import accelerators
from jaxroof.specs import kv_sizing
from jaxroof.specs import models
from jaxroof.specs import parameters
from jaxroof.specs import step_inputs
from jaxroof.specs.model_spec import FULL, SLIDING

PHASES = ("decode", "prefill")
REQUIRED = ("model", "accelerator", "phase", "batch", "time_s")
OPTIONAL = ("context", "prompt_tokens", "weight_dtype", "kv_dtype", "tp", "pp", "ep", "source")
DEFAULT_DTYPE = "bf16"
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
  return f"{path} line {line}, column {column!r}"


@functools.cache
def _model(name: str):
  return models.load_model(name)


def _check(path: str, line: int, column: str, check, *args):
  """Runs a check; its InputError gains the line and column."""
  try:
    return check(*args)
  except errors.InputError as e:
    raise errors.InputError(f"{_where(path, line, column)}: {e}") from None


def _int(path: str, line: int, column: str, value) -> int:
  try:
    number = float(value)
  except (TypeError, ValueError):
    number = float("nan")
  if not np.isfinite(number) or number != int(number) or number < 1:
    raise errors.InputError(f"{_where(path, line, column)}: {value!r} is not allowed: give a whole "
                            "number >= 1.")
  return int(number)


def _time(path: str, line: int, value) -> float:
  try:
    number = float(value)
  except (TypeError, ValueError):
    number = float("nan")
  if not np.isfinite(number) or number <= 0:
    raise errors.InputError(f"{_where(path, line, 'time_s')}: {value!r} is not allowed: give the "
                            "measured seconds, a finite number > 0.")
  return number


def _blank(value) -> bool:
  return value is None or (isinstance(value, str) and not value.strip())


def parse_row(path: str, line: int, record: dict) -> Row:
  """Validates one record (column -> value); errors name line and column."""
  for column in REQUIRED:
    if _blank(record.get(column)):
      raise errors.InputError(f"{_where(path, line, column)}: missing; every row needs "
                              f"{', '.join(REQUIRED)}.")
  unknown = sorted(set(record) - set(REQUIRED) - set(OPTIONAL))
  if unknown:
    raise errors.InputError(f"{_where(path, line, unknown[0])}: unknown column; allowed: "
                            f"{', '.join(REQUIRED + OPTIONAL)}.")
  model = str(record["model"]).strip()
  _check(path, line, "model", _model, model)
  accelerator = str(record["accelerator"]).strip().lower()
  _check(path, line, "accelerator", accelerators.load_accelerator, accelerator)
  phase = str(record["phase"]).strip().lower()
  _check(path, line, "phase", errors.require_choice, "phase", phase, PHASES)
  batch = _int(path, line, "batch", record["batch"])
  time_s = _time(path, line, record["time_s"])
  needed = "context" if phase == "decode" else "prompt_tokens"
  if _blank(record.get(needed)):
    raise errors.InputError(f"{_where(path, line, needed)}: missing; a {phase} row needs {needed} "
                            "(a whole number >= 1).")
  context = _int(path, line, "context", record["context"]) if phase == "decode" else None
  prompt = (_int(path, line, "prompt_tokens", record["prompt_tokens"])
            if phase == "prefill" else None)
  weight_dtype = str(record.get("weight_dtype") or DEFAULT_DTYPE).strip().lower()
  _check(path, line, "weight_dtype", errors.require_choice, "weight_dtype", weight_dtype,
         tuple(parameters.WEIGHT_DTYPES))
  kv_dtype = str(record.get("kv_dtype") or DEFAULT_DTYPE).strip().lower()
  _check(path, line, "kv_dtype", errors.require_choice, "kv_dtype", kv_dtype,
         tuple(kv_sizing.KV_DTYPES))
  tp, pp, ep = (
      1 if _blank(record.get(c)) else _int(path, line, c, record[c]) for c in ("tp", "pp", "ep"))
  return Row(line=line, model=model, accelerator=accelerator, phase=phase, batch=batch,
             time_s=time_s, context=context, prompt_tokens=prompt, weight_dtype=weight_dtype,
             kv_dtype=kv_dtype, tp=tp, source=str(record.get("source") or ""), pp=pp, ep=ep)


def _records(path: str) -> list[tuple[int, dict]]:
  """(line, record) pairs of a CSV or JSONL file."""
  return files.read_records("measurements", path, columns=REQUIRED + OPTIONAL)


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
  """`jaxroof.symbolic.calibrated.INPUT_NAMES` -> one value per decode row."""
  cols: dict[str, list[float]] = {n: [] for n in ("B", "T", "N", "q", "k", "BW", "F", "N_act", "L")}
  for row in rows:
    _ideal_split_only(row)
    spec = _model(row.model)
    device = accelerators.load_accelerator(row.accelerator)
    step = step_inputs.decode_step_inputs(spec, device, context=row.context,
                                          batch_sizes=[row.batch], weight_dtype=row.weight_dtype,
                                          kv_dtype=row.kv_dtype)
    values = {
        "B": row.batch, "T": row.context, "N": float(step.N[0]) / row.tp, "q": step.q,
        "k": step.k / row.tp, "BW": step.BW, "F": step.F, "N_act": step.N_act / row.tp,
        "L": spec.num_layers
    }
    for name, value in values.items():
      cols[name].append(float(value))
  return {n: np.asarray(v, dtype=np.float64) for n, v in cols.items()}


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
    device = accelerators.load_accelerator(row.accelerator)
    counts = parameters.parameter_counts(spec)
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
