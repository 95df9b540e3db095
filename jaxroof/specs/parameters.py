"""Parameter counts of a `ModelSpec`, their breakdown, and weight bytes.

Counts are exact integers from the config's dimensions (the weights a
checkpoint of the model stores, biases and norm vectors included; multi-token
prediction heads and vision towers excluded). Three totals matter:

  total          every stored weight (what must sit in device memory);
  active         weights one token uses: all but the routed experts, plus its
                 top-k experts (the convention of "12.9B active" for Mixtral;
                 it counts the embedding table);
  active_matmul  the active weights a token multiplies (FLOPs = 2 per weight):
                 `active` less the embedding table, which is looked up, not
                 multiplied (unless it is tied to the LM head).

What a decode step reads (`weights_read_per_step`) differs again: routed
experts are read once per step for every expert any sequence touches, and
the embedding lookup reads B rows, not the table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from jaxroof.symbolic import architecture as arch_formulas
from jaxroof import errors
from jaxroof.specs.model_spec import (CHUNKED, FULL, LINEAR_ATTENTION, MAMBA2, MLA, NO_MIXER,
                                      RECURRENT, SLIDING, STATE_KINDS, ModelSpec)

# Bits per stored weight, the default weights per scale (None: per-tensor or
# per-channel scales, whose bytes are negligible) and the bytes of one scale.
#   mxfp4: OCP Microscaling v1.0, E2M1 elements with one E8M0 (1 B) scale per
#          block of 32: 4.25 bits/weight (gpt-oss model card, arXiv 2508.10925).
#   nvfp4: E2M1 with one FP8 E4M3 (1 B) scale per 16, plus one FP32 per tensor
#          (negligible): 4.5 bits/weight (NVIDIA's NVFP4 format).
#   int4:  weight-only groups of 128 with a bf16 scale (GPTQ/AWQ convention).
WEIGHT_DTYPES: dict[str, tuple[int, int | None, float]] = {
    "bf16": (16, None, 0.0),
    "fp16": (16, None, 0.0),
    "fp8": (8, None, 0.0),
    "int8": (8, None, 0.0),
    "int4": (4, 128, 2.0),
    "mxfp4": (4, 32, 1.0),
    "nvfp4": (4, 16, 1.0),
}
DEFAULT_SCALE_BYTES = 2.0  # One fp16/bf16 scale per group, when a group is asked for.


@dataclasses.dataclass(frozen=True, kw_only=True)
class ParamCounts:
  """Parameters by component, plus the routing facts traffic needs."""

  embeddings: int  # Token embedding table.
  attention: int  # Projections, their biases and norms, sinks (all blocks).
  mlp: int  # Dense MLP blocks.
  experts_routed: int  # Every routed expert of every MoE block.
  experts_shared: int  # Always-on shared experts.
  router: int  # Router weights and biases.
  recurrent: int  # Recurrent mixers: Mamba-1, Mamba-2, Gated DeltaNet.
  norms: int  # Per-block norm vectors plus the final norm.
  lm_head: int  # Output projection (0 when tied to the embeddings).
  moe_layers: int = 0
  num_experts: int = 0
  experts_per_token: int = 0
  routed_expert: int = 0  # Weights of ONE routed expert in ONE block.
  hidden_size: int = 0
  tied: bool = False

  COMPONENTS = ("embeddings", "attention", "mlp", "experts_routed", "experts_shared", "router",
                "recurrent", "norms", "lm_head")

  def breakdown(self) -> dict[str, int]:
    return {name: getattr(self, name) for name in self.COMPONENTS}

  @property
  def total(self) -> int:
    return sum(self.breakdown().values())

  @property
  def active(self) -> int:
    """Weights one token uses, top-k routed experts only (embeddings included)."""
    routed = self.moe_layers * self.experts_per_token * self.routed_expert
    return self.total - self.experts_routed + routed

  @property
  def lookup_only(self) -> int:
    """Weights read by row lookup, never multiplied: an untied embedding table."""
    return 0 if self.tied else self.embeddings

  @property
  def active_matmul(self) -> int:
    """Active weights multiplied per token (`N_act`: 2 FLOPs each)."""
    return self.active - self.lookup_only

  @property
  def read_every_step(self) -> int:
    """Weights a decode step reads whatever the batch: all but routed experts
    and the embedding table (of which it reads rows)."""
    return self.total - self.experts_routed - self.lookup_only


def _attention_block(spec: ModelSpec) -> int:
  a, h = spec.attention, spec.hidden_size
  q, kv = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
  gate = q * a.output_gate  # Qwen3-Next: q_proj emits the gate too.
  weights = h * (q + gate) + 2 * h * kv + q * h
  biases = (q + gate + 2 * kv) * a.qkv_bias + h * a.o_bias
  norms = (q + kv if a.qk_norm_flat else 2 * a.head_dim) * a.qk_norm
  return weights + biases + norms + a.num_heads * a.sinks


def _mla_block(spec: ModelSpec) -> int:
  m, h = spec.mla, spec.hidden_size
  qk = m.qk_nope_head_dim + m.qk_rope_head_dim
  if m.q_lora_rank:
    query = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * m.num_heads * qk
  else:
    query = h * m.num_heads * qk
  kv_down = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
  kv_up = m.kv_lora_rank * m.num_heads * (m.qk_nope_head_dim + m.v_head_dim)
  return query + kv_down + kv_up + m.num_heads * m.v_head_dim * h


def _recurrent_block(spec: ModelSpec) -> int:
  s, h = spec.ssm, spec.hidden_size
  inner = s.inner_size
  in_proj = h * 2 * inner + 2 * inner * s.proj_bias
  conv = inner * s.conv_kernel + inner * s.conv_bias
  x_proj = inner * (s.dt_rank + 2 * s.state_size)
  dt_proj = s.dt_rank * inner + inner
  a_and_d = inner * s.state_size + inner
  out_proj = inner * h + h * s.proj_bias
  inner_norms = (s.dt_rank + 2 * s.state_size) * s.inner_norms
  return in_proj + conv + x_proj + dt_proj + a_and_d + out_proj + inner_norms


def _linear_attention_block(spec: ModelSpec) -> int:
  """Gated DeltaNet: qkvz and beta/alpha projections, conv, A and dt, gated norm, out."""
  g, h = spec.linear, spec.hidden_size
  keys, values = g.num_key_heads * g.key_head_dim, g.num_value_heads * g.value_head_dim
  in_proj = h * (2 * keys + 2 * values) + h * 2 * g.num_value_heads
  conv = (2 * keys + values) * g.conv_kernel
  return in_proj + conv + 2 * g.num_value_heads + g.value_head_dim + values * h


def _mamba2_block(spec: ModelSpec) -> int:
  """Mamba-2: in_proj to (z, x, B, C, dt), conv over (x, B, C), A, D, dt bias, norm, out."""
  m, h = spec.mamba2, spec.hidden_size
  inner, groups = m.inner_size, 2 * m.n_groups * m.state_size
  projected = 2 * inner + groups + m.num_heads
  in_proj = h * projected + projected * m.proj_bias
  conv = (inner + groups) * (m.conv_kernel + m.conv_bias)
  return in_proj + conv + 3 * m.num_heads + inner + inner * h + h * m.proj_bias


def _gated_mlp(hidden: int, units: int, bias: bool, gated: bool = True) -> int:
  """Gate, up and down projections (SwiGLU/GeGLU), with optional biases.

  Ungated (`gated=False`, squared ReLU): up and down only.
  """
  return (2 + gated) * hidden * units + ((1 + gated) * units + hidden) * bias


_MIXERS = {
    FULL: _attention_block, SLIDING: _attention_block, CHUNKED: _attention_block, MLA: _mla_block,
    RECURRENT: _recurrent_block, LINEAR_ATTENTION: _linear_attention_block, MAMBA2: _mamba2_block,
    NO_MIXER: lambda spec: 0
}


def parameter_counts(spec: ModelSpec) -> ParamCounts:
  """Exact parameter counts of a spec, by component."""
  h = spec.hidden_size
  attention = recurrent = 0
  for kind in spec.layer_kinds:
    count = _MIXERS[kind](spec)
    if kind in STATE_KINDS:
      recurrent += count
    else:
      attention += count
  mlp = 0
  if spec.intermediate_size:
    mlp = spec.num_dense_mlp_layers * _gated_mlp(h, spec.intermediate_size, spec.mlp_bias,
                                                 spec.mlp_gated)
  routed = shared = router = expert = 0
  moe = spec.moe
  if spec.is_moe:
    expert = _gated_mlp(h, moe.expert_intermediate_size, moe.expert_bias, spec.mlp_gated)
    routed = spec.num_moe_layers * moe.num_experts * expert
    shared = spec.num_moe_layers * moe.num_shared_experts * _gated_mlp(
        h, moe.shared_intermediate_size, False, spec.mlp_gated)
    per_router = (moe.num_experts * (h + moe.router_bias + moe.router_score_bias) +
                  h * moe.shared_expert_gate)
    router = spec.num_moe_layers * per_router
  embeddings = spec.vocab_size * h
  return ParamCounts(
      embeddings=embeddings,
      attention=attention,
      mlp=mlp,
      experts_routed=routed,
      experts_shared=shared,
      router=router,
      recurrent=recurrent,
      norms=(spec.num_layers * spec.norms_per_layer + 1) * h,
      lm_head=0 if spec.tie_word_embeddings else embeddings,
      moe_layers=spec.num_moe_layers,
      num_experts=moe.num_experts if spec.is_moe else 0,
      experts_per_token=moe.experts_per_token if spec.is_moe else 0,
      routed_expert=expert,
      hidden_size=h,
      tied=spec.tie_word_embeddings,
  )


def activation_widths(spec: ModelSpec) -> int:
  """Activation elements one token passes through, all blocks: each block's hidden size and
  its active MLP width (dense intermediate; MoE: the routed experts a token takes and the
  shared ones). What an engine's elementwise kernels (norms, rotary, SiLU-and-multiply,
  residual adds) scale with per token (`symbols.A_w`)."""
  mlp = spec.num_dense_mlp_layers * spec.intermediate_size
  if spec.is_moe:
    moe = spec.moe
    mlp += spec.num_moe_layers * (moe.experts_per_token * moe.expert_intermediate_size +
                                  moe.num_shared_experts * moe.shared_intermediate_size)
  return spec.num_layers * spec.hidden_size + mlp


def weights_read_per_step(counts: ParamCounts, batch: Sequence[float] | np.ndarray) -> np.ndarray:
  """Weights one decode step reads at each batch size (one token per sequence).

  Dense: every weight once, plus B embedding rows. MoE: the routed experts
  actually touched, `arch_formulas.moe_weights_read` (uniform routing assumed),
  so the weight traffic rises with B towards the full model.
  """
  B = np.asarray(batch, dtype=float)
  rows = np.zeros_like(B) if counts.tied else B * counts.hidden_size  # One value per batch.
  if not counts.moe_layers:
    return counts.read_every_step + rows
  read = arch_formulas.numpy_function(arch_formulas.moe_weights_read)(B, counts.read_every_step,
                                                                      counts.routed_expert,
                                                                      counts.moe_layers,
                                                                      counts.num_experts,
                                                                      counts.experts_per_token)
  return read + rows


def bytes_per_weight(dtype: str, group_size: int | None = None,
                     scale_bytes: float | None = None) -> float:
  """Bytes per stored weight, group-scale overhead included.

  bf16/fp16: 2. fp8/int8: 1 (per-tensor or per-channel scales, negligible,
  unless `group_size` is given, then 2-byte scales). int4: 0.5 + 2/128 =
  0.515625 by default. mxfp4: 0.5 + 1/32 = 0.53125. nvfp4: 0.5 + 1/16 =
  0.5625. `scale_bytes` overrides the dtype's scale size.
  """
  errors.require_choice("weight_dtype", dtype, tuple(WEIGHT_DTYPES))
  bits, default_group, default_scale = WEIGHT_DTYPES[dtype]
  if scale_bytes is None:
    scale_bytes = default_scale if default_group else DEFAULT_SCALE_BYTES
  if group_size is not None:
    errors.require_positive_int("group_size", group_size)
    if bits >= 16:
      raise errors.InputError(
          f"group_size={group_size} is not allowed with weight_dtype={dtype!r}: "
          "only quantized dtypes (fp8, int8, int4, mxfp4, nvfp4) have group scales.",
          field="group_size")
  errors.require_non_negative("scale_bytes", scale_bytes)
  group = group_size or default_group
  if group is None:
    return float(arch_formulas.quantized_bytes_per_weight(bits, 1, 0))
  return float(arch_formulas.quantized_bytes_per_weight(bits, group, scale_bytes))


def weight_bytes(counts: ParamCounts, dtype: str = "bf16", *, group_size: int | None = None,
                 scale_bytes: float | None = None) -> dict[str, float]:
  """Bytes of the total and active weights, every weight stored in `dtype`.

  Assumes norms, biases and embeddings are stored like the rest; they are
  well under 1% of any shipped model except through the embeddings, which
  quantized checkpoints often keep in 16 bits (a small underestimate).
  """
  q = bytes_per_weight(dtype, group_size, scale_bytes)
  return {
      "bytes_per_weight": q,
      "total_bytes": counts.total * q,
      "active_bytes": counts.active * q,
      "active_matmul_bytes": counts.active_matmul * q,
  }


# The pseudo-dtype that asks for the format a model is published in.
PUBLISHED = "published"
# Components a quantized checkpoint stores in its format: the linear layers of
# attention, MLPs, experts and recurrent mixers. Embeddings, the LM head, the
# router and the norms stay in 16 bits (gpt-oss's `modules_to_not_convert`;
# DeepSeek-V3 keeps them bf16, quantizing only its block-scaled linear layers).
QUANTIZED_PARTS = ("attention", "mlp", "experts_routed", "experts_shared", "recurrent")
# `modules_to_not_convert` patterns and the component each excludes.
_NOT_CONVERTED = {
    "attn": "attention", "mlp.experts": "experts_routed", "shared_expert": "experts_shared",
    "mixer": "recurrent"
}
# A published 16-bit `torch_dtype` and its weight dtype. float32 (and float64)
# checkpoints are served in 16 bits: bf16, labelled as not the published dtype.
_TORCH_DTYPES = {"bfloat16": "bf16", "float16": "fp16"}
COMPUTE_REST = "bf16"  # The matmul rate of the 16-bit part of a mixed format.
# fp8 block-scaled checkpoints (DeepSeek-V3, Kimi K2) store one float32
# `weight_scale_inv` per block of weight_block_size weights.
FP8_BLOCK_SCALE_BYTES = 4.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class WeightFormat:
  """How a model's weights are stored: `dtype` for `parts` (None: every
  weight), `rest_dtype` for the others; `published` when the model's own
  checkpoint says so (`basis` names how)."""

  dtype: str
  parts: tuple[str, ...] | None = None
  rest_dtype: str = "bf16"
  group_size: int | None = None
  scale_bytes: float | None = None
  published: bool = False
  basis: str = ""

  @property
  def q(self) -> float:
    """Bytes per weight of `dtype`, scales included."""
    return bytes_per_weight(self.dtype, self.group_size, self.scale_bytes)

  @property
  def q_rest(self) -> float:
    return bytes_per_weight(self.rest_dtype)

  @property
  def mixed(self) -> bool:
    return self.parts is not None and self.q != self.q_rest

  @property
  def label(self) -> str:
    """The dtype, marked when it is the model's published one: 'mxfp4 (published)'."""
    return f"{self.dtype} (published)" if self.published else self.dtype

  def describe(self) -> str:
    """Which weights are stored how, and where the format comes from."""
    if self.parts is None:
      text = (f"every weight stored as {self.dtype} ({self.q:g} B/weight, group scales "
              "included)")
    else:
      text = (f"{', '.join(self.parts)} weights stored as {self.dtype} ({self.q:g} B/weight, "
              f"scales included), the others as {self.rest_dtype} ({self.q_rest:g} B/weight)")
    if self.published:
      return f"{text}: the published format ({self.basis})"
    return f"{text} ({self.basis})" if self.basis else text

  def quantized(self, counts: ParamCounts) -> int:
    """Stored weights in `dtype`."""
    if self.parts is None:
      return counts.total
    return sum(getattr(counts, p) for p in self.parts)

  def part_bytes_per_weight(self, part: str) -> float:
    """Bytes per weight of one component (`ParamCounts.COMPONENTS`)."""
    return self.q if self.parts is None or part in self.parts else self.q_rest

  def part_bytes(self, counts: ParamCounts, part: str) -> float:
    """Stored bytes of one component: its weights times their bytes per weight
    (`part_bytes(counts, "experts_routed")`: every routed expert of every block)."""
    return getattr(counts, part) * self.part_bytes_per_weight(part)

  def resident_bytes(self, counts: ParamCounts) -> float:
    """Bytes of every stored weight (`mixed_bytes_per_weight` x total)."""
    return counts.total * self.bytes_per_weight(counts.total, self.quantized(counts))

  def bytes_per_weight(self, weights: np.ndarray | float,
                       quantized: np.ndarray | float) -> np.ndarray | float:
    """Mean bytes per weight when `quantized` of `weights` are in `dtype`."""
    if not self.mixed:
      return self.q
    return arch_formulas.numpy_function(arch_formulas.mixed_bytes_per_weight)(weights, quantized,
                                                                              self.q_rest, self.q)

  def read_bytes_per_weight(self, counts: ParamCounts,
                            batch: Sequence[float] | np.ndarray) -> np.ndarray | float:
    """Mean bytes per weight a decode step reads, per batch size (`q` of the
    step model): a scalar unless the format is mixed."""
    if not self.mixed:
      return self.q
    B = np.asarray(batch, dtype=float)
    read = weights_read_per_step(counts, B)
    fixed = sum(getattr(counts, p) for p in self.parts if p != "experts_routed")
    routed = 0.0
    if "experts_routed" in self.parts and counts.moe_layers:
      routed = arch_formulas.numpy_function(
          arch_formulas.moe_weights_read)(B, 0, counts.routed_expert, counts.moe_layers,
                                          counts.num_experts, counts.experts_per_token)
    return np.asarray(self.bytes_per_weight(read, fixed + routed), dtype=float)


