"""The TPU structure of `kernels.linear`: K as a grid axis, VMEM accumulator.

Mosaic copies blocks into VMEM, so the GPU structure's full-K windows do not
fit for large K; here each program does one K step and the K grid axis runs
in order on a core, accumulating into float32 scratch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels import _backend

_F32 = jnp.float32
# Without it dots may run at reduced precision.
_EXACT = lax.Precision.HIGHEST


def _kernel(
    x_ref,  # (block_m, block_k)
    w_ref,  # (block_k, block_n)
    o_ref,  # (block_m, block_n)
    acc_ref,  # (block_m, block_n) float32 scratch in VMEM
):
  """One output tile, one K step: the K grid axis runs in order on a core."""

  @pl.when(pl.program_id(1) == 0)
  def _():
    acc_ref[...] = jnp.zeros_like(acc_ref)

  acc_ref[...] += jnp.dot(x_ref[...], w_ref[...], precision=_EXACT, preferred_element_type=_F32)

  @pl.when(pl.program_id(1) == pl.num_programs(1) - 1)
  def _():
    o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def linear_call(x, w, *, config, target, tile, tiles, name: str, cost: pl.CostEstimate):
  """Mosaic TPU structure: K as the last grid axis, f32 accumulator in VMEM.

  Blocks are copied into VMEM, so full-K windows (the GPU structure) would
  not fit for large K; split_k is always 1 here. `cost`: the op's
  `kernels.cost_estimate.linear`, which Mosaic uses to schedule around the call.
  """
  c = config
  rows, k = x.shape
  grid = (tiles, k // c.block_k)
  return pl.pallas_call(
      _kernel,
      grid=grid,
      in_specs=[
          pl.BlockSpec((c.block_m, c.block_k), lambda t, s: (tile(t)[0], s)),
          pl.BlockSpec((c.block_k, c.block_n), lambda t, s: (s, tile(t)[1])),
      ],
      out_specs=pl.BlockSpec((c.block_m, c.block_n), lambda t, s: tile(t)),
      out_shape=jax.ShapeDtypeStruct((rows, w.shape[1]), x.dtype),
      scratch_shapes=[pltpu.VMEM((c.block_m, c.block_n), _F32)],
      compiler_params=_backend.compiler_params(
          target,
          num_warps=c.num_warps,
          num_stages=c.num_stages,
          dimension_semantics=("parallel", "arbitrary"),
      ),
      interpret=target.interpret,
      name=name,
      cost_estimate=cost,
  )(x, w)
