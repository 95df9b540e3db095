"""On a TPU: the Mosaic kernels compile and match their references, and the paged
kernel says why it does not run there. Skips without a TPU (tests/conftest.py)."""

import jax
import pytest
from absl.testing import absltest, parameterized

from jaxroof.errors import InputError
from kernels import decode_attention as da
from kernels import linear
from kernels import paged_attention as pa
from kernels import testing

pytestmark = pytest.mark.tpu


class TpuTest(parameterized.TestCase):

  @parameterized.named_parameters(("_bf16", "bfloat16"), ("_f32", "float32"))
  def test_decode_attention_matches_reference(self, dtype):
    problem = da.DecodeProblem(batch=2, heads=8, kv_heads=2, max_len=1024, head_dim=128,
                               dtype=dtype)
    seed = testing.fresh_seed()
    args = da.with_ragged_lengths(da.example_args(problem, jax.random.key(seed)),
                                  jax.random.key(seed + 1))
    out = da.decode_attention(*args)
    rtol, atol = da.tolerance(dtype)
    testing.assert_close(out, da.reference(*args), rtol=rtol, atol=atol,
                         what=f"{dtype} seed={seed}")

  @parameterized.named_parameters(("_decode", 8), ("_prefill", 512))
  def test_linear_matches_reference(self, rows):
    problem = linear.LinearProblem(m=rows, k=1024, n=512, dtype="bfloat16")
    seed = testing.fresh_seed()
    x, w = linear.example_args(problem, jax.random.key(seed))
    rtol, atol = linear.tolerance("bfloat16")
    testing.assert_close(linear.linear(x, w), linear.reference(x, w), rtol=rtol, atol=atol,
                         what=f"rows={rows} seed={seed}")

  def test_paged_attention_is_refused_with_a_reason(self):
    problem = pa.PagedProblem(batch=2, heads=8, kv_heads=2, head_dim=128, num_pages=16,
                              page_size=64, pages_per_seq=4, dtype="bfloat16")
    with self.assertRaisesRegex(InputError, "no TPU kernel"):
      pa.paged_decode_attention(*pa.example_args(problem, jax.random.key(0)))


if __name__ == "__main__":
  absltest.main()
