"""The time of one scheduler iteration with a mixed batch (continuous batching).

A continuous-batching server runs iterations, not uniform decode steps. One
iteration holds `n_dec` decode sequences (one token each, attending to
contexts whose sum is `S_dec`) and `n_pre` prompt tokens in prefill chunks
(each chunk of `c` tokens after `o` already prefilled attends causally to
`o*c + c*(c+1)/2` query-key pairs and reads or writes `o + c` positions of
K/V). The iteration's terms come from `jaxroof.symbolic.formulas`:

  weights   weight_traffic(N, q)                     read once per iteration
  K/V       retained_kv_bytes_unequal([S_dec, S_pre_kv], k)
  linear    linear_flops(N_act, n_dec + n_pre)        every row multiplies N_act
  attention L * attention_flops(1, S_dec + S_pre_att, H, d)

As an analytic bound the iteration takes the larger of memory and compute
time (the roofline of one step); calibrated, it takes the calibrated step's
form (`jaxroof.symbolic.calibrated`): weights at eta_w*BW, K/V at eta_kv*BW,
linear and attention FLOPs at eta_f*F, their overlap by r_ovl, plus the fixed
costs per iteration and per layer. With no prefill and equal contexts both
reduce to the decode step of `formulas.step_floor` / `calibrated` plus the
attention FLOPs those omit (H = 0 removes them exactly).

Each form is lambdified once (`evaluate.lambdified`, numpy) and the
simulator calls it per iteration with plain scalars.
"""

from __future__ import annotations

import functools
from typing import Any

import sympy as sp

from jaxroof.symbolic import calibrated
from jaxroof.symbolic import formulas
from jaxroof.symbolic.evaluate import Evaluator, lambdified
from jaxroof.symbolic.symbols import (BW, F, H, L, N, N_act, S_dec, S_pre_att, S_pre_kv,
                                      c_chunk, d, eta_f, eta_kv, eta_w, k, n_dec, n_pre,
                                      o_chunk, q, t0_layer, t0_step)

MIX: tuple[sp.Symbol, ...] = (n_dec, S_dec, n_pre, S_pre_att, S_pre_kv)
MODEL: tuple[sp.Symbol, ...] = (N, q, k, BW, F, N_act, L, H, d)
INPUTS: tuple[sp.Symbol, ...] = MIX + MODEL
INPUT_NAMES: tuple[str, ...] = tuple(str(s) for s in INPUTS)
MODEL_NAMES: tuple[str, ...] = tuple(str(s) for s in MODEL)


def chunk_attended_pairs(o: sp.Expr = o_chunk, c: sp.Expr = c_chunk) -> sp.Expr:
  """Query-key pairs of a causal prefill chunk: c queries after o done ones.

  Query i (1-based within the chunk) attends to o + i positions, itself
  included: the sum over i is `o*c + c*(c+1)/2`.
  """
  o, c = sp.sympify(o), sp.sympify(c)
  i = sp.Symbol("i", positive=True, integer=True)
  return sp.expand(sp.summation(o + i, (i, 1, c)))


def chunk_kv_positions(o: sp.Expr = o_chunk, c: sp.Expr = c_chunk) -> sp.Expr:
  """Positions of K/V a chunk touches: the o-token prefix read, its c written."""
  return sp.sympify(o) + sp.sympify(c)


def _shared_terms() -> dict[str, sp.Expr]:
  rows = n_dec + n_pre
  kv_bytes = formulas.retained_kv_bytes_unequal([S_dec, S_pre_kv], k)
  attention = L * formulas.attention_flops(1, S_dec + S_pre_att, H, d)
  return {"weight_bytes": formulas.weight_traffic(N, q), "kv_bytes": kv_bytes,
          "linear_flops": formulas.linear_flops(N_act, rows), "attention_flops": attention}


