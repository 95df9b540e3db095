"""The engine's wake split in two: its cold cache, from the cost model, and the rest.

`engine_idle_probe.json` measured, per shape, what a short prefill after 0.2 s idle costs
over the same beside a running decode. The cost model charges an iteration on an idle engine
its `cold_cache_s` (the step's cached weight bytes, c_llc of them, read from memory at
eta_w * BW instead of from the cache at bw_llc) on top of t_wake. This prints, per shape, the
measured wake, its `cold_cache_s` at the pass's held cache and read ceiling, and the rest.
The median rest over the shapes whose weights fit the cache (W <= c_llc: a model streamed
from memory every step keeps nothing hot to lose, and w1536L4 paid no wake) is the t_wake
that `calibrate --engine_wake_ms` holds with `--engine_cold_share=1`.
Usage (project venv, repository root):
  python results/vllm_cpu/wake_split.py results/vllm_cpu/passN [OUT.json] [ETA_W]
(the pass's engine_cache.json and accelerator.json; ETA_W: the read efficiency, default 1,
the engine fits' 0.98-1.0). The wakes are the pass's own idle probes where it has them
(`PASS/engine_idle_probe.json`, full_pass.sh's two shapes, and `PASS/engine_idle_probe_shapes.json`,
the other four), else `PROBE` (pass I7's six shapes, which passes I6 and I7 used).
"""
import json
import os
import sys

import numpy as np

from jaxroof import files
from jaxroof.specs import models, what_if
from jaxroof.specs.iteration_model import IterationModel
from jaxroof.symbolic.step_model import StepModel

PROBE = "results/vllm_cpu/engine_idle_probe.json"
PASS_PROBES = ("engine_idle_probe.json", "engine_idle_probe_shapes.json")
MODELS = "results/vllm_cpu/models"


def cold_cache_s(shape: str, read_ceiling: float, cached: float, cache_rate: float,
                 eta_w: float) -> tuple[float, float]:
  """(the cost model's `cold_cache_s` for one decode row of `shape` on the pass's CPU, the
  weight bytes that row reads)."""
  spec = models.load_model(os.path.join(MODELS, shape))
  cost = IterationModel.from_spec(spec, BW=read_ceiling, F=1e12)
  model = StepModel.calibrated(
      {"eta_w": eta_w, "eta_kv": 1.0, "eta_f": 1.0, "t0_step": 0.0, "t0_layer": 0.0, "r_ovl": 1.0},
      engine={"c_llc": cached, "bw_llc": cache_rate})
  weights = sum(cost.constants[n] for n in ("W_b", "W_h", "r_e"))
  return float(cost.decode(1.0, 1.0, model)["cold_cache_s"]), weights


def main(pass_dir: str, out: str | None, eta_w: float) -> None:
  cache = json.load(open(os.path.join(pass_dir, "engine_cache.json")))
  device = what_if.load_accelerator_file(os.path.join(pass_dir, "accelerator.json"))
  read_ceiling = device.memory_bandwidth_bytes_per_s
  probes = [os.path.join(pass_dir, n) for n in PASS_PROBES]
  probes = [p for p in probes if os.path.exists(p)] or [PROBE]
  wakes = {}
  for path in probes:
    wakes.update(json.load(open(path))["summary"]["wake_s"])
  rows = {}
  for shape, wake in wakes.items():
    cold, weights = cold_cache_s(shape, read_ceiling, cache["c_llc_bytes"],
                                 cache["bw_llc_bytes_per_s"], eta_w)
    fits = bool(weights <= cache["c_llc_bytes"])
    rows[shape] = {
        "weight_bytes": weights, "fits_cache": fits, "wake_s": wake, "cold_cache_s": cold,
        "rest_s": wake - cold
    }
    print(f"{shape:8s} {weights / 1e6:6.1f} MB{'' if fits else ' (over c_llc)'}  wake "
          f"{wake * 1e3:5.2f} ms  cold cache {cold * 1e3:5.2f} ms  rest "
          f"{(wake - cold) * 1e3:5.2f} ms")
  fitting = [r for r in rows.values() if r["fits_cache"]]
  rest = float(np.median([r["rest_s"] for r in fitting]))
  whole = float(np.median([r["wake_s"] for r in fitting]))
  mad_rest = float(np.median([abs(r["rest_s"] - rest) for r in fitting]))
  mad_whole = float(np.median([abs(r["wake_s"] - whole) for r in fitting]))
  print(f"over the {len(fitting)} shapes within c_llc: t_wake to hold {rest * 1e3:.3g} ms, the "
        f"median rest (median absolute deviation {mad_rest * 1e3:.3g} ms; the whole wake's: "
        f"{whole * 1e3:.3g} ms, {mad_whole * 1e3:.3g} ms)")
  if out:
    files.write_json(
        out, {
            "kind": "measurement split by the cost model", "what":
                "the engine's wake after 0.2 s idle per shape (engine_idle_probe.json) less "
                "the cost model's cold_cache_s (c_llc bytes read at eta_w * BW instead of "
                "bw_llc); the median rest over the shapes whose weights fit c_llc is t_wake (wake_split.py)",
            "from": [
                *probes,
                os.path.join(pass_dir, "engine_cache.json"),
                os.path.join(pass_dir, "accelerator.json")
            ], "eta_w": eta_w, "read_ceiling_bytes_per_s": read_ceiling, "c_llc_bytes":
                cache["c_llc_bytes"], "bw_llc_bytes_per_s": cache["bw_llc_bytes_per_s"],
            "rows": rows, "t_wake_s": rest
        })


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None,
       float(sys.argv[3]) if len(sys.argv) > 3 else 1.0)
