"""A toy decoder-only Transformer with a functional KV state.

It demonstrates the lesson's central claim: after prefill, each decode step
computes Q/K/V only for the new position, reads the retained K/V, and gives
the same logits as a fresh causal forward pass over the whole prefix
(`check.lesson_check`, float64). `breakers` holds four changes that break
that reuse, and `kv_account` counts the K/V a state holds.

Quick start (float64 only inside the context, never globally):

  >>> import jax, jax.numpy as jnp
  >>> from jaxroof import toy
  >>> with jax.enable_x64(True):
  ...   params = toy.init_params(toy.LESSON, jax.random.key(0), jnp.float64)
  ...   ids = jnp.asarray([toy.LESSON_PROMPT])
  ...   logits, state = toy.prefill(params, ids)
  ...   logits, state = toy.decode_step(params, state, logits[:, -1].argmax(-1))
  >>> toy.kv_account(state).positions
  4

Timing a decode step at batch B with T retained tokens (no prefill needed):

  params = toy.init_params(toy.SMALL_12L, jax.random.key(0), jnp.bfloat16)
  state = toy.random_cache(toy.SMALL_12L, batch=8, max_len=1025, length=1024,
                           key=jax.random.key(1), dtype=jnp.bfloat16)
  step = jax.jit(toy.decode_step)  # Fixed shapes: traces once.
  token = jnp.zeros((8,), jnp.int32)
  logits, new_state = step(params, state, token)  # Warm up, then time.

Re-timing the same step from the same `state` keeps T fixed; feeding
`new_state` back grows it by one each call. The fixed cache's attention reads
all `max_len` slots (masked ones too), so max_len = T + 1 times a step over
exactly the T retained positions plus the new one.
`init_cache(config, batch, max_len, dtype)` gives an empty fixed state.
"""

import importlib
from typing import Any

# Names load on first use (PEP 562): `jaxroof.toy.config` alone, which the analytic
# experiments read, then costs no jax import.
_SOURCES: dict[str, str] = {
    "BREAKS": "breakers",
    "Variant": "breakers",
    "broken": "breakers",
    "correct": "breakers",
    "new_revision": "breakers",
    "Cache": "cache",
    "FixedCache": "cache",
    "GrowingCache": "cache",
    "KVAccount": "cache",
    "empty_growing_cache": "cache",
    "init_cache": "cache",
    "kv_account": "cache",
    "random_cache": "cache",
    "CheckResult": "check",
    "StepRow": "check",
    "check_decode": "check",
    "lesson_check": "check",
    "CPU_BENCH": "config",
    "LESSON": "config",
    "LESSON_PROMPT": "config",
    "PRESETS": "config",
    "SMALL_12L": "config",
    "ToyConfig": "config",
    "preset": "config",
    "decode_step": "model",
    "extend": "model",
    "forward": "model",
    "generate": "model",
    "generate_uncached": "model",
    "prefill": "model",
    "BlockParams": "weights",
    "Params": "weights",
    "init_params": "weights",
    "num_weights": "weights",
}

__all__ = (
    "BREAKS",
    "BlockParams",
    "CPU_BENCH",
    "Cache",
    "CheckResult",
    "FixedCache",
    "GrowingCache",
    "KVAccount",
    "LESSON",
    "LESSON_PROMPT",
    "PRESETS",
    "Params",
    "SMALL_12L",
    "StepRow",
    "ToyConfig",
    "Variant",
    "broken",
    "check_decode",
    "correct",
    "decode_step",
    "empty_growing_cache",
    "extend",
    "forward",
    "generate",
    "generate_uncached",
    "init_cache",
    "init_params",
    "kv_account",
    "lesson_check",
    "new_revision",
    "num_weights",
    "prefill",
    "preset",
    "random_cache",
)


def __getattr__(name: str) -> Any:
  if name not in _SOURCES:
    raise AttributeError(f"module 'jaxroof.toy' has no attribute {name!r}")
  value = getattr(importlib.import_module(f"jaxroof.toy.{_SOURCES[name]}"), name)
  globals()[name] = value
  return value


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(__all__))
