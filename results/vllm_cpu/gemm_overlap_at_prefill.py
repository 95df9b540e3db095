"""The engine's GEMMs at prefill sizes against the cost model's linear time at r_ovl 0 and 1.

`engine_gemm_blocks.json` timed vLLM's bf16 linear path over a model's whole decoder weight
set at M rows (one thread, core 1). The cost model's `linear_s` for the same weights (the
LM head and the attention FLOPs left out) at the pass's ceilings and held cache, eta_w = eta_f = 1, combines the
weight read and the FLOPs by a p-norm, p = 1 + r_ovl: 1 adds them, 2 overlaps them partly.
This prints both beside the measurement, per model and M. Usage (project venv, root):
  python results/vllm_cpu/gemm_overlap_at_prefill.py results/vllm_cpu/passN
"""
import dataclasses
import json
import os
import sys

import numpy as np

from jaxroof.specs import models, what_if
from jaxroof.specs.iteration_model import IterationModel
from jaxroof.symbolic.step_model import StepModel

ROWS = (1, 128, 256)


def main(pass_dir: str) -> None:
  blocks = json.load(open(os.path.join(pass_dir, "engine_gemm_blocks.json")))["rows"]
  cache = json.load(open(os.path.join(pass_dir, "engine_cache.json")))
  device = what_if.load_accelerator_file(os.path.join(pass_dir, "accelerator.json"))
  print(f"{'model':14s} {'M':>4s} {'measured':>9s} {'r_ovl 0':>8s} {'r_ovl 1':>8s} (ms)")
  for name, by_rows in blocks.items():
    spec = models.load_model(os.path.join("results/vllm_cpu/models", name))
    cost = IterationModel.on_device(spec, device)
    # The decoder's linear layers alone: no LM head, no attention FLOPs (which `linear_s`
    # takes in when eta_attn is not held).
    cost = dataclasses.replace(
        cost, constants={**cost.constants, "W_h": 0.0, "N_h": 0.0, "r_e": 0.0, "a_full": 0.0})
    for rows in ROWS:
      measured = float(np.median(by_rows[str(rows)]))
      predicted = []
      for overlap in (0.0, 1.0):
        model = StepModel.calibrated(
            {
                "eta_w": 1.0, "eta_kv": 1.0, "eta_f": 1.0, "t0_step": 0.0, "t0_layer": 0.0,
                "r_ovl": overlap
            }, engine={"c_llc": cache["c_llc_bytes"], "bw_llc": cache["bw_llc_bytes_per_s"]})
        predicted.append(float(cost.prefill(float(rows), model=model)["linear_s"]))
      print(f"{name:14s} {rows:4d} {measured * 1e3:9.1f} {predicted[0] * 1e3:8.1f} "
            f"{predicted[1] * 1e3:8.1f}")


if __name__ == "__main__":
  main(sys.argv[1])
