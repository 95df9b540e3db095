"""The linear layer `x @ w`: weights read once, reused by every row of x.

In decode, x has few rows (one per sequence) and the kernel streams the
weights: its speed is the memory bandwidth, and it needs enough programs along
N (and, with `split_k`, along K) to keep every SM reading. In prefill, x has
thousands of rows and the same kernel is bound by arithmetic: large tiles,
grouped launch order for L2 reuse. Same kernel, different tuning: the lesson.

Layouts: x (M, K), w (K, N), output (M, N) in x's dtype, f32 accumulation.

Each program computes one (block_m, block_n) output tile over a K range,
looping over it in block_k steps; with `split_k > 1` the K ranges of one tile
are separate programs whose float32 partial sums are added in plain jnp. A
Triton block past the array's edge is not masked, so when x has fewer rows
than one row tile (decode) the GPU kernel masks its loads of x and stores of
the output by row; with several row tiles, and on TPU, rows of x are padded to
a multiple of block_m (a copy of x only).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from jaxroof.errors import InputError
from kernels import _backend
from kernels import _linear_tpu
from kernels import autotune
from kernels import base
from kernels import cost_estimate
from kernels import device_timing
from kernels._backend import (
    MIN_DOT,
    Target,
    is_power_of_two,
    largest_pow2_divisor,
    next_power_of_two,
)

OP_NAME = "linear"
SUPPORTED_DTYPES = ("float32", "bfloat16", "float16")
DECODE_MAX_ROWS = 64  # Up to this many rows the heuristic streams weights.
SMALL_ROWS = 16  # Up to this many rows the heuristic prefers split_k=1.
_F32 = jnp.float32
# Without it the Triton lowering runs float32 dots in TF32 (10-bit mantissa).
_EXACT = lax.Precision.HIGHEST


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class LinearConfig:
  """Tile sizes and launch parameters of the linear kernel."""

  block_m: int = 16  # Rows of x per program.
  block_n: int = 64  # Columns of w per program.
  block_k: int = 128  # Reduction step inside a program.
  split_k: int = 1  # Programs sharing one tile's K range (partial sums).
  group_m: int = 1  # Row tiles per group in the launch order (L2 reuse).
  num_warps: int = 4  # Triton only.
  num_stages: int = 3  # Triton only: software-pipelining depth.


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class LinearProblem:
  """The static description of a linear call."""

  m: int
  k: int
  n: int
  dtype: str

  @property
  def itemsize(self) -> int:
    return jnp.dtype(self.dtype).itemsize


def problem_of(x, w) -> LinearProblem:
  """Checks shapes and dtypes of a call and describes it.

  Raises:
    InputError: naming the offending argument, its value and what is allowed.
  """
  if x.ndim != 2 or w.ndim != 2:
    raise InputError(f"x.shape={x.shape}, w.shape={w.shape} are not allowed: give x (M, K) "
                     "and w (K, N).")
  if x.shape[1] != w.shape[0]:
    raise InputError(f"x.shape={x.shape} and w.shape={w.shape} do not chain: x's K must "
                     "equal w's K.")
  if x.dtype != w.dtype:
    raise InputError(f"x.dtype={x.dtype} and w.dtype={w.dtype} must be the same dtype.")
  return LinearProblem(m=x.shape[0], k=x.shape[1], n=w.shape[1], dtype=jnp.dtype(x.dtype).name)


def reference(x, w):
  """Plain jnp `x @ w` with float32 accumulation: the definition of correct."""
  out = jnp.dot(x, w, preferred_element_type=_F32, precision=lax.Precision.HIGHEST)
  return out.astype(x.dtype)


def tolerance(dtype) -> tuple[float, float]:
  """(rtol, atol) against the reference for outputs of order one."""
  if jnp.dtype(dtype) == jnp.float32:
    return 1e-4, 1e-4
  return 2e-2, 2e-2


# Kernel -----------------------------------------------------------------------


def _linear_kernel(
    x_ref,  # (block_m, k_range)
    w_ref,  # (k_range, block_n)
    o_ref,  # (block_m, block_n): output dtype, or float32 partial sums
    *,
    block_k: int,
    valid_rows: int | None = None,
):
  """One output tile over one K range, in block_k steps.

  With `valid_rows` (x has fewer rows than the tile), rows at or past it are
  neither read from x (they load as 0) nor written to the output.
  """
  block_m, k_range = x_ref.shape
  block_n = w_ref.shape[1]

  def load_x(offset):
    window = x_ref.at[:, pl.ds(offset, block_k)]  # (block_m, block_k)
    if valid_rows is None:
      return window[...]
    row = lax.broadcasted_iota(jnp.int32, (block_m, block_k), 0)
    return pltriton.load(window, mask=row < valid_rows, other=0)

  def step(i, acc):
    offset = pl.multiple_of(i * block_k, block_k)
    w = w_ref[pl.ds(offset, block_k), :]  # (block_k, block_n)
    return acc + jnp.dot(load_x(offset), w, precision=_EXACT, preferred_element_type=_F32)

  acc = lax.fori_loop(0, k_range // block_k, step, jnp.zeros((block_m, block_n), _F32))
  out = acc.astype(o_ref.dtype)
  if valid_rows is None:
    o_ref[...] = out
  else:
    row = lax.broadcasted_iota(jnp.int32, (block_m, block_n), 0)
    pltriton.store(o_ref, out, mask=row < valid_rows)


def tile_of(t, *, num_m: int, num_n: int, group_m: int):
  """(row tile, column tile) of launch index t in grouped order.

  Consecutive programs cover group_m row tiles of one column tile before
  moving to the next column, so the programs running together share tiles of
  x and w in L2. group_m = 1 is plain row-major order (columns fastest).
  """
  per_group = group_m * num_n
  first_m = (t // per_group) * group_m
  rows = jnp.minimum(num_m - first_m, group_m)
  within = t % per_group
  return first_m + within % rows, within // rows


def linear(
    x,
    w,
    *,
    config: LinearConfig | None = None,
    interpret: bool | None = None,
    platform: str | None = None,
):
  """Pallas `x @ w`: x (M, K), w (K, N) -> (M, N) in x's dtype.

  Args:
    x, w: the operands; same dtype (float32, bfloat16 or float16).
    config: tiles; None means cache, then (if enabled) tuning, then the
      heuristic (`kernels.autotune.choose_config`).
    interpret: None means interpret on the CPU and compile elsewhere.
    platform: the lowering target (cpu, cuda, rocm, tpu); None means jax's
      default backend. Set it to cross-lower for another platform.

  Raises:
    InputError: bad shapes or dtypes, or a config that does not fit.
  """
  problem = problem_of(x, w)
  target = _backend.resolve_target(platform, interpret)
  if config is None:
    config = autotune.choose_config(TUNABLE, (x, w), target)
  TUNABLE.validate(config, problem, target.rules)
  return _linear_call(x, w, config=config, target=target)


def _linear_call(x, w, *, config: LinearConfig, target: Target):
  """The pallas_call (and the split-K sum), for a validated config."""
  p = problem_of(x, w)
  c = config
  num_m = pl.cdiv(p.m, c.block_m)
  num_n = p.n // c.block_n
  masked = target.platform != "tpu" and p.m < c.block_m
  if num_m * c.block_m != p.m and not masked:
    x = jnp.pad(x, ((0, num_m * c.block_m - p.m), (0, 0)))
  tile = functools.partial(tile_of, num_m=num_m, num_n=num_n, group_m=c.group_m)
  cost = cost_estimate.linear(m=p.m, k=p.k, n=p.n, itemsize=p.itemsize)
  if target.platform == "tpu":
    out = _linear_tpu.linear_call(x, w, config=c, target=target, tile=tile, tiles=num_m * num_n,
                                  name=OP_NAME, cost=cost)
  else:
    out = _linear_call_gpu(x, w, config=c, target=target, tile=tile, tiles=num_m * num_n,
                           valid_rows=p.m if masked else None, cost=cost)
  return out[:p.m]


def _linear_call_gpu(x, w, *, config, target, tile, tiles, valid_rows, cost: pl.CostEstimate):
  """Triton structure: a K loop inside each program; split-K as a grid axis.

  `valid_rows`: x's rows when fewer than one tile (masked, not padded); `cost`:
  the op's `kernels.cost_estimate.linear`.
  """
  c = config
  rows, k = x.shape
  n = w.shape[1]
  k_range = k // c.split_k

  def o_index(t, s):
    m, j = tile(t)
    return (s, m, j) if c.split_k > 1 else (m, j)

  if c.split_k > 1:
    out_shape = jax.ShapeDtypeStruct((c.split_k, rows, n), _F32)
    out_spec = pl.BlockSpec((None, c.block_m, c.block_n), o_index)
  else:
    out_shape = jax.ShapeDtypeStruct((rows, n), x.dtype)
    out_spec = pl.BlockSpec((c.block_m, c.block_n), o_index)
  grid = (tiles, c.split_k)
  out = pl.pallas_call(
      functools.partial(_linear_kernel, block_k=c.block_k, valid_rows=valid_rows),
      grid=grid,
      in_specs=[
          pl.BlockSpec((c.block_m, k_range), lambda t, s: (tile(t)[0], s)),
          pl.BlockSpec((k_range, c.block_n), lambda t, s: (s, tile(t)[1])),
      ],
      out_specs=out_spec,
      out_shape=out_shape,
      compiler_params=_backend.compiler_params(
          target,
          num_warps=c.num_warps,
          num_stages=c.num_stages,
          dimension_semantics=("parallel", "parallel"),
      ),
      interpret=target.interpret,
      name=OP_NAME,
      cost_estimate=cost,
  )(x, w)
  if c.split_k > 1:
    out = out.sum(axis=0).astype(x.dtype)
  return out


# Configs ----------------------------------------------------------------------


def why_invalid(config: LinearConfig, problem: LinearProblem, rules: str) -> str | None:
  """Why `config` cannot run `problem` under `rules`; None if it can."""
  c, p = config, problem
  reason = base.why_not_runnable(c, p.dtype, SUPPORTED_DTYPES)
  if reason:
    return reason
  if p.k % (c.split_k * c.block_k):
    return (f"K={p.k} must be a multiple of split_k*block_k="
            f"{c.split_k * c.block_k}")
  if p.n % c.block_n:
    return f"N={p.n} must be a multiple of block_n={c.block_n}"
  if rules == "triton":
    for name in ("block_m", "block_n", "block_k"):
      value = getattr(c, name)
      if not (is_power_of_two(value) and value >= MIN_DOT):
        return f"{name}={value} must be a power of two >= 16 for Triton"
    if not is_power_of_two(c.num_warps) or c.num_warps > 16:
      return f"num_warps={c.num_warps} must be a power of two <= 16"
    tiles = c.block_m * c.block_k + c.block_k * c.block_n
    smem = c.num_stages * tiles * p.itemsize
    if smem > _backend.TRITON_SMEM_BUDGET_BYTES:
      return f"num_stages*tile bytes={smem} exceed the shared memory budget"
  elif rules == "mosaic_tpu":
    sublanes = 8 * (4 // p.itemsize)
    if c.split_k != 1:
      return f"split_k={c.split_k} must be 1 on TPU (K is a grid axis)"
    if c.block_m % sublanes and c.block_m < p.m:
      return f"block_m={c.block_m} must be a multiple of {sublanes} on TPU"
    if c.block_n % 128 and c.block_n != p.n:
      return f"block_n={c.block_n} must be a multiple of 128 or N on TPU"
    if c.block_k % 128 and c.block_k != p.k:
      return f"block_k={c.block_k} must be a multiple of 128 or K on TPU"
    vmem = (2 * (c.block_m * c.block_k + c.block_k * c.block_n) * p.itemsize +
            2 * c.block_m * c.block_n * p.itemsize + c.block_m * c.block_n * 4)
    if vmem > _backend.TPU_VMEM_BUDGET_BYTES:
      return f"double-buffered blocks ({vmem} bytes) exceed the VMEM budget"
  return None


_ADVICE = " N and K must be multiples of 16 (128 on TPU); or use `reference`."


def heuristic(problem: LinearProblem, rules: str) -> LinearConfig:
  """A config that fits `problem`, chosen without timing anything.

  GPU, decode (M <= 64): one row tile, narrow column tiles and split-K so
  about two programs per SM of the device (`base.target_programs`) stream
  the weights, deep pipelining; at M <= 16 split_k=1 comes first (no
  partial-sum epilogue, which costs as much as the rows are few). GPU, prefill: 128x128 tiles, grouped launch order, 8 warps.
  TPU: tiles up to 512x512, K steps up to 1024. Interpreter: the GPU
  shape with at most 2 splits.
  """
  p = problem
  if rules == "mosaic_tpu":
    sublanes = 8 * (4 // p.itemsize)
    first = LinearConfig(
        block_m=min(512, -(-p.m // sublanes) * sublanes),
        block_n=largest_pow2_divisor(p.n, 512, 128) or p.n,
        block_k=largest_pow2_divisor(p.k, 1024, 128) or p.k,
    )
    return TUNABLE.first_fitting([first], p, rules, fallback=first, advice=_ADVICE)
  block_n_cap, block_k_cap = (64, 128) if p.m <= DECODE_MAX_ROWS else (128, 64)
  block_n = largest_pow2_divisor(p.n, block_n_cap, MIN_DOT) or MIN_DOT
  block_k = largest_pow2_divisor(p.k, block_k_cap, MIN_DOT) or MIN_DOT
  if p.m <= DECODE_MAX_ROWS:
    first = LinearConfig(
        block_m=max(MIN_DOT, next_power_of_two(p.m)),
        block_n=block_n,
        block_k=block_k,
        num_warps=4,
        num_stages=4,
    )
    want = max(1, math.ceil(base.target_programs(rules) / (p.n // block_n)))
    splits = [min(16, next_power_of_two(want))]
  else:
    first = LinearConfig(
        block_m=128 if p.m >= 128 else 64,
        block_n=block_n,
        block_k=block_k,
        group_m=8,
        num_warps=8 if block_n >= 128 else 4,
        num_stages=3,
    )
    splits = [1]
  if rules == "interpret":
    splits = [min(2, splits[0])]
  splits = base.halvings(splits[0])
  if p.m <= SMALL_ROWS and rules == "triton":
    splits = [1, *splits]
  return TUNABLE.first_fitting((dataclasses.replace(first, split_k=s) for s in splits), p, rules,
                               fallback=dataclasses.replace(first, split_k=1), advice=_ADVICE)


def candidates(problem: LinearProblem, rules: str) -> list[LinearConfig]:
  """The configs the autotuner tries (the heuristic first); some may not fit."""
  first = heuristic(problem, rules)
  if rules == "interpret":
    return [first]
  if rules == "mosaic_tpu":
    grid = [
        dataclasses.replace(first, block_m=bm, block_n=bn, block_k=bk)
        for bm in sorted({first.block_m, min(first.block_m, 256)}) for bn in (256, 512)
        for bk in (512, 1024)
    ]
  elif problem.m <= DECODE_MAX_ROWS:
    grid = [  # Without split-K there is no partial-sum epilogue to pay.
        dataclasses.replace(first, block_n=bn, block_k=bk, split_k=split,
                            num_stages=4 if bk == 128 else 3) for bn in (32, 64, 128)
        for bk in (128, 256) for split in (1, first.split_k)
    ]
  else:
    shapes = [  # (block_m, block_n, block_k, num_warps, num_stages)
        (128, 128, 64, 8, 3),
        (128, 128, 64, 4, 4),
        (128, 256, 64, 8, 3),
        (256, 128, 64, 8, 3),
        (64, 256, 64, 4, 4),
        (128, 128, 32, 4, 4),
        (64, 128, 64, 4, 4),
        (128, 64, 64, 4, 4),
    ]
    grid = [
        dataclasses.replace(first, block_m=bm, block_n=bn, block_k=bk, num_warps=nw, num_stages=ns)
        for bm, bn, bk, nw, ns in shapes
    ]
  return list(dict.fromkeys([first, *grid]))


# Autotuning hooks -------------------------------------------------------------


def example_args(problem: LinearProblem, key: jax.Array):
  """Random x (M, K) and w (K, N) scaled so outputs are of order one."""
  kx, kw = jax.random.split(key)
  dtype = jnp.dtype(problem.dtype)
  x = jax.random.normal(kx, (problem.m, problem.k), dtype)
  w = jax.random.normal(kw, (problem.k, problem.n), _F32)
  return x, (w / math.sqrt(problem.k)).astype(dtype)


def _chain_feed(args, out):
  """The next call's arguments: the output becomes x when shapes allow.

  Otherwise x changes by a value that depends on all of the output
  (`device_timing.perturb_first`), which costs a reduction per call.
  """
  x, w = args
  if out.shape == x.shape:
    return out, w
  return device_timing.perturb_first(args, out)


TUNABLE = autotune.TunableOp(
    name=OP_NAME,
    config_type=LinearConfig,
    problem=lambda args: problem_of(*args),
    kernel=_linear_call,
    reference=reference,
    candidates=candidates,
    why_invalid=why_invalid,
    heuristic=heuristic,
    tolerance=tolerance,
    chain_feed=_chain_feed,
    example_args=example_args,
    key_fields=("dtype", "k", "n"),
    bucketed_fields=("m",),  # Rows: the batch (decode) or tokens (prefill).
)
validate = TUNABLE.validate
config_space = TUNABLE.config_space
