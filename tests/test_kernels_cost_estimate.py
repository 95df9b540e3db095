"""Each Pallas kernel hands the compiler a `pl.CostEstimate` equal to the roofline's
sympy counts for its shape (`jaxroof.symbolic.formulas`) and to a count by hand.

The estimate is read from the traced `pallas_call`, with interpret-mode targets on the
CPU, for more than one config (a config changes blocks, never the operation's work), and
from the Mosaic TPU custom call a cross-lowering emits: what the TPU compiler receives.
(Triton drops the estimate; Mosaic schedules around the call with it.)
"""

from __future__ import annotations

import re

import jax
import jax.extend
import jax.numpy as jnp
from absl.testing import absltest, parameterized
from jax.experimental import pallas as pl

from jaxroof.symbolic import formulas
from kernels import _backend
from kernels import decode_attention as da
from kernels import linear
from kernels import paged_attention as pa


def _estimates(fn, *args) -> list[pl.CostEstimate]:
  """The cost_estimate of every pallas_call `fn` traces to, nested jaxprs included."""
  found = []

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "pallas_call":
        found.append(eqn.params["cost_estimate"])
      for value in eqn.params.values():
        for sub in value if isinstance(value, (tuple, list)) else (value,):
          if isinstance(sub, jax.extend.core.ClosedJaxpr):
            walk(sub.jaxpr)
          elif isinstance(sub, jax.extend.core.Jaxpr):
            walk(sub)

  walk(jax.make_jaxpr(fn)(*args).jaxpr)
  return found


def _mosaic_estimates(fn, *args) -> list[dict[str, int]]:
  """The cost_estimate in each Mosaic custom call of `fn` cross-lowered for a TPU."""
  text = _backend.cross_lower(fn, *args, platform="tpu")
  return [{key: int(value) for key, value in re.findall(r'\\22(\w+)\\22:(\d+)', block)}
          for block in re.findall(r"\\22cost_estimate\\22: \{(.*?)\}", text)]


class CostEstimateTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("_one_split", da.DecodeAttentionConfig(block_k=16, num_splits=1)),
      ("_two_splits", da.DecodeAttentionConfig(block_k=16, num_splits=2)),
  )
  def test_decode_attention(self, config):
    p = da.DecodeProblem(batch=2, heads=4, kv_heads=2, max_len=32, head_dim=16, dtype="float32")
    args = da.example_args(p, jax.random.key(0))
    [got] = _estimates(lambda *a: da.decode_attention(*a, config=config, interpret=True), *args)
    self.assertEqual(got.flops, formulas.attention_flops(2, 32, 4, 16))
    self.assertEqual(got.bytes_accessed, formulas.attention_bytes(2, 32, 4, 2, 16, 4))
    # By hand: QK^T and PV, a multiply and an add each, per sequence, head, position
    # and coordinate; K and V of 2 KV heads at 32 positions, q and output, 4 bytes each;
    # one exponential per score.
    self.assertEqual(got.flops, 2 * 2 * 2 * 4 * 32 * 16)
    self.assertEqual(got.bytes_accessed, (2 * 2 * 32 * 2 * 16 + 2 * 2 * 4 * 16) * 4)
    self.assertEqual(got.transcendentals, 2 * 4 * 32)

  def test_paged_attention_counts_every_position_a_table_addresses(self):
    p = pa.PagedProblem(batch=3, heads=8, kv_heads=2, head_dim=32, num_pages=17, page_size=16,
                        pages_per_seq=4, dtype="bfloat16")
    args = pa.example_args(p, jax.random.key(0))
    config = pa.PagedAttentionConfig(num_splits=2)
    [got] = _estimates(lambda *a: pa.paged_decode_attention(*a, config=config, interpret=True),
                       *args)
    positions = 4 * 16
    self.assertEqual(got.flops, formulas.attention_flops(3, positions, 8, 32))
    self.assertEqual(got.bytes_accessed, formulas.attention_bytes(3, positions, 8, 2, 32, 2))
    self.assertEqual(got.flops, 4 * 3 * 8 * 64 * 32)
    self.assertEqual(got.bytes_accessed, (2 * 3 * 64 * 2 * 32 + 2 * 3 * 8 * 32) * 2)
    self.assertEqual(got.transcendentals, 3 * 8 * 64)

  @parameterized.named_parameters(
      ("_gpu_split_k", "cpu", linear.LinearConfig(block_m=16, block_n=32, block_k=64, split_k=2)),
      ("_tpu_structure", "tpu", linear.LinearConfig(block_m=16, block_n=128, block_k=128)),
  )
  def test_linear(self, platform, config):
    m, k, n = 5, 256, 128
    x = jnp.ones((m, k), jnp.bfloat16)
    w = jnp.ones((k, n), jnp.bfloat16)
    [got] = _estimates(
        lambda a, b: linear.linear(a, b, config=config, platform=platform, interpret=True), x, w)
    self.assertEqual(got.flops, formulas.linear_flops(k * n, m))
    self.assertEqual(got.bytes_accessed, formulas.linear_bytes(m, k, n, 2))
    # By hand: a multiply and an add per (row, weight); w once, x read, output written,
    # the true 5 rows (not the padded tile), 2 bytes each.
    self.assertEqual(got.flops, 2 * 5 * 256 * 128)
    self.assertEqual(got.bytes_accessed, (256 * 128 + 5 * 256 + 5 * 128) * 2)
    self.assertEqual(got.transcendentals, 0)

  def test_reaches_the_mosaic_tpu_call(self):
    x = jnp.ones((5, 256), jnp.bfloat16)
    w = jnp.ones((256, 128), jnp.bfloat16)
    config = linear.LinearConfig(block_m=16, block_n=128, block_k=128)
    [got] = _mosaic_estimates(
        lambda a, b: linear.linear(a, b, config=config, platform="tpu", interpret=False), x, w)
    self.assertEqual(
        got, {
            "flops": 2 * 5 * 256 * 128, "transcendentals": 0, "bytes_accessed":
                (256 * 128 + 5 * 256 + 5 * 128) * 2, "remote_bytes_transferred": 0
        })
    p = da.DecodeProblem(batch=2, heads=8, kv_heads=2, max_len=256, head_dim=128, dtype="bfloat16")
    args = da.example_args(p, jax.random.key(0))
    [got] = _mosaic_estimates(lambda *a: da.decode_attention(*a, platform="tpu", interpret=False),
                              *args)
    self.assertEqual(got["flops"], 4 * 2 * 8 * 256 * 128)
    self.assertEqual(got["bytes_accessed"], (2 * 2 * 256 * 2 * 128 + 2 * 2 * 8 * 128) * 2)
    self.assertEqual(got["transcendentals"], 2 * 8 * 256)


if __name__ == "__main__":
  absltest.main()
