"""KV-cache and recurrent-state sizing of a model, per layer kind.

For each kind in the model's layer schedule the per-sequence bytes are a
sympy expression in the retained tokens T, the page size p and the reserved
allowance M_new (`jaxroof.symbolic.architecture`), summed over the blocks of that kind:

  payload    the logical bytes held now: full and MLA blocks keep T tokens,
             sliding blocks min(T, W), recurrent blocks a fixed state;
  allocated  what a paged engine holds: T + M_new tokens reserved (the
             maximum output length), rounded up to whole pages of p tokens
             per sequence and block (sliding blocks: at most W tokens);
  allocated, windowed as full
             the policy some engines use of giving sliding blocks pages for
             the whole context, as if they were full attention.

The K/V dtype is independent of the weight dtype.
"""

from __future__ import annotations

import dataclasses
import functools

import sympy as sp

from jaxroof.symbolic import architecture as af
from jaxroof import errors
from jaxroof.specs.model_spec import FULL, MLA, RECURRENT, SLIDING, ModelSpec
from jaxroof.symbolic.symbols import T

KV_DTYPES: dict[str, float] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}
DEFAULT_BLOCK_SIZE = 16  # Tokens per page (vLLM's default).


def kv_bytes_per_element(kv_dtype: str) -> float:
  """Bytes per stored K, V, latent or state element."""
  errors.require_choice("kv_dtype", kv_dtype, tuple(KV_DTYPES))
  return KV_DTYPES[kv_dtype]


def _per_token_per_block(spec: ModelSpec, kind: str, b: float) -> sp.Expr:
  if kind in (FULL, SLIDING):
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
def kind_expressions(spec: ModelSpec, kv_dtype: str = "bf16") -> tuple[KindExpressions, ...]:
  """The closed forms of every layer kind the model uses, in schedule order."""
  b = kv_bytes_per_element(kv_dtype)
  reserved = af.reserved_tokens(T, af.M_new)
  out = []
  for kind in dict.fromkeys(spec.layer_kinds):
    n = spec.layers_of(kind)
    per_token = _per_token_per_block(spec, kind, b)
    window = spec.attention.sliding_window if kind == SLIDING else None
    state = sp.Integer(0)
    if kind == RECURRENT:
      s = spec.ssm
      state = n * af.ssm_state_bytes(s.inner_size, s.state_size, s.conv_kernel, b)
      payload = allocated = full_pages = state
    elif kind == SLIDING:
      payload = n * af.kv_bytes(af.windowed_tokens(T, window), per_token)
      allocated = n * af.kv_bytes(af.windowed_paged_tokens(reserved, window, af.p), per_token)
      full_pages = n * af.kv_bytes(af.paged_tokens(reserved, af.p), per_token)
    else:
      payload = n * af.kv_bytes(T, per_token)
      allocated = full_pages = n * af.kv_bytes(af.paged_tokens(reserved, af.p), per_token)
    out.append(KindExpressions(kind, n, window, n * per_token, state, payload,
                               allocated, full_pages))
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

  def to_dict(self) -> dict:
    """Every field plus the batch totals, JSON-ready."""
    out = dataclasses.asdict(self)
    out["kinds"] = [dataclasses.asdict(k) for k in self.kinds]
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


