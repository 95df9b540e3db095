"""Paged decode attention: interpreted kernel against its reference, the
reference against contiguous attention, and the real GPU lowering."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from absl.testing import absltest, parameterized

from jaxroof.errors import InputError
from kernels import _backend
from kernels import decode_attention as da
from kernels import paged_attention as pa
from kernels import testing

_SMALL = pa.PagedProblem(
    batch=3,
    heads=8,
    kv_heads=2,
    head_dim=32,
    num_pages=17,
    page_size=16,
    pages_per_seq=4,
    dtype="float32",
)


def _inputs(problem, seed):
  q, k_pages, v_pages, tables, _ = pa.example_args(problem, jax.random.key(seed))
  lengths = testing.ragged_lengths(seed, problem.batch, problem.pages_per_seq * problem.page_size)
  # Poison every pool slot no sequence uses: pages outside the tables, and
  # the tail of each sequence's last page.
  used = np.zeros((problem.num_pages, problem.page_size), bool)
  size = problem.page_size
  for b, length in enumerate(np.asarray(lengths)):
    for i, page in enumerate(np.asarray(tables)[b]):
      used[page, :max(0, min(size, int(length) - i * size))] = True
  mask = jnp.asarray(used)[:, :, None, None]
  poison = lambda a: jnp.where(mask, a, jnp.nan).astype(a.dtype)  # noqa: E731
  return q, poison(k_pages), poison(v_pages), tables, lengths


class InterpretTest(parameterized.TestCase):

  @parameterized.named_parameters(
      (f"_{name}_{dtype}", dtype, config)
      for name, config in (("heuristic", None), ("splits4", pa.PagedAttentionConfig(num_splits=4)))
      for dtype in ("float32", "bfloat16"))
  def test_matches_reference(self, dtype, config):
    problem = dataclasses.replace(_SMALL, dtype=dtype)
    seed = testing.fresh_seed()
    args = _inputs(problem, seed)
    out = pa.paged_decode_attention(*args, config=config)
    rtol, atol = pa.tolerance(dtype)
    testing.assert_close(out, pa.reference(*args), rtol=rtol, atol=atol,
                         what=f"{dtype} seed={seed}")

  def test_reference_equals_contiguous_attention(self):
    seed = testing.fresh_seed()
    q, k_pages, v_pages, tables, lengths = _inputs(_SMALL, seed)
    k = pa.gather_pages(k_pages, tables)
    v = pa.gather_pages(v_pages, tables)
    # Page i of sequence b holds positions [16 i, 16 i + 16) of b's cache.
    np.testing.assert_array_equal(np.asarray(k[1, 16:32]), np.asarray(k_pages[int(tables[1, 1])]))
    testing.assert_close(
        pa.reference(q, k_pages, v_pages, tables, lengths),
        da.reference(q, k, v, lengths),
        rtol=0,
        atol=0,
        what=f"seed={seed}",
    )


class ErrorAndLoweringTest(absltest.TestCase):

  def test_tpu_is_refused_with_a_reason(self):
    self.assertEmpty(pa.config_space(_SMALL, "mosaic_tpu"))
    args = pa.example_args(_SMALL, jax.random.key(0))
    with self.assertRaisesRegex(InputError, "no TPU kernel"):
      pa.paged_decode_attention(*args, platform="tpu", interpret=True)

  def test_bad_inputs_name_the_value(self):
    q, k_pages, v_pages, tables, lengths = pa.example_args(_SMALL, jax.random.key(0))
    with self.assertRaisesRegex(InputError, "block_tables is float32"):
      pa.paged_decode_attention(q, k_pages, v_pages, tables.astype(jnp.float32), lengths)
    with self.assertRaisesRegex(InputError, r"lengths\[2\]=65"):
      pa.paged_decode_attention(q, k_pages, v_pages, tables, lengths.at[2].set(65))

  def test_live_page_indices_must_be_in_the_pool(self):
    q, k_pages, v_pages, tables, _ = pa.example_args(_SMALL, jax.random.key(0))
    lengths = jnp.array([64, 17, 16], jnp.int32)  # Live pages: 4, 2, 1.
    call = lambda t: pa.paged_decode_attention(  # noqa: E731
        q, k_pages, v_pages, t, lengths)
    for (b, i), value in (((0, 3), 17), ((1, 1), -1), ((2, 0), 99)):
      with self.subTest(b=b, i=i, value=value):
        with self.assertRaisesRegex(
            InputError, rf"block_tables\[{b}, {i}\]={value} is not allowed"
            r".* must be in 0\.\.16 \(num_pages=17\)"):
          call(tables.at[b, i].set(value))
    # Entries past a sequence's live pages are never read: anything goes.
    tail = tables.at[1, 2:].set(-1).at[2, 1:].set(1000)
    pa.check_block_tables(tail, lengths, _SMALL.num_pages, _SMALL.page_size)
    # Under jit the values are unknown, so the check is skipped.
    jax.eval_shape(call, tables.at[0, 3].set(17))

  def test_every_config_in_the_gpu_space_lowers(self):
    for dtype in ("float32", "bfloat16"):
      problem = dataclasses.replace(
          _SMALL,
          dtype=dtype,
          head_dim=128,
          page_size=64,
          pages_per_seq=32,
          num_pages=100,
      )
      dt = jnp.dtype(dtype)
      pool = (problem.num_pages, problem.page_size, problem.kv_heads, problem.head_dim)
      abstract = (
          jax.ShapeDtypeStruct((problem.batch, problem.heads, problem.head_dim), dt),
          jax.ShapeDtypeStruct(pool, dt),
          jax.ShapeDtypeStruct(pool, dt),
          jax.ShapeDtypeStruct((problem.batch, problem.pages_per_seq), jnp.int32),
          jax.ShapeDtypeStruct((problem.batch,), jnp.int32),
      )
      space = pa.config_space(problem, "triton")
      self.assertNotEmpty(space)
      for config in space:
        with self.subTest(dtype=dtype, config=config):
          _backend.cross_lower(
              lambda *a, c=config: pa.paged_decode_attention(*a, config=c, platform="cuda"),
              *abstract,
              platform="cuda",
          )


if __name__ == "__main__":
  absltest.main()