def bound_terms() -> dict[str, sp.Expr]:
  """Named expressions of an iteration's analytic bound (seconds, bytes, FLOP)."""
  t = _shared_terms()
  memory_s = formulas.memory_time(t["weight_bytes"] + t["kv_bytes"], BW)
  compute_s = formulas.compute_time(n_dec + n_pre, N_act, F) + t["attention_flops"] / F
  return {**t, "memory_s": memory_s, "compute_s": compute_s,
          "step_s": sp.Max(memory_s, compute_s)}


def calibrated_terms() -> dict[str, sp.Expr]:
  """Named expressions of a calibrated iteration, the calibrated step's form.

  Weights at eta_w*BW, K/V at eta_kv*BW, linear and attention FLOPs at
  eta_f*F, weights and FLOPs overlapped by the fitted p-norm, and the fixed
  costs per iteration and per layer on top.
  """
  t = _shared_terms()
  weight_s = formulas.memory_time(t["weight_bytes"], eta_w * BW)
  kv_s = formulas.memory_time(t["kv_bytes"], eta_kv * BW)
  compute_s = (formulas.compute_time(n_dec + n_pre, N_act, eta_f * F)
               + t["attention_flops"] / (eta_f * F))
  fixed_s = t0_step + L * t0_layer
  linear_s = calibrated.overlap(weight_s, compute_s)
  return {**t, "weight_s": weight_s, "kv_s": kv_s, "compute_s": compute_s,
          "fixed_s": fixed_s, "linear_s": linear_s, "step_s": fixed_s + linear_s + kv_s}


@functools.cache
def bound_iteration() -> Evaluator:
  """`f(n_dec=, S_dec=, n_pre=, S_pre_att=, S_pre_kv=, N=, ..., d=) -> dict`."""
  return lambdified(bound_terms(), INPUTS)


@functools.cache
def calibrated_iteration() -> Evaluator:
  """As `bound_iteration`, with the calibrated factors as further inputs."""
  return lambdified(calibrated_terms(), INPUTS + calibrated.FACTORS)


@functools.cache
def _step_only(kind: str) -> Evaluator:
  if kind == "bound":
    return lambdified({"step_s": bound_terms()["step_s"]}, INPUTS)
  return lambdified({"step_s": calibrated_terms()["step_s"]}, INPUTS + calibrated.FACTORS)


@functools.cache
def chunk_model() -> Evaluator:
  """`f(o_chunk=, c_chunk=) -> {"attended": ..., "kv_positions": ...}` (numpy)."""
  return lambdified({"attended": chunk_attended_pairs(), "kv_positions": chunk_kv_positions()},
                    (o_chunk, c_chunk))


def iteration_expression(kind: str, factors: dict[str, float] | None = None) -> sp.Expr:
  """The step-time expression of one iteration (factors substituted if given)."""
  expr = (bound_terms() if kind == "bound" else calibrated_terms())["step_s"]
  if factors:
    expr = expr.subs({sp.Symbol(n, positive=True): v for n, v in factors.items()})
  return expr


def step_time_function(kind: str, model_values: dict[str, float],
                       factors: dict[str, float] | None = None):
  """A fast `f(n_dec, S_dec, n_pre, S_pre_att, S_pre_kv) -> seconds` for one model.

  The lambdified expression is called with the model's constants bound once;
  arguments may be scalars or arrays (broadcast).
  """
  evaluator = _step_only("bound" if kind == "bound" else "calibrated")
  fixed: dict[str, Any] = {name: float(model_values[name]) for name in MODEL_NAMES}
  if kind != "bound":
    fixed.update({n: float(factors[n]) for n in calibrated.FACTOR_NAMES})

  def step_s(n_dec, S_dec, n_pre, S_pre_att, S_pre_kv):
    return evaluator(n_dec=n_dec, S_dec=S_dec, n_pre=n_pre, S_pre_att=S_pre_att,
                     S_pre_kv=S_pre_kv, **fixed)["step_s"]

  return step_s
