"""Per-sequence lengths in a fixed-size cache: what a continuous-batching server needs.

`FixedCache` gives all rows of a batch one length. A server that admits
sequences as slots free up holds rows at different lengths, so `RowCache`
keeps a `lengths` vector, and `extend_rows` runs `t` new positions per row,
each row at its own slots and RoPE positions with its own causal mask; only
the first `num_new[r]` of row r's positions count (shorter rows are padded,
and their padding lands in slots past the row's length, which no counted
query reads and later tokens overwrite). Rows with `num_new = 0` are idle:
their state is unchanged.

`prefill_row` fills one row from a prompt without touching the others (the
server's admission); `decode_rows` feeds one token to every row.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax

from jaxroof import errors
from jaxroof.toy import model
from jaxroof.toy.config import ToyConfig
from jaxroof.toy.weights import Params


@functools.partial(jax.tree_util.register_dataclass, data_fields=["k", "v", "lengths"],
                   meta_fields=[])
@dataclasses.dataclass(frozen=True)
class RowCache:
  """`max_len` preallocated slots per row; row r's slots [0, lengths[r]) hold K/V."""

  k: jax.Array  # shape=(l, b, max_len, k, e): keys after RoPE.
  v: jax.Array  # shape=(l, b, max_len, k, e).
  lengths: jax.Array  # shape=(b,), dtype=int32: filled slots per row.

  @property
  def max_len(self) -> int:
    return self.k.shape[2]


def init_rows(config: ToyConfig, batch: int, max_len: int, dtype: jnp.dtype) -> RowCache:
  """An empty row cache of `batch` rows with `max_len` slots each."""
  batch = errors.require_positive_int("batch", batch)
  max_len = errors.require_positive_int("max_len", max_len)
  shape = (config.num_blocks, batch, max_len, config.num_kv_heads, config.head_dim)
  zeros = jnp.zeros(shape, dtype)
  return RowCache(k=zeros, v=zeros, lengths=jnp.zeros((batch,), jnp.int32))


@jax.jit
def extend_rows(params: Params, cache: RowCache, ids: jax.Array,
                num_new: jax.Array) -> tuple[jax.Array, RowCache]:
  """Runs ids (b, t) as each row's next positions; returns logits (b, t, V), cache.

  Row r's position i sits at slot `lengths[r] + i`; its query reads slots
  up to its own. Slots past `max_len` are dropped (so are their logits'
  meaning): the caller keeps `lengths + num_new <= max_len`.
  """
  b, t = ids.shape
  query_slots = cache.lengths[:, None] + jnp.arange(t)[None, :]  # (b, t)
  key_slots = jnp.arange(cache.max_len)  # (s,)
  mask = key_slots[None, None, :] <= query_slots[:, :, None]  # (b, t, s)
  rows = jnp.arange(b)[:, None]  # (b, 1)

  def attend(q, k, v, bufs, layer):
    k_all, v_all = bufs  # (l, b, s, k, e)
    k_all = k_all.at[layer, rows, query_slots].set(k.astype(k_all.dtype), mode="drop")
    v_all = v_all.at[layer, rows, query_slots].set(v.astype(v_all.dtype), mode="drop")
    k_layer = lax.dynamic_index_in_dim(k_all, layer, keepdims=False)
    v_layer = lax.dynamic_index_in_dim(v_all, layer, keepdims=False)
    return model._attention(q, k_layer, v_layer, mask), (k_all, v_all)

  logits, (k, v) = model._blocks(params, model._embed(params, ids, query_slots), query_slots,
                                 (cache.k, cache.v), attend, None)
  return logits, RowCache(k=k, v=v, lengths=cache.lengths + num_new.astype(jnp.int32))


@jax.jit
def prefill_row(params: Params, cache: RowCache, row: jax.Array, ids: jax.Array,
                length: jax.Array) -> tuple[jax.Array, RowCache]:
  """Fills row `row` from scratch with the first `length` of `ids` (1, t).

  Returns the logits of the prompt's last position (V,) and the cache; the
  other rows are untouched. Prompts padded to a few bucket lengths t keep the
  number of compilations small.
  """
  k_row = lax.dynamic_slice_in_dim(cache.k, row, 1, axis=1)
  v_row = lax.dynamic_slice_in_dim(cache.v, row, 1, axis=1)
  one = RowCache(k=k_row, v=v_row, lengths=jnp.zeros((1,), jnp.int32))
  logits, one = extend_rows(params, one, ids, length[None])
  k = lax.dynamic_update_slice_in_dim(cache.k, one.k, row, axis=1)
  v = lax.dynamic_update_slice_in_dim(cache.v, one.v, row, axis=1)
  lengths = cache.lengths.at[row].set(length.astype(jnp.int32))
  last = lax.dynamic_index_in_dim(logits[0], length - 1, axis=0, keepdims=False)
  return last, RowCache(k=k, v=v, lengths=lengths)


@jax.jit
def decode_rows(params: Params, cache: RowCache, tokens: jax.Array,
                active: jax.Array) -> tuple[jax.Array, RowCache]:
  """Feeds tokens (b,) to every row; only `active` rows (bool, b) advance.

  Returns the logits (b, V) and the cache.
  """
  logits, cache = extend_rows(params, cache, tokens[:, None], active.astype(jnp.int32))
  return logits[:, 0], cache
