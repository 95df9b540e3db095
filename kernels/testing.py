"""Helpers for kernel tests: fresh random inputs, poisoning, comparisons."""

from __future__ import annotations

import numpy as np
import jax
import jax.numpy as jnp


def fresh_seed() -> int:
  """A new seed on every call, so every run sees new inputs (print it)."""
  return int(np.random.SeedSequence().generate_state(1)[0])


def ragged_lengths(seed: int, batch: int, max_len: int) -> jax.Array:
  """int32[batch] lengths in 1..max_len, always including 1 and max_len."""
  if batch < 2:
    raise ValueError(f"{batch=} must be >= 2 to hold both 1 and max_len")
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, max_len + 1, size=batch)
  lengths[:2] = (1, max_len)
  return jnp.asarray(rng.permutation(lengths), jnp.int32)


def poison_beyond(kv: jax.Array, lengths: jax.Array) -> jax.Array:
  """NaN at every position >= its sequence's length (axis 1 of (B, T, ...)).

  A kernel that reads unused cache slots into its result turns NaN.
  """
  positions = jnp.arange(kv.shape[1]).reshape(1, -1, *([1] * (kv.ndim - 2)))
  past = positions >= lengths.reshape(-1, *([1] * (kv.ndim - 1)))
  return jnp.where(past, jnp.nan, kv).astype(kv.dtype)


def assert_close(out, expected, *, rtol: float, atol: float, what: str) -> None:
  """Raises AssertionError unless `out` is finite and close to `expected`."""
  a = np.asarray(out, np.float64)
  b = np.asarray(expected, np.float64)
  if a.shape != b.shape:
    raise AssertionError(f"{what}: shape {a.shape} != expected {b.shape}")
  if not np.isfinite(a).all():
    bad = np.argwhere(~np.isfinite(a))[:3].tolist()
    raise AssertionError(f"{what}: non-finite output at {bad}")
  err = np.abs(a - b)
  allowed = atol + rtol * np.abs(b)
  if (err > allowed).any():
    worst = np.unravel_index(np.argmax(err - allowed), err.shape)
    raise AssertionError(f"{what}: max abs error {err.max():.3g} (at {tuple(map(int, worst))}: "
                         f"{a[worst]:.6g} vs {b[worst]:.6g}); rtol={rtol}, atol={atol}")
