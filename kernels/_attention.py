"""What decode attention and paged decode attention share.

The float32 online softmax one program keeps over chunks of K/V
(`init_state`, `attend_chunk`), the log-sum-exp combine of flash-decoding
splits (`combine_splits`), the checks of lengths and scale, the tolerance
against the reference and the lengths example inputs use.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxroof.errors import InputError, require_choice, require_finite
from kernels import device_timing

SUPPORTED_DTYPES = ("float32", "bfloat16", "float16")
# What the autotuner checks a candidate's output on, for its cache record.
CHECK_NOTE = ("the timed arguments with ragged lengths, including 1 and "
              "max_len (with_ragged_lengths), then the timed arguments")
_F32 = jnp.float32
# Without it the Triton lowering runs float32 dots in TF32 (10-bit mantissa).
_EXACT = lax.Precision.HIGHEST


def check_lengths(lengths, max_len: int) -> None:
  """Checks 1 <= lengths <= max_len when the values are known (not traced)."""
  try:
    values = np.asarray(lengths)
  except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
    return  # Traced under jit: the values are not known yet.
  bad = np.flatnonzero((values < 1) | (values > max_len))
  if bad.size:
    i = int(bad[0])
    raise InputError(f"lengths[{i}]={int(values[i])} is not allowed: each length must be "
                     f"in 1..{max_len} (max_len).")


def default_scale(head_dim: int, scale: float | None) -> float:
  """1/sqrt(head_dim) unless a scale is given."""
  if scale is None:
    return 1.0 / math.sqrt(head_dim)
  return require_finite("scale", scale)


def tolerance(dtype) -> tuple[float, float]:
  """(rtol, atol) against the reference, for outputs of RMS one."""
  if jnp.dtype(dtype) == jnp.float32:
    return 2e-5, 2e-5
  return 2e-2, 2e-2


def init_state(block_h: int, head_dim: int):
  """Online-softmax state (acc, running max, running sum), all float32."""
  return (
      jnp.zeros((block_h, head_dim), _F32),
      jnp.full((block_h, 1),
               jnp.finfo(_F32).min, _F32),
      jnp.zeros((block_h, 1), _F32),
  )


def attend_chunk(q, keys, vals, first, length, state, *, scale: float):
  """One online-softmax step of q over a chunk of K/V positions.

  Args:
    q: (block_h, head_dim) query rows.
    keys, vals: (chunk, head_dim) K and V of positions first, first + 1, ...
    first: the sequence position of the chunk's first row.
    length: the sequence's length; positions >= length are masked, and
      their values zeroed so that NaN in unused cache slots cannot leak.
    state: (acc, m, l) from `init_state` or the previous chunk.
    scale: softmax scale.

  Returns:
    The updated state. The chunk must hold at least one valid position.
  """
  acc, m, l = state
  chunk = keys.shape[0]
  # (block_h, head_dim) x (chunk, head_dim) -> (block_h, chunk)
  s = lax.dot_general(
      q,
      keys,
      (((1,), (1,)), ((), ())),
      precision=_EXACT,
      preferred_element_type=_F32,
  )
  row = first + lax.broadcasted_iota(jnp.int32, (1, chunk), 1)
  col = first + lax.broadcasted_iota(jnp.int32, (chunk, 1), 0)
  s = jnp.where(row < length, s * scale, -jnp.inf)
  m_next = jnp.maximum(m, s.max(axis=1, keepdims=True))
  correction = jnp.exp(m - m_next)
  p = jnp.exp(s - m_next)
  l_next = l * correction + p.sum(axis=1, keepdims=True)
  vals = jnp.where(col < length, vals, 0)
  pv = jnp.dot(p.astype(vals.dtype), vals, precision=_EXACT, preferred_element_type=_F32)
  return acc * correction + pv, m_next, l_next


def combine_splits(o, m, l):
  """Log-sum-exp merge over axis 2 of per-split (o, m, l); returns o / l.

  A split with no valid position has m = finfo.min and l = 0, so its weight
  exp(m - max) is 0; split 0 always holds position 0, so the sum is positive.
  """
  m_max = m.max(axis=2, keepdims=True)
  weight = jnp.exp(m - m_max)
  total = (weight * l).sum(axis=2)
  return (weight * o).sum(axis=2) / total


LENGTHS = ("full", "ragged")


def example_lengths(key: jax.Array, batch: int, max_len: int, lengths: str = "full") -> jax.Array:
  """int32[batch] sequence lengths for example inputs.

  Args:
    key: for the random lengths.
    batch: sequences.
    max_len: the longest allowed length.
    lengths: "full" (all max_len) or "ragged": random in 1..max_len, the
      first 1 and (batch >= 2) the last max_len, so empty splits, ragged
      tails and full sequences all occur.
  """
  require_choice("lengths", lengths, LENGTHS)
  if lengths == "full":
    return jnp.full((batch,), max_len, jnp.int32)
  lens = jax.random.randint(key, (batch,), 1, max_len + 1, jnp.int32)
  lens = lens.at[0].set(1)
  return lens.at[-1].set(max_len) if batch > 1 else lens


def example_args(problem: Any, key: jax.Array, *, lengths: str = "full"):
  """Random contiguous-cache inputs (q, k, v, lengths) for a decode problem.

  `problem` has batch, heads, kv_heads, max_len, head_dim and dtype;
  `lengths` as for `example_lengths`.
  """
  kq, kk, kv, kl = jax.random.split(key, 4)
  p = problem
  dtype = jnp.dtype(p.dtype)
  q = jax.random.normal(kq, (p.batch, p.heads, p.head_dim), dtype)
  shape = (p.batch, p.max_len, p.kv_heads, p.head_dim)
  k = jax.random.normal(kk, shape, dtype)
  v = jax.random.normal(kv, shape, dtype)
  return q, k, v, example_lengths(kl, p.batch, p.max_len, lengths)


def with_ragged_lengths(args, key: jax.Array):
  """(q, k, v, lengths) with ragged lengths instead (`example_lengths`)."""
  q, k, v, _ = args
  batch, max_len = k.shape[:2]
  return q, k, v, example_lengths(key, batch, max_len, "ragged")


def contiguous_chain_feed(args, out):
  """Next call's args: q from the output, one K and one V element rewritten.

  As a decode step writes its new row (see `device_timing.poke`).
  """
  q, k, v, lengths = args
  return out, device_timing.poke(k, out), device_timing.poke(v, out), lengths
