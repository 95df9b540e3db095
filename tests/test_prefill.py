"""Prefill with causal attention: the toy's traced FLOPs, solved lengths, chunking, kinds."""

from __future__ import annotations

import types

import numpy as np
import pytest
import sympy as sp

from jaxroof.symbolic import formulas
from jaxroof.symbolic import prefill
from jaxroof.symbolic.symbols import A_f, B, BW, C_chunk, F, N, N_act, P, R, k, q, t, x_over


@pytest.mark.parametrize("batch,prompt", [(1, 3), (2, 5)])
def test_toy_traced_prefill_flops_equal_symbolic(batch, prompt):
  """Matmul FLOPs of the toy's traced prefill (jaxpr, as check-yourself 5 counts decode)
  are the symbolic linear FLOPs plus the masked attention the toy executes; the
  causal (useful) count is the lower triangle of that square."""
  import jax
  import jax.numpy as jnp

  from jaxroof import toy
  from jaxroof.toy import flops

  config = toy.LESSON
  params = toy.init_params(config, jax.random.key(0), jnp.float32)
  ids = jnp.asarray(np.arange(batch * prompt).reshape(batch, prompt) % config.vocab_size)
  traced = flops.dot_flops(lambda p, i: toy.prefill(p, i)[0], params, ids)
  pair = config.num_blocks * prefill.full_attention_pair_flops(config.num_heads, config.head_dim)
  weights = flops.matmul_weights(params)
  linear = prefill.linear_flops(prompt, batch, weights)
  executed = prefill.masked_attention_flops(prompt, prompt, batch, pair)
  assert traced == int(linear + executed)
  causal = prefill.attention_flops(prompt, batch, pair)
  # The convention of the issue: 2*L*H*d*P*(P+1) per sequence.
  assert causal == batch * 2 * config.num_blocks * config.num_heads * config.head_dim \
      * prompt * (prompt + 1)
  assert causal * 2 * prompt == executed * (prompt + 1)


@pytest.mark.parametrize("prompt,window", [(1, 4), (7, 4), (4, 4), (50, 8), (9, 1)])
def test_attended_pairs_match_a_brute_force_mask(prompt, window):
  rows = np.arange(prompt)[:, None]
  cols = np.arange(prompt)[None, :]
  causal = cols <= rows
  assert prefill.attended_pairs(prompt) == causal.sum()
  assert prefill.attended_pairs(prompt, window) == (causal & (rows - cols < window)).sum()


def test_compute_bound_prompt_linear_is_ridge_times_q_over_2():
  assert sp.simplify(prefill.compute_bound_prompt_linear() - R * q / 2) == 0


def test_compute_bound_prompt_with_attention_balances_memory_and_compute():
  values = {N: 8e9, N_act: 8e9, q: 2, k: 131072, A_f: 4 * 32 * 32 * 128, R: 300, BW: 2e12}
  length = float(prefill.compute_bound_prompt_with_attention().subs(values))
  memory = float(prefill.memory_time(length, 1, N, q, k, BW).subs(values))
  compute = float(prefill.compute_time(length, 1, N_act, A_f, R * BW).subs(values))
  assert memory == pytest.approx(compute, rel=1e-12)
  # Attention FLOPs and K/V writes both push it; the FLOPs win: below the linear-only point.
  assert length < float(prefill.compute_bound_prompt_linear().subs(values))


def test_attention_overtakes_linear_at_n_over_lhd_minus_one():
  layers, heads, dim, weights = 32, 32, 128, 7e9
  pair = 4 * layers * heads * dim
  length = float(prefill.attention_overtakes_linear_prompt().subs({N_act: weights, A_f: pair}))
  assert length == pytest.approx(weights / (layers * heads * dim) - 1)
  assert float(prefill.attention_flops(length, 1, pair)) == pytest.approx(
      float(prefill.linear_flops(length, 1, weights)))


def test_chunked_totals_equal_the_sum_over_chunks():
  values = {
      P: 4096, C_chunk: 512, B: 2, N: 8e9, N_act: 8e9, q: 2, k: 131072, A_f: 4 * 32 * 32 * 128,
      BW: 2e12, F: 6e14
  }
  chunks = 4096 // 512
  memory = sum(float(prefill.chunk_memory_time(i).subs(values)) for i in range(1, chunks + 1))
  compute = sum(float(prefill.chunk_compute_time(i).subs(values)) for i in range(1, chunks + 1))
  assert float(prefill.chunked_memory_time().subs(values)) == pytest.approx(memory, rel=1e-12)
  assert float(prefill.chunked_compute_time().subs(values)) == pytest.approx(compute, rel=1e-12)
  # Chunking does not change the FLOPs: the chunks' attention adds up to one pass.
  assert compute == pytest.approx(float(prefill.compute_time().subs(values)), rel=1e-12)
  # One chunk is one pass.
  one = {**values, C_chunk: 4096}
  assert float(prefill.chunked_time().subs(one)) == pytest.approx(float(prefill.floor().subs(one)),
                                                                  rel=1e-12)


