"""The linear layer: the Pallas kernel (interpreted) against its reference for
decode and prefill row counts, input errors, and the real GPU/TPU lowerings of
every config in the spaces."""

import jax
import jax.numpy as jnp
from absl.testing import absltest, parameterized

from jaxroof.errors import InputError
from kernels import _backend
from kernels import linear
from kernels import testing

# (m, k, n, platform, config): M from 1 (decode, split-K heuristic) to
# prefill rows with several row tiles; explicit split-K with grouped order;
# the TPU structure (K as a grid axis) interpreted on the CPU.
_CASES = {
    "m1_decode": (1, 512, 256, "cpu", None),
    "m5_split_grouped": (5, 256, 128, "cpu",
                         linear.LinearConfig(block_m=16, block_n=32, block_k=64, split_k=2,
                                             group_m=2)),
    "m200_prefill": (200, 128, 256, "cpu", None),
    "m40_tpu_structure": (40, 256, 256, "tpu",
                          linear.LinearConfig(block_m=16, block_n=128, block_k=128, group_m=2)),
}


def _abstract(problem):
  dtype = jnp.dtype(problem.dtype)
  return (jax.ShapeDtypeStruct((problem.m, problem.k),
                               dtype), jax.ShapeDtypeStruct((problem.k, problem.n), dtype))


class InterpretTest(parameterized.TestCase):

  @parameterized.named_parameters(
      (f"_{case}_{dtype}", case, dtype) for case in _CASES for dtype in ("float32", "bfloat16"))
  def test_matches_reference(self, case, dtype):
    m, k, n, platform, config = _CASES[case]
    problem = linear.LinearProblem(m=m, k=k, n=n, dtype=dtype)
    seed = testing.fresh_seed()
    x, w = linear.example_args(problem, jax.random.key(seed))
    out = linear.linear(x, w, config=config, platform=platform, interpret=True)
    rtol, atol = linear.tolerance(dtype)
    testing.assert_close(out, linear.reference(x, w), rtol=rtol, atol=atol,
                         what=f"{case} {dtype} seed={seed}")
    self.assertEqual(out.dtype, x.dtype)

  def test_tile_order_covers_every_tile_once(self):
    for num_m, num_n, group_m in ((5, 3, 2), (1, 7, 8), (4, 4, 1), (6, 2, 4)):
      tiles = [
          tuple(int(i) for i in linear.tile_of(t, num_m=num_m, num_n=num_n, group_m=group_m))
          for t in range(num_m * num_n)
      ]
      expected = {(i, j) for i in range(num_m) for j in range(num_n)}
      self.assertEqual(set(tiles), expected, (num_m, num_n, group_m))
      self.assertLen(tiles, len(expected))


class ErrorTest(absltest.TestCase):

  def test_bad_inputs_name_the_value(self):
    x = jnp.ones((4, 64), jnp.float32)
    with self.assertRaisesRegex(InputError, r"x.shape=\(4, 64\) and w.shape"):
      linear.linear(x, jnp.ones((32, 16), jnp.float32))
    with self.assertRaisesRegex(InputError, "same dtype"):
      linear.linear(x, jnp.ones((64, 16), jnp.bfloat16))
    with self.assertRaisesRegex(InputError, "N=48 must be a multiple"):
      linear.linear(x, jnp.ones((64, 48), jnp.float32),
                    config=linear.LinearConfig(block_n=32, block_k=64))

  def test_heuristic_explains_shapes_it_cannot_tile(self):
    problem = linear.LinearProblem(m=8, k=100, n=64, dtype="bfloat16")
    with self.assertRaisesRegex(InputError, "K=100 must be a multiple"):
      linear.heuristic(problem, "triton")

  def test_rules_by_lowering(self):
    p = linear.LinearProblem(m=16, k=4096, n=4096, dtype="bfloat16")
    huge = linear.LinearConfig(block_m=256, block_n=256, block_k=256, num_stages=4)
    self.assertIn("shared memory", linear.why_invalid(huge, p, "triton"))
    self.assertIn("split_k",
                  linear.why_invalid(linear.LinearConfig(block_n=128, split_k=2), p, "mosaic_tpu"))
    self.assertIsNone(linear.why_invalid(huge, p, "interpret"))


class CrossLoweringTest(parameterized.TestCase):
  """The real Triton and Mosaic TPU lowerings, run on the CPU."""

  @parameterized.named_parameters((f"_{platform}_{dtype}", platform, dtype)
                                  for platform in ("cuda", "tpu")
                                  for dtype in ("float32", "bfloat16"))
  def test_every_config_in_the_space_lowers(self, platform, dtype):
    rules = _backend.resolve_target(platform).rules
    for m, k, n in ((1, 1024, 512), (16, 4096, 1024), (300, 1024, 1024)):
      problem = linear.LinearProblem(m=m, k=k, n=n, dtype=dtype)
      space = linear.config_space(problem, rules)
      self.assertNotEmpty(space)
      self.assertIn(linear.heuristic(problem, rules), space)
      for config in space:
        with self.subTest(problem=problem, config=config):
          _backend.cross_lower(
              lambda *a, c=config: linear.linear(*a, config=c, platform=platform),
              *_abstract(problem),
              platform=platform,
          )

  def test_space_excludes_what_cannot_lower(self):
    problem = linear.LinearProblem(m=8, k=96, n=64, dtype="float32")
    config = linear.LinearConfig(block_m=8, block_n=64, block_k=96)
    self.assertIsNotNone(linear.why_invalid(config, problem, "triton"))
    target = _backend.resolve_target("cuda")
    with self.assertRaisesRegex(Exception, "power of 2|>= 16|16"):
      _backend.cross_lower(
          lambda *a: linear._linear_call(*a, config=config, target=target),
          *_abstract(problem),
          platform="cuda",
      )


if __name__ == "__main__":
  absltest.main()
