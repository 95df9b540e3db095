"""Serving-benchmark results (vLLM `bench serve` JSON, SGLang `bench_serving`
JSONL) as measured decode steps, by an analytic mapping.

The fit through the continuous-batching simulator (choose the factors whose
simulated TTFT/TPOT/ITL reproduce the measured ones) is
`jaxroof.serving.engine_fit` (`experiments.calibrate_engine`): the serving
layer sits above this one. This module keeps the analytic mapping of each run
to ONE decode row, with stated assumptions (labelled "analytic mapping, not
the simulator" wherever it is used), for rows to merge into a CSV:

  batch    = mean requests in flight: Little's law, completed / duration x
             mean end-to-end latency (mean_e2el_ms where written, else
             mean TTFT + mean TPOT x (mean output - 1)); `max_concurrency`
             caps it when set
  context  = mean input + mean output / 2 (the mean K/V length over a request)
  time_s   = median ITL (the typical gap between two tokens: the median is
             least affected by gaps that hold another request's prefill),
             else mean TPOT

TTFT is not mapped (it holds queueing, network and other prefills; the
simulator is needed), so a run gives no prefill row.

vLLM's file (current `vllm/benchmarks/serve.py` and the legacy
`benchmarks/benchmark_serving.py`) names the model (`model_id`, a Hugging Face
id) but not the accelerator, the tensor parallelism or the dtypes; SGLang's
names none of them. These come from the caller.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxroof import errors
from jaxroof import files
from jaxroof.measure import user_measurements as um

ASSUMPTIONS = (
    "analytic mapping, not the continuous-batching simulator (that fit is "
    "jaxroof.serving.engine_fit): one decode row per run, batch = mean requests "
    "in flight (Little's law), context = mean input + mean output / 2, step time "
    "= median ITL (else mean TPOT); TTFT not used",
)


def engine_of(run: dict[str, Any]) -> str:
  """The engine whose benchmark wrote a run ("" when neither format)."""
  if "model_id" in run or "endpoint_type" in run:
    return "vLLM bench serve"
  if "concurrency" in run or "input_throughput" in run:
    return "SGLang bench_serving"
  return ""


def load_runs(path: str) -> list[tuple[int, dict[str, Any]]]:
  """(line, run) pairs: one JSON object, or one per line (JSONL)."""
  text = files.read_text("from_vllm", path)
  try:
    data = json.loads(text)
    return [(1, data)]
  except json.JSONDecodeError:
    pass
  runs = []
  for line, chunk in enumerate(text.splitlines(), start=1):
    if not chunk.strip():
      continue
    try:
      runs.append((line, json.loads(chunk)))
    except json.JSONDecodeError as e:
      raise errors.InputError(
          f"{path} line {line}: not valid JSON ({e.msg}); give a vLLM `bench serve "
          "--save-result` JSON or SGLang `bench_serving` JSONL.") from None
  return runs


def _number(path: str, line: int, run: dict[str, Any], key: str) -> float:
  value = run.get(key)
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
    raise errors.InputError(
        f"{path} line {line}, key {key!r}: {value!r} is not a finite number; the "
        "mapping needs completed, duration, total_input_tokens, "
        "total_output_tokens and mean_tpot_ms.")
  return float(value)


def run_to_row(path: str, line: int, run: Any, *, model: str, accelerator: str,
               tp: int = 1, weight_dtype: str = "bf16", kv_dtype: str = "bf16"
               ) -> um.Row:
  """One benchmark run as a measured decode row (see the module docstring)."""
  if not isinstance(run, dict) or not engine_of(run):
    raise errors.InputError(
        f"{path} line {line}: not a vLLM `bench serve` or SGLang `bench_serving` "
        "result (no model_id, endpoint_type or concurrency key).")
  completed = _number(path, line, run, "completed")
  duration = _number(path, line, run, "duration")
  mean_in = _number(path, line, run, "total_input_tokens") / max(completed, 1)
  mean_out = _number(path, line, run, "total_output_tokens") / max(completed, 1)
  tpot_s = _number(path, line, run, "mean_tpot_ms") / 1e3
  if completed < 1 or duration <= 0 or mean_out < 2 or tpot_s <= 0:
    raise errors.InputError(
        f"{path} line {line}: completed={completed:g}, duration={duration:g}, mean "
        f"output={mean_out:g}, mean_tpot_ms={tpot_s * 1e3:g}: a run needs completed "
        "requests of at least 2 output tokens.")
  e2el = run.get("mean_e2el_ms") or run.get("mean_e2e_latency_ms")
  if isinstance(e2el, (int, float)) and e2el > 0:
    latency_s = e2el / 1e3
  else:
    latency_s = _number(path, line, run, "mean_ttft_ms") / 1e3 + tpot_s * (mean_out - 1)
  in_flight = completed / duration * latency_s
  cap = run.get("max_concurrency")
  if isinstance(cap, (int, float)) and cap > 0:
    in_flight = min(in_flight, cap)
  itl = run.get("median_itl_ms")
  step_s = itl / 1e3 if isinstance(itl, (int, float)) and itl > 0 else tpot_s
  source = (f"{engine_of(run)} result {os.path.basename(path)} line {line} "
            f"({run.get('model_id') or run.get('backend', '')}, request_rate "
            f"{run.get('request_rate')!r}); {ASSUMPTIONS[0]}; mean in flight "
            f"{in_flight:.2f}, mean input {mean_in:.1f}, mean output {mean_out:.1f}")
  record = {"model": model, "accelerator": accelerator, "phase": "decode",
            "batch": max(1, round(in_flight)), "context": max(1, round(mean_in + mean_out / 2)),
            "time_s": step_s, "weight_dtype": weight_dtype, "kv_dtype": kv_dtype,
            "tp": tp, "source": source}
  return um.parse_row(path, line, record)


def read_results(paths: Sequence[str], *, model: str, accelerator: str, tp: int = 1,
                 weight_dtype: str = "bf16", kv_dtype: str = "bf16") -> um.Measurements:
  """Every run of the given result files as measured decode rows.

  Raises:
    InputError: a missing key or file, or a file that is neither format.
  """
  rows, engines = [], set()
  for path in paths:
    path = os.fspath(path)
    for line, run in load_runs(path):
      rows.append(run_to_row(path, line, run, model=model, accelerator=accelerator,
                             tp=tp, weight_dtype=weight_dtype, kv_dtype=kv_dtype))
      engines.add(engine_of(run))
  return um.Measurements(path=",".join(os.fspath(p) for p in paths), rows=tuple(rows),
                         engine=", ".join(sorted(engines)))


def rows_to_csv(rows: Sequence[um.Row]) -> str:
  """The rows as the documented CSV, to inspect or to merge with others."""
  out = io.StringIO()
  columns = um.REQUIRED + um.OPTIONAL
  writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
  writer.writeheader()
  for row in rows:
    data = row.to_json()
    writer.writerow({c: ("" if data[c] is None else data[c]) for c in columns})
  return out.getvalue()
