"""Decode attention over a paged KV cache (a block table per sequence).

The cache is a pool of fixed-size pages shared by all sequences; sequence b's
positions [i*page_size, (i+1)*page_size) live in page `block_tables[b, i]`.
Same math and flash-decoding splits as `kernels.decode_attention` (the
online-softmax step and combine of `kernels._attention`); only where a chunk
of K/V comes from differs: one page per inner step, looked up in the block
table. The kernel clamps each page id it reads into 0..num_pages-1, so a bad
table entry under jit (where values are not checked) reads a wrong page
rather than memory outside the pool.

Layouts:
  q:             (batch, heads, head_dim)
  k_pages, v_pages: (num_pages, page_size, kv_heads, head_dim)
  block_tables:  (batch, pages_per_seq) int32 page indices
  lengths:       (batch,) int32, each in 1..pages_per_seq*page_size
  output:        (batch, heads, head_dim), q's dtype

A sequence's first ceil(length / page_size) table entries (its live pages)
must be in 0..num_pages-1; the entries after them are never read and may hold
anything (e.g. -1). Lengths and live page indices are checked when their
values are known (not traced).

GPU (Triton) and the CPU interpreter only: on TPU the page pool cannot be a
VMEM block, and a hand-written DMA pipeline is not part of jaxroof, so the TPU
config space is empty and the call raises.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from jaxroof.errors import InputError
from kernels import _attention
from kernels import _backend
from kernels import autotune
from kernels import base
from kernels import cost_estimate
from kernels import decode_attention
from kernels import device_timing
from kernels._backend import MIN_DOT, Target, is_power_of_two, next_power_of_two

OP_NAME = "paged_decode_attention"
_F32 = jnp.float32


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class PagedAttentionConfig:
  """Launch parameters of the paged decode attention kernel."""

  num_splits: int = 1  # Programs along each sequence's pages.
  num_warps: int = 4  # Triton only.
  num_stages: int = 2  # Triton only.


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class PagedProblem:
  """The static description of a paged decode attention call."""

  batch: int
  heads: int
  kv_heads: int
  head_dim: int
  num_pages: int
  page_size: int
  pages_per_seq: int
  dtype: str

  @property
  def group(self) -> int:
    return self.heads // self.kv_heads

  @property
  def max_len(self) -> int:
    """Positions a sequence's table can address."""
    return self.pages_per_seq * self.page_size

  @property
  def block_h(self) -> int:
    return max(MIN_DOT, next_power_of_two(self.group))


def problem_of(q, k_pages, v_pages, block_tables, lengths) -> PagedProblem:
  """Checks shapes and dtypes of a call and describes it."""
  if k_pages.ndim != 4 or v_pages.shape != k_pages.shape:
    raise InputError(f"k_pages.shape={k_pages.shape}, v_pages.shape={v_pages.shape}: give "
                     "both as (num_pages, page_size, kv_heads, head_dim).")
  num_pages, page_size, kv_heads, head_dim = k_pages.shape
  if q.ndim != 3 or q.shape[2] != head_dim:
    raise InputError(f"q.shape={q.shape} is not allowed: give (batch, heads, {head_dim}).")
  batch, heads, _ = q.shape
  if heads % kv_heads:
    raise InputError(f"{kv_heads=} must divide {heads=}.")
  if block_tables.ndim != 2 or block_tables.shape[0] != batch or (block_tables.dtype != jnp.int32):
    raise InputError(f"block_tables is {block_tables.dtype}{list(block_tables.shape)}: "
                     f"give int32[{batch}, pages_per_seq].")
  if tuple(lengths.shape) != (batch,) or lengths.dtype != jnp.int32:
    raise InputError(f"lengths is {lengths.dtype}{list(lengths.shape)}: give int32[{batch}].")
  dtypes = {str(jnp.dtype(a.dtype)) for a in (q, k_pages, v_pages)}
  if len(dtypes) != 1:
    raise InputError(f"q, k_pages and v_pages must share one dtype, got {sorted(dtypes)}.")
  return PagedProblem(
      batch=batch,
      heads=heads,
      kv_heads=kv_heads,
      head_dim=head_dim,
      num_pages=num_pages,
      page_size=page_size,
      pages_per_seq=block_tables.shape[1],
      dtype=dtypes.pop(),
  )


