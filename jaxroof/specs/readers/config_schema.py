"""The schema of a Hugging Face `config.json`: every field a reader uses.

`hf_config.spec_from_config` checks a config against `CONFIG` before any
reader runs: each field's type and range (a null size means "absent": the
reader's default applies), and the rules between fields: top-k at most the
experts (unless there are none), two names of one field agreeing (gpt-oss
writes both `num_experts_per_tok` and `experts_per_token`), query heads a
multiple of K/V heads. `quantization_config` must be an object with a
`quant_method`. Fields no reader uses may hold anything (Nemotron-H's
`time_step_limit` holds `Infinity`); the file's size and nesting are bounded
by `KIND`. The readers then take the defaults of the model type and refuse
what only the type decides (`layer_types` names, pattern letters).
"""

from __future__ import annotations

from jaxroof import schema
from jaxroof.schema import Flag, ListOf, Number, Object, OneOf, Text, Whole

# Plausibility limits, far above any published model (the deepest have ~130
# layers; the largest widths ~2e4, vocabularies ~3e5, contexts ~1e7): beyond
# them a value is a typo or an attack, and a per-layer schedule of it would not
# fit in memory.
MAX_LAYERS = 10_000
MAX_SIZE = 10**9
MAX_CONFIG_BYTES = 16 * 1024 * 1024  # Real config.json files are a few kB.
MAX_CONFIG_DEPTH = 32

_SIZE = Whole(1, MAX_SIZE, null=True)  # A width, a count, a length (null: absent).
_COUNT = Whole(0, MAX_SIZE, null=True)  # A count that may be 0 (experts: none).
_LAYERS = Whole(1, MAX_LAYERS, null=True)
_LAYER_INDEX = Whole(0, MAX_LAYERS, null=True)
_FLAG = Flag(null=True)
_NAME = Text(max_len=64, null=True)
_RANK = OneOf((Text(choices=("auto",)), _SIZE), '"auto" or a whole number >= 1, or null')
_INDICES = ListOf(Whole(0, MAX_LAYERS), max_len=MAX_LAYERS, null=True)

