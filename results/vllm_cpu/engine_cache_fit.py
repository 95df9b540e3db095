"""The engine's weights in the CPU's cache, measured: a pass's `engine_cache.json`.

vLLM's bf16 GEMMs at M = 1 over nine weight sets of one pass (tiny-, small- and medium-llama
in `engine_token_rates.json`, the six shapes in `engine_shape_probe.json`; 0.1-403 MB) are
fitted, by least squares on relative error, to

  t = n_calls * t_call + min(W, c_llc) / bw_llc + (W - min(W, c_llc)) / bw_rest

(c_llc on a log grid, the three rates linear at each). c_llc and bw_llc are what
`calibrate --engine_cache_mb --engine_cache_gbps` holds (the cost model's `c_llc`, `bw_llc`);
bw_rest is shown beside the pass's read ceiling (the fit's eta_w stands for it), t_call
beside the fitted per-layer cost. The same fit with an LRU's cached bytes,
max(0, min(W, 2 c_llc - W)) (the cost model's s_lru = 1: a cyclic scan over more than the
cache keeps none of it), goes under `lru`: the c_llc and bw_llc to hold with
`--engine_cache_lru=1`. Usage (project venv, repository root):
  python results/vllm_cpu/engine_cache_fit.py results/vllm_cpu/passN [ACCELERATOR_JSON]
(the ceiling shown: the pass's accelerator.json unless given).
"""
import json
import os
import sys

import numpy as np

from jaxroof import files
from jaxroof.measure import vllm_engine

GRID = np.geomspace(2e6, 8e8, 400)  # c_llc candidates, bytes.


def weight_set(config_path: str) -> tuple[float, int]:
  """(bf16 bytes, GEMM calls) of a config's decoder linear layers."""
  config = json.load(open(config_path))
  layers = int(config["num_hidden_layers"])
  shapes = vllm_engine.linear_shapes(config)
  return 2.0 * layers * sum(k * n for k, n in shapes), len(shapes) * layers


def points(pass_dir: str) -> list[dict]:
  rows = json.load(open(os.path.join(pass_dir, "engine_token_rates.json")))["rows"]
  out = []
  for row in rows:
    if row["tokens"] == 1:
      nbytes, calls = weight_set(f"results/vllm_cpu/models/{row['model']}/config.json")
      out.append({"name": row["model"], "bytes": nbytes, "calls": calls, "s": row["median_s"]})
  shapes = json.load(open(os.path.join(pass_dir, "engine_shape_probe.json")))["rows"]
  for name, row in shapes.items():
    nbytes, calls = weight_set(row["config"])
    out.append({"name": name, "bytes": nbytes, "calls": calls, "s": row["gemm_m1_median_s"]})
  return out


def fit(pts: list[dict], lru: float = 0.0) -> dict:
  """The least-squares fit; `lru`: the cost model's s_lru (cache lost per byte past c_llc)."""
  size = np.array([p["bytes"] for p in pts])
  calls = np.array([p["calls"] for p in pts], dtype=float)
  seconds = np.array([p["s"] for p in pts])
  best = None
  for cached in GRID:
    hit = np.maximum(0.0, np.minimum(size, cached - lru * (size - cached)))
    design = np.stack([calls, hit, size - hit], 1) / seconds[:, None]
    coef, *_ = np.linalg.lstsq(design, np.ones_like(seconds), rcond=None)
    if (coef <= 0).any():
      continue
    residual = design @ coef - 1
    loss = float(np.mean(residual**2))
    if best is None or loss < best[0]:
      best = (loss, cached, coef, residual)
  loss, cached, (t_call, inv_cache, inv_rest), residual = best
  return {
      "c_llc_bytes": float(cached), "bw_llc_bytes_per_s": float(1 / inv_cache),
      "bw_rest_bytes_per_s": float(1 / inv_rest), "t_call_s": float(t_call),
      "rms_rel_error": float(np.sqrt(loss)),
      "points": [{**p, "rel_error": float(r)} for p, r in zip(pts, residual)]
  }


if __name__ == "__main__":
  pass_dir = sys.argv[1].rstrip("/")
  pts = points(pass_dir)
  result = fit(pts)
  lru = {k: v for k, v in fit(pts, lru=1.0).items() if k != "points"}
  device_file = sys.argv[2] if len(sys.argv) > 2 else os.path.join(pass_dir, "accelerator.json")
  device = json.load(open(device_file))
  ceiling = next(iter(device["accelerators"].values()))["memory_bandwidth_tb_s"] * 1e12
  files.write_json(
      os.path.join(pass_dir, "engine_cache.json"), {
          "kind": "measurement fit",
          "what": "vLLM's bf16 GEMMs at M = 1 over nine weight sets, fitted to n_calls * t_call "
                  "+ min(W, c_llc) / bw_llc + the rest / bw_rest (least squares on relative "
                  "error; engine_cache_fit.py); `lru`: the same with an LRU's cached bytes, "
                  "max(0, min(W, 2 c_llc - W)) (s_lru = 1)", "from": [
                      f"{pass_dir}/engine_token_rates.json", f"{pass_dir}/engine_shape_probe.json"
                  ], "read_ceiling_bytes_per_s": ceiling, "read_ceiling_from": device_file, **
          result, "lru": {"s_lru": 1.0, **lru}
      })
  print(f"c_llc {result['c_llc_bytes'] / 1e6:.0f} MB at {result['bw_llc_bytes_per_s'] / 1e9:.1f} "
        f"GB/s, the rest at {result['bw_rest_bytes_per_s'] / 1e9:.1f} GB/s (read ceiling "
        f"{ceiling / 1e9:.1f}), {result['t_call_s'] * 1e6:.1f} us a call, rms "
        f"{result['rms_rel_error']:.1%}: --engine_cache_mb={result['c_llc_bytes'] / 1e6:.0f} "
        f"--engine_cache_gbps={result['bw_llc_bytes_per_s'] / 1e9:.1f}")
  print(f"as an LRU (s_lru = 1): c_llc {lru['c_llc_bytes'] / 1e6:.1f} MB at "
        f"{lru['bw_llc_bytes_per_s'] / 1e9:.1f} GB/s, the rest at "
        f"{lru['bw_rest_bytes_per_s'] / 1e9:.1f} GB/s, rms {lru['rms_rel_error']:.1%}: "
        f"--engine_cache_mb={lru['c_llc_bytes'] / 1e6:.1f} "
        f"--engine_cache_gbps={lru['bw_llc_bytes_per_s'] / 1e9:.1f} --engine_cache_lru=1")
