"""The calibrated step model: the symbolic floor with fitted factors and costs.

The analytic floor of `jaxroof.symbolic.formulas` assumes every byte moves at the
device's bandwidth and every FLOP at its peak, with nothing else to pay. The
calibrated model keeps its terms and adds what a device and an
implementation actually achieve, as named sympy symbols:

  weight_s  = N*q / (eta_w*BW)        weights streamed at a fraction of BW
  kv_s      = B*T*k / (eta_kv*BW)     K/V read (and, by the implementation,
                                      copied) at another fraction of BW
  compute_s = 2*N_act*B / (eta_f*F)   linear FLOPs at a fraction of F
  linear_s  = (weight_s**p + compute_s**p)**(1/p),  p = 1 + r_ovl
  step_s    = t0_step + L*t0_layer + linear_s + kv_s

Ops run one after another. The linear layers take their weight reads and
their FLOPs combined by a p-norm: a kernel that overlaps them perfectly takes
the larger (the roofline's Max, r_ovl -> oo), one that does not takes the sum
(r_ovl -> 0); the fit says which the device does. Attention's K/V reads come
on top, as do a fixed cost per step (dispatch) and one per layer (launches).
The expression is lambdified once to JAX, and optax fits the logarithms of
the six factors to the logarithm of measured step times, so a 10% error
weighs the same at 1 ms and at 1 s.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import sympy as sp

from jaxroof.symbolic import formulas
from jaxroof.symbolic.symbols import (B, BW, F, FACTOR_QUANTITIES, L, N, N_act, T, eta_f,
                                      eta_kv, eta_w, k, q, r_ovl, t0_layer, t0_step)


FACTORS: tuple[sp.Symbol, ...] = (eta_w, eta_kv, eta_f, t0_step, t0_layer,
                                  r_ovl)
FACTOR_NAMES: tuple[str, ...] = tuple(str(s) for s in FACTORS)
FACTOR_UNITS: dict[str, str] = {str(x.symbol): x.unit
                                for x in FACTOR_QUANTITIES}
INPUTS: tuple[sp.Symbol, ...] = (B, T, N, q, k, BW, F, N_act, L)
INPUT_NAMES: tuple[str, ...] = tuple(str(s) for s in INPUTS)

ASSUMPTIONS: tuple[str, ...] = (
    "ops run one after another: linear layers combine weight reads and "
    "FLOPs by the fitted overlap, attention's K/V time comes on top",
    "efficiency factors and fixed costs fitted to measured decode steps "
    "(see the profile); attention FLOPs, activations and K/V copies are "
    "absorbed by the factor of the term they scale with",
)


def _overlap(a: sp.Expr, b: sp.Expr) -> sp.Expr:
  """The p-norm of a and b, p = 1 + r_ovl, written so no power underflows."""
  larger = sp.Max(a, b)
  p = 1 + r_ovl
  return larger * ((a / larger) ** p + (b / larger) ** p) ** (1 / p)


def _terms() -> dict[str, sp.Expr]:
  """The calibrated step's named expressions, built from `formulas`."""
  weight_s = formulas.memory_time(formulas.weight_traffic(N, q), eta_w * BW)
  kv_s = formulas.memory_time(formulas.retained_kv_bytes(B, T, k),
                              eta_kv * BW)
  compute_s = formulas.compute_time(B, N_act, eta_f * F)
  fixed_s = t0_step + L * t0_layer
  step_s = fixed_s + _overlap(weight_s, compute_s) + kv_s
  return {
      "weight_bytes": formulas.weight_traffic(N, q),
      "kv_bytes": formulas.retained_kv_bytes(B, T, k),
      "traffic_bytes": formulas.step_traffic(B, N, q, T, k),
      "weight_s": weight_s,
      "kv_s": kv_s,
      "fixed_s": fixed_s,
      "memory_s": weight_s + kv_s,
      "compute_s": compute_s,
      "linear_s": _overlap(weight_s, compute_s),
      "step_s": step_s,
      "aggregate_tokens_per_s": formulas.aggregate_rate(B, step_s),
      "per_sequence_tokens_per_s": formulas.per_sequence_rate(step_s),
  }


