"""Measured decode steps by the sequences decoding: how a vLLM run's step grows per sequence.

From a detailed result (`start_times`, `ttfts`, `itls`), every token gap whose interval holds
no prompt's prefill (no request between its send and first token) and is not coalesced
(>= 0.1 ms) is one decode step; it is grouped by the requests decoding at its midpoint. The
median step of each group (of 20 gaps or more), fitted by a line weighted by the gaps,
gives the step at no sequences and its growth per sequence. Kind: measurement (the client's
token timestamps; a step as the client saw it, front end included).
Usage (project venv): python results/vllm_cpu/decode_steps_by_load.py RUN.json [RUN.json ...]
"""
import json
import sys

import numpy as np

MIN_GAPS = 20
COALESCED_S = 1e-4


def decode_gaps(path: str) -> tuple[np.ndarray, np.ndarray]:
  """(sequences decoding, gap in s) of each pure decode gap of the run."""
  raw = json.load(open(path))
  requests = []
  for start, ttft, itls in zip(raw["start_times"], raw["ttfts"], raw["itls"]):
    times = start + ttft + np.concatenate([[0.0], np.cumsum(itls)])
    requests.append((start, start + ttft, times))
  decoding, gaps = [], []
  for _, _, times in requests:
    for a, b in zip(times[:-1], times[1:]):
      middle = (a + b) / 2
      prefilling = any(sent < b and first > a for sent, first, _ in requests)
      if prefilling or b - a < COALESCED_S:
        continue
      decoding.append(sum(first <= middle < t[-1] for _, first, t in requests))
      gaps.append(b - a)
  return np.asarray(decoding), np.asarray(gaps)


def growth(path: str) -> dict:
  """The weighted line through each group's median step: intercept and slope (s)."""
  decoding, gaps = decode_gaps(path)
  groups = [n for n in np.unique(decoding) if np.sum(decoding == n) >= MIN_GAPS]
  medians = np.array([np.median(gaps[decoding == n]) for n in groups])
  weights = np.sqrt([np.sum(decoding == n) for n in groups])
  design = np.c_[np.ones(len(groups)), groups] * weights[:, None]
  (intercept, slope), *_ = np.linalg.lstsq(design, medians * weights, rcond=None)
  return {
      "run": path, "intercept_s": float(intercept), "per_sequence_s": float(slope),
      "groups": {int(n): float(m) for n, m in zip(groups, medians)}
  }


if __name__ == "__main__":
  for path in sys.argv[1:]:
    row = growth(path)
    print(f"{path}: {row['intercept_s'] * 1e3:.2f} ms + {row['per_sequence_s'] * 1e3:.3f} ms "
          f"per sequence (1-{max(row['groups'])} decoding)")
