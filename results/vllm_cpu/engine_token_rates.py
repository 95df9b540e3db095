"""The engine's own bf16 linear path (vLLM's oneDNN handler, as dispatch_cpu_unquantized_gemm
sets it up on this AVX512-BF16 CPU) over a model's whole decoder weight set, every block's
weights in turn, at several token counts M (decode batches and prefill chunks), on core 1.
Prints, per model and M, the median of 7 passes after one warm-up, as time, weight GB/s and
GFLOP/s: whether a model's GEMMs run at another rate than a smaller model's at the same M.
Usage: python engine_token_rates.py CONFIG.json [CONFIG.json ...] (env TOKENS=1,2,...: other M)"""
import json, os, sys, time
import torch

os.sched_setaffinity(0, {1})
torch.set_num_threads(1)
from vllm import _custom_ops as ops
from engine_shapes import decoder_gemms

TOKENS = tuple(int(m) for m in os.environ.get("TOKENS", "1,2,4,8,32,128,256").split(","))
out = []
for path in sys.argv[1:]:
  shapes, layers = decoder_gemms(path)
  handlers = []
  for _ in range(layers):
    for k, n in shapes:
      w = torch.randn(n, k).to(torch.bfloat16)  # nn.Linear's (out, in) weight
      handlers.append((ops.create_onednn_mm(w.t(), 32), k))
  params = layers * sum(k * n for k, n in shapes)
  for m in TOKENS:
    xs = {k: torch.randn(m, k).to(torch.bfloat16) for k, _ in shapes}

    def step():
      for hnd, k in handlers:
        ops.onednn_mm(hnd, xs[k], None)

    step()
    ts = []
    for _ in range(7):
      t = time.perf_counter()
      step()
      ts.append(time.perf_counter() - t)
    ts.sort()
    med = ts[len(ts) // 2]
    row = {
        "model": os.path.basename(os.path.dirname(path)), "tokens": m, "median_s": med,
        "best_s": ts[0], "weight_GBps": 2 * params / med / 1e9, "GFLOPs": 2 * params * m / med / 1e9
    }
    out.append(row)
    print(json.dumps(row), flush=True)
