"""The toy Transformer: causal forward, prefill, one-row decode, generation.

A decoder-only Transformer: token embedding, RoPE (or a learned position
table), pre-norm blocks with grouped-KV multi-head attention and a GELU MLP,
and an output head. Every function is pure: the KV state goes in and a new
one comes out.

`forward` recomputes everything from the token IDs and keeps no state: it is
the reference. `extend` runs new positions against a state: `prefill` is
`extend` from an empty state and `decode_step` is `extend` by one token, so a
decode step computes Q/K/V only for the new position and reads the rest.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from jaxroof import errors
from jaxroof.toy import cache as cache_lib
from jaxroof.toy.weights import Params

# Attends new queries/keys/values of block `layer` (an int), given the state
# buffers (or None); returns the attention output and the updated buffers.
_Attend = Callable[[jax.Array, jax.Array, jax.Array, Any, int], tuple[jax.Array, Any]]


def _compute_dtype(dtype: jnp.dtype) -> jnp.dtype:
  """Norms, RoPE angles and softmax run in at least float32."""
  return jnp.promote_types(dtype, jnp.float32)


def _rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  x32 = x.astype(_compute_dtype(x.dtype))
  norm = lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return (x32 * norm).astype(x.dtype) * scale


def _rope(x: jax.Array, positions: jax.Array, base: float) -> jax.Array:
  """Rotates coordinate pairs (i, i + e/2) of x (b, t, n, e) by position.

  `positions` is (t,), shared by every row, or (b, t), one per row.
  """
  e = x.shape[-1]
  half = e // 2
  dtype = _compute_dtype(x.dtype)
  inv_freq = base**(-jnp.arange(half, dtype=dtype) / half)  # shape=(e/2,)
  angle = positions.astype(dtype)[..., None] * inv_freq  # (t, e/2) or (b, t, e/2)
  if angle.ndim == 2:
    angle = angle[None]
  cos = jnp.cos(angle)[:, :, None, :]
  sin = jnp.sin(angle)[:, :, None, :]
  x1, x2 = x[..., :half].astype(dtype), x[..., half:].astype(dtype)
  rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
  return rotated.astype(x.dtype)


def _attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
  """Grouped-KV attention of q (b, t, h, e) over k, v (b, s, k, e).

  `mask` (t, s), or (b, t, s) per row, is True where a query may read a key slot.
  """
  b, t, h, e = q.shape
  if mask.ndim == 3:
    mask = mask[:, None, None]  # (b, 1, 1, t, s) against (b, k, g, t, s).
  kv_heads = k.shape[2]
  dtype = _compute_dtype(q.dtype)
  q = q.reshape(b, t, kv_heads, h // kv_heads, e)
  # (b, k, g, t, s)
  scores = jnp.einsum("btkge,bske->bkgts", q, k, preferred_element_type=dtype) / jnp.sqrt(
      jnp.asarray(e, dtype))
  scores = jnp.where(mask, scores, jnp.finfo(dtype).min)
  weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  # (b, t, k, g, e)
  out = jnp.einsum("bkgts,bske->btkge", weights, v)
  return out.reshape(b, t, h, e)


def _attention_rows(q: jax.Array, k_rows: jax.Array, v_rows: jax.Array,
                    mask: jax.Array) -> jax.Array:
  """Grouped-KV attention of q (b, t, h, e) over head-major K/V rows.

  `k_rows`, `v_rows` are (b * k, s, e): row i * k + j holds sequence i's
  K/V head j (`cache.to_blocks`). `mask` (t, s) is True where a query may
  read a key slot. The same arithmetic as `_attention`, arranged for
  XLA:CPU, where each row's keys are one contiguous (s, e) matrix that both
  products read in place: the scores are computed with the slot axis
  leading (the long axis as the product's rows measured 2-3 times faster),
  then turned (they are e / (g * t) times smaller than the keys) so the
  softmax and the value product run along contiguous slots; the softmax
  normalises the output, not the scores.
  """
  b, t, h, e = q.shape
  n, s, _ = k_rows.shape
  kv_heads = n // b
  g = h // kv_heads
  dtype = _compute_dtype(q.dtype)
  # (n, g * t, e): a row's g query heads times t positions.
  q = q.reshape(b, t, kv_heads, g, e).transpose(0, 2, 3, 1, 4).reshape(n, g * t, e)
  scores = jnp.einsum("nse,nre->nsr", k_rows, q, preferred_element_type=dtype) / jnp.sqrt(
      jnp.asarray(e, dtype))
  scores = jnp.swapaxes(scores, 1, 2)  # (n, g * t, s)
  allowed = jnp.broadcast_to(mask[None], (g, t, s)).reshape(g * t, s)
  scores = jnp.where(allowed, scores, jnp.finfo(dtype).min)
  scores = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
  total = jnp.sum(scores, axis=-1)  # (n, g * t)
  out = jnp.einsum("nrs,nse->nre", scores.astype(v_rows.dtype), v_rows,
                   preferred_element_type=dtype)
  out = (out / total[..., None]).astype(q.dtype)  # (n, g * t, e)
  return out.reshape(b, kv_heads, g, t, e).transpose(0, 3, 1, 2, 4).reshape(b, t, h, e)


def _dropout(x: jax.Array, rate: float, keep: jax.Array | None) -> jax.Array:
  """Training-mode (inverted) dropout with mask `keep`; identity without."""
  if keep is None:
    return x
  return jnp.where(keep, x / (1 - rate), 0).astype(x.dtype)


def _embed(params: Params, ids: jax.Array, positions: jax.Array) -> jax.Array:
  x = params.embed[ids]  # (b, t, D)
  if params.pos_embed is not None:
    table = params.pos_embed[positions]  # (t, D) or (b, t, D)
    x = x + (table if positions.ndim == 2 else table[None])
  return x


def _blocks(
    params: Params,
    x: jax.Array,
    positions: jax.Array,
    buffers: Any,
    attend: _Attend,
    dropout_rng: jax.Array | None,
) -> tuple[jax.Array, Any]:
  """Runs the blocks in order; returns the logits and the buffers.

  A Python loop, unrolled at trace time: each block multiplies by its own
  weight arrays and `attend` reads and writes its own K/V buffers, so XLA
  neither slices (copies) a stacked weight nor a stacked cache per block.
  """
  c = params.config
  use_rope = c.positions == "rope"
  keep = None  # Dropout masks of every block, drawn at once.
  if dropout_rng is not None and c.dropout_rate > 0:
    keep = jax.random.bernoulli(dropout_rng, 1 - c.dropout_rate, (c.num_blocks, 2) + x.shape)
  for layer, blk in enumerate(params.blocks):
    attn_keep, mlp_keep = (None, None) if keep is None else keep[layer]
    h = _rms_norm(x, blk.attn_norm, c.norm_eps)
    q = jnp.einsum("btD,Dhe->bthe", h, blk.wq)
    k = jnp.einsum("btD,Dke->btke", h, blk.wk)
    v = jnp.einsum("btD,Dke->btke", h, blk.wv)
    if use_rope:
      q = _rope(q, positions, c.rope_base)
      k = _rope(k, positions, c.rope_base)
    a, buffers = attend(q, k, v, buffers, layer)
    b, t = a.shape[:2]
    # (h, e) flattened on both sides: one matrix product, no weight transpose.
    a = jnp.dot(a.reshape(b, t, -1), blk.wo.reshape(-1, c.width))
    x = x + _dropout(a, c.dropout_rate, attn_keep)
    h = _rms_norm(x, blk.mlp_norm, c.norm_eps)
    m = jnp.einsum("btF,FD->btD", jax.nn.gelu(jnp.einsum("btD,DF->btF", h, blk.w_up)), blk.w_down)
    x = x + _dropout(m, c.dropout_rate, mlp_keep)
  x = _rms_norm(x, params.final_norm, c.norm_eps)
  logits = jnp.einsum("btD,DV->btV", x, params.unembed,
                      preferred_element_type=_compute_dtype(x.dtype))
  return logits, buffers


def _check_ids(ids: jax.Array) -> None:
  if ids.ndim != 2 or ids.shape[1] < 1:
    raise errors.InputError(f"ids has shape {ids.shape}: give (batch, seq) with seq >= 1.")


def _check_positions(params: Params, last: int) -> None:
  c = params.config
  if c.positions == "learned" and last >= c.max_positions:
    raise errors.InputError(f"position {last} is not allowed: the learned position table has"
                            f" max_positions={c.max_positions} rows.")


def forward(
    params: Params,
    ids: jax.Array,
    *,
    causal: bool = True,
    dropout_rng: jax.Array | None = None,
) -> jax.Array:
  """Logits (b, t, V) of every position, recomputed from scratch (no state).

  Args:
    params: the weights.
    ids: token IDs, shape (b, t).
    causal: attend only to earlier positions (False: bidirectional).
    dropout_rng: a key turns on training-mode dropout.
  """
  _check_ids(ids)
  _check_positions(params, ids.shape[1] - 1)
  return _forward(params, ids, causal=causal, dropout_rng=dropout_rng)


@functools.partial(jax.jit, static_argnames=("causal",))
def _forward(params: Params, ids: jax.Array, *, causal: bool,
             dropout_rng: jax.Array | None) -> jax.Array:
  t = ids.shape[1]
  positions = jnp.arange(t)
  mask = (positions[None, :] <= positions[:, None] if causal else jnp.ones((t, t), bool))

  def attend(q, k, v, bufs, layer):
    del bufs, layer  # Unused: nothing is kept.
    return _attention(q, k, v, mask), None

  logits, _ = _blocks(params, _embed(params, ids, positions), positions, None, attend, dropout_rng)
  return logits


def extend(
    params: Params,
    state: cache_lib.Cache,
    ids: jax.Array,
    *,
    causal: bool = True,
    position_offset: int = 0,
    dropout_rng: jax.Array | None = None,
) -> tuple[jax.Array, cache_lib.Cache]:
  """Runs `ids` (b, t) as the next t positions after the state's ones.

  Computes Q/K/V for the new positions only, writes their K/V into the state
  and attends over the state's K/V.

  Args:
    params: the weights.
    state: K/V of the positions processed so far.
    ids: token IDs of the new positions, shape (b, t).
    causal: new positions attend only to earlier ones (False: to all filled
      slots, including later new positions).
    position_offset: a Python int added to the positions RoPE or the table
      sees (0 is correct; `breakers` shows what a decode-only offset does).
    dropout_rng: a key turns on training-mode dropout.

  Returns:
    The logits (b, t, V) of the new positions and the new state.

  Raises:
    InputError: bad shapes, or (outside jit) no room left in a fixed state.
  """
  _check_ids(ids)
  b, t = ids.shape
  if b != state.batch:
    raise errors.InputError(f"ids has batch {b} but the state holds {state.batch} sequences.")
  state.check_room(t)
  slots = state.max_len if isinstance(state, cache_lib.FixedCache) else (state.length + t)
  _check_positions(params, slots - 1 + position_offset)
  return _extend(params, state, ids, causal=causal, position_offset=position_offset,
                 dropout_rng=dropout_rng)


@functools.partial(jax.jit, static_argnames=("causal", "position_offset"))
def _extend(
    params: Params,
    state: cache_lib.Cache,
    ids: jax.Array,
    *,
    causal: bool,
    position_offset: int,
    dropout_rng: jax.Array | None,
) -> tuple[jax.Array, cache_lib.Cache]:
  t = ids.shape[1]
  k_bufs, v_bufs, start = state.buffers(t)
  slots = k_bufs[0].shape[1]
  query_slots = start + jnp.arange(t)  # (t,)
  key_slots = jnp.arange(slots)  # (s,)
  if causal:
    mask = key_slots[None, :] <= query_slots[:, None]
  else:
    mask = jnp.broadcast_to(key_slots[None, :] < start + t, (t, slots))
  positions = query_slots + position_offset

  def attend(q, k, v, bufs, layer):
    k_all, v_all = bufs  # Per block (b * k, s, e): only the new slots are written.
    k_layer = cache_lib.write_block(k_all[layer], k, start)
    v_layer = cache_lib.write_block(v_all[layer], v, start)
    k_all = k_all[:layer] + (k_layer,) + k_all[layer + 1:]
    v_all = v_all[:layer] + (v_layer,) + v_all[layer + 1:]
    return _attention_rows(q, k_layer, v_layer, mask), (k_all, v_all)

  logits, (k_bufs, v_bufs) = _blocks(params, _embed(params, ids, positions), positions,
                                     (tuple(k_bufs), tuple(v_bufs)), attend, dropout_rng)
  # Under jit the room check cannot run; an overflowing write would clamp
  # onto the last slot, so poison the logits instead of returning wrong ones.
  logits = jnp.where(start + t <= slots, logits, jnp.nan)
  return logits, state.written(k_bufs, v_bufs, t)


def prefill(
    params: Params,
    ids: jax.Array,
    state: cache_lib.Cache | None = None,
    **kwargs,
) -> tuple[jax.Array, cache_lib.Cache]:
  """Processes a prompt (b, t); returns its logits (b, t, V) and the state.

  Without `state`, returns a `GrowingCache` in the weights' dtype; pass
  `init_cache(...)` to fill a fixed-size one. Keywords go to `extend`.
  """
  if state is None:
    _check_ids(ids)
    state = cache_lib.empty_growing_cache(params.config, ids.shape[0], params.embed.dtype)
  return extend(params, state, ids, **kwargs)


def decode_step(params: Params, state: cache_lib.Cache, token: jax.Array,
                **kwargs) -> tuple[jax.Array, cache_lib.Cache]:
  """Feeds one token per sequence, shape (b,); returns logits (b, V), state.

  Keywords go to `extend`. With a `FixedCache` the shapes never change, so
  `jax.jit(decode_step)` traces once.
  """
  logits, state = extend(params, state, token[:, None], **kwargs)
  return logits[:, 0], state


def generate(
    params: Params,
    ids: jax.Array,
    steps: int,
    cache_dtype: jnp.dtype | None = None,
) -> jax.Array:
  """Greedy decoding with a fixed-size state: the `steps` outputs (b, steps).

  The state has prompt + steps - 1 slots: the last output is never fed back,
  so it needs no K/V. jit with `static_argnames=("steps", "cache_dtype")`.
  """
  steps = errors.require_positive_int("steps", steps)
  _check_ids(ids)
  b, prompt_len = ids.shape
  dtype = params.embed.dtype if cache_dtype is None else cache_dtype
  state = cache_lib.init_cache(params.config, b, prompt_len + steps - 1, dtype)
  logits, state = prefill(params, ids, state)
  first = jnp.argmax(logits[:, -1], axis=-1).astype(ids.dtype)

  def step(carry, _):
    state, token = carry
    logits, state = decode_step(params, state, token)
    token = jnp.argmax(logits, axis=-1).astype(ids.dtype)
    return (state, token), token

  _, rest = lax.scan(step, (state, first), None, length=steps - 1)
  return jnp.concatenate([first[:, None], rest.T], axis=1)


def generate_uncached(params: Params, ids: jax.Array, steps: int) -> jax.Array:
  """Greedy decoding that recomputes the whole prefix for every output.

  The reference `generate` must equal (nanoGPT's way). Shapes stay static: each
  step runs `forward` over a buffer of prompt + steps slots, whose slots after
  the current position are masked out by causality, and reads the current
  row. That costs at most (prompt + steps) / prompt times the ideal recompute
  of the prefix alone. jit with `static_argnames=("steps",)`.
  """
  steps = errors.require_positive_int("steps", steps)
  _check_ids(ids)
  b, prompt_len = ids.shape
  _check_positions(params, prompt_len + steps - 1)
  buffer = jnp.concatenate([ids, jnp.zeros((b, steps), ids.dtype)], axis=1)

  def step(buffer, i):
    current = prompt_len + i - 1  # Last filled slot.
    logits = lax.dynamic_index_in_dim(forward(params, buffer), current, axis=1, keepdims=False)
    token = jnp.argmax(logits, axis=-1).astype(ids.dtype)
    buffer = lax.dynamic_update_slice_in_dim(buffer, token[:, None], current + 1, axis=1)
    return buffer, token

  _, tokens = lax.scan(step, buffer, jnp.arange(steps))
  return tokens.T
