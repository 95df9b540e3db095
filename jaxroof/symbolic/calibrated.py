"""The calibrated decode step and prefill: the one cost model specialised, lambdified.

The analytic floor assumes every byte moves at the device's bandwidth and
every FLOP at its peak, with nothing else to pay. The calibrated model is the
same iteration (`cost_model.calibrated_terms`) with what a device and an
implementation achieve, as registered cost terms (`terms.py`). For a decode
step of B sequences at context T (`cost_model.calibrated_decode_outputs`):

  weight_s  = N*q / (eta_w*BW)             weights streamed at a fraction of BW
  kv_s      = B*T*k / (eta_kv*BW)          K/V read at another fraction of BW
  compute_s = (2*N_act + A_t*T)*B / (eta_f*F)   linear (and attention) FLOPs
  linear_s  = (weight_s**p + compute_s**p)**(1/p),  p = 1 + r_ovl
  step_s    = t0_step + L*t0_layer + B*t0_seq + linear_s + kv_s

(attention FLOPs on top at eta_attn*F where an engine's kernel was measured),
plus what each named engine extension adds. The six factors `FACTORS` are
what a profile fits; optax fits their logarithms to the logarithm of measured
step times, so a 10% error weighs the same at 1 ms and at 1 s. Crossovers and
limits are solved from the same expressions (`calibrated_summary_model`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Literal

import sympy as sp

from jaxroof.symbolic import cost_model
from jaxroof.symbolic import terms
from jaxroof.symbolic.lambdify import Evaluator, lambdified
from jaxroof.symbolic.symbols import (A_t, A_w, B, FACTOR_QUANTITIES, eta_attn, eta_f, eta_kv,
                                      eta_w, r_ovl, t0_layer, t0_seq, t0_step)
from jaxroof.symbolic.terms import eta_comm, eta_moe, m_moe

Backend = Literal["numpy", "jax"]
FACTORS: tuple[sp.Symbol, ...] = (eta_w, eta_kv, eta_f, t0_step, t0_layer, r_ovl)
FACTOR_NAMES: tuple[str, ...] = tuple(str(s) for s in FACTORS)
FACTOR_UNITS: dict[str, str] = {str(x.symbol): x.unit for x in FACTOR_QUANTITIES}
# The core terms beyond the six a profile fits (their defaults: absent).
CORE_TERM_NAMES: tuple[str, ...] = tuple(
    str(s) for s in cost_model.CALIBRATED_TERMS if s not in FACTORS)
INPUTS: tuple[sp.Symbol, ...] = cost_model.DECODE_INPUTS[:-1]  # A_t: 0 unless given.
INPUT_NAMES: tuple[str, ...] = tuple(str(s) for s in INPUTS)
PREFILL_FACTOR_NAMES: tuple[str, ...] = tuple(str(s) for s in cost_model.PREFILL_TERMS)
PREFILL_INPUT_NAMES: tuple[str, ...] = tuple(str(s) for s in cost_model.PREFILL_INPUTS)

ASSUMPTIONS: tuple[str, ...] = (
    "ops run one after another: linear layers combine weight reads and "
    "FLOPs by the fitted overlap, attention's K/V time comes on top",
    "efficiency factors and fixed costs fitted to measured decode steps "
    "(see the profile); activations and K/V copies are absorbed by the "
    "factor of the term they scale with",
)
PREFILL_ASSUMPTIONS: tuple[str, ...] = (
    "prefill of B prompts of P tokens in one pass: weights read once, linear "
    "FLOPs 2*N_act*B*P and causal attention FLOPs at eta_f_prefill of F",
    "fixed costs per pass and per layer, and the overlap of weight reads and "
    "FLOPs, are the decode step's; K/V writes and activations are absorbed",
)


def extensions_of(names) -> tuple[str, ...]:
  """The engine extensions the named terms need (`terms.owners`)."""
  return terms.owners(names)


def _with_defaults(evaluate: Evaluator, names: tuple[str, ...]) -> Evaluator:
  """`evaluate` taking A_t and A_w as 0 and every term beyond the six factors at its
  default where not given."""

  def call(**values: Any) -> dict[str, Any]:
    for name in names:
      if values.get(name) is None:
        values[name] = 0.0 if name in ("A_t", "A_w") else terms.get(name).default
    return evaluate(**values)

  return call


@functools.cache
def decode_model(backend: Backend = "numpy", extensions: tuple[str, ...] = ()) -> Evaluator:
  """The calibrated decode step as a vectorised function, lambdified once.

  Returns `f(**values) -> dict` where `values` holds `INPUT_NAMES`, `FACTOR_NAMES`
  and optionally A_t (attention FLOPs per retained token and row), the core terms
  beyond the six and the extensions' terms (each at its default when absent), arrays
  that broadcast together. The JAX form is jit-compiled and differentiable.
  """
  outputs = cost_model.calibrated_decode_outputs(tuple(extensions))
  given = cost_model.DECODE_INPUTS + cost_model.CALIBRATED_TERMS + cost_model.extension_terms(
      tuple(extensions))
  free = set().union(*(sp.sympify(e).free_symbols for e in outputs.values()))
  inputs = given + tuple(s for s in (A_w,) if s in free)
  optional = tuple(str(s) for s in inputs if s not in INPUTS + FACTORS)
  return _with_defaults(lambdified(outputs, inputs, backend), optional)


@functools.cache
def _plain() -> dict[str, sp.Expr]:
  """The decode outputs with no attention FLOPs and no per-sequence or attention-kernel
  term: the form a profile's six factors are fitted in, whose crossovers are solved in
  closed form."""
  zero = {A_t: 0, t0_seq: 0, eta_attn: 0, eta_moe: 1, m_moe: 0, eta_comm: 1}
  return {n: sp.sympify(e).xreplace(zero) for n, e in cost_model.calibrated_decode_outputs().items()}


def calibrated_step() -> sp.Expr:
  """The calibrated decode step time in `INPUTS` and the six `FACTORS` (seconds): the
  cost model's at the decode specialisation with A_t = 0 and the other core terms
  absent (the full form: `cost_model.calibrated_decode_outputs()["step_s"]`)."""
  return _plain()["step_s"]


def readable_step() -> str:
  """The calibrated step with the overlap written as a named p-norm."""
  t = _plain()
  pnorm = sp.Function("pnorm")(t["weight_s"], t["compute_s"])
  return f"{t['fixed_s'] + pnorm + t['kv_s']}, p = {1 + r_ovl}"


OUTPUT_NAMES: tuple[str, ...] = tuple(cost_model.calibrated_decode_outputs())
SUMMARY_NAMES: tuple[str, ...] = (
    "weight_kv_crossover_batch",
    "memory_limit_tokens_per_s",
    "compute_crossover_batch",
    "rate_limit_tokens_per_s",
)


@functools.cache
def _summary_exprs() -> tuple[sp.Expr, ...]:
  """Calibrated crossovers and limits, solved from the calibrated decode step (the
  linear layers' FLOPs; the six factors)."""
  t = _plain()
  [kv_cross] = sp.solve(sp.Eq(t["weight_s"], t["kv_s"]), B)
  memory_limit = sp.limit(B / t["memory_s"], B, sp.oo)
  [compute_cross] = sp.solve(sp.Eq(t["memory_s"], t["compute_s"]), B)
  # Past every crossover the linear layers are compute-bound.
  rate_limit = sp.limit(B / (t["fixed_s"] + t["compute_s"] + t["kv_s"]), B, sp.oo)
  return tuple(sp.simplify(e) for e in (kv_cross, memory_limit, compute_cross, rate_limit))


@functools.cache
def calibrated_summary_model() -> Evaluator:
  """The solved summary as a numpy function of `INPUT_NAMES` and `FACTOR_NAMES`."""
  return lambdified(dict(zip(SUMMARY_NAMES, _summary_exprs())), INPUTS + FACTORS)


@functools.cache
def prefill_model(backend: Backend = "numpy") -> Evaluator:
  """The calibrated prefill of users' rows (`cost_model.calibrated_prefill_outputs`),
  lambdified once: `f(**values)` of `PREFILL_INPUT_NAMES` and `PREFILL_FACTOR_NAMES`."""
  return lambdified(cost_model.calibrated_prefill_outputs(),
                    cost_model.PREFILL_INPUTS + cost_model.PREFILL_TERMS, backend)


def held_terms(values: Mapping[str, float]) -> dict[str, float]:
  """The terms beyond the six factors among `values`, checked against their bounds."""
  return terms.checked({n: v for n, v in values.items() if n not in FACTOR_NAMES}, "terms")


@functools.cache
def _iteration_symbols(extensions: tuple[str, ...]) -> frozenset[str]:
  exprs = cost_model.calibrated_terms(extensions).values()
  return frozenset(str(s) for e in exprs for s in sp.sympify(e).free_symbols)


def iteration_terms(values: Mapping[str, float]) -> dict[str, float]:
  """The terms among `values` beyond the six factors that the calibrated iteration
  itself takes (with their engines' extensions); a term at its default (absent) and one
  that shapes something else (a per-request delay, an idle engine's wake) are left out."""
  known = terms.registered()
  names = [
      n for n in values
      if n in known and n not in FACTOR_NAMES and float(values[n]) != known[n].default
  ]
  used = _iteration_symbols(terms.owners(names))
  return {n: float(values[n]) for n in names if n in used}


def readable_extras(names) -> str:
  """What the named terms' engines add to the decode step, each as `name = expression`
  (empty for core terms), for a reader of the fitted step."""
  outputs = cost_model.calibrated_decode_outputs(terms.owners(names))
  added = [m for n in terms.owners(names) for m in terms.extension(n).memory
          ] + [k for k in outputs if k not in cost_model.calibrated_decode_outputs()]
  zero = {A_t: 0, t0_seq: 0, eta_attn: 0, eta_moe: 1, m_moe: 0, eta_comm: 1}
  return "; ".join(f"{k} = {sp.sympify(outputs[k]).xreplace(zero)}" for k in dict.fromkeys(added))
