"""`ModelSpec`: what a model is made of.

A spec lists the layer schedule (the attention or mixer kind of every block
and whether its MLP is routed) and the dimensions each kind needs. Specs are built
from a Hugging Face `config.json` by `jaxroof.specs.hf_config` and loaded by
name or path with `jaxroof.specs.models.load_model`. Parameter counts come from `jaxroof.specs.parameters`; KV sizes from `jaxroof.specs.kv_sizing`.
"""

from __future__ import annotations

import dataclasses

from jaxroof import errors

# Attention (or mixer) kinds of a block.
FULL = "full"  # Keeps K/V for every retained token.
SLIDING = "sliding"  # Keeps K/V for the last `sliding_window` tokens.
MLA = "mla"  # Keeps a compressed latent plus a RoPE key per token.
RECURRENT = "recurrent"  # Keeps a fixed-size state per sequence (SSM).
LAYER_KINDS = (FULL, SLIDING, MLA, RECURRENT)



@dataclasses.dataclass(frozen=True, kw_only=True)
class AttentionSpec:
  """Grouped-query attention (full or sliding-window blocks)."""

  num_heads: int
  num_kv_heads: int
  head_dim: int
  sliding_window: int | None = None  # Tokens kept by SLIDING blocks.
  qkv_bias: bool = False  # Biases on the q, k and v projections.
  o_bias: bool = False  # Bias on the output projection.
  qk_norm: bool = False  # RMSNorm over q and k heads (Qwen3, Gemma 3).
  sinks: bool = False  # One learned attention-sink logit per head (gpt-oss).


@dataclasses.dataclass(frozen=True, kw_only=True)
class MLASpec:
  """Multi-head latent attention (DeepSeek-V2/V3)."""

  num_heads: int
  q_lora_rank: int | None  # None: queries projected directly from the input.
  kv_lora_rank: int
  qk_nope_head_dim: int
  qk_rope_head_dim: int
  v_head_dim: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoESpec:
  """Routed experts (plus optional always-on shared experts) in MoE blocks."""

  num_experts: int
  experts_per_token: int
  expert_intermediate_size: int
  num_shared_experts: int = 0
  shared_intermediate_size: int = 0  # Hidden units of each shared expert.
  expert_bias: bool = False  # Biases inside each expert (gpt-oss).
  router_bias: bool = False  # Bias on the router logits (gpt-oss).
  router_score_bias: bool = False  # Per-expert score correction (DeepSeek-V3).


@dataclasses.dataclass(frozen=True, kw_only=True)
class SSMSpec:
  """A Mamba (selective state space) mixer."""

  inner_size: int
  state_size: int
  conv_kernel: int
  dt_rank: int
  proj_bias: bool = False
  conv_bias: bool = True


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSpec:
  """A decoder's structure: layer schedule, dimensions, provenance.

  Attributes:
    name: a shipped slug, or the user's model name or path.
    model_type: the Hugging Face `model_type` it was read as.
    hidden_size: residual stream width.
    vocab_size: rows of the embedding table (padded, where the model pads).
    layer_kinds: per block, one of `LAYER_KINDS`.
    moe_layers: per block, True where the MLP is routed experts.
    intermediate_size: hidden units of a dense MLP block (0: none).
    tie_word_embeddings: the LM head reuses the embedding table.
    norms_per_layer: hidden-size norm vectors per block (plus one final).
    mlp_bias: biases on the dense MLP projections.
    attention, mla, moe, ssm: the parts the layer kinds need, else None.
    max_position_embeddings: the config's context limit, if it gives one.
    torch_dtype: the checkpoint's stored dtype, as the config says.
    source: where the config came from (path, or URL for shipped ones).
    defaults_used: fields absent from the config, filled with the defaults
      of the Hugging Face config class (`"field=value"`).
    notes: what else the reader decided (e.g. parts not counted).
  """

  name: str
  model_type: str
  hidden_size: int
  vocab_size: int
  layer_kinds: tuple[str, ...]
  moe_layers: tuple[bool, ...]
  intermediate_size: int
  tie_word_embeddings: bool
  norms_per_layer: int = 2
  mlp_bias: bool = False
  attention: AttentionSpec | None = None
  mla: MLASpec | None = None
  moe: MoESpec | None = None
  ssm: SSMSpec | None = None
  max_position_embeddings: int | None = None
  torch_dtype: str | None = None
  source: str = ""
  defaults_used: tuple[str, ...] = ()
  notes: tuple[str, ...] = ()

  def __post_init__(self):
    if len(self.layer_kinds) != len(self.moe_layers):
      raise errors.InputError(
          f"{self.name}: {len(self.layer_kinds)} layer kinds but "
          f"{len(self.moe_layers)} MoE flags: give one of each per block."
      )
    for kind in self.layer_kinds:
      errors.require_choice("layer kind", kind, LAYER_KINDS)
    needs = {FULL: "attention", SLIDING: "attention", MLA: "mla", RECURRENT: "ssm"}
    for kind in set(self.layer_kinds):
      if getattr(self, needs[kind]) is None:
        raise errors.InputError(f"{self.name}: {kind} blocks need `{needs[kind]}`.")
    if SLIDING in self.layer_kinds and not self.attention.sliding_window:
      raise errors.InputError(
          f"{self.name}: sliding-window blocks but no sliding_window length."
      )
    if any(self.moe_layers) and self.moe is None:
      raise errors.InputError(f"{self.name}: MoE blocks need `moe`.")

  @property
  def num_layers(self) -> int:
    return len(self.layer_kinds)

  def layers_of(self, kind: str) -> int:
    """Blocks of one attention/mixer kind."""
    return self.layer_kinds.count(kind)

  @property
  def num_moe_layers(self) -> int:
    return sum(self.moe_layers)

  @property
  def is_moe(self) -> bool:
    return self.num_moe_layers > 0