def calibrated_step() -> sp.Expr:
  """The calibrated step time as one sympy expression (seconds)."""
  return _terms()["step_s"]


def readable_step() -> str:
  """The calibrated step with the overlap written as a named p-norm."""
  t = _terms()
  pnorm = sp.Function("pnorm")(t["weight_s"], t["compute_s"])
  return f"{t['fixed_s'] + pnorm + t['kv_s']}, p = {1 + r_ovl}"


OUTPUT_NAMES: tuple[str, ...] = tuple(_terms())


@functools.cache
def calibrated_model(backend: Literal["numpy", "jax"] = "numpy"):
  """The calibrated terms as a vectorised function, lambdified once.

  Returns `f(inputs, factors) -> dict` where `inputs` maps `INPUT_NAMES` and
  `factors` maps `FACTOR_NAMES` to arrays that broadcast together. The JAX
  form is jit-compiled and differentiable in the factors.
  """
  if backend not in ("numpy", "jax"):
    raise ValueError(f"{backend=} is not allowed: use 'numpy' or 'jax'.")
  terms = _terms()
  fn = sp.lambdify(INPUTS + FACTORS, tuple(terms.values()), modules=backend,
                   cse=True)
  if backend == "jax":
    import jax  # Deferred: numpy evaluation should not pay for jax start-up.

    fn = jax.jit(fn)

  def evaluate(inputs: Mapping[str, Any], factors: Mapping[str, Any]):
    args = [inputs[n] for n in INPUT_NAMES] + [factors[n]
                                               for n in FACTOR_NAMES]
    return dict(zip(OUTPUT_NAMES, fn(*args)))

  return evaluate


SUMMARY_NAMES: tuple[str, ...] = (
    "weight_kv_crossover_batch",
    "memory_limit_tokens_per_s",
    "compute_crossover_batch",
    "rate_limit_tokens_per_s",
)


@functools.cache
def _summary_exprs() -> tuple[sp.Expr, ...]:
  """Calibrated crossovers and limits, solved from the calibrated terms."""
  t = _terms()
  [kv_cross] = sp.solve(sp.Eq(t["weight_s"], t["kv_s"]), B)
  memory_limit = sp.limit(B / t["memory_s"], B, sp.oo)
  [compute_cross] = sp.solve(sp.Eq(t["memory_s"], t["compute_s"]), B)
  # Past every crossover the linear layers are compute-bound.
  rate_limit = sp.limit(B / (t["fixed_s"] + t["compute_s"] + t["kv_s"]), B,
                        sp.oo)
  return tuple(sp.simplify(e) for e in (kv_cross, memory_limit,
                                        compute_cross, rate_limit))


@functools.cache
def calibrated_summary_model():
  """The solved summary as a numpy function of (inputs, factors)."""
  fn = sp.lambdify(INPUTS + FACTORS, _summary_exprs(), modules="numpy",
                   cse=True)

  def evaluate(inputs: Mapping[str, Any], factors: Mapping[str, Any]):
    args = [inputs.get(n, 1.0) for n in INPUT_NAMES] + [
        factors[n] for n in FACTOR_NAMES]
    return dict(zip(SUMMARY_NAMES, fn(*args)))

  return evaluate


# Fitting ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Fit:
  """Fitted factors and how well they reproduce the training points."""

  factors: dict[str, float]
  loss: float  # Final mean squared log error (plus the weak prior).
  steps: int
  learning_rate: float


def initial_factors(measured_s: np.ndarray, layers: np.ndarray
                    ) -> dict[str, float]:
  """A neutral start: half of each ceiling, small fixed costs, p = 2."""
  fastest = float(np.min(measured_s))
  return {"eta_w": 0.5, "eta_kv": 0.5, "eta_f": 0.5,
          "t0_step": 0.05 * fastest,
          "t0_layer": 0.05 * fastest / float(np.max(layers)), "r_ovl": 1.0}