def test_smallest_chunk_costs_exactly_the_overhead():
  values = {
      P: 8192, B: 1, N: 8e9, N_act: 8e9, q: 2, k: 131072, A_f: 4 * 32 * 32 * 128, BW: 2e12, F: 6e14
  }
  one_pass = float(prefill.floor().subs(values))
  chunk = float(prefill.smallest_chunk_for_overhead().subs({**values, x_over: 0.1, t: one_pass}))
  at = float(prefill.chunked_time().subs({**values, C_chunk: chunk}))
  assert at == pytest.approx(1.1 * one_pass, rel=1e-9)
  smaller = float(prefill.chunked_time().subs({**values, C_chunk: chunk / 2}))
  assert smaller > 1.1 * one_pass


def _spec(kinds, **parts):
  return types.SimpleNamespace(layer_kinds=tuple(kinds), **parts)


def test_attention_terms_per_layer_kind():
  attention = types.SimpleNamespace(num_heads=8, head_dim=64, sliding_window=16)
  mla = types.SimpleNamespace(num_heads=4, kv_lora_rank=32, qk_rope_head_dim=8)
  spec = _spec(["full", "sliding", "sliding", "recurrent", "mla"], attention=attention, mla=mla)
  terms = {t.kind: t for t in prefill.attention_terms(spec)}
  assert set(terms) == {"full", "sliding", "mla"}  # Recurrent: no quadratic term.
  assert terms["full"].pair_flops == 4 * 8 * 64
  assert terms["sliding"].pair_flops == 2 * 4 * 8 * 64 and terms["sliding"].window == 16
  assert terms["mla"].pair_flops == 2 * 4 * (2 * 32 + 8)
  length = 100
  expected = (4 * 8 * 64 * length * (length + 1) / 2 + 2 * 4 * 8 * 64 *
              (16 * 17 / 2 + (length - 16) * 16) + 2 * 4 * (2 * 32 + 8) * length * (length + 1) / 2)
  assert prefill.attention_flops_of(tuple(terms.values()), length) == pytest.approx(expected)


def test_unknown_layer_kind_raises_naming_it():
  with pytest.raises(ValueError, match="hyena"):
    prefill.attention_terms(
        _spec(["full", "hyena"], attention=types.SimpleNamespace(num_heads=1, head_dim=2)))


def test_real_model_matches_the_full_attention_convention():
  from jaxroof.specs.models import load_model

  spec = load_model("llama-2-7b")
  (term,) = prefill.attention_terms(spec)
  a = spec.attention
  assert prefill.attention_flops_of((term,), 1024) == 2 * spec.num_layers * a.num_heads \
      * a.head_dim * 1024 * 1025
  assert int(formulas.attention_flops(1, 1, a.num_heads, a.head_dim)) * spec.num_layers \
      == term.pair_flops


def test_chunked_attention_and_state_kinds():
  attention = types.SimpleNamespace(num_heads=2, head_dim=4, chunk_size=8, sliding_window=None)
  spec = _spec(["chunked", "mamba2", "linear_attention", "mlp_only"], attention=attention)
  (term,) = prefill.attention_terms(spec)
  assert term.kind == "chunked" and term.chunk == 8
  rows, cols = np.arange(20)[:, None], np.arange(20)[None, :]
  pairs = ((cols <= rows) & (rows // 8 == cols // 8)).sum()  # Brute force: same chunk.
  assert prefill.attention_flops_of((term,), 20) == pytest.approx(4 * 2 * 4 * pairs)


def _hand_pair_flops(spec, kind: str) -> int:
  """FLOPs per (query, key) pair of one block of `kind`, counted by hand: QK^T and PV
  each a multiply and an add per head and coordinate (MLA: in its latent space)."""
  if kind == "mla":
    m = spec.mla
    return 2 * m.num_heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim)
  return 2 * 2 * spec.attention.num_heads * spec.attention.head_dim


def test_every_shipped_model_has_prefill_terms():
  """Each shipped model's terms count every block with a quadratic mixer once, at the hand
  count per pair, with its window or chunk; state and MLP-only blocks add nothing."""
  from jaxroof.specs.models import load_model, shipped_models

  no_quadratic = {"recurrent", "mamba2", "linear_attention", "mlp_only"}
  seen = set()
  for name in shipped_models():
    spec = load_model(name)
    terms = prefill.attention_terms(spec)
    kinds = list(spec.layer_kinds)
    assert {t.kind: t.layers for t in terms
           } == {kind: kinds.count(kind) for kind in kinds if kind not in no_quadratic}, name
    for term in terms:
      seen.add(term.kind)
      assert term.pair_flops == term.layers * _hand_pair_flops(spec, term.kind), name
      assert term.window == (spec.attention.sliding_window
                             if term.kind == "sliding" else None), name
      assert term.chunk == (spec.attention.chunk_size if term.kind == "chunked" else None)
  assert seen == {"full", "sliding", "mla", "chunked"}  # Every quadratic kind is shipped.
