"""vLLM `bench serve` metrics of a run (simulated or measured).

Definitions as in vLLM's `calculate_metrics` (vllm/benchmarks/serve.py):
TTFT per request; TPOT = (E2EL - TTFT) / (output - 1) over requests with more
than one output token; ITL over the flattened gaps of every request; E2EL
from arrival to the last token. Durations run from the first arrival to the
last token. Goodput counts requests meeting every given target (TTFT and/or
TPOT, in seconds) per second of duration.
"""

from __future__ import annotations

import numpy as np

STATS: tuple[str, ...] = ("mean", "median", "p90", "p99")


def stats(values: np.ndarray) -> dict[str, float | None]:
  """Mean, median, p90 and p99 (None where there is no value)."""
  values = np.asarray(values, float)
  if values.size == 0:
    return {name: None for name in STATS}
  return {
      "mean": float(values.mean()), "median": float(np.median(values)),
      "p90": float(np.percentile(values, 90)), "p99": float(np.percentile(values, 99))
  }


def per_request(arrival_s, first_token_s, finish_s, output_tokens) -> dict[str, np.ndarray]:
  """TTFT, E2EL and TPOT per completed request (TPOT only where output > 1)."""
  arrival_s, first, finish = (np.asarray(a, float) for a in (arrival_s, first_token_s, finish_s))
  output = np.asarray(output_tokens)
  done = np.isfinite(finish)
  ttft = first[done] - arrival_s[done]
  e2el = finish[done] - arrival_s[done]
  multi = output[done] > 1
  tpot = (e2el[multi] - ttft[multi]) / (output[done][multi] - 1)
  return {"ttft_s": ttft, "e2el_s": e2el, "tpot_s": tpot, "done": done}


def serving_metrics(arrival_s, first_token_s, finish_s, output_tokens, itl_s, *,
                    ttft_target_s: float | None = None, tpot_target_s: float | None = None) -> dict:
  """The metrics block: latency stats, throughputs, goodput, completed."""
  per = per_request(arrival_s, first_token_s, finish_s, output_tokens)
  done = per["done"]
  completed = int(done.sum())
  arrival_s = np.asarray(arrival_s, float)
  if completed:
    duration = float(np.max(np.asarray(finish_s, float)[done]) - np.min(arrival_s))
  else:
    duration = 0.0
  output = np.asarray(output_tokens)[done]
  good = np.ones(completed, bool)
  if ttft_target_s is not None:
    good &= per["ttft_s"] <= ttft_target_s
  if tpot_target_s is not None:
    tpot_all = np.where(output > 1, (per["e2el_s"] - per["ttft_s"]) / np.maximum(output - 1, 1),
                        0.0)
    good &= tpot_all <= tpot_target_s
  rate = (lambda count: float(count / duration)) if duration > 0 else (lambda count: None)
  return {
      "ttft_s": stats(per["ttft_s"]),
      "tpot_s": stats(per["tpot_s"]),
      "itl_s": stats(itl_s),
      "e2el_s": stats(per["e2el_s"]),
      "request_throughput_per_s": rate(completed),
      "output_throughput_tokens_per_s": rate(int(output.sum())),
      "goodput_per_s":
          (rate(int(good.sum())) if ttft_target_s is not None or tpot_target_s is not None else None
          ),
      "completed": completed,
      "duration_s": duration,
      "goodput_targets": {"ttft_s": ttft_target_s, "tpot_s": tpot_target_s},
  }


def run_metrics(run, *, ttft_target_s: float | None = None, tpot_target_s: float | None = None,
                requests: np.ndarray | None = None) -> dict:
  """`serving_metrics` of a run: anything with `arrival_s`, `first_token_s`, `finish_s`,
  `output_tokens` and `itl_s` per request (a simulated `Run`, a served toy run).

  `requests`: a boolean mask of the requests counted (a fleet replica's own);
  the inter-token latencies are the run's, whole.
  """
  per_request_fields = (run.arrival_s, run.first_token_s, run.finish_s, run.output_tokens)
  if requests is not None:
    per_request_fields = tuple(np.asarray(a)[requests] for a in per_request_fields)
  return serving_metrics(*per_request_fields, run.itl_s, ttft_target_s=ttft_target_s,
                         tpot_target_s=tpot_target_s)


def iteration_means(run) -> dict[str, float | None]:
  """Means over the iterations, as a decode token sees them.

  `running_batch_mean`: sequences in the iteration, weighted by its decode
  rows (the concurrency a decode token runs at; busy periods hold more
  tokens, so this exceeds the time average when the load fluctuates);
  `running_batch_time_mean`: the same weighted by duration (Little's law's
  n); `decode_step_mean_s`: the iteration time a decode token waits,
  weighted by decode rows (the mean inter-token latency).
  """
  steps = np.asarray(run.step_s, float)
  decoding = np.asarray(run.decoding, float)
  running = np.asarray(run.running, float)
  busy, rows = float(steps.sum()), float(decoding.sum())
  return {
      "running_batch_mean": float(np.dot(decoding, running) / rows) if rows else None,
      "running_batch_time_mean": float(np.dot(running, steps) / busy) if busy else None,
      "decode_step_mean_s": float(np.dot(decoding, steps) / rows) if rows else None
  }


def _thinned(values: np.ndarray, keep: int) -> list:
  values = np.asarray(values)
  if len(values) > keep:
    values = values[np.linspace(0, len(values) - 1, keep).astype(int)]
  return values.tolist()


def simulation_block(run, total_pages: int, keep: int = 500) -> dict:
  """The `simulation` block: iterations, wall time, memory and queue over time."""
  return {
      "iterations": int(run.iterations),
      "wall_s": float(run.wall_s),
      "preemptions": int(run.preemptions),
      "prefill_tokens": int(run.prefill_tokens),
      "kv_pages_total": int(total_pages),
      "kv_pages_peak": int(run.pages_in_use.max()) if len(run.pages_in_use) else 0,
      "queue_length_max": int(run.queue_length.max()) if len(run.queue_length) else 0,
      "over_time": {
          "t_s": _thinned(run.history_s, keep), "kv_pages_in_use": _thinned(run.pages_in_use, keep),
          "queue_length": _thinned(run.queue_length, keep)
      },
  }
