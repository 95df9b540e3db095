"""vLLM's oneDNN GEMMs at a row count they have not run before: the first call against the next.

vLLM's CPU linear layer keeps a cache of 32 oneDNN primitives per weight, one per row count M
(`ops.create_onednn_mm(weight, 32)`, model_executor/layers/utils.py). A served step whose
token count is new (two prompts arriving together: 512 + k rows) builds new primitives in
every linear layer. This probe times a model's whole decoder GEMM set at fresh row counts:
the first call at each M (cold), then the same M twice more (warm), on core 1, one thread,
REPEATS row counts per range (256 + k: one prompt beside k decodes; 512 + k, 768 + k).
Kind: measurement (wall time of the GEMM calls only).
Run with the engine's python:
  DIR/bin/python results/vllm_cpu/engine_cold_rows.py CONFIG.json [CONFIG.json ...] > OUT.jsonl
then with the project's:
  python results/vllm_cpu/engine_cold_rows.py --collect OUT.json RUN.jsonl [RUN.jsonl ...]
writes the rows and `t_build`: the cold call's excess over the warm one per decoder layer
and per row, fitted through the origin over every model and range (least squares), the
cost model's held `--engine_build_us` (`engine_fit.KERNEL_BUILD`).
"""
import json
import os
import statistics
import sys
import time

REPEATS = int(os.environ.get("REPEATS", "5"))
BASES = (1, 256, 512, 768)


def main(paths: list[str]) -> None:
  import torch
  from vllm import _custom_ops as ops
  from engine_shapes import decoder_gemms
  os.sched_setaffinity(0, {1})
  torch.set_num_threads(1)
  for path in paths:
    shapes, layers = decoder_gemms(path)
    handlers = [(ops.create_onednn_mm(torch.randn(n, k).to(torch.bfloat16).t(), 32), k)
                for _ in range(layers) for k, n in shapes]
    inputs = {}

    def call(m: int) -> float:
      xs = inputs.setdefault(m, {k: torch.randn(m, k).to(torch.bfloat16) for k, _ in shapes})
      start = time.perf_counter()
      for handler, k in handlers:
        ops.onednn_mm(handler, xs[k], None)
      return time.perf_counter() - start

    call(4)
    for base in BASES:
      cold, warm = [], []
      for r in range(REPEATS):
        m = base + 3 + 2 * r  # Row counts run nowhere before.
        cold.append(call(m))
        warm.append(min(call(m), call(m)))
      print(
          json.dumps({
              "model": os.path.basename(os.path.dirname(path)), "layers": layers,
              "rows_from": base + 3, "rows_to": base + 1 + 2 * REPEATS,
              "cold_median_s": statistics.median(cold), "warm_median_s": statistics.median(warm),
              "cold_s": cold, "warm_s": warm, "load": os.getloadavg()
          }), flush=True)


def collect(out: str, paths: list[str]) -> None:
  """The runs' rows and t_build (s per layer per row) fitted through the origin."""
  import numpy as np
  from jaxroof import files
  rows = [json.loads(line) for p in paths for line in open(p) if line.startswith("{")]
  for row in rows:
    row["rows_mid"] = (row["rows_from"] + row["rows_to"]) / 2
    row["excess_per_layer_per_row_s"] = ((row["cold_median_s"] - row["warm_median_s"]) /
                                         row["layers"] / row["rows_mid"])
  m = np.array([r["rows_mid"] for r in rows])
  y = np.array([(r["cold_median_s"] - r["warm_median_s"]) / r["layers"] for r in rows])
  slope = float(m @ y / (m @ m))
  files.write_json(
      out, {
          "kind": "measurement", "what": __doc__.split("\n")[0], "runs": paths,
          "device": "Intel(R) Xeon(R) Processor (amx_bf16, avx512_bf16, avx512f, avx2), 2 cores",
          "engine": "vllm 0.32.0+cpu, torch 2.13.0+cpu, bf16", "rows": rows, "t_build_s": slope,
          "t_build_what": "cold minus warm per decoder layer, over the rows, fitted through the "
                          "origin (s per layer per row)", "t_build_rms_rel": float(
                              np.sqrt(np.mean(((slope * m - y) / y)**2)))
      })
  print(f"t_build {slope * 1e6:.2f} us per layer per row")


if __name__ == "__main__" and sys.argv[1:2] == ["--collect"]:
  collect(sys.argv[2], sys.argv[3:])
elif __name__ == "__main__":
  main(sys.argv[1:])
