"""KV-cache and recurrent-state sizing of a model, per layer kind.

For each kind in the model's layer schedule the per-sequence bytes are a
sympy expression in the retained tokens T, the page size p and the reserved
allowance M_new (`jaxroof.symbolic.architecture`), summed over the blocks of that kind:

  payload    the logical bytes held now: full and MLA blocks keep T tokens,
             sliding blocks min(T, W), chunked blocks min(T, W_chunk),
             recurrent blocks (Mamba-1, Mamba-2, Gated DeltaNet) a fixed state;
  allocated  what a paged engine holds: T + M_new tokens reserved (the
             maximum output length), rounded up to whole pages of p tokens
             per sequence and block (sliding blocks: at most W tokens);
  allocated, windowed as full
             the policy some engines use of giving sliding blocks pages for
             the whole context, as if they were full attention.

The K/V dtype is independent of the weight dtype. Recurrent states keep their
convolution window in the K/V dtype and their state matrix in `state_dtype`:
by default the K/V dtype for Mamba-1 (vLLM's "auto": the model dtype) and
fp32 for Mamba-2 (vLLM's Nemotron-H default) and Gated DeltaNet (the fp32
final state of the FLA kernels and transformers; vLLM's "auto" keeps bf16,
so pass state_dtype="bf16" to size that), unless the config names one
(`mamba_ssm_cache_dtype`). The convolution window holds d_conv taps, as
transformers' caches do (vLLM keeps d_conv - 1; `hybrid_pages` uses that).

Chunked blocks (Llama 4) are allocated one chunk at most; vLLM reserves
min(chunk + max_num_batched_tokens, max_model_len) tokens for them
(`ChunkedLocalAttentionSpec`), slightly more.

`hybrid_pages` states vLLM's page policy for hybrids (tensor parallelism 1): one attention page of
`block_size` tokens holds the bytes of one layer's state, and each
recurrent layer takes one such page per sequence.
"""

from __future__ import annotations

import dataclasses
import functools

import sympy as sp

from jaxroof.symbolic import architecture as af
from jaxroof import errors
from jaxroof.specs.model_spec import (CHUNKED, FULL, LINEAR_ATTENTION, MLA, NO_MIXER, RECURRENT,
                                      SLIDING, STATE_KINDS, ModelSpec)
from jaxroof.symbolic.symbols import T

# Block-scaled FP8 K/V: E4M3 elements with one 1-byte E8M0 scale per block of
# 32 values (the OCP Microscaling v1.0 MXFP8 scheme), 8/8 + 1/32 = 1.03125 B per
# element. DeepSeek's FlashMLA FP8 cache (one fp32 scale per 128 values) costs
# the same 1 + 4/128. Per-tensor "fp8" (vLLM's default: one fp32 k_scale and
# v_scale per layer) and per-head scales are negligible: 1 B per element.
FP8_BLOCK_VALUES, FP8_BLOCK_SCALE_BYTES = 32, 1
KV_DTYPES: dict[str, float] = {
    "fp32": 4,
    "bf16": 2,
    "fp16": 2,
    "fp8": 1,
    "int8": 1,
    "fp8_block": float(af.quantized_bytes_per_weight(8, FP8_BLOCK_VALUES, FP8_BLOCK_SCALE_BYTES)),
}
DEFAULT_BLOCK_SIZE = 16  # Tokens per page (vLLM's default).
HYBRID_PAGE_ALIGN = 16  # vLLM rounds hybrid attention blocks to 16 tokens.
ATTENTION_KINDS = (FULL, SLIDING, CHUNKED)  # Per-head K/V per token.


def state_dtype_of(spec: ModelSpec, kind: str, kv_dtype: str, state_dtype: str | None) -> str:
  """The dtype of a recurrent kind's state matrix (see the module docstring)."""
  if state_dtype is not None:
    errors.require_choice("state_dtype", state_dtype, tuple(KV_DTYPES))
    return state_dtype
  if spec.state_dtype is not None:
    return spec.state_dtype
  return kv_dtype if kind == RECURRENT else "fp32"


