"""MoE routing and traffic: expected distinct experts and the weights a step reads.

The closed form E*(1 - (1 - k/E)**B) is checked at its limits and against a
seeded simulation of uniform top-k routing (the assumption it states).
"""

import numpy as np
import pytest
import sympy as sp

from jaxroof.symbolic import architecture as af
from jaxroof.specs import parameters as params
from jaxroof.specs.models import load_model
from jaxroof.symbolic.symbols import B
from jaxroof.specs.parameters import parameter_counts

EXPERTS = af.numpy_function(af.expected_distinct_experts)


def test_one_token_touches_exactly_k_experts():
  assert sp.simplify(af.expected_distinct_experts(1) - af.K) == 0
  assert af.expected_distinct_experts(1, 256, 8) == 8


def test_many_tokens_touch_every_expert():
  assert sp.limit(af.expected_distinct_experts(B, 256, 8), B, sp.oo) == 256
  assert EXPERTS(np.array([10_000.0]), 8, 2)[0] == pytest.approx(8)


def test_expected_experts_rise_with_batch_and_stay_bounded():
  batch = np.arange(1, 200, dtype=float)
  touched = EXPERTS(batch, 64, 4)
  assert np.all(np.diff(touched) > 0)
  assert np.all(touched <= np.minimum(64, 4 * batch) + 1e-9)


@pytest.mark.parametrize("tokens, experts, top_k", [(4, 8, 2), (16, 8, 2), (32, 128, 8)])
def test_formula_matches_simulated_uniform_routing(tokens, experts, top_k):
  rng = np.random.default_rng(0)
  trials = 2000
  scores = rng.random((trials, tokens, experts), dtype=np.float32)
  chosen = np.argsort(scores, axis=-1)[..., :top_k]  # k distinct experts per token.
  hit = np.zeros((trials, experts), dtype=bool)
  np.put_along_axis(hit, chosen.reshape(trials, -1), True, axis=1)
  simulated = hit.sum(axis=1).mean()
  assert EXPERTS(np.array([float(tokens)]), experts, top_k)[0] == pytest.approx(simulated, rel=0.01)


def test_mixtral_weights_read_rise_from_active_towards_total():
  counts = parameter_counts(load_model("mixtral-8x7b"))
  batch = np.array([1.0, 2, 8, 64, 100_000])
  read = params.weights_read_per_step(counts, batch)
  assert np.all(np.diff(read) > 0)
  expert = 3 * 4096 * 14336  # From the config: hidden 4096, expert width 14336.
  rows = batch * 4096  # Embedding rows looked up, one per sequence.
  assert read[0] == pytest.approx(counts.read_every_step + 32 * 2 * expert + rows[0])
  assert read[0] - rows[0] == pytest.approx(counts.active_matmul)
  assert read[-1] - rows[-1] == pytest.approx(counts.total - counts.embeddings)
  expected_b2 = counts.read_every_step + 32 * expert * 8 * (1 - (1 - 2 / 8)**2)
  assert read[1] == pytest.approx(expected_b2 + rows[1])


def test_moe_weight_traffic_formula_is_built_on_weight_traffic():
  closed = af.moe_weight_traffic()
  by_hand = af.q * (af.N_fixed + af.L_moe * af.N_exp * af.E * (1 - (1 - af.K / af.E)**B))
  assert sp.simplify(closed - by_hand) == 0


def test_dense_weights_read_do_not_depend_on_batch_but_for_embedding_rows():
  counts = parameter_counts(load_model("llama-3-8b"))
  read = params.weights_read_per_step(counts, np.array([1.0, 1000.0]))
  assert read[1] - read[0] == 999 * 4096


def test_deepseek_reads_shared_experts_and_dense_blocks_every_step():
  counts = parameter_counts(load_model("deepseek-v3"))
  assert counts.experts_shared == 58 * 3 * 7168 * 2048
  assert counts.read_every_step > counts.experts_shared + counts.attention + counts.mlp
  one = params.weights_read_per_step(counts, np.array([1.0]))[0]
  assert one - 7168 == pytest.approx(counts.active_matmul)
