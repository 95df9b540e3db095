"""Decode attention: one new query row per sequence over its retained K/V.

Each sequence b attends with its `heads` query rows to the first `lengths[b]`
positions of its K/V cache. KV heads are shared by groups of query heads (GQA;
`heads == kv_heads` is MHA). The Pallas kernel splits the KV axis into
`num_splits` ranges processed by separate programs (flash-decoding); each
keeps an online softmax in float32 and writes its unnormalised output with the
running max and sum, and a log-sum-exp combine in plain jnp merges the splits.

Layouts:
  q:        (batch, heads, head_dim)
  k, v:     (batch, max_len, kv_heads, head_dim)
  lengths:  (batch,) int32, each in 1..max_len
  output:   (batch, heads, head_dim), q's dtype

K/V are read in place (no transpose or pad of the cache): a program's block
is a window (positions, kv heads, head_dim) of the cache, and positions at or
past a sequence's length are masked, so whatever they hold (even NaN) is
ignored.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from jaxroof.errors import InputError
from kernels import _backend
from kernels import autotune
from kernels import base
from kernels import cost_estimate
from kernels import _attention
from kernels._attention import (  # noqa: F401 - part of this module's API.
    CHECK_NOTE, LENGTHS, SUPPORTED_DTYPES, attend_chunk, check_lengths, combine_splits,
    default_scale, example_args, example_lengths, init_state, tolerance, with_ragged_lengths,
)
from kernels._backend import (
    MIN_DOT,
    Target,
    is_power_of_two,
    largest_pow2_divisor,
    next_power_of_two,
)

OP_NAME = "decode_attention"
_F32 = jnp.float32


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class DecodeAttentionConfig:
  """Block sizes and launch parameters of the decode attention kernel."""

  block_k: int = 64  # K/V positions per inner step.
  num_splits: int = 1  # Programs along the KV axis (flash-decoding).
  kv_heads_per_block: int = 1  # KV heads one program handles.
  num_warps: int = 4  # Triton only.
  num_stages: int = 2  # Triton only: software-pipelining depth.


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class DecodeProblem:
  """The static description of a decode attention call."""

  batch: int
  heads: int
  kv_heads: int
  max_len: int
  head_dim: int
  dtype: str

  @property
  def group(self) -> int:
    """Query heads per KV head."""
    return self.heads // self.kv_heads

  @property
  def block_h(self) -> int:
    """Query rows per program: the group padded to a power of two >= 16."""
    return max(MIN_DOT, next_power_of_two(self.group))

  @property
  def itemsize(self) -> int:
    return jnp.dtype(self.dtype).itemsize


def problem_of(q, k, v, lengths) -> DecodeProblem:
  """Checks shapes and dtypes of a call and describes it.

  Raises:
    InputError: naming the offending argument, its value and what is allowed.
  """
  if q.ndim != 3:
    raise InputError(f"q.shape={q.shape} is not allowed: give (batch, heads, head_dim).")
  if k.ndim != 4:
    raise InputError(f"k.shape={k.shape} is not allowed: give "
                     "(batch, max_len, kv_heads, head_dim).")
  if v.shape != k.shape:
    raise InputError(f"v.shape={v.shape} must equal k.shape={k.shape}.")
  batch, heads, head_dim = q.shape
  k_batch, max_len, kv_heads, k_head_dim = k.shape
  if (k_batch, k_head_dim) != (batch, head_dim):
    raise InputError(f"k.shape={k.shape} does not match q.shape={q.shape}: batch and "
                     "head_dim must agree.")
  if heads % kv_heads:
    raise InputError(f"{kv_heads=} must divide {heads=}.")
  if tuple(lengths.shape) != (batch,) or lengths.dtype != jnp.int32:
    raise InputError(f"lengths is {lengths.dtype}{list(lengths.shape)}: give int32[{batch}].")
  dtypes = {str(jnp.dtype(a.dtype)) for a in (q, k, v)}
  if len(dtypes) != 1:
    raise InputError(f"q, k and v must share one dtype, got {sorted(dtypes)}.")
  return DecodeProblem(
      batch=batch,
      heads=heads,
      kv_heads=kv_heads,
      max_len=max_len,
      head_dim=head_dim,
      dtype=dtypes.pop(),
  )


def reference(q, k, v, lengths, *, scale: float | None = None):
  """Plain jnp decode attention in float32: the definition of correct."""
  batch, heads, head_dim = q.shape
  _, max_len, kv_heads, _ = k.shape
  scale = default_scale(head_dim, scale)
  hi = lax.Precision.HIGHEST
  # (batch, kv_heads, group, head_dim)
  qg = q.reshape(batch, kv_heads, heads // kv_heads, head_dim).astype(_F32)
  # (b, n, g, d) x (b, t, n, d) -> (b, n, g, t)
  scores = jnp.einsum("bngd,btnd->bngt", qg, k.astype(_F32), precision=hi)
  valid = jnp.arange(max_len)[None, :] < lengths[:, None]  # (batch, max_len)
  scores = jnp.where(valid[:, None, None, :], scores * scale, -jnp.inf)
  weights = jax.nn.softmax(scores, axis=-1)
  values = jnp.where(valid[:, :, None, None], v.astype(_F32), 0.0)
  # (b, n, g, t) x (b, t, n, d) -> (b, n, g, d)
  out = jnp.einsum("bngt,btnd->bngd", weights, values, precision=hi)
  return out.reshape(batch, heads, head_dim).astype(q.dtype)


# Kernel -----------------------------------------------------------------------


def _decode_kernel(
    lengths_ref,  # (batch,) int32, whole array
    q_ref,  # (heads_per_block, block_h, head_dim)
    k_ref,  # (split_len, heads_per_block, head_dim)
    v_ref,  # (split_len, heads_per_block, head_dim)
    *out_refs,
    block_k: int,
    scale: float,
):
  """One (sequence, KV-head block, split): online softmax over its range.

  `out_refs` is (o, m, l) per split, each (heads_per_block, block_h, ...)
  float32 with o unnormalised, for the combine; with a single split it is
  just the output (heads_per_block, block_h, head_dim), normalised here, in
  q's dtype: nothing is left to combine.
  """
  split_len, heads_per_block, head_dim = k_ref.shape
  block_h = q_ref.shape[1]
  start = pl.program_id(2) * split_len
  length = lengths_ref[pl.program_id(0)]
  n_valid = jnp.clip(length - start, 0, split_len)
  n_chunks = (n_valid + block_k - 1) // block_k  # Only chunks with data.

  for h in range(heads_per_block):
    q = q_ref[h]  # (block_h, head_dim)

    def step(c, state, h=h, q=q):
      offset = pl.multiple_of(c * block_k, block_k)
      chunk = pl.ds(offset, block_k)
      return attend_chunk(
          q,
          k_ref[chunk, h, :],
          v_ref[chunk, h, :],
          start + offset,
          length,
          state,
          scale=scale,
      )

    acc, m, l = lax.fori_loop(0, n_chunks, step, init_state(block_h, head_dim))
    if len(out_refs) == 1:
      out_refs[0][h] = (acc / l).astype(out_refs[0].dtype)
    else:
      o_ref, m_ref, l_ref = out_refs
      o_ref[h] = acc
      m_ref[h] = m
      l_ref[h] = l


def decode_attention(
    q,
    k,
    v,
    lengths,
    *,
    config: DecodeAttentionConfig | None = None,
    scale: float | None = None,
    interpret: bool | None = None,
    platform: str | None = None,
):
  """Pallas decode attention; see the module docstring for layouts.

  Args:
    q, k, v, lengths: see the module docstring.
    config: block sizes; None means cache, then (if enabled) tuning, then the
      heuristic (`kernels.autotune.choose_config`).
    scale: softmax scale, 1/sqrt(head_dim) unless given.
    interpret: None means interpret on the CPU and compile elsewhere.
    platform: the lowering target (cpu, cuda, rocm, tpu); None means jax's
      default backend. Set it to cross-lower for another platform.

  Returns:
    (batch, heads, head_dim) in q's dtype.

  Raises:
    InputError: bad shapes, dtypes, lengths or a config that does not fit.
  """
  problem = problem_of(q, k, v, lengths)
  check_lengths(lengths, problem.max_len)
  target = _backend.resolve_target(platform, interpret)
  if config is None:
    config = autotune.choose_config(TUNABLE, (q, k, v, lengths), target)
  TUNABLE.validate(config, problem, target.rules)
  return _decode_call(
      q,
      k,
      v,
      lengths,
      config=config,
      target=target,
      scale=default_scale(problem.head_dim, scale),
  )


def _decode_call(q, k, v, lengths, *, config, target: Target, scale: float | None = None):
  """The pallas_call (and, with several splits, the combine)."""
  p = problem_of(q, k, v, lengths)
  scale = default_scale(p.head_dim, scale)
  hb = config.kv_heads_per_block
  split_len = p.max_len // config.num_splits
  # (batch, kv_heads, block_h, head_dim): each KV head's query rows, padded.
  qg = q.reshape(p.batch, p.kv_heads, p.group, p.head_dim)
  qg = jnp.pad(qg, ((0, 0), (0, 0), (0, p.block_h - p.group), (0, 0)))
  grid = (p.batch, p.kv_heads // hb, config.num_splits)
  part = (p.batch, p.kv_heads, config.num_splits, p.block_h)
  kv_spec = pl.BlockSpec((None, split_len, hb, p.head_dim), lambda b, n, s: (b, s, n, 0))
  part_spec = lambda last: pl.BlockSpec(  # noqa: E731
      (None, hb, None, p.block_h, last), lambda b, n, s: (b, n, s, 0, 0))
  if config.num_splits == 1:
    out_specs = pl.BlockSpec((None, hb, p.block_h, p.head_dim), lambda b, n, s: (b, n, 0, 0))
    out_shape = jax.ShapeDtypeStruct((p.batch, p.kv_heads, p.block_h, p.head_dim), q.dtype)
  else:
    out_specs = [part_spec(p.head_dim), part_spec(1), part_spec(1)]
    out_shape = [
        jax.ShapeDtypeStruct((*part, p.head_dim), _F32),
        jax.ShapeDtypeStruct((*part, 1), _F32),
        jax.ShapeDtypeStruct((*part, 1), _F32)
    ]
  out = pl.pallas_call(
      functools.partial(_decode_kernel, block_k=config.block_k, scale=scale),
      grid=grid,
      in_specs=[
          _backend.whole_array_scalars_spec(target),
          pl.BlockSpec((None, hb, p.block_h, p.head_dim), lambda b, n, s: (b, n, 0, 0)),
          kv_spec,
          kv_spec,
      ],
      out_specs=out_specs,
      out_shape=out_shape,
      compiler_params=_backend.compiler_params(
          target,
          num_warps=config.num_warps,
          num_stages=config.num_stages,
          dimension_semantics=("parallel",) * len(grid),
      ),
      interpret=target.interpret,
      name=OP_NAME,
      cost_estimate=cost_estimate.attention(batch=p.batch, heads=p.heads, kv_heads=p.kv_heads,
                                            positions=p.max_len, head_dim=p.head_dim,
                                            itemsize=p.itemsize),
  )(lengths, qg, k, v)
  if config.num_splits > 1:
    out = combine_splits(*out)
  out = out[:, :, :p.group]
  return out.reshape(p.batch, p.heads, p.head_dim).astype(q.dtype)


# Configs ----------------------------------------------------------------------


def why_invalid(config: DecodeAttentionConfig, problem: DecodeProblem, rules: str) -> str | None:
  """Why `config` cannot run `problem` under `rules`; None if it can."""
  c, p = config, problem
  reason = base.why_not_runnable(c, p.dtype, SUPPORTED_DTYPES)
  if reason:
    return reason
  if p.max_len % (c.num_splits * c.block_k):
    return (f"max_len={p.max_len} must be a multiple of "
            f"num_splits*block_k={c.num_splits * c.block_k}")
  if p.kv_heads % c.kv_heads_per_block:
    return (f"kv_heads_per_block={c.kv_heads_per_block} must divide "
            f"kv_heads={p.kv_heads}")
  split_len = p.max_len // c.num_splits
  if rules == "triton":
    if not (is_power_of_two(c.block_k) and c.block_k >= MIN_DOT):
      return f"block_k={c.block_k} must be a power of two >= 16 for Triton"
    if not (is_power_of_two(p.head_dim) and p.head_dim >= MIN_DOT):
      return f"head_dim={p.head_dim} must be a power of two >= 16 for Triton"
    if not is_power_of_two(c.num_warps) or c.num_warps > 16:
      return f"num_warps={c.num_warps} must be a power of two <= 16"
    smem = c.num_stages * 2 * c.block_k * p.head_dim * p.itemsize
    if smem > _backend.TRITON_SMEM_BUDGET_BYTES:
      return f"num_stages*K/V chunk bytes={smem} exceed the shared memory budget"
  elif rules == "mosaic_tpu":
    if c.kv_heads_per_block != p.kv_heads and c.kv_heads_per_block % 8:
      return (f"kv_heads_per_block={c.kv_heads_per_block} must equal "
              f"kv_heads={p.kv_heads} or be a multiple of 8 on TPU")
    if c.block_k % 128:
      return f"block_k={c.block_k} must be a multiple of 128 on TPU"
    vmem = 2 * 2 * split_len * c.kv_heads_per_block * p.head_dim * p.itemsize
    if vmem > _backend.TPU_VMEM_BUDGET_BYTES:
      return f"double-buffered K/V blocks ({vmem} bytes) exceed the VMEM budget"
  return None


def heuristic(problem: DecodeProblem, rules: str) -> DecodeAttentionConfig:
  """A config that fits `problem`, chosen without timing anything.

  GPU: one KV head per program, chunks of 64 positions (128 for small heads),
  and enough splits for two programs per SM of the device
  (`base.target_programs`), so the KV reads of a small batch still spread
  over every SM. TPU: all KV heads in one block (layout rules),
  large chunks, two splits for the two cores of a megacore. Interpreter: two
  splits so the combine is exercised, nothing else matters.

  Raises:
    InputError: when max_len has no power-of-two divisor the kernel can use.
  """
  p = problem
  if rules == "mosaic_tpu":
    block_k = largest_pow2_divisor(p.max_len, 512, 128)
    first = DecodeAttentionConfig(block_k=block_k or 128, kv_heads_per_block=p.kv_heads)
    splits = [2, 1, 4, 8, 16, 32, 64]
  else:
    cap = 64 if p.head_dim >= 128 else 128
    block_k = largest_pow2_divisor(p.max_len, cap, MIN_DOT)
    first = DecodeAttentionConfig(block_k=block_k or MIN_DOT)
    if rules == "interpret":
      splits = [2, 1]
    else:
      programs = base.target_programs(rules)
      want = max(1, math.ceil(programs / (p.batch * p.kv_heads)))
      splits = base.halvings(min(next_power_of_two(want), 64))
  return TUNABLE.first_fitting((dataclasses.replace(first, num_splits=s) for s in splits), p, rules,
                               fallback=dataclasses.replace(first, num_splits=1),
                               advice=" Allocate the cache with max_len a multiple of 128, or use "
                               "`reference`.")


def candidates(problem: DecodeProblem, rules: str) -> list[DecodeAttentionConfig]:
  """The configs the autotuner tries (the heuristic first); some may not fit."""
  first = heuristic(problem, rules)
  if rules == "interpret":
    return [first]
  if rules == "mosaic_tpu":
    grid = [
        dataclasses.replace(first, block_k=bk, num_splits=s) for bk in (128, 256, 512)
        for s in (first.num_splits, 2 * first.num_splits, 4 * first.num_splits)
    ]
  else:
    s = first.num_splits  # More splits: more programs, a longer combine.
    grid = [
        DecodeAttentionConfig(block_k=bk, num_splits=split, num_stages=st)
        for split in sorted({s, min(64, 2 * s), min(64, 4 * s)}) for bk in (64, 128)
        for st in (2, 3)
    ]
  return list(dict.fromkeys([first, *grid]))


TUNABLE = autotune.TunableOp(
    name=OP_NAME,
    config_type=DecodeAttentionConfig,
    problem=lambda args: problem_of(*args),
    kernel=_decode_call,
    reference=reference,
    candidates=candidates,
    why_invalid=why_invalid,
    heuristic=heuristic,
    tolerance=tolerance,
    chain_feed=_attention.contiguous_chain_feed,
    example_args=example_args,
    key_fields=("dtype", "heads", "kv_heads", "head_dim"),
    bucketed_fields=("batch", "max_len"),
    check_args=_attention.with_ragged_lengths,
    check_note=CHECK_NOTE,
    timing_note="example_args: every length max_len",
)
validate = TUNABLE.validate
config_space = TUNABLE.config_space