# Every field a reader (`readers/classic.py`, `dense.py`, `hybrid.py`,
# `fields.spec`) reads, with what it may hold.
FIELDS: dict[str, schema.Spec] = {
    "model_type": _NAME,
    "torch_dtype": _NAME,
    "dtype": _NAME,
    # Sizes.
    "hidden_size": _SIZE,
    "d_model": _SIZE,
    "num_hidden_layers": _LAYERS,
    "n_layer": _LAYERS,
    "num_attention_heads": _SIZE,
    "num_key_value_heads": _SIZE,
    "head_dim": _SIZE,
    "attention_head_dim": _SIZE,
    "intermediate_size": _SIZE,
    "intermediate_size_mlp": _SIZE,
    "vocab_size": _SIZE,
    "pad_vocab_size_multiple": _SIZE,
    "max_position_embeddings": _SIZE,
    # Attention kinds and windows.
    "layer_types": ListOf(Text(max_len=64), max_len=MAX_LAYERS, null=True),
    "sliding_window": _SIZE,
    "use_sliding_window": _FLAG,
    "max_window_layers": _LAYER_INDEX,
    "sliding_window_pattern": _SIZE,
    "_sliding_window_pattern": _SIZE,
    "attention_chunk_size": _SIZE,
    "no_rope_layers": ListOf(Whole(0, 1), max_len=MAX_LAYERS, null=True),
    "full_attention_interval": _SIZE,
    "partial_rotary_factor": Number(low=0, low_open=True, high=1, null=True),
    "use_qk_norm": _FLAG,
    # Biases and tying.
    "attention_bias": _FLAG,
    "mlp_bias": _FLAG,
    "tie_word_embeddings": _FLAG,
    "tie_embeddings": _FLAG,
    "use_bias": _FLAG,
    "use_conv_bias": _FLAG,
    "mamba_proj_bias": _FLAG,
    "mamba_conv_bias": _FLAG,
    # Mixture of experts.
    "num_local_experts": _COUNT,
    "num_experts": _COUNT,
    "n_routed_experts": _COUNT,
    "num_experts_per_tok": _SIZE,
    "experts_per_token": _SIZE,
    "moe_intermediate_size": _SIZE,
    "shared_expert_intermediate_size": _SIZE,
    "moe_shared_expert_intermediate_size": _SIZE,
    "n_shared_experts": _COUNT,
    "decoder_sparse_step": _SIZE,
    "mlp_only_layers": _INDICES,
    "moe_layers": _INDICES,
    "interleave_moe_layer_step": _SIZE,
    "first_k_dense_replace": _LAYER_INDEX,
    "moe_layer_freq": _SIZE,
    "topk_method": _NAME,
    "num_nextn_predict_layers": _LAYER_INDEX,
    # Latent attention (DeepSeek).
    "q_lora_rank": _SIZE,
    "kv_lora_rank": _SIZE,
    "qk_nope_head_dim": _SIZE,
    "qk_rope_head_dim": _SIZE,
    "v_head_dim": _SIZE,
    # Linear attention, Mamba and hybrids.
    "linear_num_key_heads": _SIZE,
    "linear_num_value_heads": _SIZE,
    "linear_key_head_dim": _SIZE,
    "linear_value_head_dim": _SIZE,
    "linear_conv_kernel_dim": _SIZE,
    "hybrid_override_pattern": Text(max_len=MAX_LAYERS, null=True),
    "mamba_num_heads": _SIZE,
    "mamba_head_dim": _SIZE,
    "ssm_state_size": _SIZE,
    "n_groups": _SIZE,
    "conv_kernel": _SIZE,
    "state_size": _SIZE,
    "expand": _SIZE,
    "time_step_rank": _RANK,
    "mamba_d_state": _SIZE,
    "mamba_d_conv": _SIZE,
    "mamba_expand": _SIZE,
    "mamba_dt_rank": _RANK,
    "mamba_ssm_cache_dtype": _NAME,
    "mamba_ssm_dtype": _NAME,
    "attn_layer_period": _SIZE,
    "attn_layer_offset": _LAYER_INDEX,
    "expert_layer_period": _SIZE,
    "expert_layer_offset": _LAYER_INDEX,
    # A checkpoint published quantized: the method, and the fields read or
    # commonly given with it.
    "quantization_config": Object(
        {
            "quant_method": Text(max_len=64),
            "bits": Whole(1, 64, null=True),
            "group_size": Whole(-1, MAX_SIZE, null=True),  # -1: one group per channel.
            "weight_block_size": ListOf(Whole(1, MAX_SIZE), min_len=1, max_len=4, null=True),
            "modules_to_not_convert": ListOf(Text(max_len=1000), max_len=100_000, null=True),
        },
        required=("quant_method",),
        null=True),
}

# The original mamba_ssm config's `ssm_cfg` (renamed to the Hugging Face fields).
SSM_CFG = Object(
    {
        "d_state": _SIZE, "d_conv": _SIZE, "expand": _SIZE, "dt_rank": _RANK, "bias": _FLAG,
        "conv_bias": _FLAG, "layer": _NAME
    }, null=True)

RULES: tuple[schema.Rule, ...] = (
    schema.agree("num_experts_per_tok", "experts_per_token"),
    schema.agree("num_local_experts", "num_experts"),
    schema.agree("num_hidden_layers", "n_layer"),
    schema.agree("tie_word_embeddings", "tie_embeddings"),
    schema.agree("sliding_window_pattern", "_sliding_window_pattern"),
    schema.agree("attention_head_dim", "head_dim"),
    *(schema.at_most(top_k, experts, unless_zero=True)
      for top_k in ("num_experts_per_tok", "experts_per_token")
      for experts in ("num_local_experts", "num_experts", "n_routed_experts")),
    schema.Rule(("num_attention_heads", "num_key_value_heads"), lambda heads, kv: heads % kv == 0,
                "num_attention_heads must be a multiple of num_key_value_heads"),
)

DECODER = Object(FIELDS, rules=RULES, null=True)  # A multimodal config's `text_config`.
CONFIG = Object({**FIELDS, "text_config": DECODER, "ssm_cfg": SSM_CFG}, rules=RULES)
KIND = schema.FileKind(what="model config", schema=CONFIG, max_bytes=MAX_CONFIG_BYTES,
                       max_depth=MAX_CONFIG_DEPTH)
