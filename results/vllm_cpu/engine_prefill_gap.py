"""vLLM's own prefill times against the cost model's prefill at an engine fit's factors.

For each shape and prompt length of an `engine_prefill_lengths.py` JSON: the engine's
measured prefill time (its /metrics histogram, isolated requests), the cost model's prefill
iteration of that prompt at the fit's factors with and without its fitted t0_chunk, and the
gaps. A fit whose t0_chunk stands for what the engine pays to admit a prompt leaves gaps near
zero on every shape and length; the gap without it is what the cost model lacks.
Kind: calibrated prediction against measurement. Usage (project venv, repository root):
  PYTHONPATH=. python results/vllm_cpu/engine_prefill_gap.py PROBE_JSON FIT_JSON [OUT_JSON]
"""
import statistics
import sys

from jaxroof import files
from jaxroof.calibrate import engine_fit
from jaxroof.specs import models
from jaxroof.specs.iteration_model import IterationModel
from jaxroof.symbolic import calibrated
from jaxroof.symbolic.step_model import StepModel

MODELS = "results/vllm_cpu/models"  # The probe's shapes' configs (w64L1 ... w1536L4).


def step_model(fit: dict, chunk: bool) -> StepModel:
  """The fit's step model (its factors and held engine terms), t0_chunk kept or zeroed."""
  f = fit["factors"]
  engine = {
      "t0_seq": f.get("t0_seq", 0.0), "m_pass": fit["setup"].get("m_pass", 0),
      "eta_attn": f.get("eta_attn", 0.0), "c_llc": f.get("c_llc", 0.0),
      "bw_llc": f.get("bw_llc", 0.0), "t0_chunk": f.get("t0_chunk", 0.0) if chunk else 0.0
  }
  return StepModel.calibrated({n: f[n] for n in calibrated.FACTOR_NAMES}, engine=engine)


def gaps(probe: dict, fit: dict) -> dict:
  device = engine_fit.load_device(
      engine_fit.ServingSetup(**{
          k: v for k, v in fit["setup"].items() if k in engine_fit.ServingSetup.__dataclass_fields__
      }))
  with_chunk, without = step_model(fit, True), step_model(fit, False)
  out = {}
  for shape, row in probe["rows"].items():
    cost = IterationModel.on_device(models.load_model(f"{MODELS}/{shape}"), device)
    out[shape] = {}
    for n, m in row["median"].items():
      full = float(cost.prefill(float(n), 1.0, with_chunk)["step_s"])
      bare = float(cost.prefill(float(n), 1.0, without)["step_s"])
      out[shape][n] = {
          "measured_s": m["prefill_s"], "model_s": full, "model_without_chunk_s": bare,
          "gap_s": m["prefill_s"] - full, "gap_without_chunk_s": m["prefill_s"] - bare
      }
  return out


if __name__ == "__main__":
  probe, fit = (files.read_json("json", p) for p in sys.argv[1:3])
  table = gaps(probe, fit)
  bare = [v["gap_without_chunk_s"] for row in table.values() for v in row.values()]
  print(f"fit t0_chunk {fit['factors'].get('t0_chunk', 0.0) * 1e3:.2f} ms; the engine's "
        f"prefill beyond the model without it: median {statistics.median(bare) * 1e3:.2f} ms "
        f"({min(bare) * 1e3:.2f} to {max(bare) * 1e3:.2f})")
  for shape, row in table.items():
    print(
        shape, " ".join(
            f"{n}:{v['measured_s'] * 1e3:.1f}/{v['model_s'] * 1e3:.1f}" for n, v in row.items()),
        "(measured/model ms)")
  if len(sys.argv) > 3:
    files.write_json(
        sys.argv[3], {
            "kind": "calibrated prediction against measurement",
            "what": "vLLM's prefill time of isolated requests against the cost model's prefill "
                    "iteration at an engine fit's factors, with and without its t0_chunk",
            "probe": sys.argv[1], "fit": sys.argv[2], "t0_chunk_s": fit["factors"].get(
                "t0_chunk",
                0.0), "gap_without_chunk_s_median": statistics.median(bare), "rows": table
        })