def check_block_tables(block_tables, lengths, num_pages: int, page_size: int) -> None:
  """Checks every live page index is in 0..num_pages-1, when values are known.

  Live: the first ceil(lengths[b] / page_size) entries of row b, the pages
  the kernel reads. Skipped under tracing (jit), as `check_lengths` is.

  Raises:
    InputError: naming the first bad `block_tables[b, i]` and its value.
  """
  try:
    tables = np.asarray(block_tables)
    lens = np.asarray(lengths)
  except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
    return  # Traced under jit: the values are not known yet.
  live = np.arange(tables.shape[1])[None, :] * page_size < lens[:, None]
  bad = np.argwhere(live & ((tables < 0) | (tables >= num_pages)))
  if bad.size:
    b, i = (int(n) for n in bad[0])
    raise InputError(f"block_tables[{b}, {i}]={int(tables[b, i])} is not allowed: the "
                     f"first ceil(lengths[{b}]/page_size) = "
                     f"{-(-int(lens[b]) // page_size)} page indices of sequence {b} must "
                     f"be in 0..{num_pages - 1} (num_pages={num_pages}).")


def gather_pages(pages, block_tables):
  """(num_pages, page_size, n, d) -> (batch, pages_per_seq*page_size, n, d)."""
  batch, pages_per_seq = block_tables.shape
  _, page_size, kv_heads, head_dim = pages.shape
  return pages[block_tables].reshape(batch, pages_per_seq * page_size, kv_heads, head_dim)


def reference(q, k_pages, v_pages, block_tables, lengths, *, scale: float | None = None):
  """Gathers each sequence's pages, then the contiguous reference."""
  return decode_attention.reference(
      q,
      gather_pages(k_pages, block_tables),
      gather_pages(v_pages, block_tables),
      lengths,
      scale=scale,
  )


def _paged_kernel(
    tables_ref,  # (batch, pages_per_seq) int32, whole array
    lengths_ref,  # (batch,) int32, whole array
    q_ref,  # (block_h, head_dim)
    k_ref,  # (num_pages, page_size, head_dim): one KV head of the pool
    v_ref,  # (num_pages, page_size, head_dim)
    o_ref,  # (block_h, head_dim) float32, unnormalised
    m_ref,  # (block_h, 1) float32
    l_ref,  # (block_h, 1) float32
    *,
    pages_per_split: int,
    scale: float,
):
  """One (sequence, KV head, split): online softmax over its pages."""
  num_pages, page_size, head_dim = k_ref.shape
  b = pl.program_id(0)
  first_page = pl.program_id(2) * pages_per_split
  length = lengths_ref[b]
  start = first_page * page_size
  n_valid = jnp.clip(length - start, 0, pages_per_split * page_size)
  n_pages = (n_valid + page_size - 1) // page_size
  q = q_ref[...]

  def step(i, state):
    page = jnp.clip(tables_ref[b, first_page + i], 0, num_pages - 1)
    return _attention.attend_chunk(
        q,
        k_ref[page],
        v_ref[page],
        start + i * page_size,
        length,
        state,
        scale=scale,
    )

  acc, m, l = lax.fori_loop(0, n_pages, step, _attention.init_state(q.shape[0], head_dim))
  o_ref[...] = acc
  m_ref[...] = m
  l_ref[...] = l


