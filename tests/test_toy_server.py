"""The toy server: greedy outputs equal `generate` per request whatever the batch
mixing; per-row lengths leave other rows alone; bad input is one line."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxroof.errors import InputError
from jaxroof.serving import arrivals, metrics, toy_server
from jaxroof.toy import generate, init_params, rows
from jaxroof.toy.config import ToyConfig

TINY = ToyConfig(vocab_size=64, num_blocks=2, num_heads=2, num_kv_heads=1, head_dim=8, width=16,
                 mlp_dim=32)


@pytest.fixture(scope="module")
def params():
  return init_params(TINY, jax.random.key(0), jnp.float32)


@pytest.fixture(scope="module")
def server(params):
  return toy_server.ToyServer(params, slots=3, max_len=32, prompt_lengths=np.array([5, 12]))


_GENERATED: dict[tuple, list[int]] = {}


def _generate(params, prompt: tuple[int, ...], steps: int) -> list[int]:
  if (prompt, steps) not in _GENERATED:
    ids = jnp.asarray(prompt, jnp.int32)[None]
    _GENERATED[prompt, steps] = np.asarray(generate(params, ids, steps))[0].tolist()
  return _GENERATED[prompt, steps]


@pytest.mark.parametrize("rate", [1e6, pytest.param(40.0, marks=pytest.mark.slow)])
def test_outputs_equal_generate_per_request(params, server, rate):
  # Two prompt and two output lengths keep `generate`'s compilations few; the
  # arrivals interleave them over 3 rows, so rows hold different lengths.
  n = 6
  w = arrivals.synthetic(arrival="poisson", num_requests=n, arrival_rate=rate, seed=1,
                         prompt_tokens=8, output_tokens=5)
  w = arrivals.Workload(w.arrival_s, np.array([5, 9] * (n // 2)), np.array([4, 4, 6, 6, 4, 6]), {})
  prompts = toy_server.prompts_for(w, TINY.vocab_size, seed=2)
  prompts[2] = prompts[0]  # The same prompt in other company gives the same output.
  served = server.serve(w, prompts)
  for prompt, out, steps in zip(prompts, served.outputs, w.output_tokens):
    assert out == _generate(params, tuple(prompt.tolist()), int(steps))
  m = metrics.serving_metrics(served.arrival_s, served.first_token_s, served.finish_s,
                              served.output_tokens, served.itl_s)
  assert m["completed"] == n
  assert len(served.itl_s) == int(np.sum(w.output_tokens - 1))
  assert np.all(served.first_token_s >= served.arrival_s)
  if rate > 1e5:  # All at once with 3 rows: rows were reused and mixed.
    assert served.mix["n_dec"].max() == 3 and np.any(served.mix["n_pre"] > 0)


def test_prefill_row_leaves_other_rows_alone(params):
  cache = rows.init_rows(TINY, 2, 16, jnp.float32)
  ids = jnp.arange(1, 17, dtype=jnp.int32)[None]
  _, cache = rows.prefill_row(params, cache, jnp.int32(0), ids, jnp.int32(7))
  before = cache.k[:, 0]
  _, cache = rows.prefill_row(params, cache, jnp.int32(1), ids, jnp.int32(3))
  np.testing.assert_array_equal(cache.k[:, 0], before)
  np.testing.assert_array_equal(cache.lengths, [7, 3])


def test_request_longer_than_rows_is_one_line(server):
  w = arrivals.Workload(np.array([0.0]), np.array([30]), np.array([10]), {})
  with pytest.raises(InputError, match="max_len"):
    server.serve(w, [np.zeros(30, np.int32)])
