"""Decode attention: the Pallas kernel (interpreted) against its reference,
input errors, and the real GPU/TPU lowerings of every config in the spaces."""

import dataclasses

import jax
import jax.numpy as jnp
from absl.testing import absltest, parameterized

from jaxroof.errors import InputError
from kernels import _backend
from kernels import decode_attention as da
from kernels import testing

_SMALL = da.DecodeProblem(batch=3, heads=8, kv_heads=2, max_len=256, head_dim=32, dtype="float32")
# (platform, config): CPU heuristic, many small splits, the TPU structure
# (all KV heads per program) interpreted on the CPU.
_VARIANTS = {
    "heuristic": ("cpu", None),
    "splits4_block16": ("cpu", da.DecodeAttentionConfig(block_k=16, num_splits=4)),
    "tpu_structure": ("tpu",
                      da.DecodeAttentionConfig(block_k=128, num_splits=2, kv_heads_per_block=2)),
}


def _inputs(problem, seed):
  q, k, v, _ = da.example_args(problem, jax.random.key(seed))
  lengths = testing.ragged_lengths(seed, problem.batch, problem.max_len)
  return q, testing.poison_beyond(k, lengths), testing.poison_beyond(v, lengths), lengths


def _abstract(problem):
  dtype = jnp.dtype(problem.dtype)
  kv = (problem.batch, problem.max_len, problem.kv_heads, problem.head_dim)
  return (
      jax.ShapeDtypeStruct((problem.batch, problem.heads, problem.head_dim), dtype),
      jax.ShapeDtypeStruct(kv, dtype),
      jax.ShapeDtypeStruct(kv, dtype),
      jax.ShapeDtypeStruct((problem.batch,), jnp.int32),
  )


class InterpretTest(parameterized.TestCase):

  @parameterized.named_parameters((f"_{variant}_{dtype}", dtype, variant) for variant in _VARIANTS
                                  for dtype in ("float32", "bfloat16"))
  def test_matches_reference(self, dtype, variant):
    problem = dataclasses.replace(_SMALL, dtype=dtype)
    platform, config = _VARIANTS[variant]
    seed = testing.fresh_seed()
    q, k, v, lengths = _inputs(problem, seed)
    out = da.decode_attention(q, k, v, lengths, config=config, platform=platform, interpret=True)
    rtol, atol = da.tolerance(dtype)
    testing.assert_close(
        out,
        da.reference(q, k, v, lengths),
        rtol=rtol,
        atol=atol,
        what=f"{variant} {dtype} seed={seed} lengths={lengths.tolist()}",
    )
    self.assertEqual(out.dtype, q.dtype)

  def test_mha_wide_group_and_scale(self):
    seed = testing.fresh_seed()
    for heads, kv_heads in ((4, 4), (32, 1)):
      problem = dataclasses.replace(_SMALL, heads=heads, kv_heads=kv_heads, batch=2, max_len=64)
      q, k, v, lengths = _inputs(problem, seed)
      out = da.decode_attention(q, k, v, lengths, scale=0.3)
      testing.assert_close(
          out,
          da.reference(q, k, v, lengths, scale=0.3),
          rtol=2e-5,
          atol=2e-5,
          what=f"{heads=} {kv_heads=} seed={seed}",
      )

  def test_reference_ignores_poisoned_slots_and_is_softmax(self):
    # One position: the output is that position's value row.
    problem = dataclasses.replace(_SMALL, batch=2, max_len=16)
    q, k, v, _ = da.example_args(problem, jax.random.key(testing.fresh_seed()))
    lengths = jnp.array([1, 1], jnp.int32)
    out = da.reference(q, testing.poison_beyond(k, lengths), testing.poison_beyond(v, lengths),
                       lengths)
    expected = jnp.repeat(v[:, 0], problem.group, axis=1)
    testing.assert_close(out, expected, rtol=1e-6, atol=1e-6, what="length 1")


