"""The toy Transformer's weights: an immutable pytree and its random init.

Each block's weights are their own arrays (`Params.blocks` is a tuple of
`BlockParams`), so a compiled step multiplies by each weight where it lies.
On XLA:CPU, weights stacked on a block axis and run with `lax.scan` were
sliced, i.e. copied, block by block on every step: the batch-1 decode step
then moved each weight three times (`experiments.bench_decode_step`). The
config rides along as static metadata: `jit(f)(params, ...)` recompiles only
for a new config, shape or dtype.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from jaxroof import errors
from jaxroof.toy.config import ToyConfig

# Einsum letters used throughout the model:
#   b batch, t query positions, s key slots, D width, F mlp, V vocab,
#   h query heads, k KV heads, g query heads per KV head, e head coordinates,
#   l blocks, n (sequence, KV head) rows of the head-major cache.


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_up", "w_down"],
    meta_fields=[],
)
@dataclasses.dataclass(frozen=True)
class BlockParams:
  """Weights of one block."""

  attn_norm: jax.Array  # shape=(D,): RMSNorm scale before attention.
  wq: jax.Array  # shape=(D, h, e).
  wk: jax.Array  # shape=(D, k, e).
  wv: jax.Array  # shape=(D, k, e).
  wo: jax.Array  # shape=(h, e, D).
  mlp_norm: jax.Array  # shape=(D,): RMSNorm scale before the MLP.
  w_up: jax.Array  # shape=(D, F).
  w_down: jax.Array  # shape=(F, D).


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["embed", "pos_embed", "blocks", "final_norm", "unembed"],
    meta_fields=["config"],
)
@dataclasses.dataclass(frozen=True)
class Params:
  """All weights of the toy Transformer, with its (static) config."""

  embed: jax.Array  # shape=(V, D): token embedding.
  pos_embed: jax.Array | None  # shape=(max_positions, D); None with RoPE.
  blocks: tuple[BlockParams, ...]  # One per block, input side first.
  final_norm: jax.Array  # shape=(D,).
  unembed: jax.Array  # shape=(D, V): output head.
  config: ToyConfig


def init_params(config: ToyConfig, key: jax.Array, dtype: jnp.dtype = jnp.float32) -> Params:
  """Random weights: normal with std 1/sqrt(fan-in), norm scales one.

  For float64 weights call it inside `jax.enable_x64(True)`.
  """
  return _init_params(config, key, jnp.dtype(dtype))


@functools.partial(jax.jit, static_argnames=("config", "dtype"))
def _init_params(config: ToyConfig, key: jax.Array, dtype: jnp.dtype):
  c = config
  l, width = c.num_blocks, c.width
  # (shape, fan-in) of each random weight, drawn from one normal sample: one
  # random-bits computation compiles much faster than one per weight.
  specs = {
      "embed": ((c.vocab_size, width), 1),
      "wq": ((l, width, c.num_heads, c.head_dim), width),
      "wk": ((l, width, c.num_kv_heads, c.head_dim), width),
      "wv": ((l, width, c.num_kv_heads, c.head_dim), width),
      "wo": ((l, c.num_heads, c.head_dim, width), c.num_heads * c.head_dim),
      "w_up": ((l, width, c.mlp_dim), width),
      "w_down": ((l, c.mlp_dim, width), c.mlp_dim),
      "unembed": ((width, c.vocab_size), width),
  }
  if c.positions == "learned":
    specs["pos_embed"] = ((c.max_positions, width), 1)
  sizes = [math.prod(shape) for shape, _ in specs.values()]
  sample = jax.random.normal(key, (sum(sizes),), dtype)
  w = {}
  start = 0
  for (name, (shape, fan_in)), size in zip(specs.items(), sizes):
    w[name] = sample[start:start + size].reshape(shape) / fan_in**0.5
    start += size

  # Drawn stacked (the same numbers for a seed whatever the layout), then
  # returned one array per block and weight.
  blocks = tuple(
      BlockParams(
          attn_norm=jnp.ones((width,), dtype),
          wq=w["wq"][i],
          wk=w["wk"][i],
          wv=w["wv"][i],
          wo=w["wo"][i],
          mlp_norm=jnp.ones((width,), dtype),
          w_up=w["w_up"][i],
          w_down=w["w_down"][i],
      ) for i in range(l))
  return Params(
      embed=w["embed"],
      pos_embed=w.get("pos_embed"),
      blocks=blocks,
      final_norm=jnp.ones((width,), dtype),
      unembed=w["unembed"],
      config=c,
  )


def num_weights(params: Params) -> int:
  """Weights in the pytree (embedding tables included)."""
  return sum(x.size for x in jax.tree_util.tree_leaves(params))


MEMORY_LIMIT_BYTES = 4e9  # The toy runs on a 2 GB-budget machine; leave room to spare.


def _weight_count(config: ToyConfig) -> int:
  """Weights of `config`, from the shapes of a 1- and a 2-block model (blocks are
  alike), so a config of a billion blocks is counted without tracing them."""

  def count(blocks: int) -> int:
    small = dataclasses.replace(config, num_blocks=blocks)
    shapes = jax.eval_shape(lambda key: init_params(small, key, jnp.float32), jax.random.key(0))
    return sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(shapes))

  one = count(1)
  return one + (config.num_blocks - 1) * (count(2) - one)


# Block programs a run may trace and compile (blocks x programs): every block is
# its own code in each compiled program. 2,000 is minutes of compilation on a
# 2-core CPU; the lesson's decode check is 14.
MAX_BLOCK_PASSES = 2_000


def require_compilable(config: ToyConfig, programs: int, *, what: str, fewer: str = "blocks",
                       limit: int = MAX_BLOCK_PASSES) -> int:
  """Refuses a run that would compile more than `limit` block passes
  (`config.num_blocks` x `programs`), naming the estimate; returns it."""
  passes = config.num_blocks * programs
  if passes > limit:
    raise errors.InputError(
        f"num_blocks={config.num_blocks:,} needs about {passes:,} block passes to compile "
        f"({config.num_blocks:,} blocks x {programs:,} programs: {what}) over the limit of "
        f"{limit:,} (minutes of compilation on a CPU): use fewer {fewer}.")
  return passes


def require_fits(config: ToyConfig, itemsize: int, *, batch: int, positions: int,
                 attention_positions: int = 0, limit_bytes: float = MEMORY_LIMIT_BYTES) -> float:
  """Estimates the toy's memory (weights, K/V cache, logits) without allocating
  it, and refuses a configuration over `limit_bytes`, naming the estimate.

  `attention_positions`: the length of a full forward pass run too (its
  attention scores and softmax weights, batch x heads x length^2 each).
  """
  weights = _weight_count(config)
  cache = 2 * config.num_blocks * batch * positions * config.num_kv_heads * config.head_dim
  logits = batch * positions * config.vocab_size
  scores = 2 * batch * config.num_heads * attention_positions**2
  total = float((weights + cache + logits + scores) * itemsize)
  if total > limit_bytes:
    scored = (f", {batch} x {config.num_heads} heads x {attention_positions:,}^2 attention "
              "scores" if scores else "")
    raise errors.InputError(
        f"this toy needs about {total / 1e9:,.1f} GB ({weights:,} weights, {batch:,} x "
        f"{positions:,} positions of K/V and logits{scored} at {itemsize} B) over the "
        f"{limit_bytes / 1e9:g} GB limit: use smaller sizes.")
  return total


def stacked_blocks(params: Params) -> BlockParams:
  """All blocks' weights stacked on a leading block axis `l` (a copy).

  For code that places or scans every block's weight as one array (the
  tensor-parallel toy); the model itself reads each block's own arrays.
  """
  return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *params.blocks)
