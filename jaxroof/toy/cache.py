"""The KV state: immutable pytrees in two layouts, and what they hold.

* `GrowingCache`: K/V arrays exactly as long as the processed positions. Each
  step returns longer arrays, so a jit-compiled step retraces every time.
* `FixedCache`: preallocated `max_len` slots plus a `length`. Shapes never
  change, so a jit-compiled decode step traces once.

Both store keys after RoPE. All sequences of a batch share one length.
`kv_account` counts what a state holds from the state itself.

Storage is one buffer per block and per K and V, head-major: shape
(b * k, slots, e), row `i * k + j` holding sequence i's K/V head j. Why, on
XLA:CPU (measured in `experiments.bench_decode_step`):

* one buffer per block: a decode step writes its new slot into each buffer
  in place (the buffers are donated) and attention reads the buffer itself.
  Stacked (l, ...) buffers make XLA copy a block's slice before every read.
* head-major rows: each (sequence, head) attends over one contiguous
  (slots, e) matrix, so attention is two batched matrix products with no
  transpose of the cache; (b * k) as one axis keeps a degenerate axis
  (batch 1) from turning the read into a reshaped copy.

`k` and `v` give the familiar (l, b, slots, k, e) view (a copy, for
inspection and tests; the model never builds it).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

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

Blocks = tuple[jax.Array, ...]  # One (b * k, slots, e) buffer per block.


def to_blocks(x: jax.Array) -> Blocks:
  """(l, b, slots, k, e) -> per block (b * k, slots, e), head-major."""
  l, b, s, k, e = x.shape
  return tuple(x[i].transpose(0, 2, 1, 3).reshape(b * k, s, e) for i in range(l))


def from_blocks(blocks: Sequence[jax.Array], batch: int) -> jax.Array:
  """Per block (b * k, slots, e) -> (l, b, slots, k, e) (a copy)."""
  n, s, e = blocks[0].shape
  return jnp.stack([x.reshape(batch, n // batch, s, e).transpose(0, 2, 1, 3) for x in blocks])


def write_block(buffer: jax.Array, new: jax.Array, start: int | jax.Array) -> jax.Array:
  """`buffer` (b * k, s, e) with `new` (b, t, k, e) written at slot `start`;
  only the new slots are touched."""
  b, t, k, e = new.shape
  rows = new.transpose(0, 2, 1, 3).reshape(b * k, t, e).astype(buffer.dtype)
  zero = jnp.zeros((), jnp.int32)
  return lax.dynamic_update_slice(buffer, rows, (zero, jnp.asarray(start, jnp.int32), zero))


class _Views:
  """The (l, b, slots, k, e) views and sizes shared by both layouts."""

  k_blocks: Blocks
  v_blocks: Blocks
  batch: int

  @property
  def k(self) -> jax.Array:
    """Keys as (l, b, slots, k, e) (a copy)."""
    return from_blocks(self.k_blocks, self.batch)

  @property
  def v(self) -> jax.Array:
    """Values as (l, b, slots, k, e) (a copy)."""
    return from_blocks(self.v_blocks, self.batch)

  @property
  def max_len(self) -> int:
    return self.k_blocks[0].shape[1]

  @property
  def dtype(self) -> jnp.dtype:
    return self.k_blocks[0].dtype


@functools.partial(jax.tree_util.register_dataclass, data_fields=["k_blocks", "v_blocks"],
                   meta_fields=["batch"])
@dataclasses.dataclass(frozen=True)
class GrowingCache(_Views):
  """K/V of the T processed positions; T is the buffers' length."""

  k_blocks: Blocks  # Per block, shape=(b * k, T, e): keys after RoPE.
  v_blocks: Blocks  # Per block, shape=(b * k, T, e).
  batch: int  # Sequences (static).

  @property
  def length(self) -> int:
    """Positions holding computed K/V (static)."""
    return self.max_len

  def check_room(self, num_new: int) -> None:
    """A growing state always has room."""
    del num_new  # Unused.

  def buffers(self, num_new: int) -> tuple[Blocks, Blocks, int]:
    """Buffers with `num_new` empty slots appended, and where they start."""
    pad = ((0, 0), (0, num_new), (0, 0))
    return (tuple(jnp.pad(x, pad) for x in self.k_blocks),
            tuple(jnp.pad(x, pad) for x in self.v_blocks), self.length)

  def written(self, k: Blocks, v: Blocks, num_new: int) -> GrowingCache:
    """The state after `buffers`' new slots were filled."""
    del num_new  # Unused: the length is the buffers' length.
    return GrowingCache(k_blocks=tuple(k), v_blocks=tuple(v), batch=self.batch)


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["k_blocks", "v_blocks", "length"],
    meta_fields=["batch"],
)
@dataclasses.dataclass(frozen=True)
class FixedCache(_Views):
  """`max_len` preallocated slots; slots [0, length) hold computed K/V."""

  k_blocks: Blocks  # Per block, shape=(b * k, max_len, e): keys after RoPE.
  v_blocks: Blocks  # Per block, shape=(b * k, max_len, e).
  length: jax.Array  # shape=(), dtype=int32: filled slots per sequence.
  batch: int  # Sequences (static).

  @classmethod
  def from_arrays(cls, k: jax.Array, v: jax.Array, length: jax.Array | int) -> FixedCache:
    """A state from (l, b, max_len, k, e) keys and values (copied)."""
    return cls(k_blocks=to_blocks(k), v_blocks=to_blocks(v), length=jnp.asarray(length, jnp.int32),
               batch=k.shape[1])

  def check_room(self, num_new: int) -> None:
    """Raises if `num_new` positions do not fit; skipped under jit."""
    try:
      free = self.max_len - int(self.length)
    except _TRACED:
      return  # Under jit: an overflow makes the logits NaN (`model._extend`).
    if num_new > free:
      raise errors.InputError(f"{num_new} new positions do not fit: the fixed cache has"
                              f" max_len={self.max_len} and {free} free slots.")

  def buffers(self, num_new: int) -> tuple[Blocks, Blocks, jax.Array]:
    """The buffers and the first free slot."""
    del num_new  # Unused: the slots are preallocated.
    return self.k_blocks, self.v_blocks, self.length

  def written(self, k: Blocks, v: Blocks, num_new: int) -> FixedCache:
    """The state after `buffers`' new slots were filled."""
    return FixedCache(k_blocks=tuple(k), v_blocks=tuple(v), length=self.length + num_new,
                      batch=self.batch)


