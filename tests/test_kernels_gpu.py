"""On a GPU: every config in the default spaces compiles and matches the
reference, and the autotuner tunes and caches for real. Skips without a GPU."""

import dataclasses

import jax
import pytest
from absl.testing import absltest, parameterized

from kernels import _backend
from kernels import autotune
from kernels import decode_attention as da
from kernels import linear
from kernels import paged_attention as pa
from kernels import testing

pytestmark = pytest.mark.gpu  # Skips without a GPU (tests/conftest.py).

_ATTENTION = [
    da.DecodeProblem(batch=2, heads=8, kv_heads=2, max_len=1024, head_dim=128, dtype=dtype)
    for dtype in ("bfloat16", "float32")
] + [da.DecodeProblem(batch=3, heads=4, kv_heads=4, max_len=512, head_dim=64, dtype="bfloat16")]
_LINEAR = [
    linear.LinearProblem(m=m, k=1024, n=512, dtype=dtype)
    for m, dtype in ((1, "bfloat16"), (16, "bfloat16"), (16, "float32"), (300, "bfloat16"))
]
_PAGED = [
    pa.PagedProblem(batch=3, heads=8, kv_heads=2, head_dim=128, num_pages=40, page_size=64,
                    pages_per_seq=8, dtype="bfloat16")
]


def _check_space(op, space_fn, problem, args):
  target = _backend.resolve_target()
  expected = jax.jit(op.reference)(*args)
  rtol, atol = op.tolerance(problem.dtype)
  space = space_fn(problem, target.rules)
  assert space, problem
  for config in space:
    out = jax.jit(lambda *a, c=config: op.kernel(*a, config=c, target=target))(*args)
    testing.assert_close(out, expected, rtol=rtol, atol=atol, what=f"{problem} {config}")


class GpuKernelTest(parameterized.TestCase):

  def test_decode_attention_space(self):
    for problem in _ATTENTION:
      seed = testing.fresh_seed()
      q, k, v, _ = da.example_args(problem, jax.random.key(seed))
      lengths = testing.ragged_lengths(seed, problem.batch, problem.max_len)
      args = (q, testing.poison_beyond(k, lengths), testing.poison_beyond(v, lengths), lengths)
      _check_space(da.TUNABLE, da.config_space, problem, args)

  def test_linear_space(self):
    for problem in _LINEAR:
      args = linear.example_args(problem, jax.random.key(testing.fresh_seed()))
      _check_space(linear.TUNABLE, linear.config_space, problem, args)

  def test_paged_attention_space(self):
    for problem in _PAGED:
      args = pa.example_args(problem, jax.random.key(testing.fresh_seed()), lengths="ragged")
      _check_space(pa.TUNABLE, pa.config_space, problem, args)

  def test_tune_writes_the_cache_and_the_kernel_reads_it(self):
    cache_dir = self.create_tempdir().full_path
    problem = linear.LinearProblem(m=16, k=2048, n=2048, dtype="bfloat16")
    target = _backend.resolve_target()
    result = autotune.tune(linear.TUNABLE, problem, target=target, cache_dir=cache_dir,
                           max_candidates=4, progress=False)
    self.assertTrue(result.tuned, result.trials)
    ok = [t for t in result.trials if t.status == "ok"]
    self.assertNotEmpty(ok)
    self.assertTrue(all(t.timing.median_s > 0 for t in ok))
    x, w = linear.example_args(problem, jax.random.key(0))
    self.assertEqual(
        autotune.choose_config(linear.TUNABLE, (x, w), target, cache_dir=cache_dir),
        result.config,
    )
    self.assertEqual(dataclasses.asdict(result.config), result.entry["best"])


if __name__ == "__main__":
  absltest.main()