def fit_factors(
    inputs: Mapping[str, np.ndarray],
    measured_s: np.ndarray,
    *,
    init: Mapping[str, float] | None = None,
    steps: int = 3000,
    learning_rate: float = 0.05,
    prior_weight: float = 1e-4,
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

  Returns:
    The fitted factors.
  """
  import jax  # Deferred, as in `calibrated_model`.
  import jax.numpy as jnp
  import optax

  measured_s = np.asarray(measured_s, dtype=np.float64)
  if measured_s.ndim != 1 or measured_s.size == 0 or np.any(measured_s <= 0):
    raise ValueError("measured_s must be a non-empty vector of times > 0")
  if init is None:
    init = initial_factors(measured_s, np.asarray(inputs["L"]))
  model = calibrated_model("jax")
  x = {n: jnp.asarray(inputs[n], jnp.float32) for n in INPUT_NAMES}
  log_measured = jnp.log(jnp.asarray(measured_s, jnp.float32))
  start = {n: jnp.log(jnp.float32(init[n])) for n in FACTOR_NAMES}

  def loss_fn(log_factors):
    factors = {n: jnp.exp(v) for n, v in log_factors.items()}
    predicted = model(x, factors)["step_s"]
    data = jnp.mean((jnp.log(predicted) - log_measured) ** 2)
    prior = sum((log_factors[n] - start[n]) ** 2 for n in FACTOR_NAMES)
    return data + prior_weight * prior

  optimizer = optax.adam(learning_rate)

  def step(carry, _):
    params, state = carry
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, state = optimizer.update(grads, state, params)
    return (optax.apply_updates(params, updates), state), loss

  @jax.jit
  def run(params):
    (params, _), losses = jax.lax.scan(
        step, (params, optimizer.init(params)), None, length=steps)
    return params, losses[-1]

  params, loss = run(start)
  return Fit(factors={n: float(jnp.exp(v)) for n, v in params.items()},
             loss=float(loss), steps=steps, learning_rate=learning_rate)


def predict(inputs: Mapping[str, Any], factors: Mapping[str, float]
            ) -> np.ndarray:
  """Calibrated step time (seconds) at each point, numpy."""
  return np.asarray(calibrated_model("numpy")(inputs, factors)["step_s"],
                    dtype=np.float64)


def relative_errors(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
  """|predicted - measured| / measured, per point."""
  measured = np.asarray(measured, dtype=np.float64)
  return np.abs(np.asarray(predicted, dtype=np.float64) - measured) / measured


def error_summary(rel: Sequence[float]) -> dict[str, float | int | None]:
  """Median and max relative error (None without points)."""
  rel = np.asarray(rel, dtype=np.float64)
  if rel.size == 0:
    return {"median_rel_error": None, "max_rel_error": None, "points": 0}
  return {"median_rel_error": float(np.median(rel)),
          "max_rel_error": float(np.max(rel)), "points": int(rel.size)}


def split_heldout(count: int, fraction: float = 0.25, seed: int = 0
                  ) -> np.ndarray:
  """A boolean mask of held-out points, spread over the (sorted) points.

  Points come sorted (by model, batch, context); one in every
  `round(1/fraction)` consecutive points is held out, which one chosen at
  random, so held-out points cover the whole grid.
  """
  if not 0 < fraction < 1:
    raise ValueError(f"{fraction=} must be in (0, 1)")
  stride = max(2, round(1 / fraction))
  rng = np.random.default_rng(seed)
  mask = np.zeros(count, dtype=bool)
  for start in range(0, count, stride):
    size = min(stride, count - start)
    if size == stride or rng.random() < size / stride:
      mask[start + rng.integers(size)] = True
  return mask
