"""Readers of hybrid models whose blocks mix attention with recurrent mixers.

  qwen3_next  Gated DeltaNet (linear attention) blocks with a gated full-
              attention block every `full_attention_interval`-th block
              (blocks i with (i + 1) % interval == 0, as transformers derives
              `layer_types`); every block MoE with one gated shared expert.
              Rule adopted: the interval must divide `num_hidden_layers`
              (every published config does), unless `layer_types` is given.
  nemotron_h  one character of `hybrid_override_pattern` per block: M a
              Mamba-2 mixer, * attention (no positional encoding), - a
              squared-ReLU MLP, E a routed MoE MLP; each block has only its
              one part.
  jamba       attention where i % attn_layer_period == attn_layer_offset,
              Mamba-1 elsewhere; MoE where i % expert_layer_period ==
              expert_layer_offset, a SwiGLU MLP elsewhere.

Falcon-H1 (Mamba-2 and attention side by side in every block) is not
supported: a block here has one mixer kind.
"""

from __future__ import annotations

import math

from jaxroof import errors
from jaxroof.specs.model_spec import (FULL, LINEAR_ATTENTION, MAMBA2, NO_MIXER, RECURRENT,
                                      LinearAttentionSpec, Mamba2Spec, ModelSpec, MoESpec, SSMSpec)
from jaxroof.specs.readers import classic
from jaxroof.specs.readers.fields import MISSING, Fields, attention, spec

_STATE_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def _bad(f: Fields, key: str, value: object, allowed: str) -> errors.InputError:
  return errors.InputError(f"{f.source}: config field {key}={value!r} is not allowed: {allowed}.")


def _layer_types(f: Fields, n: int, names: dict[str, str]) -> tuple[str, ...] | None:
  types = f.config.get("layer_types")
  if types is None:
    return None
  if not isinstance(types, list) or len(types) != n or any(t not in names for t in types):
    raise _bad(f, "layer_types", types,
               f"it must list one of {', '.join(names)} for each of the {n} blocks")
  return tuple(names[t] for t in types)


def _config_state_dtype(f: Fields) -> str | None:
  value = f.config.get("mamba_ssm_cache_dtype", f.config.get("mamba_ssm_dtype"))
  if value in (None, "auto"):
    return None
  if value not in _STATE_DTYPES:
    raise _bad(f, "mamba_ssm_cache_dtype", value, f"one of {', '.join(_STATE_DTYPES)}")
  return _STATE_DTYPES[value]


def _qwen3_next(f: Fields, name: str) -> ModelSpec:
  n = f.int("num_hidden_layers")
  kinds = _layer_types(f, n, {"linear_attention": LINEAR_ATTENTION, "full_attention": FULL})
  if kinds is None:
    interval = f.int("full_attention_interval", default=4)
    if n % interval:
      raise _bad(f, "full_attention_interval", interval,
                 f"it must divide num_hidden_layers={n} (or give layer_types)")
    kinds = tuple(FULL if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(n))
  linear = LinearAttentionSpec(num_key_heads=f.int("linear_num_key_heads", default=16),
                               num_value_heads=f.int("linear_num_value_heads", default=32),
                               key_head_dim=f.int("linear_key_head_dim", default=128),
                               value_head_dim=f.int("linear_value_head_dim", default=128),
                               conv_kernel=f.int("linear_conv_kernel_dim", default=4))
  experts = f.int("num_experts", default=512, minimum=0)
  moe_layers = classic.qwen_moe_layers(f, n, experts)
  moe = None
  if any(moe_layers):
    moe = MoESpec(num_experts=experts, experts_per_token=f.int("num_experts_per_tok", default=10),
                  expert_intermediate_size=f.int("moe_intermediate_size",
                                                 default=512), num_shared_experts=1,
                  shared_intermediate_size=f.int("shared_expert_intermediate_size",
                                                 default=512), shared_expert_gate=True)
  bias = f.bool("attention_bias", default=False)
  attn = attention(f, window=None, head_dim=256, qkv_bias=bias, o_bias=bias, qk_norm=True,
                   output_gate=True)
  f.notes.append("gated attention: q_proj also emits a per-head output gate "
                 "(2 x heads x head_dim outputs)")
  return spec(f, name=name, layer_kinds=kinds, moe_layers=moe_layers,
              intermediate=None if all(moe_layers) else MISSING, attention=attn, linear=linear,
              moe=moe)


_PATTERN = {"M": MAMBA2, "*": FULL, "-": NO_MIXER, "E": NO_MIXER}