def _excluded(patterns: Sequence[str]) -> set[str]:
  return {part for pattern in patterns for key, part in _NOT_CONVERTED.items() if key in pattern}


def published_format(spec: ModelSpec) -> WeightFormat:
  """The format a model's config says its checkpoint is published in.

  `quantization_config` first: mxfp4 (gpt-oss: the linear layers not in
  `modules_to_not_convert`, i.e. the experts, in MXFP4 with E8M0 scales per 32)
  and fp8 (DeepSeek-V3, Kimi K2: block-scaled E4M3 with one float32 scale per
  weight_block_size block). Otherwise `torch_dtype`: bfloat16 -> bf16,
  float16 -> fp16. Anything else (float32 configs such as Gemma 2's, or an
  unmodelled quant_method): bf16, not marked published, saying why.
  """
  method, dtype = spec.quant_method, spec.torch_dtype
  counts = parameter_counts(spec)
  parts = tuple(p for p in QUANTIZED_PARTS
                if getattr(counts, p) and p not in _excluded(spec.quant_not_converted))
  if method == "mxfp4":
    return WeightFormat(dtype="mxfp4", parts=parts, published=True,
                        basis="quantization_config quant_method mxfp4")
  if method == "fp8":
    block = int(np.prod(spec.quant_weight_block)) if spec.quant_weight_block else None
    where = (f"{'x'.join(map(str, spec.quant_weight_block))} blocks, float32 scales"
             if block else "per-tensor scales")
    return WeightFormat(dtype="fp8", parts=parts, group_size=block,
                        scale_bytes=FP8_BLOCK_SCALE_BYTES if block else None, published=True,
                        basis=f"quantization_config fp8, {where}")
  if method is not None:
    return WeightFormat(dtype="bf16", published=False,
                        basis=f"quant_method {method!r} is not modelled: bf16 assumed")
  served = _TORCH_DTYPES.get(str(dtype).lower())
  if served is None:
    return WeightFormat(dtype="bf16", published=False,
                        basis=f"config torch_dtype {dtype}: served in bf16, assumed")
  return WeightFormat(dtype=served, published=True, basis=f"torch_dtype {dtype}")


def weight_format(spec: ModelSpec, weight_dtype: str,
                  group_size: int | None = None) -> WeightFormat:
  """`published` -> the model's own format; any other dtype: every weight in it."""
  errors.require_choice("weight_dtype", weight_dtype, (PUBLISHED,) + tuple(WEIGHT_DTYPES))
  if weight_dtype == PUBLISHED:
    fmt = published_format(spec)
    if group_size is not None:
      bytes_per_weight(fmt.dtype, group_size)  # Refuses a group for 16-bit formats.
      fmt = dataclasses.replace(fmt, group_size=group_size, scale_bytes=None)
    return fmt
  bytes_per_weight(weight_dtype, group_size)  # Validates both.
  return WeightFormat(dtype=weight_dtype, group_size=group_size)
