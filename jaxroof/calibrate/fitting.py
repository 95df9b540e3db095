"""Fitting the calibrated step model's factors to measured step times (optax).

The model is the cost model's calibrated decode step (`jaxroof.symbolic.calibrated`);
here its JAX form is fitted in log space with Adam, and predictions are scored against
measurements. A term beyond the six factors in the start (an engine's, e.g. XLA:CPU's
`r_pack`) brings its engine's extension into the model and may be fitted too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxroof import engines  # noqa: F401  (registers the engines' terms a fit may hold)
from jaxroof.symbolic.calibrated import (FACTOR_NAMES, INPUT_NAMES, decode_model, extensions_of)

PRIOR_WEIGHT = 1e-4  # `fit_factors`' pull of each log factor towards its start.


@dataclasses.dataclass(frozen=True)
class Fit:
  """Fitted factors and how well they reproduce the training points."""

  factors: dict[str, float]
  loss: float  # Final mean squared log error (plus the weak prior).
  steps: int
  learning_rate: float


def initial_factors(measured_s: np.ndarray, layers: np.ndarray) -> dict[str, float]:
  """A neutral start: half of each ceiling, small fixed costs, p = 2."""
  fastest = float(np.min(measured_s))
  return {
      "eta_w": 0.5, "eta_kv": 0.5, "eta_f": 0.5, "t0_step": 0.05 * fastest,
      "t0_layer": 0.05 * fastest / float(np.max(layers)), "r_ovl": 1.0
  }


def fit_factors(
    inputs: Mapping[str, np.ndarray],
    measured_s: np.ndarray,
    *,
    init: Mapping[str, float] | None = None,
    steps: int = 3000,
    learning_rate: float = 0.05,
    prior_weight: float = PRIOR_WEIGHT,
    free: Sequence[str] | None = None,
) -> Fit:
  """Fits the factors to measured step times with optax (Adam).

  The parameters are the factors' logarithms (so they stay positive) and the
  loss is the mean squared difference of log predicted and log measured
  time, plus a weak pull (`prior_weight`) of each log factor towards its
  start, which only decides directions the data leave undetermined.

  Args:
    inputs: `INPUT_NAMES` -> arrays of one value per point.
    measured_s: measured step time per point, seconds.
    init: starting factors; None means `initial_factors`.
    steps, learning_rate: Adam's schedule (full batch).
    prior_weight: weight of the pull towards the start.
    free: the factors to fit (None: all); the others stay at `init`. The
      operation fits use it: a linear layer's timings decide `eta_w`, `eta_f`
      and `r_ovl`, attention's `eta_kv`, the smallest steps the fixed costs.
      A term beyond the six in `init` (e.g. `r_pack`) brings its engine's
      extension (`jaxroof.engines.xla_cpu`) and may be free.

  Returns:
    The fitted factors (and every other term `init` has).
  """

  measured_s = np.asarray(measured_s, dtype=np.float64)
  if measured_s.ndim != 1 or measured_s.size == 0 or np.any(measured_s <= 0):
    raise ValueError("measured_s must be a non-empty vector of times > 0")
  if init is None:
    init = initial_factors(measured_s, np.asarray(inputs["L"]))
  extra = tuple(n for n in init if n not in FACTOR_NAMES)
  model = decode_model("jax", extensions_of(extra))
  every = FACTOR_NAMES + extra
  x = {n: jnp.asarray(inputs[n], jnp.float32) for n in INPUT_NAMES}
  log_measured = jnp.log(jnp.asarray(measured_s, jnp.float32))
  names = FACTOR_NAMES if free is None else tuple(free)
  unknown = sorted(set(names) - set(every))
  if unknown or not names:
    raise ValueError(f"free={free!r}: give some of {every}")
  start = {n: jnp.log(jnp.float32(init[n])) for n in names}
  fixed = {n: jnp.float32(init[n]) for n in every if n not in names}

  def loss_fn(log_factors):
    factors = {**fixed, **{n: jnp.exp(v) for n, v in log_factors.items()}}
    predicted = model(**x, **factors)["step_s"]
    data = jnp.mean((jnp.log(predicted) - log_measured)**2)
    prior = sum((log_factors[n] - start[n])**2 for n in names)
    return data + prior_weight * prior

  params, loss = minimize(loss_fn, start, steps=steps, learning_rate=learning_rate)
  fitted = {n: float(jnp.exp(params[n])) if n in params else float(init[n]) for n in every}
  return Fit(factors=fitted, loss=float(loss), steps=steps, learning_rate=learning_rate)


def minimize(loss_fn: Callable[[Any], jax.Array], start: Any, *, steps: int,
             learning_rate: float) -> tuple[Any, jax.Array]:
  """Full-batch Adam (optax) for `steps` steps, run as one jitted `lax.scan`.

  Returns the final parameters (a pytree like `start`) and the last loss.
  """
  optimizer = optax.adam(learning_rate)

  def step(carry, _):
    params, state = carry
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, state = optimizer.update(grads, state, params)
    return (optax.apply_updates(params, updates), state), loss

  @jax.jit
  def run(params):
    (params, _), losses = jax.lax.scan(step, (params, optimizer.init(params)), None, length=steps)
    return params, losses[-1]

  return run(start)


def predict(inputs: Mapping[str, Any], factors: Mapping[str, float]) -> np.ndarray:
  """Calibrated step time (seconds) at each point, numpy; a term beyond the six among
  the factors (e.g. `r_pack`) with its engine's extension."""
  extra = tuple(n for n in factors if n not in FACTOR_NAMES)
  return np.asarray(
      decode_model("numpy", extensions_of(extra))(**inputs, **factors)["step_s"], dtype=np.float64)