def paged_decode_attention(
    q,
    k_pages,
    v_pages,
    block_tables,
    lengths,
    *,
    config: PagedAttentionConfig | None = None,
    scale: float | None = None,
    interpret: bool | None = None,
    platform: str | None = None,
):
  """Pallas decode attention over a paged cache; see the module docstring.

  Raises:
    InputError: bad shapes or dtypes, a config that does not fit, or TPU.
  """
  problem = problem_of(q, k_pages, v_pages, block_tables, lengths)
  _attention.check_lengths(lengths, problem.max_len)
  check_block_tables(block_tables, lengths, problem.num_pages, problem.page_size)
  target = _backend.resolve_target(platform, interpret)
  args = (q, k_pages, v_pages, block_tables, lengths)
  if config is None:
    config = autotune.choose_config(TUNABLE, args, target)
  TUNABLE.validate(config, problem, target.rules)
  return _paged_call(*args, config=config, target=target, scale=scale)


def _paged_call(q, k_pages, v_pages, block_tables, lengths, *, config, target: Target,
                scale: float | None = None):
  """The pallas_call and the combine, for a validated config."""
  p = problem_of(q, k_pages, v_pages, block_tables, lengths)
  scale = _attention.default_scale(p.head_dim, scale)
  qg = q.reshape(p.batch, p.kv_heads, p.group, p.head_dim)
  qg = jnp.pad(qg, ((0, 0), (0, 0), (0, p.block_h - p.group), (0, 0)))
  grid = (p.batch, p.kv_heads, config.num_splits)
  part = (p.batch, p.kv_heads, config.num_splits, p.block_h)
  pool_spec = pl.BlockSpec(
      (p.num_pages, p.page_size, None, p.head_dim),
      lambda b, n, s: (0, 0, n, 0),
  )
  part_spec = lambda last: pl.BlockSpec(  # noqa: E731
      (None, None, None, p.block_h, last), lambda b, n, s: (b, n, s, 0, 0))
  scalars = _backend.whole_array_scalars_spec(target)
  o, m, l = pl.pallas_call(
      functools.partial(
          _paged_kernel,
          pages_per_split=p.pages_per_seq // config.num_splits,
          scale=scale,
      ),
      grid=grid,
      in_specs=[
          scalars,
          scalars,
          pl.BlockSpec((None, None, p.block_h, p.head_dim), lambda b, n, s: (b, n, 0, 0)),
          pool_spec,
          pool_spec,
      ],
      out_specs=[part_spec(p.head_dim), part_spec(1),
                 part_spec(1)],
      out_shape=[
          jax.ShapeDtypeStruct((*part, p.head_dim), _F32),
          jax.ShapeDtypeStruct((*part, 1), _F32),
          jax.ShapeDtypeStruct((*part, 1), _F32),
      ],
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
                                            itemsize=jnp.dtype(p.dtype).itemsize),
  )(block_tables, lengths, qg, k_pages, v_pages)
  out = _attention.combine_splits(o, m, l)[:, :, :p.group]
  return out.reshape(p.batch, p.heads, p.head_dim).astype(q.dtype)


def why_invalid(config: PagedAttentionConfig, problem: PagedProblem, rules: str) -> str | None:
  """Why `config` cannot run `problem` under `rules`; None if it can."""
  c, p = config, problem
  reason = base.why_not_runnable(c, p.dtype, _attention.SUPPORTED_DTYPES)
  if reason:
    return reason
  if rules == "mosaic_tpu":
    return "paged decode attention has no TPU kernel in jaxroof"
  if p.pages_per_seq % c.num_splits:
    return (f"num_splits={c.num_splits} must divide "
            f"pages_per_seq={p.pages_per_seq}")
  if rules == "triton":
    if not (is_power_of_two(p.page_size) and p.page_size >= MIN_DOT):
      return f"page_size={p.page_size} must be a power of two >= 16 for Triton"
    if not (is_power_of_two(p.head_dim) and p.head_dim >= MIN_DOT):
      return f"head_dim={p.head_dim} must be a power of two >= 16 for Triton"
    if not is_power_of_two(c.num_warps) or c.num_warps > 16:
      return f"num_warps={c.num_warps} must be a power of two <= 16"
  return None


