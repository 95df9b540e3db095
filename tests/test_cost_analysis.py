"""XLA's cost analysis next to the analytic counts."""

import dataclasses
import json

import jax.numpy as jnp
import pytest

from jaxroof.measure import calibration_models
from jaxroof.measure import cost_analysis
from jaxroof.measure import step_sweeps

TINY = dataclasses.replace(calibration_models.CALIBRATION, vocab_size=64, num_blocks=2, num_heads=4,
                           num_kv_heads=2, head_dim=8, width=32, mlp_dim=64)


def test_linear_counts_equal_xlas():
  row = cost_analysis.linear_cost(8, 256, 128, jnp.float32)
  assert row.analytic_flops == 2 * 8 * 256 * 128
  assert row.flops_ratio == pytest.approx(1.0, rel=0.01)
  # Weights once, x read, output written, 4 B each: what XLA counts too.
  assert row.analytic_bytes == (256 * 128 + 8 * 256 + 8 * 128) * 4
  assert row.bytes_ratio == pytest.approx(1.0, rel=0.01)


def test_attention_counts_are_close_to_ours():
  row = cost_analysis.attention_cost(2, 64, 4, 2, 8, jnp.float32)
  # K and V of every position and K/V head, plus the queries and outputs.
  assert row.analytic_bytes == (2 * 64 * 2 * 2 * 8 + 2 * 2 * 4 * 8) * 4
  # Ours counts q.k and p.v; XLA adds the softmax (a few FLOPs per score,
  # much against 4*head_dim = 32 here).
  assert 1.0 <= row.flops_ratio < 2.0
  assert row.bytes_ratio >= 1.0
  assert json.loads(json.dumps(row.to_json()))["op"] == "decode_attention"


def test_decode_step_compares_like_with_like():
  bench = step_sweeps.DecodeStepBench(TINY, jnp.float32, param_sets=1)
  row = cost_analysis.decode_step_cost(bench, 2, 16)
  assert row.op == "decode_step" and row.flops_ratio > 0
  if "one block" in row.counts:  # A loop over blocks is counted once.
    assert row.analytic_flops == pytest.approx(2 * 2 * (bench.inputs.N - bench.inputs.N_block))
  cells = cost_analysis.table_rows([row])
  assert len(cells[0]) == len(cost_analysis.HEADERS)


def test_cost_of_accepts_both_result_forms():

  class Old:

    def cost_analysis(self):
      return [{"flops": 3.0, "bytes accessed": 5.0}]

  class Empty:

    def cost_analysis(self):
      return None

  assert cost_analysis.cost_of(Old()) == {"flops": 3.0, "bytes_accessed": 5.0}
  assert cost_analysis.cost_of(Empty()) == {"flops": None, "bytes_accessed": None}