def relative_errors(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
  """|predicted - measured| / measured, per point."""
  measured = np.asarray(measured, dtype=np.float64)
  return np.abs(np.asarray(predicted, dtype=np.float64) - measured) / measured


def error_summary(rel: Sequence[float]) -> dict[str, float | int | None]:
  """Median and max relative error (None without points)."""
  rel = np.asarray(rel, dtype=np.float64)
  if rel.size == 0:
    return {"median_rel_error": None, "max_rel_error": None, "points": 0}
  return {
      "median_rel_error": float(np.median(rel)), "max_rel_error": float(np.max(rel)),
      "points": int(rel.size)
  }


def log_slopes(inputs: Mapping[str, Any], factors: Mapping[str, float], names: Sequence[str], *,
               step: float = 1e-4) -> np.ndarray:
  """d log(predicted step time) / d log(factor) at each point (points x names),
  by central differences of `predict` in float64."""
  columns = []
  for name in names:
    up, down = dict(factors), dict(factors)
    up[name] = factors[name] * np.exp(step)
    down[name] = factors[name] * np.exp(-step)
    columns.append((np.log(predict(inputs, up)) - np.log(predict(inputs, down))) / (2 * step))
  return np.stack(columns, axis=1)


def sensitivity(slopes: np.ndarray, prior_weight: float = PRIOR_WEIGHT) -> np.ndarray:
  """How a least-squares fit in log space (`fit_factors`) moves its free factors
  when the measured times move: d log(factor) / d log(time), names x points.

  This is the Gauss-Newton linearisation at the optimum, (A'A/n + w I)^-1 A'/n
  with A the `log_slopes` over the n fitted points and w `fit_factors`' weak prior
  (it decides a factor the data barely determine, such as `r_ovl` near its start).
  It tells a factor that moved with its data from a fit that moved on its own: a
  row near 1/n is an average, a large entry amplifies that point's noise.
  """
  a = np.asarray(slopes, dtype=np.float64)
  n = a.shape[0]
  return np.linalg.solve(a.T @ a / n + prior_weight * np.eye(a.shape[1]), a.T / n)