Cache = GrowingCache | FixedCache


def _shape(config: ToyConfig, batch: int, slots: int) -> tuple[int, ...]:
  return (config.num_blocks, batch, slots, config.num_kv_heads, config.head_dim)


def block_shape(config: ToyConfig, batch: int, slots: int) -> tuple[int, int, int]:
  """Shape of one block's K (or V) buffer: (b * k, slots, e)."""
  return (batch * config.num_kv_heads, slots, config.head_dim)


def _zeros(config: ToyConfig, batch: int, slots: int, dtype: jnp.dtype) -> Blocks:
  return tuple(
      jnp.zeros(block_shape(config, batch, slots), dtype) for _ in range(config.num_blocks))


def empty_growing_cache(config: ToyConfig, batch: int, dtype: jnp.dtype) -> GrowingCache:
  """A growing state with no positions."""
  return GrowingCache(k_blocks=_zeros(config, batch, 0, dtype),
                      v_blocks=_zeros(config, batch, 0, dtype), batch=batch)


def init_cache(config: ToyConfig, batch: int, max_len: int, dtype: jnp.dtype) -> FixedCache:
  """An empty fixed-size state of `max_len` slots per sequence (zeros)."""
  batch = errors.require_positive_int("batch", batch)
  max_len = errors.require_positive_int("max_len", max_len)
  if config.positions == "learned" and max_len > config.max_positions:
    raise errors.InputError(f"max_len={max_len} is not allowed: the learned position table has"
                            f" max_positions={config.max_positions} rows.")
  return FixedCache(k_blocks=_zeros(config, batch, max_len, dtype),
                    v_blocks=_zeros(config, batch, max_len, dtype), length=jnp.zeros(
                        (), jnp.int32), batch=batch)


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
    raise errors.InputError(f"length={length!r} is not allowed: it must be a whole number in"
                            f" [0, max_len) = [0, {cache.max_len}), leaving a slot to decode into.")
  length = int(length)
  shape = _shape(config, batch, max_len)
  filled = jnp.arange(max_len)[None, None, :, None, None] < length
  key_k, key_v = jax.random.split(key)
  k = jnp.where(filled, jax.random.normal(key_k, shape, dtype), 0)
  v = jnp.where(filled, jax.random.normal(key_v, shape, dtype), 0)
  return FixedCache.from_arrays(k.astype(dtype), v.astype(dtype), length)


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

  The position count is the growing buffers' length or the fixed cache's
  length; the bytes are the sizes of those slots in the K and V buffers.
  """
  positions = int(cache.length)
  batch = cache.batch
  # Elements of one slot of one sequence: each buffer's rows per sequence
  # (its K/V heads) times the coordinates per head.
  elements = sum(x.shape[0] // batch * x.shape[2] for x in cache.k_blocks + cache.v_blocks)
  itemsize = cache.dtype.itemsize
  filled = sum(
      math.prod((x.shape[0], positions, x.shape[2])) for x in cache.k_blocks + cache.v_blocks)
  return KVAccount(
      positions=positions,
      elements_per_position=elements,
      itemsize=itemsize,
      batch=batch,
      nbytes=filled * itemsize,
  )
