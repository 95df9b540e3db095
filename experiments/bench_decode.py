"""Measures generation with the KV cache against recomputing the prefix.

Generates `--new_tokens` greedy tokens after a `--prompt_len`-token random
prompt twice: with a fixed-size KV state (prefill, then one-row decode steps)
and by recomputing a causal forward pass over the whole prefix for every
output. Both are one jit-compiled function each; one warm-up run (which
compiles) is excluded; each run is synchronised with `block_until_ready`; the
median of `--repeats` runs is reported with its spread (`jaxroof.timing`).

These are measurements on this machine (`backend`, `device` in the JSON). The
recompute path runs the forward pass over prompt + new_tokens slots every step
(static shapes; later slots masked), so its linear-layer work exceeds that of
recomputing the exact prefix by at most (prompt + new) / prompt (1.125 at the
defaults).

  python -m experiments.bench_decode --json_out=results/bench_decode_cpu.json
  python -m experiments.bench_decode --preset=small_12l --dtype=bfloat16
"""

from __future__ import annotations

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags, logging

from experiments import _cli
from jaxroof.toy import weights
from jaxroof import errors, timing
from jaxroof.symbolic import formulas
from jaxroof import files
from jaxroof.toy import config as config_lib
from jaxroof.toy.model import generate, generate_uncached
from jaxroof.toy.weights import init_params, num_weights

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}

# Model.
_PRESET = flags.DEFINE_enum("preset", "cpu_bench", list(config_lib.PRESETS), "Model sizes.")
_BLOCKS = flags.DEFINE_integer(
    "blocks", None, "Override the preset's blocks (>= 1).", lower_bound=1)
_WIDTH = flags.DEFINE_integer(
    "width", None, "Override the preset's residual width (>= 1).",
    lower_bound=1)
_DTYPE = flags.DEFINE_enum("dtype", "float32", list(DTYPES), "Weights and K/V.")

# Workload.
_BATCH = flags.DEFINE_integer(
    "batch", 1, "Sequences generated together (>= 1).", lower_bound=1)
_PROMPT_LEN = flags.DEFINE_integer(
    "prompt_len", 1024, "Prompt tokens (>= 1).", lower_bound=1)
_NEW_TOKENS = flags.DEFINE_integer(
    "new_tokens", 128, "Generated tokens (>= 1).", lower_bound=1)

# Timing.
_REPEATS = flags.DEFINE_integer(
    "repeats", 5, "Timed runs of each path after one warm-up. In [1, 10,000].",
    lower_bound=1, upper_bound=10_000)
_SEED = flags.DEFINE_integer("seed", 0, "Seeds the weights and the prompt. In [0, 2**32).",
                             lower_bound=0, upper_bound=2**32 - 1)
_JSON_OUT = flags.DEFINE_string(
    "json_out", None, "Write inputs, results and units as JSON to this path.")


def main(argv: list[str]) -> int:
  del argv  # Unused.
  config = config_lib.preset(_PRESET.value)
  overrides = {}
  if _BLOCKS.value:
    overrides["num_blocks"] = _BLOCKS.value
  if _WIDTH.value:
    overrides["width"] = _WIDTH.value
  config = dataclasses.replace(config, **overrides)
  dtype_name = errors.require_choice("dtype", _DTYPE.value, tuple(DTYPES))
  dtype = DTYPES[dtype_name]
  batch, prompt_len, steps = (_BATCH.value, _PROMPT_LEN.value,
                              _NEW_TOKENS.value)
  if config.positions == "learned" and prompt_len + steps > (
      config.max_positions):
    raise errors.InputError(
        f"prompt_len + new_tokens = {prompt_len + steps} is not allowed: the"
        f" preset's learned table has max_positions={config.max_positions}.")

  weights.require_compilable(config, 2, what="cached and recomputing generation")
  weights.require_fits(config, jnp.dtype(dtype).itemsize, batch=batch,
                       positions=prompt_len + steps, attention_positions=prompt_len + steps)
  params_key, ids_key = jax.random.split(jax.random.key(_SEED.value))
  params = init_params(config, params_key, dtype)
  ids = jax.random.randint(ids_key, (batch, prompt_len), 0,
                           config.vocab_size, jnp.int32)
  paths = {
      "cached": jax.jit(generate, static_argnames=("steps",)),
      "recompute": jax.jit(generate_uncached, static_argnames=("steps",)),
  }
  logging.info("%s: %d weights, %s, batch %d, prompt %d, %d new tokens",
               _PRESET.value, num_weights(params), dtype_name, batch,
               prompt_len, steps)

  load_before = os.getloadavg()[0]
  timings, outputs = {}, {}
  for name, fn in paths.items():
    logging.info("timing %s: 1 warm-up (compiles) + %d runs", name,
                 _REPEATS.value)
    fn = functools.partial(fn, steps=steps)
    # The warm-up: compiles, and gives the outputs compared below.
    outputs[name] = jax.block_until_ready(fn(params, ids))
    measured = timing.time_call(fn, [(params, ids)], warmup=0,
                                repeats=_REPEATS.value)
    timings[name] = dataclasses.replace(measured, warmup=1)
    logging.info("%s: median %.3f s", name, measured.median_s)

  cached, recompute = timings["cached"], timings["recompute"]
  speedup = recompute.median_s / cached.median_s
  outputs_match = bool(np.array_equal(outputs["cached"],
                                      outputs["recompute"]))
  device = jax.devices()[0]
  print(f"{_PRESET.value} ({num_weights(params):,} weights, {dtype_name}),"
        f" batch {batch}: {steps} tokens after a {prompt_len}-token prompt on"
        f" {device.device_kind} ({jax.default_backend()})")
  for name, t in (("with KV cache", cached), ("recomputing prefix", recompute)):
    print(f"  {name:<19} median {t.median_s:.3f} s"
          f" (min {t.min_s:.3f}, max {t.max_s:.3f}; {t.repeats} runs)")
  print(f"  speedup {speedup:.1f}x (measured); greedy outputs"
        f" {'identical' if outputs_match else 'differ'}.")

  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, {
        "experiment": "bench_decode",
        "kind": "measurement",
        "backend": jax.default_backend(),
        "device": device.device_kind,
        "jax_version": jax.__version__,
        "cpu_count": os.cpu_count(),
        "load_average_1m": {"start": load_before,
                            "end": os.getloadavg()[0]},
        "dtype": dtype_name,
        "timing": "jaxroof.timing.time_call: jit-compiled; one warm-up run"
                  " (with compilation) excluded; block_until_ready; wall"
                  " clock; median of repeats",
        "inputs": {
            "preset": _PRESET.value,
            "config": dataclasses.asdict(config),
            "weights": num_weights(params),
            "batch": batch,
            "prompt_len": prompt_len,
            "new_tokens": steps,
            "repeats": _REPEATS.value,
            "seed": _SEED.value,
        },
        "cached": cached.to_json(),
        "recompute": recompute.to_json(),
        "speedup": speedup,
        "outputs_match": outputs_match,
        "recompute_note": "forward over prompt_len + new_tokens slots each"
                          " step (static shapes, later slots masked)",
        # Rows run through the model per sequence (a count, not a time).
        "positions_processed": {
            "cached": int(formulas.positions_with_kv(prompt_len, steps)),
            "recompute": steps * (prompt_len + steps),
        },
        "units": {"*_s": "s", "speedup": "1 (recompute / cached medians)",
                  "positions_processed": "positions per sequence"},
    })
  return 0


if __name__ == "__main__":
  _cli.run(main)