def state_bytes_per_block(spec: ModelSpec, kind: str, b: float, b_state: float,
                          conv_taps_less: int = 0) -> sp.Expr:
  """One block's recurrent state per sequence (conv window keeps kernel - `conv_taps_less` taps)."""
  if kind == RECURRENT:
    s = spec.ssm
    return af.mamba1_state_bytes(s.inner_size, s.state_size, s.conv_kernel - conv_taps_less,
                                 b_state, b)
  if kind == LINEAR_ATTENTION:
    g = spec.linear
    return af.linear_attention_state_bytes(g.num_key_heads, g.num_value_heads, g.key_head_dim,
                                           g.value_head_dim, g.conv_kernel - conv_taps_less,
                                           b_state, b)
  m = spec.mamba2
  return af.mamba2_state_bytes(m.num_heads, m.head_dim, m.state_size, m.n_groups,
                               m.conv_kernel - conv_taps_less, b_state, b)


def kv_bytes_per_element(kv_dtype: str) -> float:
  """Bytes per stored K, V, latent or state element."""
  errors.require_choice("kv_dtype", kv_dtype, tuple(KV_DTYPES))
  return KV_DTYPES[kv_dtype]


def _per_token_per_block(spec: ModelSpec, kind: str, b: float) -> sp.Expr:
  if kind in ATTENTION_KINDS:
    a = spec.attention
    return af.full_attention_kv_per_token(a.num_kv_heads, a.head_dim, b)
  if kind == MLA:
    return af.mla_kv_per_token(spec.mla.kv_lora_rank, spec.mla.qk_rope_head_dim, b)
  return sp.Integer(0)


@dataclasses.dataclass(frozen=True)
class KindExpressions:
  """Per-sequence bytes of all blocks of one kind, as expressions in T, p, M_new."""

  kind: str
  layers: int
  window: int | None
  bytes_per_token: sp.Expr  # All blocks of the kind, per retained token.
  state_bytes: sp.Expr  # All blocks of the kind, fixed per sequence.
  payload: sp.Expr
  allocated: sp.Expr
  allocated_windowed_as_full: sp.Expr


@functools.lru_cache(maxsize=256)
def kind_expressions(spec: ModelSpec, kv_dtype: str = "bf16",
                     state_dtype: str | None = None) -> tuple[KindExpressions, ...]:
  """The closed forms of every layer kind the model uses, in schedule order.

  Blocks without a token mixer (Nemotron-H's MLP blocks) keep nothing and
  get no entry.
  """
  b = kv_bytes_per_element(kv_dtype)
  reserved = af.reserved_tokens(T, af.M_new)
  out = []
  for kind in dict.fromkeys(k for k in spec.layer_kinds if k != NO_MIXER):
    n = spec.layers_of(kind)
    per_token = _per_token_per_block(spec, kind, b)
    window = {SLIDING: spec.attention.sliding_window, CHUNKED: spec.attention.chunk_size
             }.get(kind) if spec.attention else None
    state = sp.Integer(0)
    if kind in STATE_KINDS:
      b_state = kv_bytes_per_element(state_dtype_of(spec, kind, kv_dtype, state_dtype))
      state = n * state_bytes_per_block(spec, kind, b, b_state)
      payload = allocated = full_pages = state
    elif kind == CHUNKED:
      payload = n * af.kv_bytes(af.chunked_tokens(T, window), per_token)
      allocated = n * af.kv_bytes(af.paged_tokens(af.chunked_tokens(reserved, window), af.p),
                                  per_token)
      full_pages = n * af.kv_bytes(af.paged_tokens(reserved, af.p), per_token)
    elif kind == SLIDING:
      payload = n * af.kv_bytes(af.windowed_tokens(T, window), per_token)
      allocated = n * af.kv_bytes(af.windowed_paged_tokens(reserved, window, af.p), per_token)
      full_pages = n * af.kv_bytes(af.paged_tokens(reserved, af.p), per_token)
    else:
      payload = n * af.kv_bytes(T, per_token)
      allocated = full_pages = n * af.kv_bytes(af.paged_tokens(reserved, af.p), per_token)
    out.append(
        KindExpressions(kind, n, window, n * per_token, state, payload, allocated, full_pages))
  return tuple(out)


