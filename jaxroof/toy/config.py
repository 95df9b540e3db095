"""The toy Transformer's sizes: a frozen, hashable config and named presets.

The config is static (it is hashed into `jit`'s cache through `Params`), so a
decode step compiled for one config is reused for every call with it.
"""

from __future__ import annotations

import dataclasses

from jaxroof import errors

POSITION_KINDS = ("rope", "learned")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToyConfig:
  """Sizes of a decoder-only Transformer with grouped KV heads.

  Attributes:
    vocab_size: token IDs are in [0, vocab_size).
    num_blocks: pre-norm blocks (layers); each keeps its own K/V.
    num_heads: query heads per block.
    num_kv_heads: K/V heads per block; divides `num_heads` (grouped-query
      attention when smaller).
    head_dim: coordinates per head (even for RoPE).
    width: residual stream width.
    mlp_dim: hidden units of each block's MLP.
    positions: "rope" (rotary, relative) or "learned" (an absolute table).
    max_positions: rows of the learned table; 0 for RoPE (no limit).
    rope_base: RoPE's frequency base.
    norm_eps: RMSNorm epsilon.
    dropout_rate: residual dropout probability, used only in training mode.
  """

  vocab_size: int
  num_blocks: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  width: int
  mlp_dim: int
  positions: str = "rope"
  max_positions: int = 0
  rope_base: float = 10_000.0
  norm_eps: float = 1e-6
  dropout_rate: float = 0.1

  def __post_init__(self):
    for name in ("vocab_size", "num_blocks", "num_heads", "num_kv_heads", "head_dim", "width",
                 "mlp_dim"):
      errors.require_positive_int(name, getattr(self, name))
    errors.require_choice("positions", self.positions, POSITION_KINDS)
    if self.num_heads % self.num_kv_heads:
      raise errors.InputError(f"num_heads={self.num_heads} is not allowed with "
                              f"num_kv_heads={self.num_kv_heads}: it must be a multiple of it.")
    if self.positions == "rope" and self.head_dim % 2:
      raise errors.InputError(
          f"head_dim={self.head_dim} is not allowed with RoPE: it must be even.")
    if self.positions == "learned":
      errors.require_positive_int("max_positions", self.max_positions)
    errors.require_positive("rope_base", self.rope_base)
    errors.require_positive("norm_eps", self.norm_eps)
    if not 0 <= self.dropout_rate < 1:
      raise errors.InputError(f"dropout_rate={self.dropout_rate!r} is not allowed: it must be in"
                              " [0, 1).")

  @property
  def group_size(self) -> int:
    """Query heads that share one K/V head."""
    return self.num_heads // self.num_kv_heads


# The lesson's toy: two blocks, two KV heads per block, two coordinates per
# head. Vocabulary 8 holds the prompt IDs [1, 4, 6].
LESSON = ToyConfig(
    vocab_size=8,
    num_blocks=2,
    num_heads=2,
    num_kv_heads=2,
    head_dim=2,
    width=4,
    mlp_dim=16,
)
LESSON_PROMPT: tuple[int, ...] = (1, 4, 6)

# A realistic small model (GPT-2-small-like sizes, grouped KV heads): what the
# calibration times as an end-to-end decode step.
SMALL_12L = ToyConfig(
    vocab_size=32_000,
    num_blocks=12,
    num_heads=12,
    num_kv_heads=4,
    head_dim=64,
    width=768,
    mlp_dim=3072,
)

# Small enough that recomputing a 1,152-token prefix 128 times takes seconds
# on a 2-core CPU: the default of `experiments.bench_decode`.
CPU_BENCH = ToyConfig(
    vocab_size=4096,
    num_blocks=4,
    num_heads=4,
    num_kv_heads=2,
    head_dim=32,
    width=128,
    mlp_dim=512,
)

PRESETS: dict[str, ToyConfig] = {
    "lesson": LESSON,
    "small_12l": SMALL_12L,
    "cpu_bench": CPU_BENCH,
}


def preset(name: str) -> ToyConfig:
  """A named config; raises `InputError` naming the known presets."""
  return PRESETS[errors.require_choice("preset", name, tuple(PRESETS))]
