"""Changes that break K/V reuse: each makes cached decode differ from a fresh
causal forward pass, which is how the check detects it.

Cached decode equals the fresh forward pass because of causality, fixed
parameters and the same positions. Each break violates one:

* `revision`: the parameters change between prefill and decode (a new model
  revision); the retained K/V came from the old one.
* `position_offset`: decode places the new token one position too far, so
  RoPE (or the table) sees different distances to the retained keys.
* `mask`: prefill attends bidirectionally over the prompt (prefix-LM), so the
  retained K/V of blocks after the first saw later prompt tokens. With one
  block the retained K/V come from the embeddings alone and nothing changes.
* `dropout`: training-mode dropout in prefill and decode.
"""

from __future__ import annotations

import dataclasses

import jax

from jaxroof import errors
from jaxroof.toy.weights import Params

BREAKS = ("revision", "position_offset", "mask", "dropout")

# Relative size of the weight change that makes a new revision.
REVISION_SCALE = 1e-2
# Where decode puts the new token relative to the correct position.
POSITION_OFFSET = 1


@dataclasses.dataclass(frozen=True)
class Variant:
  """How a cached run is done. The default is the correct one.

  The reference for each step is a fresh causal forward pass without dropout
  using the parameters of that step (`prefill_params` for the prefill row,
  `decode_params` for decode rows).
  """

  name: str
  prefill_params: Params
  decode_params: Params
  prefill_causal: bool = True
  position_offset: int = 0
  dropout_rng: jax.Array | None = None


def correct(params: Params) -> Variant:
  """Prefill and decode as they should be."""
  return Variant(name="none", prefill_params=params, decode_params=params)


def new_revision(params: Params, key: jax.Array, scale: float = REVISION_SCALE) -> Params:
  """Every weight w becomes w * (1 + scale * noise), noise standard normal."""
  return _new_revision(params, key, scale)


@jax.jit
def _new_revision(params: Params, key: jax.Array, scale: float) -> Params:
  leaves, tree = jax.tree_util.tree_flatten(params)
  sizes = [x.size for x in leaves]
  noise = jax.random.normal(key, (sum(sizes),), leaves[0].dtype)
  changed, start = [], 0
  for x, size in zip(leaves, sizes):
    changed.append(x * (1 + scale * noise[start:start + size].reshape(x.shape)))
    start += size
  return jax.tree_util.tree_unflatten(tree, changed)


def broken(name: str, params: Params, key: jax.Array) -> Variant:
  """The variant `name` (one of `BREAKS`), random parts drawn from `key`."""
  errors.require_choice("break", name, BREAKS)
  base = correct(params)
  if name == "revision":
    return dataclasses.replace(base, name=name, decode_params=new_revision(params, key))
  if name == "position_offset":
    return dataclasses.replace(base, name=name, position_offset=POSITION_OFFSET)
  if name == "mask":
    if params.config.num_blocks < 2:
      raise errors.InputError("break='mask' needs num_blocks >= 2: with one block the retained"
                              " K/V depend on each token alone, so no mask can change them.")
    return dataclasses.replace(base, name=name, prefill_causal=False)
  if params.config.dropout_rate == 0:
    raise errors.InputError("break='dropout' needs dropout_rate > 0 in the config.")
  return dataclasses.replace(base, name=name, dropout_rng=key)
