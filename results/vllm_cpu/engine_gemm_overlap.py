"""The overlap r_ovl of vLLM's GEMMs on this CPU, fitted to engine_token_rates.json.

Each row is one model's whole decoder weight set at M tokens. The fit is
t = ((W / BW)^p + (2 N M / F)^p)^(1/p), p = 1 + r_ovl, with BW, F and p free
(least squares on log times), beside p fixed at 1 (the sum) and at 2 (the engine
fit's default r_ovl = 1). It writes `overlap_fit` into the JSON.
Usage (project venv): python results/vllm_cpu/engine_gemm_overlap.py [JSON]"""
import json
import sys

import numpy as np
from scipy.optimize import least_squares

path = sys.argv[1] if len(sys.argv) > 1 else "results/vllm_cpu/engine_token_rates.json"
data = json.load(open(path))
rows = data["rows"]
t = np.array([r["median_s"] for r in rows])
m = np.array([r["tokens"] for r in rows], float)
params = np.array([r["weight_GBps"] * r["median_s"] * 1e9 / 2 for r in rows])  # bf16 weights


def times(x, p):
  bw, f = np.exp(x[0]), np.exp(x[1])
  p = 1 + np.exp(x[2]) if p is None else p
  return ((2 * params / bw)**p + (2 * params * m / f)**p)**(1 / p)


fits = {}
for label, p in (("free", None), ("sum (p = 1)", 1.0), ("engine fit default (p = 2)", 2.0)):
  x = least_squares(lambda x: np.log(times(x, p) / t), [np.log(35e9), np.log(450e9), 0.0]).x
  err = np.abs(times(x, p) / t - 1)
  fits[label] = {
      "p": float(1 + np.exp(x[2]) if p is None else p),
      "r_ovl": float(np.exp(x[2]) if p is None else p - 1),
      "bandwidth_GBps": float(np.exp(x[0]) / 1e9), "flops_GFLOPs": float(np.exp(x[1]) / 1e9),
      "median_rel_error": float(np.median(err)), "max_rel_error": float(err.max())
  }
  print(label, {k: round(v, 3) for k, v in fits[label].items()})
data["overlap_fit"] = {"what": __doc__.splitlines()[0], "fits": fits}
with open(path, "w") as f:
  json.dump(data, f, indent=1)
