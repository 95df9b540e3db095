"""Times the vectorised step model over a (batch, context) grid of >= 10M points.

Both lambdified forms of the one sympy step model are timed through
`jaxroof.timing` (warm-up excluded, synchronised, median of repeats): numpy
over broadcast arrays and the jit-compiled JAX form. For scale, a per-point
Python loop (what a scalar calculator does) is timed on a small subset.

  python -m experiments.bench_sweep --json_out=results/bench_sweep_cpu.json
"""

from __future__ import annotations

import platform

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from experiments import _cli
from jaxroof.errors import InputError
from jaxroof import files
from jaxroof.symbolic.evaluate import step_model
from jaxroof.timing import time_call

_BATCHES = flags.DEFINE_integer("batches", 4096, "Batch sizes 1..this in the grid. >= 1.", lower_bound=1)
_CONTEXTS = flags.DEFINE_integer("contexts", 2500, "Context lengths in the grid. >= 1.", lower_bound=1)
_REPEATS = flags.DEFINE_integer("repeats", 10, "Timed repeats per backend. In [1, 10,000].",
                                lower_bound=1, upper_bound=10_000)
_LOOP_POINTS = flags.DEFINE_integer(
    "loop_points", 20000, "Points for the per-point Python loop baseline. >= 1.", lower_bound=1)
_JSON_OUT = flags.DEFINE_string("json_out", None, "Write the timings as JSON here.")

# An 8B BF16 model with Llama-3-8B-like KV (131,072 B/token) on 2 TB/s, 600 TFLOP/s.
_MODEL = dict(N=8e9, q=2.0, k=131072.0, BW=2e12, F=6e14)


MEMORY_LIMIT_BYTES = 4e9


def _grid(batches: int, contexts: int) -> tuple[np.ndarray, np.ndarray]:
  batch = np.arange(1, batches + 1, dtype=np.float64)[:, None]
  context = np.linspace(128, 131072, contexts, dtype=np.float64)[None, :]
  return batch, context


def main(argv: list[str]) -> None:
  del argv  # Unused.
  points = _BATCHES.value * _CONTEXTS.value
  # Each output of the step model is a float64 array of every point, ~10 of them.
  if points * 8 * 10 > MEMORY_LIMIT_BYTES:
    raise InputError(f"--batches x --contexts = {points:,} points need about "
                     f"{points * 80 / 1e9:,.1f} GB, over the {MEMORY_LIMIT_BYTES / 1e9:g} GB "
                     "limit: give fewer points.")
  batch, context = _grid(_BATCHES.value, _CONTEXTS.value)
  m = _MODEL
  results = {}

  numpy_model = step_model("numpy")
  timing = time_call(lambda b, c: numpy_model(B=b, T=c, **m),
                     [(batch, context)], warmup=2, repeats=_REPEATS.value)
  results["numpy"] = {"points_per_s": points / timing.median_s, "timing": timing.to_json(),
                      "dtype": "float64"}

  jax_model = step_model("jax")
  jb, jc = jnp.asarray(batch, jnp.float32), jnp.asarray(context, jnp.float32)
  timing = time_call(lambda b, c: jax_model(B=b, T=c, **m),
                     [(jb, jc)], warmup=2, repeats=_REPEATS.value)
  results["jax_jit"] = {"points_per_s": points / timing.median_s, "timing": timing.to_json(),
                        "dtype": "float32", "device": str(jax.devices()[0].device_kind)}

  flat_b = batch.ravel()[: _LOOP_POINTS.value]

  def loop() -> None:
    for b in flat_b:
      numpy_model(B=float(b), T=4096.0, **m)

  timing = time_call(loop, [()], warmup=0, repeats=1)
  results["python_loop"] = {"points_per_s": len(flat_b) / timing.median_s,
                            "points": len(flat_b), "timing": timing.to_json()}

  best = max(("numpy", "jax_jit"), key=lambda name: results[name]["points_per_s"])
  report = {
      "kind": "measurement",
      "what": "evaluation speed of the analytic step model (not a kernel speed)",
      "points": points,
      "grid": {"batches": _BATCHES.value, "contexts": _CONTEXTS.value},
      "points_per_s": results["numpy"]["points_per_s"],
      "best_backend": best,
      "backends": results,
      "machine": {"processor": platform.processor() or platform.machine(),
                  "python": platform.python_version(), "jax": jax.__version__,
                  "numpy": np.__version__},
      "method": "jaxroof.timing.time_call: warm-up excluded, block_until_ready, median",
  }
  for name, r in results.items():
    print(f"{name:12s} {r['points_per_s']:>16,.0f} points/s")
  print(f"grid: {points:,} (batch, context) points; points_per_s (numpy) = {report['points_per_s']:,.0f}")
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, report)


if __name__ == "__main__":
  _cli.run(main)
