"""The KV state: immutable pytrees in two layouts, and what they hold.

* `GrowingCache`: K/V arrays exactly as long as the processed positions. Each
  step returns longer arrays, so a jit-compiled step retraces every time.
* `FixedCache`: preallocated `max_len` slots plus a `length`. Shapes never
  change, so a jit-compiled decode step traces once.

Both store keys after RoPE. All sequences of a batch share one length.
`kv_account` counts what a state holds from the state itself.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from jaxroof import errors
from jaxroof.toy.config import ToyConfig

# What `int()` raises on a traced value.
_TRACED = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerIntegerConversionError,
)


@functools.partial(
    jax.tree_util.register_dataclass, data_fields=["k", "v"], meta_fields=[]
)
@dataclasses.dataclass(frozen=True)
class GrowingCache:
  """K/V of the T processed positions; T is the arrays' length."""

  k: jax.Array  # shape=(l, b, T, k, e): keys after RoPE.
  v: jax.Array  # shape=(l, b, T, k, e).

  @property
  def max_len(self) -> int:
    return self.k.shape[2]

  @property
  def length(self) -> int:
    """Positions holding computed K/V (static)."""
    return self.k.shape[2]

  def check_room(self, num_new: int) -> None:
    """A growing state always has room."""
    del num_new  # Unused.

  def buffers(self, num_new: int) -> tuple[jax.Array, jax.Array, int]:
    """Buffers with `num_new` empty slots appended, and where they start."""
    pad = [(0, 0)] * self.k.ndim
    pad[2] = (0, num_new)
    return jnp.pad(self.k, pad), jnp.pad(self.v, pad), self.length

  def written(self, k: jax.Array, v: jax.Array, num_new: int) -> GrowingCache:
    """The state after `buffers`' new slots were filled."""
    del num_new  # Unused: the length is the buffers' length.
    return GrowingCache(k=k, v=v)


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["k", "v", "length"],
    meta_fields=[],
)
@dataclasses.dataclass(frozen=True)
class FixedCache:
  """`max_len` preallocated slots; slots [0, length) hold computed K/V."""

  k: jax.Array  # shape=(l, b, max_len, k, e): keys after RoPE.
  v: jax.Array  # shape=(l, b, max_len, k, e).
  length: jax.Array  # shape=(), dtype=int32: filled slots per sequence.

  @property
  def max_len(self) -> int:
    return self.k.shape[2]

  def check_room(self, num_new: int) -> None:
    """Raises if `num_new` positions do not fit; skipped under jit."""
    try:
      free = self.max_len - int(self.length)
    except _TRACED:
      return  # Under jit: an overflow makes the logits NaN (`model._extend`).
    if num_new > free:
      raise errors.InputError(
          f"{num_new} new positions do not fit: the fixed cache has"
          f" max_len={self.max_len} and {free} free slots."
      )

  def buffers(self, num_new: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The buffers and the first free slot."""
    del num_new  # Unused: the slots are preallocated.
    return self.k, self.v, self.length

  def written(self, k: jax.Array, v: jax.Array, num_new: int) -> FixedCache:
    """The state after `buffers`' new slots were filled."""
    return FixedCache(k=k, v=v, length=self.length + num_new)


Cache = GrowingCache | FixedCache


def _shape(config: ToyConfig, batch: int, slots: int) -> tuple[int, ...]:
  return (config.num_blocks, batch, slots, config.num_kv_heads,
          config.head_dim)


def empty_growing_cache(
    config: ToyConfig, batch: int, dtype: jnp.dtype
) -> GrowingCache:
  """A growing state with no positions."""
  zeros = jnp.zeros(_shape(config, batch, 0), dtype)
  return GrowingCache(k=zeros, v=zeros)


def init_cache(
    config: ToyConfig, batch: int, max_len: int, dtype: jnp.dtype
) -> FixedCache:
  """An empty fixed-size state of `max_len` slots per sequence (zeros)."""
  batch = errors.require_positive_int("batch", batch)
  max_len = errors.require_positive_int("max_len", max_len)
  if config.positions == "learned" and max_len > config.max_positions:
    raise errors.InputError(
        f"max_len={max_len} is not allowed: the learned position table has"
        f" max_positions={config.max_positions} rows."
    )
  zeros = jnp.zeros(_shape(config, batch, max_len), dtype)
  return FixedCache(k=zeros, v=zeros, length=jnp.zeros((), jnp.int32))


def random_cache(
    config: ToyConfig,
    batch: int,
    max_len: int,
    length: int,
    key: jax.Array,
    dtype: jnp.dtype,
) -> FixedCache:
  """A fixed-size state whose first `length` slots hold random K/V.

  For timing a decode step at a given batch and context without running
  prefill: the step reads and attends to these slots like computed ones.
  """
  cache = init_cache(config, batch, max_len, dtype)
  length = errors.require_non_negative("length", length)
  if length != int(length) or length >= cache.max_len:
    raise errors.InputError(
        f"length={length!r} is not allowed: it must be a whole number in"
        f" [0, max_len) = [0, {cache.max_len}), leaving a slot to decode into."
    )
  length = int(length)
  shape = _shape(config, batch, max_len)
  filled = jnp.arange(max_len)[None, None, :, None, None] < length
  key_k, key_v = jax.random.split(key)
  k = jnp.where(filled, jax.random.normal(key_k, shape, dtype), 0)
  v = jnp.where(filled, jax.random.normal(key_v, shape, dtype), 0)
  return FixedCache(
      k=k.astype(dtype), v=v.astype(dtype),
      length=jnp.asarray(length, jnp.int32),
  )


def write_layer(
    buffer: jax.Array, new: jax.Array, layer: int | jax.Array,
    start: int | jax.Array,
) -> jax.Array:
  """`buffer` (l, b, s, k, e) with `new` (b, t, k, e) written into block
  `layer` at slot `start`; only the new slots are touched."""
  zero = jnp.zeros((), jnp.int32)
  index = (jnp.asarray(layer, jnp.int32), zero, jnp.asarray(start, jnp.int32), zero, zero)
  return lax.dynamic_update_slice(buffer, new.astype(buffer.dtype)[None], index)


@dataclasses.dataclass(frozen=True)
class KVAccount:
  """What a state holds, counted from the state itself (per sequence)."""

  positions: int  # Positions holding computed K/V, per sequence.
  elements_per_position: int  # K and V elements, all blocks, per sequence.
  itemsize: int  # Bytes per element at the state's dtype.
  batch: int
  nbytes: int  # Bytes of the filled slots' arrays, whole batch.

  @property
  def bytes_per_position(self) -> int:
    """K/V bytes one position keeps at the state's dtype."""
    return self.elements_per_position * self.itemsize

  def bytes_per_position_at(self, bytes_per_element: int) -> int:
    """K/V bytes per position with a hypothetical element size."""
    return self.elements_per_position * bytes_per_element

  def bytes_at(self, bytes_per_element: int) -> int:
    """K/V bytes of all filled positions of one sequence at that size."""
    return self.positions * self.bytes_per_position_at(bytes_per_element)


def kv_account(cache: Cache) -> KVAccount:
  """Counts the positions holding computed K/V and the bytes they occupy.

  The position count is the growing arrays' length or the fixed cache's
  length; the bytes are the sizes of those slots' K and V arrays.
  """
  positions = int(cache.length)
  batch = cache.k.shape[1]
  # Elements of one slot of one sequence: the arrays' shapes without the
  # batch and slot axes.
  elements = sum(
      math.prod(x.shape[:1] + x.shape[3:]) for x in (cache.k, cache.v)
  )
  k_filled = cache.k[:, :, :positions]
  v_filled = cache.v[:, :, :positions]
  return KVAccount(
      positions=positions,
      elements_per_position=elements,
      itemsize=cache.k.dtype.itemsize,
      batch=batch,
      nbytes=k_filled.nbytes + v_filled.nbytes,
  )
