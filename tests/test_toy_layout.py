"""The toy's storage layout: what the compiled decode step does with it.

Properties of the compiled HLO and of the state, no timings: a donated
decode step updates every K/V buffer in place (each is aliased to an output,
nothing cache-sized is copied) and multiplies by the weights where they lie
(no slice of a weight or of the cache is materialised). The head-major
layout holds the same K/V as the (l, b, slots, k, e) view of a fresh
prefill (float64).
"""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxroof import toy
from jaxroof.toy import cache as cache_lib
from jaxroof.toy import weights

CONFIG = dataclasses.replace(toy.CPU_BENCH, num_blocks=3, vocab_size=64)


def _compiled_step_hlo(config: toy.ToyConfig, batch: int, slots: int) -> str:
  params = jax.eval_shape(lambda: toy.init_params(config, jax.random.key(0)))
  state = jax.eval_shape(lambda: toy.init_cache(config, batch, slots, jnp.float32))
  token = jax.ShapeDtypeStruct((batch,), jnp.int32)
  step = jax.jit(toy.decode_step, donate_argnums=1)
  return step.lower(params, state, token).compile().as_text()


def _entry(hlo: str) -> str:
  return hlo[hlo.index("ENTRY"):]


@pytest.mark.parametrize("batch", [1, 3])
def test_donated_decode_step_updates_every_kv_buffer_in_place(batch):
  hlo = _compiled_step_hlo(CONFIG, batch, slots=40)
  header = hlo.splitlines()[0]
  aliased = re.findall(r"\{(\d+)\}: \((\d+), \{\}, may-alias\)", header)
  # Outputs 1 .. 2L are the K and V buffers; each reuses a donated input.
  buffers = 2 * CONFIG.num_blocks
  assert {int(out) for out, _ in aliased} >= set(range(1, buffers + 1))
  cache_shape = f"f32[{batch * CONFIG.num_kv_heads},40,{CONFIG.head_dim}]"
  copies = [
      line for line in _entry(hlo).splitlines()
      if " copy(" in line and cache_shape in line.split("=")[1].split(" ")[1]
  ]
  assert not copies, copies[:3]


def test_decode_step_reads_weights_and_cache_where_they_lie():
  hlo = _entry(_compiled_step_hlo(CONFIG, batch=2, slots=40))
  # A weight or a block's cache taken out of a larger array would show as a
  # (dynamic-)slice or a transpose in the entry computation.
  assert "dynamic-slice" not in hlo
  assert " slice(" not in hlo
  assert " transpose(" not in hlo


def test_head_major_blocks_round_trip():
  x = jax.random.normal(jax.random.key(0), (3, 2, 5, 4, 6))  # (l, b, s, k, e)
  blocks = cache_lib.to_blocks(x)
  assert len(blocks) == 3 and blocks[0].shape == (2 * 4, 5, 6)
  # Row i * k + j is sequence i's head j.
  np.testing.assert_array_equal(blocks[1][1 * 4 + 2], x[1, 1, :, 2])
  np.testing.assert_array_equal(cache_lib.from_blocks(blocks, batch=2), x)


def test_decoded_state_holds_what_a_fresh_prefill_computes():
  config = dataclasses.replace(toy.LESSON, num_blocks=3, num_heads=4, width=8)
  with jax.enable_x64(True):
    params = toy.init_params(config, jax.random.key(1), jnp.float64)
    ids = jnp.asarray([[1, 4, 6, 2, 5], [3, 3, 0, 7, 1]])
    state = toy.init_cache(config, 2, 6, jnp.float64)
    _, state = toy.prefill(params, ids[:, :3], state)
    for i in (3, 4):
      _, state = jax.jit(toy.decode_step, donate_argnums=1)(params, state, ids[:, i])
    _, fresh = toy.prefill(params, ids)  # A growing state of all five.
    assert int(state.length) == 5 and fresh.length == 5
    np.testing.assert_allclose(state.k[:, :, :5], fresh.k, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(state.v[:, :, :5], fresh.v, rtol=1e-12, atol=1e-12)
    assert not np.any(np.asarray(state.k[:, :, 5:]))  # The free slot stays empty.


def test_stacked_blocks_keep_every_blocks_weights():
  params = toy.init_params(CONFIG, jax.random.key(0))
  stacked = weights.stacked_blocks(params)
  assert stacked.wq.shape == (CONFIG.num_blocks,) + params.blocks[0].wq.shape
  np.testing.assert_array_equal(stacked.w_down[2], params.blocks[2].w_down)