def heuristic(problem: PagedProblem, rules: str) -> PagedAttentionConfig:
  """Two programs per SM on a GPU (as for contiguous decode); 2 splits else."""
  p = problem
  first = 2
  if rules == "triton":
    programs = base.target_programs(rules)
    first = min(64, next_power_of_two(max(1, math.ceil(programs / (p.batch * p.kv_heads)))))
  return TUNABLE.first_fitting((PagedAttentionConfig(num_splits=s) for s in base.halvings(first)),
                               p, rules, fallback=PagedAttentionConfig())


def candidates(problem: PagedProblem, rules: str) -> list[PagedAttentionConfig]:
  """The configs the autotuner tries (the heuristic first)."""
  if rules == "mosaic_tpu":
    return []
  first = heuristic(problem, rules)
  if rules == "interpret":
    return [first]
  s = first.num_splits
  grid = [
      PagedAttentionConfig(num_splits=split, num_stages=stages, num_warps=w)
      for split in sorted({max(1, s // 2), s, 2 * s}) for stages in (2, 3) for w in (4,)
  ]
  return list(dict.fromkeys([first, *grid]))


def example_args(problem: PagedProblem, key: jax.Array, *, lengths: str = "full"):
  """Random inputs: a shuffled page pool, each page used at most once.

  `lengths` is "full" or "ragged", as for `decode_attention.example_lengths`.
  """
  p = problem
  kq, kk, kv, kt, kl = jax.random.split(key, 5)
  dtype = jnp.dtype(p.dtype)
  q = jax.random.normal(kq, (p.batch, p.heads, p.head_dim), dtype)
  shape = (p.num_pages, p.page_size, p.kv_heads, p.head_dim)
  k_pages = jax.random.normal(kk, shape, dtype)
  v_pages = jax.random.normal(kv, shape, dtype)
  needed = p.batch * p.pages_per_seq
  if needed > p.num_pages:
    raise InputError(f"num_pages={p.num_pages} is too few for batch*pages_per_seq={needed}.")
  order = jax.random.permutation(kt, p.num_pages)[:needed]
  tables = order.reshape(p.batch, p.pages_per_seq).astype(jnp.int32)
  lens = _attention.example_lengths(kl, p.batch, p.max_len, lengths)
  return q, k_pages, v_pages, tables, lens


def with_ragged_lengths(args, key: jax.Array):
  """The paged arguments with ragged lengths (`example_lengths`) instead."""
  q, k_pages, v_pages, tables, _ = args
  max_len = tables.shape[1] * k_pages.shape[1]
  lens = _attention.example_lengths(key, q.shape[0], max_len, "ragged")
  return q, k_pages, v_pages, tables, lens


def _chain_feed(args, out):
  """As for contiguous decode: q from the output, one pool element rewritten."""
  q, k_pages, v_pages, tables, lengths = args
  return (out, device_timing.poke(k_pages, out), device_timing.poke(v_pages, out), tables, lengths)


TUNABLE = autotune.TunableOp(
    name=OP_NAME,
    config_type=PagedAttentionConfig,
    problem=lambda args: problem_of(*args),
    kernel=_paged_call,
    reference=reference,
    candidates=candidates,
    why_invalid=why_invalid,
    heuristic=heuristic,
    tolerance=_attention.tolerance,
    chain_feed=_chain_feed,
    example_args=example_args,
    # Not num_pages: the pool is sized by memory, not by the problem.
    key_fields=("dtype", "heads", "kv_heads", "head_dim", "page_size"),
    bucketed_fields=("batch", "max_len"),
    check_args=with_ragged_lengths,
    check_note=_attention.CHECK_NOTE,
    timing_note="example_args: every length pages_per_seq*page_size",
)
tolerance = _attention.tolerance
validate = TUNABLE.validate
config_space = TUNABLE.config_space
