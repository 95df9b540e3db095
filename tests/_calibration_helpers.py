"""What the toy-calibration tests share: known factors, and operations, decode steps and
profiles timed "by the model" from them (not collected: no test here)."""

import jax
import numpy as np

from jaxroof.calibrate import fitting
from jaxroof.measure import calibration_models
from jaxroof.measure import ceilings as ceilings_lib
from jaxroof.measure import measurement
from jaxroof.measure import profiles
from jaxroof.measure import step_sweeps
from jaxroof.measure import toy_steps
from jaxroof.timing import Timing

TRUE = {
    "eta_w": 0.6, "eta_kv": 0.3, "eta_f": 0.5, "t0_step": 4e-4, "t0_layer": 1.5e-4, "r_ovl": 0.5
}

BW, F = 5e10, 2e11

CALL_S = 3e-5  # A timed operation's own cost per call (dispatch).

CEILINGS = ceilings_lib.Ceilings("cpu", BW, BW, BW, {"float32": F})

DEVICE = measurement.Device("cpu", "cpu", jax.__version__)


def record(op, shapes, seconds, extra=None):
  timing = Timing(median_s=seconds, min_s=seconds, max_s=seconds, p10_s=seconds, p90_s=seconds,
                  repeats=3, warmup=1)
  return measurement.Measurement(op=op, shapes=shapes, dtype="float32", backend="xla",
                                 device=DEVICE, timing=timing, extra=extra or {})


def model_time(inputs):
  return fitting.predict({**inputs, "BW": BW, "F": F}, TRUE)


def synthetic_operations(noise: float, seed: int = 0, attention_eta_kv: float | None = None):
  """Linear layers and one-layer attention timed 'by the model' (the attention alone at
  `attention_eta_kv` when given: slower than inside a step, as on XLA:CPU)."""
  rng = np.random.default_rng(seed)
  jitter = lambda: float(np.exp(rng.normal(0.0, noise)))  # noqa: E731
  linear = []
  for d_in, d_out in ((1024, 1024), (1024, 2048), (2048, 1024), (1024, 4096)):
    for m in (1, 2, 4, 16, 64, 256, 1024, 2048):
      n = d_in * d_out
      t = float(
          model_time({"B": m, "T": 0.0, "N": n, "N_act": n, "q": 4.0, "k": 0.0, "L": 0.0}) -
          TRUE["t0_step"])
      linear.append(
          record("linear", {"rows": m, "d_in": d_in, "d_out": d_out}, (t + CALL_S) * jitter()))
  attention = []
  for b, c in ((1, 128), (1, 4096), (4, 1024), (16, 2048), (64, 512), (256, 128), (256, 512)):
    k = 2 * 2 * 64 * 4
    t = b * c * k / ((attention_eta_kv or TRUE["eta_kv"]) * BW)
    attention.append(
        record("decode_attention",
               {"batch": b, "context": c, "heads": 16, "kv_heads": 2, "head_dim": 64},
               (t + CALL_S) * jitter()))
  return linear, attention


def synthetic_steps(configs, points, factors=TRUE, scale=1.0):
  """Decode-step records of toy models, timed 'by the model'."""
  out = []
  for p in points:
    inputs = calibration_models.step_inputs(configs[p.model], "float32")
    t = fitting.predict(
        {
            "B": p.batch, "T": p.context + 1, "N": inputs.N, "N_act": inputs.N_act, "q": inputs.q,
            "k": inputs.k, "L": inputs.L, "BW": BW, "F": F
        }, factors)
    out.append(
        record(
            "decode_step", {"batch": p.batch, "context": p.context, "layers": inputs.L},
            float(t) * scale, extra={
                "model": p.model, "step_inputs": inputs.to_json(), "retained_tokens": p.context + 1,
                "round_medians_s": [float(t) * scale] * 3, "round_spread": 0.0, "load_avg_1m": 0.5
            }))
  return out


SMALL_STEPS = [
    step_sweeps.StepPoint(m, b, c) for m in calibration_models.FIT_MODELS
    for b, c in toy_steps.SMALLEST
]

FIT_STEPS = SMALL_STEPS + [
    step_sweeps.StepPoint(m, b, c) for m in calibration_models.FIT_MODELS
    for b, c in toy_steps.KV_STEPS
]


def fake_profile(factors, median, path="a.json", fastest=None):
  return profiles.Profile(device_kind="cpu", platform="cpu", backend="xla", dtype="float32",
                          jax_version="", created="", ceilings={}, factors=factors,
                          fit={"heldout_median_rel_error": median,
                               "fastest_fit_step_s": fastest}, path=path)