@dataclasses.dataclass(frozen=True)
class KindSizing:
  """Bytes per sequence of one layer kind at a given context."""

  kind: str
  layers: int
  window: int | None
  bytes_per_token: float
  state_bytes: float
  retained_tokens: int  # Per block (0 for recurrent state).
  payload_bytes: float
  allocated_bytes: float
  allocated_bytes_windowed_as_full: float
  payload_formula: str  # Per sequence, in T.
  allocated_formula: str  # Per sequence, in T, page size p, reserve M_new.
  state_dtype: str | None = None  # Recurrent kinds only: the state matrix's dtype.

  def to_dict(self) -> dict:
    out = dataclasses.asdict(self)
    if self.state_dtype is None:
      del out["state_dtype"]
    return out


@dataclasses.dataclass(frozen=True)
class HybridPages:
  """vLLM's hybrid page policy: one attention page holds one layer's state.

  Attention pages of `block_size` tokens take `page_bytes`, the smallest
  multiple of 16 tokens whose K/V (one layer) is at least one recurrent
  layer's state (vLLM's shapes: d_conv - 1 taps); each recurrent layer takes
  one page per sequence, padded up to `page_bytes`.
  """

  attention_bytes_per_token_per_layer: float
  state_bytes_per_layer: float  # The largest recurrent layer's state (vLLM shapes).
  block_size: int  # Tokens per attention page.
  page_bytes: float
  state_padding_fraction: float  # page_bytes / state_bytes_per_layer - 1.
  allocated_bytes_per_sequence: float  # Under this policy, at the context.
  payload_bytes_per_sequence: float  # What it logically holds (vLLM's state shapes).


@dataclasses.dataclass(frozen=True)
class KVSizing:
  """KV and state sizing of B sequences of one model at one context.

  `*_per_sequence` fields are per sequence; the others are for the batch.
  """

  model: str
  context: int
  batch: int
  kv_dtype: str
  block_size: int
  max_new_tokens: int
  kinds: tuple[KindSizing, ...]
  kv_bytes_per_token: float  # Blocks that keep every token (full and MLA).
  payload_bytes_per_sequence: float
  allocated_bytes_per_sequence: float
  allocated_bytes_windowed_as_full_per_sequence: float
  payload_formula: str  # Per sequence, in T.
  notes: tuple[str, ...] = ()
  hybrid_pages: HybridPages | None = None  # Models mixing attention and state.

  def to_dict(self) -> dict:
    """Every field plus the batch totals, JSON-ready (absent parts left out)."""
    out = dataclasses.asdict(self)
    out["kinds"] = [k.to_dict() for k in self.kinds]
    if self.hybrid_pages is None:
      del out["hybrid_pages"]
    out.update(payload_bytes=self.payload_bytes, allocated_bytes=self.allocated_bytes,
               allocated_bytes_windowed_as_full=self.allocated_bytes_windowed_as_full)
    return out

  @property
  def payload_bytes(self) -> float:
    return self.batch * self.payload_bytes_per_sequence

  @property
  def allocated_bytes(self) -> float:
    return self.batch * self.allocated_bytes_per_sequence

  @property
  def allocated_bytes_windowed_as_full(self) -> float:
    return self.batch * self.allocated_bytes_windowed_as_full_per_sequence


def _value(expr: sp.Expr, values: dict) -> float:
  return float(expr.subs(values))


