"""How far one pass's measurements move on the next: the repeatability floor of issue 25's targets.

Two passes of `same_hour_pass.sh` run the same benchmarks with the same seed, so every run
replays the same arrivals and lengths: what differs between a run and its repeat is the
engine and the machine alone. For each run both passes hold, this prints the measured
p50/p90 TTFT, TPOT and ITL and the throughput of both, and their relative difference
(B - A) / A. A perfect model, its factors fitted on pass A, predicts pass B's rows no better
than pass A's own measurements do, so the share of rows within the targets here (p50 within
10%, p90 within 20%, throughput within 5%) is what a cross-pass prediction can reach at best.
A token gap under `engine_fit.COALESCED_S` (a coalesced delivery, not a step) has no
relative difference, as in the fits. Kind: measurement against measurement.
Usage (project venv, repository root):
  python results/vllm_cpu/pass_spread.py results/vllm_cpu/passA results/vllm_cpu/passB [OUT.json]
"""
import glob
import json
import os
import sys

import numpy as np

from jaxroof import files
from jaxroof.calibrate import engine_fit
from jaxroof.measure import vllm_results
from jaxroof.report import real_engine

METRICS = ("ttft", "tpot", "itl")
TARGETS = {50: real_engine.P50_TARGET, 90: real_engine.P90_TARGET}
THROUGHPUT_TARGET = 0.05  # Issue 25: throughput within 5%.


def _run(path: str) -> vllm_results.BenchRun:
  [run] = vllm_results.read_runs([path])
  return run


def spread(first: str, second: str) -> dict:
  """Every run both pass folders hold: both measurements and their relative difference."""
  names = sorted(
      set(map(os.path.basename, glob.glob(f"{first}/*_vllm_*.json"))) &
      set(map(os.path.basename, glob.glob(f"{second}/*_vllm_*.json"))))
  if not names:
    raise SystemExit(f"pass_spread: {first!r} and {second!r} hold no result file "
                     "(*_vllm_*.json) of the same name: give two pass folders")
  rows, within = [], {p: [] for p in TARGETS}
  for name in names:
    a, b = _run(os.path.join(first, name)), _run(os.path.join(second, name))
    if not np.array_equal(a.prompt_tokens, b.prompt_tokens):
      raise SystemExit(f"{name}: the two passes' prompts differ (another seed or dataset)")
    for metric in METRICS:
      for percentile, target in TARGETS.items():
        x = vllm_results.measured_percentile(a, metric, percentile)
        y = vllm_results.measured_percentile(b, metric, percentile)
        coalesced = min(x, y) < engine_fit.COALESCED_S
        rel = None if coalesced else (y - x) / x
        if rel is not None:
          within[percentile].append(abs(rel) <= target)
        rows.append({
            "run": name, "metric": metric, "percentile": percentile, "first_s": x, "second_s": y,
            "rel_difference": rel
        })
    rows.append({
        "run": name, "metric": "throughput", "percentile": None,
        "first_per_s": a.measured_throughput, "second_per_s": b.measured_throughput,
        "rel_difference": b.measured_throughput / a.measured_throughput - 1
    })
  latencies = [
      abs(r["rel_difference"]) for r in rows
      if r["percentile"] is not None and r["rel_difference"] is not None
  ]
  throughput = [abs(r["rel_difference"]) for r in rows if r["percentile"] is None]
  summary = {
      "runs": len(names),
      "median_abs_rel_difference": float(np.median(latencies)),
      "max_abs_rel_difference": float(np.max(latencies)),
      "throughput_max_abs_rel_difference": float(np.max(throughput)),
      f"throughput_within_{THROUGHPUT_TARGET:.0%}":
          f"{sum(t <= THROUGHPUT_TARGET for t in throughput)} of "
          f"{len(throughput)}",
  }
  for percentile, target in TARGETS.items():
    summary[f"p{percentile}_within_{target:.0%}"] = (f"{sum(within[percentile])} of "
                                                     f"{len(within[percentile])}")
    for metric in METRICS:
      picked = [
          abs(r["rel_difference"]) for r in rows if r["metric"] == metric and
          r["percentile"] == percentile and r["rel_difference"] is not None
      ]
      summary[f"p{percentile}_{metric}_median_abs_rel_difference"] = (float(np.median(picked))
                                                                      if picked else None)
  return {
      "kind": "measurement against measurement: the same benchmarks (same seed) on two passes",
      "first": first, "second": second, "summary": summary, "rows": rows
  }


if __name__ == "__main__":
  if len(sys.argv) not in (3, 4):
    raise SystemExit(__doc__.split("Usage")[1])
  result = spread(sys.argv[1], sys.argv[2])
  for row in result["rows"]:
    rel = row["rel_difference"]
    what = row["metric"] + (f" p{row['percentile']}" if row["percentile"] else "")
    print(f"{row['run']:40s} {what:15s} {'coalesced' if rel is None else f'{rel:+.1%}'}")
  print(json.dumps(result["summary"], indent=1))
  if len(sys.argv) == 4:
    files.write_json(sys.argv[3], result)
