"""Which linear path vLLM's CPU backend takes in bf16 and fp32 on this CPU, and how fast.

vLLM 0.32's `dispatch_cpu_unquantized_gemm` tries oneDNN (`ops.create_onednn_mm`) and falls
back to torch's `F.linear` when oneDNN refuses. On a CPU with AVX512-BF16 (the AMD EPYC of
passes 1-9) oneDNN takes bf16; on one without it (AVX2 only) it may refuse. This records, on
core 1 with one thread (as the served engine), for each dtype: whether oneDNN builds a bf16 or
fp32 matmul, and the rate of tiny-llama's four block projections (qkv, o, gate+up, down) at
M = 1, 32 and 128 rows through oneDNN (where it builds) and through `F.linear`, and
`torch.mm` of n^2, n doubled from 256 to 2048 while a call stays short (the ceiling
`experiments.vllm_bench` measures). Kind: measurement
(time.perf_counter around each call; median, min and max of 7 after one warm-up).

Usage (engine venv, from the repository root; about a minute on an AVX2 CPU):
  python results/vllm_cpu/engine_dtype_rates.py OUT.json results/vllm_cpu/models/tiny-llama/config.json
"""
import datetime, json, os, platform, statistics, sys, time

import torch
import torch.nn.functional as F

os.sched_setaffinity(0, {1})
torch.set_num_threads(1)
from vllm import _custom_ops as ops
from engine_shapes import decoder_gemms

TOKENS = (1, 32, 128)
REPEATS = 7


def timed(fn):
  fn()
  ts = []
  for _ in range(REPEATS):
    t = time.perf_counter()
    fn()
    ts.append(time.perf_counter() - t)
  return {"median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts)}


def cpu_facts():
  text = open("/proc/cpuinfo").read()
  name = next((l.split(":", 1)[1].strip() for l in text.splitlines() if l.startswith("model name")),
              platform.processor())
  flags = set(next((l.split(":", 1)[1].split() for l in text.splitlines() if l.startswith("flags")),
                   []))
  return {"cpu": name, "avx512f": "avx512f" in flags, "avx512_bf16": "avx512_bf16" in flags,
          "amx_bf16": "amx_bf16" in flags, "torch_capability": torch.backends.cpu.get_cpu_capability()}


def main(out_path, config_path):
  shapes, _ = decoder_gemms(config_path)
  rows = []
  for name, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
    n = 256  # As experiments.vllm_bench's ceiling: doubled to 2048 while a call stays short.
    while n < 2048:
      a, b = torch.randn(n, n).to(dt), torch.randn(n, n).to(dt)
      if 8 * timed(lambda: torch.mm(a, b))["min_s"] > 1.0:
        break
      n *= 2
    a, b = torch.randn(n, n).to(dt), torch.randn(n, n).to(dt)
    mm = timed(lambda: torch.mm(a, b))
    rows.append({"dtype": name, "path": f"torch.mm {n}^2", "tokens": n, **mm,
                 "gflop_per_s": 2 * n**3 / mm["median_s"] / 1e9})
    weights = [torch.randn(n, k).to(dt) for k, n in shapes]  # nn.Linear's (out, in)
    try:
      handlers = [ops.create_onednn_mm(w.t(), 32) for w in weights]
      refused = None
    except RuntimeError as error:
      handlers, refused = None, str(error).splitlines()[0][:200]
    rows.append({"dtype": name, "path": "oneDNN", "builds": handlers is not None, "error": refused})
    for m in TOKENS:
      xs = {k: torch.randn(m, k).to(dt) for k, _ in shapes}
      flops = sum(2 * m * k * n for k, n in shapes)
      paths = {"F.linear": lambda: [F.linear(xs[w.shape[1]], w) for w in weights]}
      if handlers:
        paths["oneDNN"] = lambda: [ops.onednn_mm(hd_, xs[w.shape[1]], None)
                                   for hd_, w in zip(handlers, weights)]
      for path, fn in paths.items():
        t = timed(fn)
        rows.append({"dtype": name, "path": path, "tokens": m, **t,
                     "gflop_per_s": flops / t["median_s"] / 1e9,
                     "weight_gb_per_s": sum(w.numel() * w.element_size() for w in weights) /
                     t["median_s"] / 1e9})
      print(name, m, {r["path"]: round(r["gflop_per_s"], 1) for r in rows[-len(paths):]},
            flush=True)
  out = {"kind": "measurement", "what": __doc__.split("\n\n")[0], "device": cpu_facts(),
         "model_config": config_path, "torch": torch.__version__,
         "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
         "load": os.getloadavg(), "method": f"median of {REPEATS} after one warm-up, core 1, "
         "one thread", "rows": rows}
  tmp = out_path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(out, f, indent=1)
  os.replace(tmp, out_path)


if __name__ == "__main__":
  main(*sys.argv[1:3])
