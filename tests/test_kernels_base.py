"""The shared kernel base and the GPU run's safety rules, checked on the CPU."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxroof.errors import InputError
from kernels import autotune
from kernels import base
from kernels import decode_attention as da
from kernels import linear
from kernels import paged_attention as pa


def test_why_not_positive_names_the_first_bad_field():
  assert base.why_not_positive(linear.LinearConfig()) is None
  for bad in (0, -1, 1.5, True, None):
    reason = base.why_not_positive(linear.LinearConfig(block_k=bad))
    assert reason.startswith(f"block_k={bad!r}"), reason


def test_every_op_validates_through_one_base():
  problem = linear.LinearProblem(m=16, k=64, n=48, dtype="float32")
  for op in (da.TUNABLE, pa.TUNABLE, linear.TUNABLE):
    assert isinstance(op, base.KernelOp)
  with pytest.raises(InputError, match="N=48 must be a multiple"):
    linear.validate(linear.LinearConfig(block_n=32, block_k=64), problem, "interpret")
  space = linear.config_space(problem, "triton")
  assert space and all(linear.why_invalid(c, problem, "triton") is None for c in space)


def test_small_row_counts_prefer_one_split():
  # Issue 13: at M <= 16 the split-K epilogue costs as much as the rows are
  # few, so the heuristic takes split_k=1 whenever it fits.
  for m in (1, 8, 16):
    problem = linear.LinearProblem(m=m, k=8192, n=8192, dtype="bfloat16")
    assert linear.heuristic(problem, "triton").split_k == 1
  problem = linear.LinearProblem(m=64, k=8192, n=8192, dtype="bfloat16")
  assert linear.heuristic(problem, "triton").split_k > 1


def test_masked_rows_read_nothing_past_the_edge():
  # Interpret mode reads NaN past an array's edge: a finite, correct output
  # for M < block_m shows the rows are masked, not read.
  problem = linear.LinearProblem(m=5, k=128, n=64, dtype="float32")
  x, w = linear.example_args(problem, jax.random.key(0))
  out = linear.linear(x, w, config=linear.LinearConfig(block_m=16, block_n=32, block_k=64))
  np.testing.assert_allclose(out, linear.reference(x, w), rtol=1e-5, atol=1e-5)


def test_one_split_normalises_in_the_kernel():
  problem = da.DecodeProblem(batch=2, heads=4, kv_heads=2, max_len=64, head_dim=16, dtype="float32")
  args = da.with_ragged_lengths(da.example_args(problem, jax.random.key(1)), jax.random.key(2))
  config = da.DecodeAttentionConfig(block_k=16, num_splits=1)
  for splits, outputs in ((1, 1), (2, 3)):  # (o) or (o, m, l) per split.
    jaxpr = jax.make_jaxpr(lambda *a, s=splits: da.decode_attention(
        *a, config=dataclasses.replace(config, num_splits=s)))(*args)
    calls = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "pallas_call"]
    assert [len(e.outvars) for e in calls] == [outputs]
  np.testing.assert_allclose(da.decode_attention(*args, config=config), da.reference(*args),
                             rtol=2e-5, atol=2e-5)


def test_paged_kernel_clamps_page_ids_under_jit():
  # Under jit the values are not checked; an out-of-range live page id must
  # read some page of the pool (finite output), never memory past it.
  problem = pa.PagedProblem(batch=2, heads=4, kv_heads=2, head_dim=16, num_pages=8, page_size=16,
                            pages_per_seq=2, dtype="float32")
  q, k, v, tables, lengths = pa.example_args(problem, jax.random.key(3))
  tables = tables.at[0, 0].set(1000).at[1, 1].set(-5)
  out = jax.jit(lambda *a: pa.paged_decode_attention(*a, config=pa.PagedAttentionConfig(
      num_splits=1)))(q, k, v, tables, lengths)
  assert np.isfinite(np.asarray(out)).all()
  clamped = jnp.clip(tables, 0, problem.num_pages - 1)
  np.testing.assert_allclose(out, pa.reference(q, k, v, clamped, lengths), rtol=2e-5, atol=2e-5)


def test_tolerance_scales_with_the_reference_rms():
  # At long contexts attention outputs are small: an RMS of 0.005 is below
  # bf16's absolute 2e-2, so a 40% error (a kernel dropping positions) would
  # pass an absolute check. Relative to the RMS it fails; a 0.5% error passes.
  expected = jnp.full((4, 8), 0.005, jnp.bfloat16)
  assert not autotune._matches(da.TUNABLE, expected * 1.4, expected)
  assert autotune._matches(da.TUNABLE, expected * 1.005, expected)


def test_device_cores_defaults_off_a_gpu():
  assert base.device_cores("triton") == base.DEFAULT_GPU_CORES
  assert base.target_programs("triton") == 2 * base.DEFAULT_GPU_CORES
  assert base.halvings(8) == [8, 4, 2, 1]
  assert dataclasses.is_dataclass(base.KernelOp)
