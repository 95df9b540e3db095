"""Whether vLLM's GEMMs read a model's weights faster at 2-4 rows than at 1 (issue 25), timed
in pairs so that the host's drift cancels.

A pass's probes time each row count M minutes apart (engine_token_rates.py), and on this
shared host the GEMMs' rate moves a median 11-28% between samples 20 s apart
(memory_drift.py): too much to see a 10-20% difference by M. Here every round times one pass
over the model's whole decoder weight set at each M in turn (the order rotated each round),
milliseconds apart, and the ratio t(M) / t(1) is taken within the round. Each M's kernels are
built and warmed before the first round (vLLM's oneDNN handler keeps one per row count).
Writes JSON; usage (the engine's venv, a quiet machine, core 1):
  python row_count_pairs.py OUT.json ROUNDS CONFIG.json [CONFIG.json ...]"""
import datetime
import json
import os
import statistics
import sys
import time

import torch

from engine_token_rates import onednn_handlers
from vllm import _custom_ops as ops

ROWS = (1, 2, 3, 4)


def one_pass(handlers: list, xs: dict) -> float:
  t = time.perf_counter()
  for hnd, k in handlers:
    ops.onednn_mm(hnd, xs[k], None)
  return time.perf_counter() - t


def quartiles(values: list[float]) -> dict:
  q1, q2, q3 = statistics.quantiles(values, n=4)
  return {"median": q2, "q1": q1, "q3": q3}


def probe(config: str, rounds: int) -> dict:
  handlers, shapes, params = onednn_handlers(config)
  xs = {m: {k: torch.randn(m, k).to(torch.bfloat16) for k, _ in shapes} for m in ROWS}
  for m in ROWS:  # Build and warm each row count's kernels.
    one_pass(handlers, xs[m])
    one_pass(handlers, xs[m])
  times = {m: [] for m in ROWS}
  for r in range(rounds):
    for i in range(len(ROWS)):
      m = ROWS[(i + r) % len(ROWS)]
      times[m].append(one_pass(handlers, xs[m]))
  ratios = {m: [t / one for t, one in zip(times[m], times[1])] for m in ROWS[1:]}
  return {
      "model": config, "weight_bytes": 2 * params, "rounds": rounds,
      "median_s": {str(m): statistics.median(times[m]) for m in ROWS},
      "ratio_to_one_row": {str(m): quartiles(ratios[m]) for m in ROWS[1:]},
      "share_of_rounds_faster_than_one_row": {
          str(m): sum(x < 1 for x in ratios[m]) / rounds for m in ROWS[1:]
      }
  }


def main(out_path: str, rounds: int, configs: list[str]) -> None:
  rows = []
  for config in configs:
    rows.append(probe(config, rounds))
    print(json.dumps({k: rows[-1][k] for k in ("model", "median_s", "ratio_to_one_row")}),
          flush=True)
  result = {
      "kind": "measurement",
      "what": "vLLM's bf16 oneDNN GEMMs over each model's decoder weights at 1-4 rows, timed in "
              "rounds (one pass per row count, the order rotated), ratios within a round",
      "timing": "perf_counter per pass over every decoder weight; each row count built and "
                "warmed first; one thread on core 1",
      "device": os.environ.get("DEVICE", ""), "engine": f"torch {torch.__version__}",
      "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
      "load_before": os.getloadavg()[0], "rows": rows
  }
  tmp = out_path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(result, f, indent=1)
  os.replace(tmp, out_path)


if __name__ == "__main__":
  if (len(sys.argv) < 4 or not sys.argv[2].isdigit() or int(sys.argv[2]) < 4 or
      not all(os.path.isfile(c) for c in sys.argv[3:])):
    raise SystemExit("row_count_pairs: give OUT.json, ROUNDS (an integer >= 4) and one or "
                     f"more model config.json files (got {sys.argv[1:]})")
  os.sched_setaffinity(0, {1})
  torch.set_num_threads(1)
  main(sys.argv[1], int(sys.argv[2]), sys.argv[3:])
