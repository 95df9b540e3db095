"""The benchmarks `experiments.bench` runs, one function per `--what`.

Each times one piece of jaxroof through `jaxroof.timing.time_call` (warm-up excluded,
synchronised, median and spread of repeats) and returns its JSON document, with the keys
the former `bench_sweep`, `bench_simulate` and `bench_decode` apps wrote (the planner's,
`experiments._plan_benchmark`).
These are measurements of this machine (`machine` in the JSON), never of an accelerator
the model describes.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from jaxroof import errors
from jaxroof import progress
from jaxroof import timing
from jaxroof.serving import arrivals
from jaxroof.serving import replica
from jaxroof.serving import simulator
from jaxroof.specs.accelerators import load_accelerator
from jaxroof.specs.models import load_model
from jaxroof.symbolic import formulas
from jaxroof.symbolic.evaluate import step_model
from jaxroof.toy import config as config_lib
from jaxroof.toy import model as toy_model
from jaxroof.toy import weights

# sweep: an 8B BF16 model with Llama-3-8B-like K/V (131,072 B/token) on 2 TB/s, 600 TFLOP/s.
SWEEP_MODEL = dict(N=8e9, q=2.0, k=131072.0, BW=2e12, F=6e14)
SWEEP_MEMORY_LIMIT_BYTES = 4e9  # About ten float64 outputs per grid point.
DECODE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def sweep(*, batches: int, contexts: int, repeats: int, loop_points: int) -> dict:
  """Points per second of the lambdified step model over a (batch, context) grid: numpy,
  jit-compiled JAX, and for scale a per-point Python loop on a subset."""
  points = batches * contexts
  if points * 8 * 10 > SWEEP_MEMORY_LIMIT_BYTES:
    raise errors.InputError(
        f"batches x contexts = {points:,} points need about {points * 80 / 1e9:,.1f} GB, over "
        f"the {SWEEP_MEMORY_LIMIT_BYTES / 1e9:g} GB limit: give fewer points.", field="batches")
  batch = np.arange(1, batches + 1, dtype=np.float64)[:, None]
  context = np.linspace(128, 131072, contexts, dtype=np.float64)[None, :]
  numpy_model, jax_model = step_model("numpy"), step_model("jax")
  numpy_t = timing.time_call(lambda b, c: numpy_model(B=b, T=c, **SWEEP_MODEL), [(batch, context)],
                             warmup=2, repeats=repeats)
  jax_t = timing.time_call(lambda b, c: jax_model(B=b, T=c, **SWEEP_MODEL),
                           [(jnp.asarray(batch, jnp.float32), jnp.asarray(context, jnp.float32))],
                           warmup=2, repeats=repeats)
  flat_b = batch.ravel()[:loop_points]
  loop_t = timing.time_call(
      lambda: [numpy_model(B=float(b), T=4096.0, **SWEEP_MODEL) for b in flat_b], [()], warmup=0,
      repeats=1)
  backends = {
      "numpy": {
          "points_per_s": points / numpy_t.median_s, "timing": numpy_t.to_json(), "dtype": "float64"
      }, "jax_jit": {
          "points_per_s": points / jax_t.median_s, "timing": jax_t.to_json(), "dtype": "float32",
          "device": str(jax.devices()[0].device_kind)
      }, "python_loop": {
          "points_per_s": len(flat_b) / loop_t.median_s, "points": len(flat_b),
          "timing": loop_t.to_json()
      }
  }
  return {
      "experiment": "bench_sweep", "kind": "measurement",
      "what": "evaluation speed of the analytic step model (not a kernel speed)", "points": points,
      "grid": {"batches": batches, "contexts": contexts
              }, "points_per_s": backends["numpy"]["points_per_s"], "best_backend": max(
                  ("numpy", "jax_jit"), key=lambda n: backends[n]["points_per_s"]),
      "backends": backends, "machine": timing.host(),
      "method": "jaxroof.timing.time_call: warm-up excluded, block_until_ready, median"
  }


def simulate(*, num_requests: int, arrival_rate: float, schedulers: list[str], repeats: int,
             show_progress: bool) -> dict:
  """Wall seconds, requests/s and iterations/s of the simulator per scheduler, on
  llama-3-8b on h100-sxm with lognormal prompts (~1,000) and outputs (~200)."""
  for name in schedulers:
    errors.require_choice("schedulers", name, simulator.SCHEDULERS)
  w = arrivals.synthetic(arrival="poisson", num_requests=num_requests, arrival_rate=arrival_rate,
                         seed=0, prompt_tokens=1000, output_tokens=200,
                         prompt_distribution="lognormal", output_distribution="lognormal",
                         prompt_spread=0.5, output_spread=0.5)
  r = replica.from_model(load_model("llama-3-8b"), load_accelerator("h100-sxm"), context=1200,
                         batch_window_s=0.05)
  load_before = os.getloadavg()
  rows = {}
  for name in progress.bar(schedulers, desc="schedulers", unit="scheduler",
                           requested=show_progress):
    iterations = simulator.simulate(w, r, name).iterations  # The warm-up (lambdify caches).
    t = timing.time_call(lambda: simulator.simulate(w, r, name), [()], warmup=0, repeats=repeats)
    rows[name] = {
        "wall_s_median": t.median_s, "wall_s_min": t.min_s, "wall_s_max": t.max_s,
        "iterations": iterations, "requests_per_s_simulated": len(w) / t.median_s,
        "iterations_per_s_simulated": iterations / t.median_s, "within_10_s": t.median_s <= 10.0,
        "timing": t.to_json()
    }
  return {
      "experiment": "bench_simulate", "kind": "measurement",
      "label": "measurement of the simulator's own speed (wall clock, jaxroof.timing.time_call;"
               " 1 warm-up + repeats, median)",
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "machine": {
          **timing.host(), "load_average_1_5_15_before": list(load_before),
          "load_average_1_5_15_after": list(os.getloadavg())
      }, "workload": w.description, "replica": r.description, "repeats": repeats, "schedulers": rows
  }


def decode(config: config_lib.ToyConfig, *, preset: str, dtype_name: str, batch: int,
           prompt_len: int, new_tokens: int, repeats: int, seed: int) -> dict:
  """The toy's generation with the K/V cache against recomputing the prefix for every
  output: both jit-compiled, one warm-up (compiling) run excluded."""
  dtype = DECODE_DTYPES[errors.require_choice("dtype", dtype_name, tuple(DECODE_DTYPES))]
  if config.positions == "learned" and prompt_len + new_tokens > config.max_positions:
    raise errors.InputError(
        f"prompt_len + new_tokens = {prompt_len + new_tokens} is not allowed: the preset's "
        f"learned table has max_positions={config.max_positions}.", field="prompt_len")
  weights.require_compilable(config, 2, what="cached and recomputing generation")
  weights.require_fits(config,
                       jnp.dtype(dtype).itemsize, batch=batch, positions=prompt_len + new_tokens,
                       attention_positions=prompt_len + new_tokens)
  params_key, ids_key = jax.random.split(jax.random.key(seed))
  params = weights.init_params(config, params_key, dtype)
  ids = jax.random.randint(ids_key, (batch, prompt_len), 0, config.vocab_size, jnp.int32)
  load_before = os.getloadavg()[0]
  timings, outputs = {}, {}
  for name, generate in (("cached", toy_model.generate), ("recompute",
                                                          toy_model.generate_uncached)):
    fn = functools.partial(jax.jit(generate, static_argnames=("steps",)), steps=new_tokens)
    outputs[name] = jax.block_until_ready(fn(params, ids))  # The warm-up: compiles.
    measured = timing.time_call(fn, [(params, ids)], warmup=0, repeats=repeats)
    timings[name] = dataclasses.replace(measured, warmup=1)
  cached, recompute = timings["cached"], timings["recompute"]
  return {
      "experiment": "bench_decode",
      "kind": "measurement",
      "backend": jax.default_backend(),
      "device": jax.devices()[0].device_kind,
      "jax_version": jax.__version__,
      "cpu_count": os.cpu_count(),
      "load_average_1m": {"start": load_before, "end": os.getloadavg()[0]},
      "dtype": dtype_name,
      "timing": "jaxroof.timing.time_call: jit-compiled; one warm-up run (with compilation) "
                "excluded; block_until_ready; wall clock; median of repeats",
      "inputs": {
          "preset": preset, "config": dataclasses.asdict(config),
          "weights": weights.num_weights(params), "batch": batch, "prompt_len": prompt_len,
          "new_tokens": new_tokens, "repeats": repeats, "seed": seed
      },
      "cached": cached.to_json(),
      "recompute": recompute.to_json(),
      "speedup": recompute.median_s / cached.median_s,
      "outputs_match": bool(np.array_equal(outputs["cached"], outputs["recompute"])),
      "recompute_note": "forward over prompt_len + new_tokens slots each step (static "
                        "shapes, later slots masked)",
      # Rows run through the model per sequence (a count, not a time).
      "positions_processed": {
          "cached": int(formulas.positions_with_kv(prompt_len, new_tokens)),
          "recompute": new_tokens * (prompt_len + new_tokens)
      },
      "units": {
          "*_s": "s", "speedup": "1 (recompute / cached medians)",
          "positions_processed": "positions per sequence"
      }
  }
