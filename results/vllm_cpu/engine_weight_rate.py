"""The engine's own bf16 linear path (vLLM's oneDNN handler, as dispatch_cpu_unquantized_gemm
sets it up on AVX512-BF16 without AMX) over a model's whole decoder weight set at one token,
every block's weights in turn (no cache reuse between blocks, as in a decode step), on core 1.
Usage: python weight_rate.py CONFIG.json [CONFIG.json ...]"""
import json, os, sys, time
import torch
os.sched_setaffinity(0, {1})
torch.set_num_threads(1)
from vllm import _custom_ops as ops
out = []
for path in sys.argv[1:]:
  c = json.load(open(path))
  h, heads = c["hidden_size"], c["num_attention_heads"]
  kv = c.get("num_key_value_heads") or heads
  hd = c.get("head_dim") or h // heads
  inter = c["intermediate_size"]
  shapes = [(h, (heads + 2 * kv) * hd), (heads * hd, h), (h, 2 * inter), (inter, h)]
  layers = c["num_hidden_layers"]
  handlers = []
  for _ in range(layers):
    for k, n in shapes:
      w = torch.randn(n, k).to(torch.bfloat16)  # nn.Linear's (out, in) weight
      handlers.append((ops.create_onednn_mm(w.t(), 32), k))
  row = {"model": path, "layers": layers, "weight_bytes": 2 * layers * sum(k * n for k, n in shapes)}
  for m in (1, 4):
    xs = {k: torch.randn(m, k).to(torch.bfloat16) for k, _ in shapes}
    def step():
      for hnd, k in handlers:
        ops.onednn_mm(hnd, xs[k], None)
    step(); ts = []
    for _ in range(9):
      t = time.perf_counter(); step(); ts.append(time.perf_counter() - t)
    ts.sort()
    row[f"m{m}_best_s"], row[f"m{m}_median_s"] = ts[0], ts[len(ts) // 2]
    row[f"m{m}_GBps_median"] = row["weight_bytes"] / ts[len(ts) // 2] / 1e9
  out.append(row)
  print(json.dumps(row), flush=True)