def hybrid_pages(spec: ModelSpec, *, context: int, kv_dtype: str = "bf16",
                 state_dtype: str | None = None, max_new_tokens: int = 0) -> HybridPages | None:
  """vLLM's page policy for a model with attention and recurrent blocks; else None."""
  kinds = [k for k in dict.fromkeys(spec.layer_kinds) if k != NO_MIXER]
  attention = [k for k in kinds if k in ATTENTION_KINDS]
  states = [k for k in kinds if k in STATE_KINDS]
  if not attention or not states:
    return None
  b = kv_bytes_per_element(kv_dtype)
  per_token = float(_per_token_per_block(spec, attention[0], b))
  state = max(
      float(
          state_bytes_per_block(
              spec, k, b, kv_bytes_per_element(state_dtype_of(spec, k, kv_dtype, state_dtype)),
              conv_taps_less=1)) for k in states)
  block = int(af.hybrid_block_size(state, per_token, HYBRID_PAGE_ALIGN))
  page = block * per_token
  values = {T: context, af.p: block, af.M_new: max_new_tokens}
  allocated = payload = 0.0
  for e in kind_expressions(spec, kv_dtype, state_dtype):
    if e.kind in STATE_KINDS:
      b_state = kv_bytes_per_element(state_dtype_of(spec, e.kind, kv_dtype, state_dtype))
      payload += e.layers * float(state_bytes_per_block(spec, e.kind, b, b_state, conv_taps_less=1))
      allocated += e.layers * page
    else:
      payload += _value(e.payload, values)
      allocated += _value(e.allocated, values)
  return HybridPages(attention_bytes_per_token_per_layer=per_token, state_bytes_per_layer=state,
                     block_size=block, page_bytes=page, state_padding_fraction=page / state - 1,
                     allocated_bytes_per_sequence=allocated, payload_bytes_per_sequence=payload)


def size_kv(spec: ModelSpec, *, context: int, batch: int = 1, kv_dtype: str = "bf16",
            block_size: int = DEFAULT_BLOCK_SIZE, max_new_tokens: int = 0,
            state_dtype: str | None = None) -> KVSizing:
  """Payload and allocation of `batch` sequences that each retain `context` tokens.

  Args:
    spec: the model.
    context: tokens each sequence retains now (holding K/V), >= 1.
    batch: sequences, >= 1.
    kv_dtype: one of `KV_DTYPES`.
    block_size: tokens per page, >= 1 (1: no paging).
    max_new_tokens: further tokens each sequence may add, reserved up front
      (>= 0).
    state_dtype: the recurrent-state matrix dtype (one of `KV_DTYPES`);
      None: `state_dtype_of`'s default per kind.
  """
  context = errors.require_positive_int("context", context)
  batch = errors.require_positive_int("batch", batch)
  block_size = errors.require_positive_int("block_size", block_size)
  errors.require_non_negative("max_new_tokens", max_new_tokens)
  if max_new_tokens != int(max_new_tokens):
    raise errors.InputError(
        f"max_new_tokens={max_new_tokens!r} is not allowed: it must be a whole number >= 0.")
  max_new_tokens = int(max_new_tokens)
  if state_dtype is not None:
    errors.require_choice("state_dtype", state_dtype, tuple(KV_DTYPES))
  values = {T: context, af.p: block_size, af.M_new: max_new_tokens}
  kinds = []
  for e in kind_expressions(spec, kv_dtype, state_dtype):
    if e.kind in STATE_KINDS:
      retained = 0
    elif e.window:
      retained = int(af.windowed_tokens(context, e.window))
    else:
      retained = context
    kinds.append(
        KindSizing(
            kind=e.kind, layers=e.layers, window=e.window, bytes_per_token=float(e.bytes_per_token),
            state_bytes=float(e.state_bytes), retained_tokens=retained,
            payload_bytes=_value(e.payload, values), allocated_bytes=_value(e.allocated, values),
            allocated_bytes_windowed_as_full=_value(e.allocated_windowed_as_full,
                                                    values), payload_formula=str(e.payload),
            allocated_formula=str(e.allocated), state_dtype=(state_dtype_of(
                spec, e.kind, kv_dtype, state_dtype) if e.kind in STATE_KINDS else None)))
  notes = []
  limit = spec.max_position_embeddings
  if isinstance(limit, int) and context + max_new_tokens > limit:
    notes.append(f"context + max_new_tokens = {context + max_new_tokens} exceeds the "
                 f"model's max_position_embeddings {limit}")
  total = sp.Add(*(e.payload for e in kind_expressions(spec, kv_dtype, state_dtype)))
  return KVSizing(
      model=spec.name, context=context, batch=batch, kv_dtype=kv_dtype, block_size=block_size,
      max_new_tokens=max_new_tokens, kinds=tuple(kinds),
      kv_bytes_per_token=sum(k.bytes_per_token for k in kinds if k.kind in (FULL, MLA)),
      payload_bytes_per_sequence=sum(k.payload_bytes for k in kinds),
      allocated_bytes_per_sequence=sum(k.allocated_bytes for k in kinds),
      allocated_bytes_windowed_as_full_per_sequence=sum(
          k.allocated_bytes_windowed_as_full for k in kinds), payload_formula=str(total),
      notes=tuple(notes), hybrid_pages=hybrid_pages(spec, context=context, kv_dtype=kv_dtype,
                                                    state_dtype=state_dtype,
                                                    max_new_tokens=max_new_tokens))


