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
RECURRENT = "recurrent"  # Keeps a fixed-size state per sequence (Mamba-1 SSM).
CHUNKED = "chunked"  # Attends within chunks of `chunk_size` tokens (Llama 4).
LINEAR_ATTENTION = "linear_attention"  # Gated DeltaNet: fixed state per sequence.
MAMBA2 = "mamba2"  # Mamba-2 SSM: fixed state per sequence.
NO_MIXER = "mlp_only"  # A block with an MLP and no token mixer (Nemotron-H '-').
LAYER_KINDS = (FULL, SLIDING, MLA, RECURRENT, CHUNKED, LINEAR_ATTENTION, MAMBA2, NO_MIXER)
STATE_KINDS = (RECURRENT, LINEAR_ATTENTION, MAMBA2)  # A fixed state per sequence.


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
  chunk_size: int | None = None  # Tokens per chunk of CHUNKED blocks (Llama 4).
  output_gate: bool = False  # q_proj also emits a sigmoid output gate (Qwen3-Next).
  qk_norm_flat: bool = False  # q/k norms over all heads at once (OLMo 2).


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
  shared_expert_gate: bool = False  # A hidden->1 sigmoid gate on the shared expert.

  def __post_init__(self):
    if not 1 <= self.experts_per_token <= self.num_experts:
      raise errors.InputError(
          f"experts_per_token={self.experts_per_token} is not allowed with "
          f"num_experts={self.num_experts}: each token is routed to between 1 and "
          "num_experts experts.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SSMSpec:
  """A Mamba (selective state space) mixer."""

  inner_size: int
  state_size: int
  conv_kernel: int
  dt_rank: int
  proj_bias: bool = False
  conv_bias: bool = True
  inner_norms: bool = False  # RMSNorms on dt, B and C (Jamba).


@dataclasses.dataclass(frozen=True, kw_only=True)
class LinearAttentionSpec:
  """A Gated DeltaNet linear-attention mixer (Qwen3-Next)."""

  num_key_heads: int
  num_value_heads: int
  key_head_dim: int
  value_head_dim: int
  conv_kernel: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class Mamba2Spec:
  """A Mamba-2 mixer (Nemotron-H): heads x head_dim channels, grouped B/C."""

  num_heads: int
  head_dim: int
  state_size: int
  n_groups: int
  conv_kernel: int
  proj_bias: bool = False
  conv_bias: bool = True

  @property
  def inner_size(self) -> int:
    return self.num_heads * self.head_dim


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
    attention, mla, moe, ssm, linear, mamba2: the parts the layer kinds
      need, else None.
    mlp_layers: per block, True where it has a dense MLP; None: every block
      that is not MoE (Nemotron-H's Mamba and attention blocks have none).
    mlp_gated: MLPs (dense and experts) have a gate projection (SwiGLU);
      False: up and down only (Nemotron-H's squared ReLU).
    state_dtype: the recurrent-state dtype the config asks for, if any.
    assumed_llama_like: read by the Llama fallback for an unknown type.
    max_position_embeddings: the config's context limit, if it gives one.
    torch_dtype: the checkpoint's stored dtype, as the config says.
    quant_method: `quantization_config.quant_method` of a checkpoint
      published quantized (e.g. "fp8", "mxfp4"), else None.
    quant_weight_block: its `weight_block_size` (e.g. (128, 128)), if given.
    quant_not_converted: its `modules_to_not_convert` patterns, if given.
    source: where the config came from (path, or URL for shipped ones).
    defaults_used: fields absent from the config, filled with the defaults
      of the Hugging Face config class (`"field=value"`).
    defaults_applied: the same in words, with how each default is derived
      (outputs list them among their assumptions and as `defaults_applied`).
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
  linear: LinearAttentionSpec | None = None
  mamba2: Mamba2Spec | None = None
  mlp_layers: tuple[bool, ...] | None = None
  mlp_gated: bool = True
  state_dtype: str | None = None
  assumed_llama_like: bool = False
  max_position_embeddings: int | None = None
  torch_dtype: str | None = None
  quant_method: str | None = None
  quant_weight_block: tuple[int, ...] = ()
  quant_not_converted: tuple[str, ...] = ()
  source: str = ""
  defaults_used: tuple[str, ...] = ()
  defaults_applied: tuple[str, ...] = ()
  notes: tuple[str, ...] = ()
  shipped: bool = False  # A config shipped in jaxroof/specs/data/models/.

  def __post_init__(self):
    if len(self.layer_kinds) != len(self.moe_layers):
      raise errors.InputError(f"{self.name}: {len(self.layer_kinds)} layer kinds but "
                              f"{len(self.moe_layers)} MoE flags: give one of each per block.")
    for kind in self.layer_kinds:
      errors.require_choice("layer kind", kind, LAYER_KINDS)
    needs = {
        FULL: "attention", SLIDING: "attention", MLA: "mla", RECURRENT: "ssm", CHUNKED: "attention",
        LINEAR_ATTENTION: "linear", MAMBA2: "mamba2"
    }
    for kind in set(self.layer_kinds) & set(needs):
      if getattr(self, needs[kind]) is None:
        raise errors.InputError(f"{self.name}: {kind} blocks need `{needs[kind]}`.")
    if SLIDING in self.layer_kinds and not self.attention.sliding_window:
      raise errors.InputError(f"{self.name}: sliding-window blocks but no sliding_window length.")
    if CHUNKED in self.layer_kinds and not self.attention.chunk_size:
      raise errors.InputError(f"{self.name}: chunked-attention blocks but no attention_chunk_size.")
    if self.mlp_layers is not None and len(self.mlp_layers) != len(self.layer_kinds):
      raise errors.InputError(f"{self.name}: {len(self.mlp_layers)} dense-MLP flags for "
                              f"{len(self.layer_kinds)} blocks.")
    if any(self.moe_layers) and self.moe is None:
      raise errors.InputError(f"{self.name}: MoE blocks need `moe`.")

  @property
  def default_assumptions(self) -> tuple[str, ...]:
    """The defaults a user's config fell back to, for an output's assumptions
    (a shipped config's are Hugging Face's own reading of the published file,
    and stay in `defaults_applied`)."""
    return () if self.shipped else self.defaults_applied

  def context_warning(self, context: int) -> str | None:
    """A labelled warning when `context` tokens exceed the config's
    `max_position_embeddings` (sized as asked, but beyond what the model was
    built for), else None."""
    limit = self.max_position_embeddings
    if isinstance(limit, int) and not isinstance(limit, bool) and context > limit:
      return (f"WARNING: context {context:,} tokens is beyond {self.name}'s "
              f"max_position_embeddings = {limit:,}: sized as asked, but the model "
              "was not built for it")
    return None

  @property
  def num_layers(self) -> int:
    return len(self.layer_kinds)

  def layers_of(self, kind: str) -> int:
    """Blocks of one attention/mixer kind."""
    return self.layer_kinds.count(kind)

  @property
  def num_dense_mlp_layers(self) -> int:
    """Blocks with a dense (not routed) MLP."""
    if self.mlp_layers is None:
      return self.num_layers - self.num_moe_layers
    return sum(self.mlp_layers)

  @property
  def num_moe_layers(self) -> int:
    return sum(self.moe_layers)

  @property
  def is_moe(self) -> bool:
    return self.num_moe_layers > 0
