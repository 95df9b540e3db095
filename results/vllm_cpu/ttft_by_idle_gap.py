"""A served run's TTFT split by what its request found: a busy engine, or one idle for a gap.

From a `vllm bench serve --save-detailed` result: each request's start time, TTFT and token
gaps give when it ended; a request that starts after every earlier one ended found the engine
idle, for the time since the last one ended (the gap). This prints the median TTFT of the
requests that found it busy and of those that found it idle, by gap. The difference is the
wake the simulator charges (`Replica.wake_s`), measured on the run itself rather than on
isolated probes. Usage (any python with numpy):
  python results/vllm_cpu/ttft_by_idle_gap.py RESULT.json [RESULT.json ...]
"""
import json
import sys

import numpy as np

GAPS_S = (0.0, 0.05, 0.2, 0.5, np.inf)


def split(path: str) -> dict:
  """{"busy": TTFTs (s), "idle": [(gap s, TTFT s)]} of one result file."""
  with open(path) as f:
    run = json.load(f)
  start = np.asarray(run["start_times"], float)
  ttft = np.asarray(run["ttfts"], float)
  end = start + ttft + np.array([sum(gaps) for gaps in run["itls"]])
  served = ttft > 0  # vLLM records a failed request with TTFT 0: left out.
  start, ttft, end = start[served], ttft[served], end[served]
  order = np.argsort(start)
  start, ttft, end = start[order], ttft[order], end[order]
  busy, idle = [], []
  for i in range(1, len(start)):
    gap = start[i] - end[:i].max()
    (idle.append((gap, ttft[i])) if gap > 0 else busy.append(ttft[i]))
  return {"busy": busy, "idle": idle}


def main(paths: list[str]) -> None:
  for path in paths:
    parts = split(path)
    busy = np.asarray(parts["busy"])
    idle = np.asarray(parts["idle"]).reshape(-1, 2)
    line = [path.rsplit("/", 1)[-1]]
    if len(busy):
      line.append(f"busy {len(busy)}: {np.median(busy) * 1e3:.1f} ms")
    for lo, hi in zip(GAPS_S[:-1], GAPS_S[1:]):
      chosen = idle[(idle[:, 0] > lo) & (idle[:, 0] <= hi), 1]
      if len(chosen):
        line.append(f"idle {lo:g}-{hi:g} s {len(chosen)}: {np.median(chosen) * 1e3:.1f} ms")
    print("; ".join(line))


if __name__ == "__main__":
  main(sys.argv[1:])
