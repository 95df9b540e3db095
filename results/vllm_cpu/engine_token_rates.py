"""The engine's own bf16 linear path (vLLM's oneDNN handler, as dispatch_cpu_unquantized_gemm
sets it up on this AVX512-BF16 CPU) over a model's whole decoder weight set, every block's
weights in turn, at several token counts M (decode batches and prefill chunks), on core 1.
Prints, per model and M, the median of 7 passes after one warm-up, as time, weight GB/s and
GFLOP/s: whether a model's GEMMs run at another rate than a smaller model's at the same M.
Usage: python engine_token_rates.py CONFIG.json [CONFIG.json ...] (env TOKENS=1,2,...: other M)"""
import json
import os
import sys
import time

import torch
from vllm import _custom_ops as ops
from engine_shapes import decoder_gemms

TOKENS = tuple(int(m) for m in os.environ.get("TOKENS", "1,2,4,8,32,128,256").split(","))


def onednn_handlers(path: str) -> tuple[list, list[tuple[int, int]], int]:
  """(vLLM's oneDNN handler and K of every decoder linear weight in order, the block's shapes,
  the parameters) of a config, random bf16 weights."""
  shapes, layers = decoder_gemms(path)
  handlers = []
  for _ in range(layers):
    for k, n in shapes:
      w = torch.randn(n, k).to(torch.bfloat16)  # nn.Linear's (out, in) weight
      handlers.append((ops.create_onednn_mm(w.t(), 32), k))
  return handlers, shapes, layers * sum(k * n for k, n in shapes)


def timed_passes(handlers: list, xs: dict) -> list[float]:
  """Sorted seconds of 7 passes over every handler after one warm-up."""

  def step():
    for hnd, k in handlers:
      ops.onednn_mm(hnd, xs[k], None)

  step()
  ts = []
  for _ in range(7):
    t = time.perf_counter()
    step()
    ts.append(time.perf_counter() - t)
  return sorted(ts)


def main(paths: list[str]) -> None:
  for path in paths:
    handlers, shapes, params = onednn_handlers(path)
    for m in TOKENS:
      ts = timed_passes(handlers, {k: torch.randn(m, k).to(torch.bfloat16) for k, _ in shapes})
      med = ts[len(ts) // 2]
      row = {
          "model": os.path.basename(os.path.dirname(path)), "tokens": m, "median_s": med,
          "best_s": ts[0], "weight_GBps": 2 * params / med / 1e9,
          "GFLOPs": 2 * params * m / med / 1e9
      }
      print(json.dumps(row), flush=True)


if __name__ == "__main__":
  os.sched_setaffinity(0, {1})
  torch.set_num_threads(1)
  main(sys.argv[1:])
