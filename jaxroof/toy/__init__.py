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

from jaxroof.toy.breakers import BREAKS
from jaxroof.toy.breakers import Variant
from jaxroof.toy.breakers import broken
from jaxroof.toy.breakers import correct
from jaxroof.toy.breakers import new_revision
from jaxroof.toy.cache import Cache
from jaxroof.toy.cache import FixedCache
from jaxroof.toy.cache import GrowingCache
from jaxroof.toy.cache import KVAccount
from jaxroof.toy.cache import empty_growing_cache
from jaxroof.toy.cache import init_cache
from jaxroof.toy.cache import kv_account
from jaxroof.toy.cache import random_cache
from jaxroof.toy.check import CheckResult
from jaxroof.toy.check import StepRow
from jaxroof.toy.check import check_decode
from jaxroof.toy.check import lesson_check
from jaxroof.toy.config import CPU_BENCH
from jaxroof.toy.config import LESSON
from jaxroof.toy.config import LESSON_PROMPT
from jaxroof.toy.config import PRESETS
from jaxroof.toy.config import SMALL_12L
from jaxroof.toy.config import ToyConfig
from jaxroof.toy.config import preset
from jaxroof.toy.model import decode_step
from jaxroof.toy.model import extend
from jaxroof.toy.model import forward
from jaxroof.toy.model import generate
from jaxroof.toy.model import generate_uncached
from jaxroof.toy.model import prefill
from jaxroof.toy.weights import BlockParams
from jaxroof.toy.weights import Params
from jaxroof.toy.weights import init_params
from jaxroof.toy.weights import num_weights

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
