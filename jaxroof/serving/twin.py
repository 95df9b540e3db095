"""The simulated twin of the toy server: the iteration model fitted to the server itself.

The calibrated iteration (`jaxroof.symbolic.iteration.step_expression`) has
the calibrated step's six factors. Here they are fitted, in log space with
optax's Adam, to the wall times of the server's own iterations (their mix of
decodes, contexts and prefill tokens as inputs), measured on a calibration
run with its own seed, apart from the runs the twin then predicts. The
ceilings BW and F are nominal: the factors are fractions of them.
"""

from __future__ import annotations

import functools

import numpy as np

from jaxroof.serving import replica, toy_server
from jaxroof.symbolic import calibrated, formulas, iteration
from jaxroof.symbolic.evaluate import lambdified
from jaxroof.symbolic.step_model import StepModel
from jaxroof.toy import flops
from jaxroof.toy.weights import Params

NOMINAL_BW = 1e10  # B/s: the factors scale these nominal ceilings.
NOMINAL_F = 1e11  # FLOP/s.


def toy_model_values(params: Params) -> dict[str, float]:
  """The toy's iteration-model constants: matmul weights, K/V bytes per token, attention."""
  c = params.config
  b = float(params.embed.dtype.itemsize)
  weights = float(flops.matmul_weights(params))
  k = float(formulas.kv_bytes_per_position(c.num_blocks, c.num_kv_heads, c.head_dim, b))
  return {
      "N": weights, "q": b, "k": k, "BW": NOMINAL_BW, "F": NOMINAL_F, "N_act": weights,
      "L": float(c.num_blocks), "H": float(c.num_heads), "d": float(c.head_dim)
  }


@functools.cache
def _jax_step():
  return lambdified({"step_s": iteration.step_expression("calibrated")},
                    iteration.INPUTS + calibrated.FACTORS, backend="jax")


def fit_iteration_factors(mix: dict[str, np.ndarray], measured_s: np.ndarray,
                          model_values: dict[str, float], *, steps: int = 2000,
                          learning_rate: float = 0.05) -> dict[str, float]:
  """Factors minimising the squared log error over the measured iterations.

  Iterations with and without prefill weigh equally in total, so the many
  decode-only iterations do not drown the prefill cost that sets TTFT.
  """
  import jax
  import jax.numpy as jnp
  import optax

  step = _jax_step()
  fixed = {n: jnp.asarray(model_values[n]) for n in iteration.MODEL_NAMES}
  inputs = {str(s): jnp.asarray(mix[str(s)], jnp.float32) for s in iteration.MIX}
  target = jnp.log(jnp.asarray(measured_s, jnp.float32))
  has_prefill = np.asarray(mix["n_pre"]) > 0
  weight = np.where(has_prefill, 1.0 / max(has_prefill.sum(), 1), 1.0 / max(
      (~has_prefill).sum(), 1))
  weight = jnp.asarray(weight / weight.sum(), jnp.float32)
  fastest = float(np.min(measured_s))
  init = {
      "eta_w": 0.5, "eta_kv": 0.5, "eta_f": 0.5, "t0_step": 0.5 * fastest,
      "t0_layer": 0.05 * fastest / model_values["L"], "r_ovl": 1.0
  }
  params = {n: jnp.log(jnp.asarray(v, jnp.float32)) for n, v in init.items()}

  def loss(log_factors):
    factors = {n: jnp.exp(v) for n, v in log_factors.items()}
    predicted = step(**inputs, **fixed, **factors)["step_s"]
    return jnp.sum(weight * (jnp.log(predicted) - target)**2)

  optimizer = optax.adam(learning_rate)
  state = optimizer.init(params)

  @jax.jit
  def update(params, state):
    value, grads = jax.value_and_grad(loss)(params)
    updates, state = optimizer.update(grads, state)
    return optax.apply_updates(params, updates), state, value

  for _ in range(steps):
    params, state, _ = update(params, state)
  return {n: float(np.exp(v)) for n, v in params.items()}


def twin_replica(params: Params, factors: dict[str, float], *, slots: int, max_len: int,
                 provenance: dict, costing: str = "tokens") -> replica.Replica:
  """The simulator replica of the toy server: `slots` rows of `max_len` positions.

  `costing` "tokens" costs each iteration by its logical tokens (the
  simulator's own rule); "computed" by what the fixed-shape server computes
  (all rows, padded prompts, every slot; `Replica.padded_to`).
  """
  values = toy_model_values(params)
  model = StepModel.calibrated(factors, provenance=provenance)
  return replica.from_numbers(
      N=values["N"], q=values["q"], k=values["k"], BW=values["BW"], F=values["F"],
      L=int(values["L"]), H=int(values["H"]), d=int(values["d"]),
      kv_memory_bytes=slots * max_len * values["k"], page_bytes=max_len * values["k"],
      page_tokens=max_len, step_model=model, max_running=slots, max_context=max_len,
      padded_to=toy_server.padded_prompt if costing == "computed" else None, description={
          "model": "toy", "fitted_to": "the toy server's own iterations", "costing": costing,
          **provenance
      })