class ErrorTest(absltest.TestCase):

  def test_bad_inputs_name_the_value(self):
    q, k, v, lengths = da.example_args(_SMALL, jax.random.key(0))
    with self.assertRaisesRegex(InputError, "kv_heads=2 must divide heads=7"):
      da.decode_attention(q[:, :7], k, v, lengths)
    with self.assertRaisesRegex(InputError, r"lengths\[1\]=0"):
      da.decode_attention(q, k, v, lengths.at[1].set(0))
    with self.assertRaisesRegex(InputError, r"lengths\[0\]=257"):
      da.decode_attention(q, k, v, lengths.at[0].set(257))
    with self.assertRaisesRegex(InputError, "int32"):
      da.decode_attention(q, k, v, lengths.astype(jnp.float32))
    with self.assertRaisesRegex(InputError, "interpret=False"):
      da.decode_attention(q, k, v, lengths, interpret=False, platform="cpu")
    with self.assertRaisesRegex(InputError, "platform='gpu' is unknown"):
      da.decode_attention(q, k, v, lengths, platform="gpu")

  def test_bad_configs_are_explained(self):
    bad = da.DecodeAttentionConfig(block_k=48, num_splits=1)
    problem = dataclasses.replace(_SMALL, max_len=96)
    self.assertIn("power of two", da.why_invalid(bad, problem, "triton"))
    self.assertIn(
        "multiple of num_splits*block_k",
        da.why_invalid(da.DecodeAttentionConfig(block_k=256, num_splits=2), _SMALL, "interpret"))
    self.assertIn("kv_heads_per_block",
                  da.why_invalid(da.DecodeAttentionConfig(block_k=128), _SMALL, "mosaic_tpu"))
    q, k, v, lengths = da.example_args(_SMALL, jax.random.key(0))
    with self.assertRaisesRegex(InputError, "max_len=256 must be a multiple"):
      da.decode_attention(q, k, v, lengths, config=da.DecodeAttentionConfig(block_k=96))
    odd = dataclasses.replace(_SMALL, max_len=100)
    with self.assertRaisesRegex(InputError, "max_len a multiple of 128"):
      da.heuristic(odd, "triton")


class CrossLoweringTest(parameterized.TestCase):
  """The real Triton and Mosaic TPU lowerings, run on the CPU."""

  def _lowers(self, problem, config, platform):
    _backend.cross_lower(
        lambda *a: da.decode_attention(*a, config=config, platform=platform),
        *_abstract(problem),
        platform=platform,
    )

  @parameterized.named_parameters((f"_{platform}_{dtype}", platform, dtype)
                                  for platform in ("cuda", "tpu")
                                  for dtype in ("float32", "bfloat16"))
  def test_every_config_in_the_space_lowers(self, platform, dtype):
    rules = _backend.resolve_target(platform).rules
    problems = [
        dataclasses.replace(_SMALL, dtype=dtype),
        dataclasses.replace(_SMALL, heads=4, kv_heads=4, max_len=4096, head_dim=128, dtype=dtype)
    ]
    for problem in problems:
      space = da.config_space(problem, rules)
      self.assertNotEmpty(space)
      self.assertIn(da.heuristic(problem, rules), space)
      for config in space:
        with self.subTest(problem=problem, config=config):
          self._lowers(problem, config, platform)

  def test_space_excludes_what_cannot_lower(self):
    # A 48-row chunk is not a power of two: Triton's lowering rejects it,
    # which is why the space leaves it out.
    problem = dataclasses.replace(_SMALL, max_len=96)
    config = da.DecodeAttentionConfig(block_k=48)
    self.assertIsNotNone(da.why_invalid(config, problem, "triton"))
    target = _backend.resolve_target("cuda")
    with self.assertRaisesRegex(Exception, "power of 2"):
      _backend.cross_lower(
          lambda *a: da._decode_call(*a, config=config, target=target),
          *_abstract(problem),
          platform="cuda",
      )


if __name__ == "__main__":
  absltest.main()
