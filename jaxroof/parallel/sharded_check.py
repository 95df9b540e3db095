"""Checks the sharded toy against the single-device toy and the symbolic count.

`check(tps)` runs in a fresh process whose host devices were set before jax
started (XLA's `xla_force_host_platform_device_count` in `XLA_FLAGS`), as
`tests/test_parallel_sharded.py` does:

  python -c "from jaxroof.parallel import sharded_check; sharded_check.main([1, 2, 4])"

For each tp: the largest |logit difference| from the unsharded toy
(float64) for prefill and one decode step, and the collectives of each
compiled program (kind, bytes) beside the count and bytes that
`jaxroof.symbolic.collectives` gives.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from jaxroof.parallel import sharded_toy
from jaxroof.symbolic import collectives
from jaxroof.symbolic.symbols import BY_NAME
from jaxroof.toy import model as toy_model
from jaxroof.toy.config import ToyConfig
from jaxroof.toy.weights import init_params

CONFIG = ToyConfig(vocab_size=64, num_blocks=2, num_heads=8, num_kv_heads=4, head_dim=8, width=32,
                   mlp_dim=64)
BATCH, PROMPT = 2, 5


def _expected(rows: int, tp: int) -> dict:
  """The symbolic collectives of one pass over `rows` rows on tp chips (float64).

  At tp = 1 XLA keeps the one-device collectives in the program; the
  symbolic time of each is zero there ((n - 1) factors).
  """
  values = {"D": CONFIG.width, "V": CONFIG.vocab_size, "a_act": 8, "n_blk": CONFIG.num_blocks}
  s = {BY_NAME[n].symbol: v for n, v in values.items()}
  return {
      "all-reduce": {
          "count": int(collectives.tp_allreduces_per_pass().subs(s)),
          "bytes": int(collectives.tp_allreduce_bytes(rows).subs(s))
      }, "all-gather": {"count": 1, "bytes": int(collectives.logits_gather_bytes(rows).subs(s))},
      "time_is_zero": tp == 1
  }


def check(tps: list[int]) -> dict:
  """The sharded toy at each tensor-parallel degree in `tps` (<= the host devices)."""
  jax.config.update("jax_enable_x64", True)
  params = init_params(CONFIG, jax.random.key(0), jnp.float64)
  ids = jax.random.randint(jax.random.key(1), (BATCH, PROMPT), 0, CONFIG.vocab_size)
  token = jax.random.randint(jax.random.key(2), (BATCH,), 0, CONFIG.vocab_size)
  ref_prefill, state = toy_model.prefill(params, ids)
  ref_decode, _ = toy_model.decode_step(params, state, token)
  results = {}
  for tp in tps:
    mesh = sharded_toy.make_mesh(jax.devices()[:tp])
    weights = sharded_toy.shard_weights(params, mesh)
    prefill = sharded_toy.prefill_fn(params, mesh)
    decode = sharded_toy.decode_fn(params, mesh, PROMPT)
    prefill = prefill.lower(weights, ids).compile()
    logits, k, v = prefill(weights, ids)
    decode = decode.lower(weights, token, k, v).compile()
    step = decode(weights, token, k, v)
    programs = {"prefill": prefill.as_text(), "decode": decode.as_text()}
    results[str(tp)] = {
        "prefill_max_abs_diff": float(jnp.max(jnp.abs(logits - ref_prefill))),
        "decode_max_abs_diff": float(jnp.max(jnp.abs(step - ref_decode))),
        "dtype": str(logits.dtype),
        "collectives": {name: sharded_toy.collectives(text) for name, text in programs.items()},
        "expected": {"prefill": _expected(BATCH * PROMPT, tp), "decode": _expected(BATCH, tp)},
    }
  return {"devices": len(jax.devices()), "platform": jax.devices()[0].platform, "results": results}


def main(tps: Sequence[int] = (1, 2, 4)) -> None:
  """Prints `check(tps)` as one JSON object (for the process that runs it)."""
  print(json.dumps(check(list(tps))))