def size_kv(spec: ModelSpec, *, context: int, batch: int = 1,
            kv_dtype: str = "bf16", block_size: int = DEFAULT_BLOCK_SIZE,
            max_new_tokens: int = 0) -> KVSizing:
  """Payload and allocation of `batch` sequences that each retain `context` tokens.

  Args:
    spec: the model.
    context: tokens each sequence retains now (holding K/V), >= 1.
    batch: sequences, >= 1.
    kv_dtype: one of `KV_DTYPES`.
    block_size: tokens per page, >= 1 (1: no paging).
    max_new_tokens: further tokens each sequence may add, reserved up front
      (>= 0).
  """
  context = errors.require_positive_int("context", context)
  batch = errors.require_positive_int("batch", batch)
  block_size = errors.require_positive_int("block_size", block_size)
  errors.require_non_negative("max_new_tokens", max_new_tokens)
  if max_new_tokens != int(max_new_tokens):
    raise errors.InputError(
        f"max_new_tokens={max_new_tokens!r} is not allowed: it must be a whole number >= 0."
    )
  max_new_tokens = int(max_new_tokens)
  values = {T: context, af.p: block_size, af.M_new: max_new_tokens}
  kinds = []
  for e in kind_expressions(spec, kv_dtype):
    if e.kind == RECURRENT:
      retained = 0
    elif e.window:
      retained = int(af.windowed_tokens(context, e.window))
    else:
      retained = context
    kinds.append(KindSizing(
        kind=e.kind, layers=e.layers, window=e.window,
        bytes_per_token=float(e.bytes_per_token), state_bytes=float(e.state_bytes),
        retained_tokens=retained, payload_bytes=_value(e.payload, values),
        allocated_bytes=_value(e.allocated, values),
        allocated_bytes_windowed_as_full=_value(e.allocated_windowed_as_full, values),
        payload_formula=str(e.payload), allocated_formula=str(e.allocated)))
  notes = []
  limit = spec.max_position_embeddings
  if isinstance(limit, int) and context + max_new_tokens > limit:
    notes.append(f"context + max_new_tokens = {context + max_new_tokens} exceeds the "
                 f"model's max_position_embeddings {limit}")
  total = sp.Add(*(e.payload for e in kind_expressions(spec, kv_dtype)))
  return KVSizing(
      model=spec.name, context=context, batch=batch, kv_dtype=kv_dtype,
      block_size=block_size, max_new_tokens=max_new_tokens, kinds=tuple(kinds),
      kv_bytes_per_token=sum(k.bytes_per_token for k in kinds if k.kind in (FULL, MLA)),
      payload_bytes_per_sequence=sum(k.payload_bytes for k in kinds),
      allocated_bytes_per_sequence=sum(k.allocated_bytes for k in kinds),
      allocated_bytes_windowed_as_full_per_sequence=sum(
          k.allocated_bytes_windowed_as_full for k in kinds),
      payload_formula=str(total), notes=tuple(notes))


def mla_expanded_bytes_per_token(spec: ModelSpec, kv_dtype: str = "bf16") -> float:
  """Per-token bytes of an MLA model if every block cached per-head K and V."""
  m = spec.mla
  if m is None:
    raise errors.InputError(f"model={spec.name!r} has no MLA blocks.")
  per_block = af.mla_expanded_kv_per_token(
      m.num_heads, m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim,
      kv_bytes_per_element(kv_dtype))
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


def capacity(sizing: KVSizing, *, weight_bytes: float, memory_capacity_bytes: float,
             workspace_fraction: float = 0.1) -> Capacity:
  """Fit of `sizing`'s allocation beside the weights, a workspace kept free.

  Uses `arch_formulas.capacity_sequences`; a negative result (the weights
  alone do not fit) is reported as 0 sequences.
  """
  errors.require_positive("memory_capacity_bytes", memory_capacity_bytes)
  errors.require_non_negative("weight_bytes", weight_bytes)
  errors.require_non_negative("workspace_fraction", workspace_fraction)
  if workspace_fraction >= 1:
    raise errors.InputError(
        f"workspace_fraction={workspace_fraction!r} is not allowed: it must be in [0, 1)."
    )

  def most(per_sequence: float) -> int:
    if per_sequence <= 0:
      return 0
    n = af.capacity_sequences(memory_capacity_bytes, workspace_fraction,
                              weight_bytes, per_sequence)
    return max(int(n), 0)

  usable = float(af.usable_kv_memory(memory_capacity_bytes, workspace_fraction, weight_bytes))
  return Capacity(
      memory_capacity_bytes=memory_capacity_bytes,
      workspace_fraction=workspace_fraction,
      weight_bytes=weight_bytes,
      usable_bytes=usable,
      fits=bool(usable >= sizing.allocated_bytes),
      max_batch=most(sizing.allocated_bytes_per_sequence),
      max_batch_windowed_as_full=most(sizing.allocated_bytes_windowed_as_full_per_sequence),
  )