def _nemotron_h(f: Fields, name: str) -> ModelSpec:
  n = f.int("num_hidden_layers")
  pattern = f.config.get("hybrid_override_pattern")
  if not isinstance(pattern, str) or not pattern:
    raise _bad(f, "hybrid_override_pattern", pattern,
               "it must be a string of M (Mamba-2), * (attention), - (MLP), E (MoE)")
  unknown = sorted(set(pattern) - set(_PATTERN))
  if unknown:
    raise _bad(f, "hybrid_override_pattern", pattern,
               f"letters {''.join(unknown)!r} are unknown; allowed: M, *, -, E")
  if len(pattern) != n:
    raise _bad(f, "hybrid_override_pattern", f"<{len(pattern)} letters>",
               f"it must have one letter per block (num_hidden_layers={n})")
  kinds = tuple(_PATTERN[c] for c in pattern)
  moe = None
  if "E" in pattern:
    moe = MoESpec(num_experts=f.int("n_routed_experts"),
                  experts_per_token=f.int("num_experts_per_tok"),
                  expert_intermediate_size=f.int("moe_intermediate_size"),
                  num_shared_experts=f.int("n_shared_experts", default=1, minimum=0),
                  shared_intermediate_size=f.int("moe_shared_expert_intermediate_size"),
                  router_score_bias=True)
  mamba2 = None
  if "M" in pattern:
    mamba2 = Mamba2Spec(num_heads=f.int("mamba_num_heads"), head_dim=f.int("mamba_head_dim"),
                        state_size=f.int("ssm_state_size"), n_groups=f.int("n_groups", default=8),
                        conv_kernel=f.int("conv_kernel", default=4),
                        proj_bias=f.bool("mamba_proj_bias", "use_bias", default=False),
                        conv_bias=f.bool("use_conv_bias", default=True))
  attn = None
  if "*" in pattern:
    head_dim = f.config.get("attention_head_dim", f.config.get("head_dim"))
    bias = f.bool("attention_bias", default=False)
    attn = attention(f, window=None, head_dim=head_dim, qkv_bias=bias, o_bias=bias)
    f.notes.append("attention blocks use no positional encoding (NoPE)")
  f.notes.append("each block has one part: a Mamba-2 mixer, attention, or an MLP")
  return spec(f, name=name, layer_kinds=kinds, moe_layers=tuple(c == "E" for c in pattern),
              intermediate=MISSING if "-" in pattern else None,
              mlp_layers=tuple(c == "-" for c in pattern), mlp_gated=False, norms_per_layer=1,
              mlp_bias=f.bool("mlp_bias", default=False), attention=attn, mamba2=mamba2, moe=moe,
              state_dtype=_config_state_dtype(f))


def _period(f: Fields, what: str, period: int, offset: int) -> tuple[int, int]:
  p = f.int(f"{what}_layer_period", default=period)
  o = f.int(f"{what}_layer_offset", default=offset, minimum=0)
  if o >= p:
    raise _bad(f, f"{what}_layer_offset", o, f"it must be below {what}_layer_period={p}")
  return p, o


def _jamba(f: Fields, name: str) -> ModelSpec:
  n = f.int("num_hidden_layers")
  hidden = f.int("hidden_size")
  attn_period, attn_offset = _period(f, "attn", 8, 4)
  moe_period, moe_offset = _period(f, "expert", 2, 1)
  kinds = tuple(FULL if i % attn_period == attn_offset else RECURRENT for i in range(n))
  experts = f.int("num_experts", default=16)
  moe_layers = tuple(experts > 1 and i % moe_period == moe_offset for i in range(n))
  rank = f.config.get("mamba_dt_rank", "auto")
  ssm = SSMSpec(inner_size=f.int("mamba_expand", default=2) * hidden,
                state_size=f.int("mamba_d_state",
                                 default=16), conv_kernel=f.int("mamba_d_conv", default=4),
                dt_rank=math.ceil(hidden / 16) if rank == "auto" else f.int("mamba_dt_rank"),
                proj_bias=f.bool("mamba_proj_bias",
                                 default=False), conv_bias=f.bool("mamba_conv_bias",
                                                                  default=True), inner_norms=True)
  moe = None
  if any(moe_layers):
    moe = MoESpec(num_experts=experts, experts_per_token=f.int("num_experts_per_tok", default=2),
                  expert_intermediate_size=f.int("intermediate_size", default=14336))
  f.notes.append("attention blocks use no positional encoding")
  return spec(f, name=name, layer_kinds=kinds, moe_layers=moe_layers, intermediate=14336,
              attention=attention(f, window=None, heads=32, kv_heads=8), ssm=ssm, moe=moe)


READERS = {
    "qwen3_next": _qwen3_next,
    "nemotron_h": _nemotron_h,
    "jamba": _jamba,
}