def mla_expanded_bytes_per_token(spec: ModelSpec, kv_dtype: str = "bf16") -> float:
  """Per-token bytes of an MLA model if every block cached per-head K and V."""
  m = spec.mla
  if m is None:
    raise errors.InputError(f"model={spec.name!r} has no MLA blocks.")
  per_block = af.mla_expanded_kv_per_token(m.num_heads, m.qk_nope_head_dim + m.qk_rope_head_dim,
                                           m.v_head_dim, kv_bytes_per_element(kv_dtype))
  return float(spec.layers_of(MLA) * per_block)


@dataclasses.dataclass(frozen=True)
class Capacity:
  """Whether a batch fits in device memory, and how many sequences could."""

  memory_capacity_bytes: float
  workspace_fraction: float
  weight_bytes: float
  usable_bytes: float  # Capacity less workspace less weights.
  fits: bool
  max_batch: int  # Sequences of this context that fit (allocated bytes).
  max_batch_windowed_as_full: int


def _check_fit(weight_bytes: float, memory_capacity_bytes: float,
               workspace_fraction: float) -> None:
  errors.require_positive("memory_capacity_bytes", memory_capacity_bytes)
  errors.require_non_negative("weight_bytes", weight_bytes)
  errors.require_non_negative("workspace_fraction", workspace_fraction)
  if workspace_fraction >= 1:
    raise errors.InputError(
        f"workspace_fraction={workspace_fraction!r} is not allowed: it must be in [0, 1).",
        field="workspace_fraction")


def sequences_fit(*, per_sequence_bytes: float, weight_bytes: float, memory_capacity_bytes: float,
                  workspace_fraction: float = 0.1) -> int:
  """Sequences of `per_sequence_bytes` each that fit beside the weights, a workspace
  kept free (`arch_formulas.capacity_sequences`); 0 when the weights alone do not
  fit or a sequence takes no bytes."""
  _check_fit(weight_bytes, memory_capacity_bytes, workspace_fraction)
  if per_sequence_bytes <= 0:
    return 0
  n = af.capacity_sequences(memory_capacity_bytes, workspace_fraction, weight_bytes,
                            per_sequence_bytes)
  return max(int(n), 0)


def usable_bytes(*, weight_bytes: float, memory_capacity_bytes: float,
                 workspace_fraction: float = 0.1) -> float:
  """Bytes left for K/V (`arch_formulas.usable_kv_memory`; < 0: the weights do not fit)."""
  _check_fit(weight_bytes, memory_capacity_bytes, workspace_fraction)
  return float(af.usable_kv_memory(memory_capacity_bytes, workspace_fraction, weight_bytes))


def capacity(sizing: KVSizing, *, weight_bytes: float, memory_capacity_bytes: float,
             workspace_fraction: float = 0.1) -> Capacity:
  """Fit of `sizing`'s allocation beside the weights, a workspace kept free
  (`sequences_fit`)."""
  fit = dict(weight_bytes=weight_bytes, memory_capacity_bytes=memory_capacity_bytes,
             workspace_fraction=workspace_fraction)
  usable = usable_bytes(**fit)
  return Capacity(
      memory_capacity_bytes=memory_capacity_bytes,
      workspace_fraction=workspace_fraction,
      weight_bytes=weight_bytes,
      usable_bytes=usable,
      fits=bool(usable >= sizing.allocated_bytes),
      max_batch=sequences_fit(per_sequence_bytes=sizing.allocated_bytes_per_sequence, **fit),
      max_batch_windowed_as_full=sequences_fit(
          per_sequence_bytes=sizing.allocated_bytes_windowed_as_full_per_sequence, **fit),
  )
