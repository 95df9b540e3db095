"""The toy models a calibration times: the fit's and the held-out, and their step inputs.

The calibration model reads 30.4M weights per step (122 MB in float32, well beyond a
CPU's last-level cache); two variants tell the fixed costs from weight streaming (half
the depth; an eight times larger vocabulary), and two held-out variants of another
width, depth and K/V layout measure every profile's error on models the fit never saw.
`step_inputs` counts what the step model needs to know about one of them.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable
from typing import Any

import jax
import jax.numpy as jnp

from jaxroof import errors
from jaxroof.symbolic import formulas
from jaxroof.toy import config as config_lib
from jaxroof.toy import weights as params_lib

# The calibration model: 30.4M weights read per step (122 MB in float32, well
# beyond a CPU's last-level cache), 4 KiB of K/V per position in float32
# (2 KiB in bfloat16): 250,000 retained tokens take 1 GB.
CALIBRATION = dataclasses.replace(config_lib.SMALL_12L, vocab_size=4096, num_blocks=4, num_heads=16,
                                  num_kv_heads=2, head_dim=64, width=1024, mlp_dim=2048)
# Two variants tell the fixed costs from weight streaming: the same blocks at
# half the depth (per-layer costs), and an eight times larger vocabulary,
# whose output head adds weights without adding layers (per-step costs). The
# shallow variant also has another K/V layout (16 query over 8 K/V heads, GQA
# group 2 against 8): the same K/V bytes read 15-45% faster or slower in
# another layout on a CPU, so eta_kv is fitted over two (a model the fit never
# saw has a layout of its own).
SHALLOW = dataclasses.replace(CALIBRATION, num_blocks=2, num_kv_heads=8)
WIDE_VOCAB = dataclasses.replace(CALIBRATION, vocab_size=32_768)
MODELS: dict[str, config_lib.ToyConfig] = {
    "calibration": CALIBRATION, "shallow": SHALLOW, "wide_vocab": WIDE_VOCAB
}


def _kv_heads(heads: int, target: float, avoid: int) -> int:
  """The divisor of `heads` nearest `target`, other than `avoid` if possible."""
  divisors = [d for d in range(1, heads + 1) if heads % d == 0]
  others = [d for d in divisors if d != avoid] or divisors
  return min(others, key=lambda d: (abs(d - target), d))


def heldout_variant(config: config_lib.ToyConfig, kind: str) -> config_lib.ToyConfig:
  """A toy model a fit on `config` never sees: other width, depth, K/V heads.

  "narrow": 3/4 of the query heads (so of the width), one block fewer,
  about twice the K/V heads; "wide": 5/4 of the heads, one block more,
  about 1.5 times the K/V heads. The MLP keeps its ratio to the width and the
  head size and vocabulary stay, so the variant is a different model of the
  same family, as a user's model is.
  """
  errors.require_choice("kind", kind, ("narrow", "wide"))
  scale, blocks, kv_scale = ((3, 4), -1, 2.0) if kind == "narrow" else ((5, 4), 1, 1.5)
  heads = max(1, config.num_heads * scale[0] // scale[1])
  width = heads * config.head_dim
  return dataclasses.replace(
      config, num_heads=heads, width=width,
      num_kv_heads=_kv_heads(heads, config.num_kv_heads * kv_scale,
                             config.num_kv_heads), num_blocks=max(1, config.num_blocks + blocks),
      mlp_dim=max(1, config.mlp_dim * width // config.width))


# The fit's models (the operations are timed at their shapes; their smallest
# steps give the fixed costs) and the two held out: every profile's error is
# measured on models the fit never saw (width 768 / 3 blocks / 4 K/V heads,
# and width 1280 / 5 blocks / 4 K/V heads, against 1024 / 4 blocks / 2 K/V heads
# and 1024 / 2 / 8).
FIT_MODELS: dict[str, config_lib.ToyConfig] = {"calibration": CALIBRATION, "shallow": SHALLOW}
HELDOUT_NARROW = heldout_variant(CALIBRATION, "narrow")
HELDOUT_WIDE = heldout_variant(CALIBRATION, "wide")
HELDOUT_MODELS: dict[str, config_lib.ToyConfig] = {
    "heldout_narrow": HELDOUT_NARROW, "heldout_wide": HELDOUT_WIDE
}
ALL_MODELS: dict[str, config_lib.ToyConfig] = {**MODELS, **HELDOUT_MODELS}

MAX_RETAINED_TOKENS = 250_000  # batch * context of the default grid.


@dataclasses.dataclass(frozen=True)
class StepInputs:
  """What the step model needs to know about a toy model at a dtype."""

  N: int  # Weights read per step: all but the embedding table.
  N_act: int  # Weights multiplied per token (dense: N).
  q: int  # Bytes per weight.
  k: int  # K/V bytes per retained position, all blocks.
  L: int  # Blocks.
  N_block: int  # Weights of one block (N - L*N_block: the output head).

  def to_json(self) -> dict[str, int]:
    return dataclasses.asdict(self)


def step_inputs(config: config_lib.ToyConfig, dtype: Any) -> StepInputs:
  """Counts the toy model's weights and K/V bytes without allocating them.

  The embedding table is a lookup (one row per sequence), not a weight read
  in full, so it is left out of N.
  """
  shapes = jax.eval_shape(lambda key: params_lib.init_params(config, key, dtype), jax.random.key(0))
  total = sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(shapes))
  read = total - math.prod(shapes.embed.shape)
  blocks = sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(shapes.blocks))
  itemsize = jnp.dtype(dtype).itemsize
  kv = formulas.kv_bytes_per_position(config.num_blocks, config.num_kv_heads, config.head_dim,
                                      itemsize)
  return StepInputs(N=read, N_act=read, q=itemsize, k=int(kv), L=config.num_blocks,
                    N_block=blocks // config.num_blocks)


def decode_grid(
    batches: Iterable[int],
    contexts: Iterable[int],
    max_tokens: int | None = MAX_RETAINED_TOKENS,
) -> list[tuple[int, int]]:
  """(batch, context) pairs with batch * context <= max_tokens (None: all)."""
  return [(b, c) for b, c in itertools.product(batches, contexts)
          if max_tokens is None or b * c <= max_tokens]
