"""Serving-benchmark results (vLLM `bench serve` JSON, SGLang `bench_serving`
JSONL) as measured decode steps, by an analytic mapping.

The fit through the continuous-batching simulator (choose the factors whose
simulated TTFT/TPOT/ITL reproduce the measured ones) is
`jaxroof.calibrate.engine_fit` (the calibrate experiment's vLLM source): the serving
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
import dataclasses
import io
import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxroof import errors
from jaxroof import files
from jaxroof.measure import user_measurements as um
from jaxroof.measure import vllm_result_schema
from jaxroof.engines import vllm_engine
from jaxroof.symbolic import request_formulas
from jaxroof.symbolic.lambdify import formula_function

_MEAN_CONTEXT = formula_function(request_formulas.mean_context)  # P + G/2, tokens.

# Metric (seconds here) -> the result file's key (milliseconds).
METRICS = {
    "median_ttft_s": "median_ttft_ms", "median_tpot_s": "median_tpot_ms",
    "median_itl_s": "median_itl_ms"
}
ASSUMPTIONS = ("analytic mapping, not the continuous-batching simulator (that fit is "
               "jaxroof.calibrate.engine_fit): one decode row per run, batch = mean requests "
               "in flight (Little's law), context = mean input + mean output / 2, step time "
               "= median ITL (else mean TPOT); TTFT not used",)


def engine_of(run: dict[str, Any]) -> str:
  """The engine whose benchmark wrote a run ("" when neither format)."""
  if "model_id" in run or "endpoint_type" in run:
    return "vLLM bench serve"
  if "concurrency" in run or "input_throughput" in run:
    return "SGLang bench_serving"
  return ""


def load_runs(path: str, field: str = "from_vllm") -> list[tuple[int, dict[str, Any]]]:
  """(line, run) pairs: one JSON object, or one per line (JSONL); `field` names
  the parameter that gave the path, in errors.

  The file's size, each document's nesting (`vllm_result_schema.MAX_DEPTH`) and
  the number of runs (`MAX_RUNS`) are bounded, and every run is checked against
  `vllm_result_schema.RUN` before any of it is used.
  """
  text = files.read_text(field, path, max_bytes=vllm_result_schema.KIND.max_bytes)
  where = f"{field}={path!r}"
  whole = _parse(where, text, field)
  if whole is not _NOT_ONE:
    vllm_result_schema.check_run(whole, where, field=field)
    return [(1, whole)]
  runs = []
  for line, chunk in enumerate(text.splitlines(), start=1):
    if not chunk.strip():
      continue
    if len(runs) == MAX_RUNS:
      raise errors.InputError(
          f"{where} holds more than {MAX_RUNS:,} runs (line {line}): give at most "
          f"{MAX_RUNS:,} per file.", field=field)
    run = _parse(f"{where} line {line}", chunk, field)
    if run is _NOT_ONE:
      raise errors.InputError(
          f"{where} line {line}: not valid JSON; give a vLLM `bench serve "
          "--save-result` JSON or SGLang `bench_serving` JSONL.", field=field)
    vllm_result_schema.check_run(run, where, line, field=field)
    runs.append((line, run))
  return runs


MAX_FILES = 64  # Result files in one call (one flag's list): far above a real study's.
MAX_RUNS = 256  # Runs in one file (JSONL lines); each holds at most MAX_REQUESTS requests.
_NOT_ONE = object()  # `_parse`: the text is not one JSON document.


def _parse(where: str, text: str, field: str) -> Any:
  """One JSON document, its nesting bounded; `_NOT_ONE` when the text is not one."""
  try:
    data = json.loads(text)
  except json.JSONDecodeError:
    return _NOT_ONE
  except RecursionError:
    data = _NOT_ONE
  except ValueError as e:  # An integer of over 4,300 digits.
    raise errors.InputError(f"{where} cannot be read as JSON: {str(e).splitlines()[0][:100]}.",
                            field=field) from None
  depth = vllm_result_schema.MAX_DEPTH
  if data is _NOT_ONE or files.json_depth(data, depth) > depth:
    raise errors.InputError(
        f"{where} is nested over {depth} levels deep (objects and lists), deeper "
        "than a benchmark result is: give the result file.", field=field)
  return data


def check_paths(paths: Sequence[str], field: str = "from_vllm") -> list[str]:
  """The result files of one parameter, at most `MAX_FILES` of them (none empty)."""
  paths = [os.fspath(p) for p in paths]
  if len(paths) > MAX_FILES:
    raise errors.InputError(
        f"{field} gives {len(paths):,} result files: at most {MAX_FILES} are read at once "
        "(merge runs into a JSONL file, one run per line).", field=field)
  for path in paths:
    if not path.strip():
      raise errors.InputError(f"{field} holds an empty file name: give result files.", field=field)
  return paths


def _number(path: str, line: int, run: dict[str, Any], key: str) -> float:
  value = run.get(key)
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
    raise errors.InputError(
        f"{path} line {line}, key {key!r}: {value!r} is not a finite number; the "
        "mapping needs completed, duration, total_input_tokens, "
        "total_output_tokens and mean_tpot_ms.")
  return float(value)


def run_to_row(path: str, line: int, run: Any, *, model: str, accelerator: str, tp: int = 1,
               weight_dtype: str = "bf16", kv_dtype: str = "bf16") -> um.Row:
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
  record = {
      "model": model, "accelerator": accelerator, "phase": "decode",
      "batch": max(1, round(in_flight)),
      "context": max(1, round(float(_MEAN_CONTEXT(mean_in, mean_out)))), "time_s": step_s,
      "weight_dtype": weight_dtype, "kv_dtype": kv_dtype, "tp": tp, "source": source
  }
  return um.parse_row(path, line, record)


def read_results(paths: Sequence[str], *, model: str, accelerator: str, tp: int = 1,
                 weight_dtype: str = "bf16", kv_dtype: str = "bf16") -> um.Measurements:
  """Every run of the given result files as measured decode rows.

  Raises:
    InputError: a missing key or file, or a file that is neither format.
  """
  rows, engines = [], set()
  for path in check_paths(paths):
    for line, run in load_runs(path):
      rows.append(
          run_to_row(path, line, run, model=model, accelerator=accelerator, tp=tp,
                     weight_dtype=weight_dtype, kv_dtype=kv_dtype))
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


@dataclasses.dataclass(frozen=True, eq=False)
class BenchRun:
  """One benchmark run: its workload description and measured metrics (seconds)."""

  path: str
  line: int
  engine: str
  request_rate: float  # math.inf for "inf".
  burstiness: float
  max_concurrency: int | None
  prompt_tokens: np.ndarray
  output_tokens: np.ndarray
  measured: dict[str, float]  # METRICS names -> seconds.
  arrival_s: np.ndarray | None = None  # From start_times (detailed results), from 0.
  detail: dict[str, Any] | None = None  # Measured per-request ttft_s, tpot_s, itl_s.
  server: dict[str, Any] | None = None  # The jaxroof_engine_run block's server facts.
  model: str | None = None  # Another model than the setup's (a held-out model).
  measured_throughput: float | None = None  # Requests/s (the file's request_throughput).
  engine_run: dict[str, Any] | None = None  # The whole jaxroof_engine_run block.

  @property
  def label(self) -> str:
    """`file.json:1 (rate 4)`; a run of rate inf sent every request at once."""
    rate = "all at once" if math.isinf(self.request_rate) else f"rate {self.request_rate:g}"
    return f"{os.path.basename(self.path)}:{self.line} ({rate})"


def _bad(path: str, line: int, key: str, value: Any, allowed: str) -> errors.InputError:
  return errors.InputError(f"{path} line {line}, key {key!r}: {value!r} is not allowed: "
                           f"{allowed}.")


def _lengths(path: str, line: int, run: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
  inputs, outputs = run.get("input_lens"), run.get("output_lens")
  if isinstance(inputs, list) and isinstance(outputs, list) and inputs and \
      len(inputs) == len(outputs):
    pairs = [(int(i), int(o)) for i, o in zip(inputs, outputs)
             if isinstance(i, (int, float)) and isinstance(o, (int, float)) and i >= 1 and o >= 1]
    if pairs:
      return (np.asarray([p[0] for p in pairs],
                         np.int64), np.asarray([p[1] for p in pairs], np.int64))
  completed = run.get("completed")
  if not isinstance(completed, (int, float)) or completed < 1:
    raise _bad(path, line, "completed", completed, "give a run with completed requests >= 1")
  means = []
  for key in ("total_input_tokens", "total_output_tokens"):
    total = run.get(key)
    if not isinstance(total, (int, float)) or total < completed:
      raise _bad(path, line, key, total, "give a whole number >= completed (or the "
                 "input_lens/output_lens lists)")
    means.append(max(1, round(total / completed)))
  n = int(completed)
  return np.full(n, means[0], np.int64), np.full(n, means[1], np.int64)


def parse_run(path: str, line: int, run: Any) -> BenchRun:
  """Validates one result object; errors name the file, line and key."""
  if not isinstance(run, dict) or not engine_of(run):
    raise errors.InputError(
        f"{path} line {line}: not a vLLM `bench serve` or SGLang `bench_serving` result "
        "(no model_id, endpoint_type or concurrency key).")
  rate = run.get("request_rate", "inf")
  if rate in ("inf", None) or (isinstance(rate, float) and math.isinf(rate)):
    rate = math.inf
  elif isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
    raise _bad(path, line, "request_rate", rate, 'give a number > 0 or "inf"')
  burst = run.get("burstiness", 1.0)
  if not isinstance(burst, (int, float)) or isinstance(burst, bool) or not 0 < burst < math.inf:
    raise _bad(path, line, "burstiness", burst, "give a number > 0")
  cap = run.get("max_concurrency")
  if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
    raise _bad(path, line, "max_concurrency", cap, "give a whole number >= 1 or null")
  measured = {}
  for name, key in METRICS.items():
    value = run.get(key)
    if value is None:
      continue
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
        or not math.isfinite(value):
      raise _bad(path, line, key, value, "give a finite number of milliseconds > 0")
    measured[name] = float(value) / 1e3
  if cap is not None:
    measured.pop("median_ttft_s", None)
  if not measured:
    raise errors.InputError(f"{path} line {line}: none of {', '.join(METRICS.values())} is "
                            "present (with max_concurrency, TPOT or ITL); "
                            "the fit needs at least one measured median.")
  extra: dict[str, Any] = {}
  if all(isinstance(run.get(k), list) and run.get(k) for k in vllm_engine.DETAIL_KEYS):
    extra = _detail(path, line, run)
    rate_done = run.get("request_throughput")
    if isinstance(rate_done, (int, float)) and not isinstance(rate_done, bool) \
        and 0 < rate_done < math.inf:
      extra["measured_throughput"] = float(rate_done)
    prompts, outputs = extra.pop("prompt_tokens"), extra.pop("output_tokens")
  else:
    prompts, outputs = _lengths(path, line, run)
  return BenchRun(path=path, line=line, engine=engine_of(run), request_rate=float(rate),
                  burstiness=float(burst), max_concurrency=cap, prompt_tokens=prompts,
                  output_tokens=outputs, measured=measured, **extra)


def _detail(path: str, line: int, run: Mapping[str, Any]) -> dict[str, Any]:
  """Arrivals, lengths and measured per-request metrics of a detailed result.

  Requests that failed (no output) are left out; TPOT per request as vLLM
  computes it, (latency - ttft) / (output - 1).
  """
  vllm_engine.check_detailed(dict(run), f"{path} line {line}")
  n = len(run["start_times"])
  latencies = run.get("latencies") if isinstance(run.get("latencies"), list) else [None] * n
  keep, ttft, tpot, itl = [], [], [], []
  for i in range(n):
    start, inp, out, first = (
        run[k][i] for k in ("start_times", "input_lens", "output_lens", "ttfts"))
    if not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        for v in (start, inp, out, first)) or out < 1 or inp < 1 or first <= 0:
      continue
    keep.append(i)
    ttft.append(float(first))
    gaps = [float(g) for g in (run["itls"][i] or []) if isinstance(g, (int, float))]
    itl += gaps
    latency = latencies[i] if len(latencies) > i else None
    if out > 1 and isinstance(latency, (int, float)) and latency > first:
      tpot.append((latency - first) / (out - 1))
  if len(keep) < 1:
    raise _bad(path, line, "output_lens", "no completed request", "give a run whose "
               "requests completed")
  starts = np.asarray([run["start_times"][i] for i in keep], float)
  block = run.get(vllm_engine.RUN_KEY)
  block = block if isinstance(block, dict) else None
  server = block.get("server") if block else None
  return {
      "prompt_tokens": np.asarray([run["input_lens"][i] for i in keep], np.int64),
      "output_tokens": np.asarray([run["output_lens"][i] for i in keep],
                                  np.int64), "arrival_s": starts - starts.min(),
      "detail": {"ttft_s": np.asarray(ttft), "tpot_s": np.asarray(tpot), "itl_s": np.asarray(itl)},
      "server": server if isinstance(server, dict) else None, "engine_run": block
  }


def measured_percentile(run: BenchRun, metric: str, percentile: float) -> float | None:
  """A measured percentile (s) of ttft/tpot/itl: from the detail, else the file's median."""
  if run.detail is not None and len(run.detail[f"{metric}_s"]):
    return float(np.percentile(run.detail[f"{metric}_s"], percentile))
  if percentile == 50:
    return run.measured.get(f"median_{metric}_s")
  return None


def read_runs(paths: Sequence[str], field: str = "from_vllm") -> list[BenchRun]:
  """Every run of the given result files (JSON, or JSONL one run per line), each
  replayable by the simulator; `field` names the parameter that gave the paths."""
  out = []
  for path in check_paths(paths, field):
    for line, run in load_runs(path, field):
      out.append(parse_run(path, line, run))
  if not out:
    raise errors.InputError(f"{field}={','.join(map(str, paths))!r} holds no runs.", field=field)
  return out
