"""Quantities derived from the formulas by `sympy.solve` and `sympy.limit`.

Each function derives its closed form once (cached) from `jaxroof.symbolic.formulas`,
then substitutes whatever values it is given by symbol name:
`weight_kv_crossover_batch(N=8e9, q=2, T=1, k=2.5e8) == 64`.
"""

from __future__ import annotations

import functools

import sympy as sp

from jaxroof.symbolic import formulas
from jaxroof.symbolic.symbols import B, BY_NAME, N_act, R, t_gap, with_dense_default


def _solve_for_batch(lhs: sp.Expr, rhs: sp.Expr) -> sp.Expr:
  """The unique positive B with lhs == rhs (symbols are positive)."""
  solutions = sp.solve(sp.Eq(lhs, rhs), B, dict=True)
  if len(solutions) != 1:
    raise ArithmeticError(f"expected one solution for B, got {solutions}")
  return sp.simplify(solutions[0][B])


@functools.cache
def _ridge_batch() -> sp.Expr:
  return _solve_for_batch(formulas.weight_only_intensity(), R)


@functools.cache
def _weight_kv_crossover_batch() -> sp.Expr:
  return _solve_for_batch(formulas.weight_traffic(), formulas.retained_kv_bytes())


@functools.cache
def _compute_crossover_batch() -> sp.Expr:
  return _solve_for_batch(formulas.memory_time(), formulas.compute_time(N=N_act))


@functools.cache
def _memory_limit_rate() -> sp.Expr:
  rate = formulas.aggregate_rate(t=formulas.memory_time())
  return sp.limit(rate, B, sp.oo)


@functools.cache
def _max_batch_for_token_gap() -> sp.Expr:
  memory_bound = _solve_for_batch(formulas.memory_time(), t_gap)
  compute_bound = _solve_for_batch(formulas.compute_time(N=N_act), t_gap)
  return sp.Min(memory_bound, compute_bound)


def _substitute(expr: sp.Expr, values: dict[str, object]) -> sp.Expr:
  """Substitutes values by symbol name; a dense model (N given, N_act not) has N_act = N."""
  unknown = sorted(set(values) - set(BY_NAME))
  if unknown:
    raise TypeError(f"unknown symbol names {unknown}; known: {sorted(BY_NAME)}")
  values = with_dense_default(values)
  return expr.subs({BY_NAME[n].symbol: sp.sympify(v) for n, v in values.items()})


def ridge_batch(**values) -> sp.Expr:
  """Batch at which weight-only intensity reaches the ridge point R: `R*q/2`."""
  return _substitute(_ridge_batch(), values)


def weight_kv_crossover_batch(**values) -> sp.Expr:
  """Batch at which KV reads equal weight reads: `N*q/(T*k)`.

  Past it the cache, not the weights, is the larger part of each step's traffic.
  """
  return _substitute(_weight_kv_crossover_batch(), values)


def compute_crossover_batch(**values) -> sp.Expr:
  """Batch at which linear compute time equals memory time.

  `N*q*F / (2*N_act*BW - T*k*F)` (N weights read, N_act multiplied per token;
  equal for a dense model); when the denominator is <= 0 the KV reads grow as
  fast as the FLOPs and the step stays memory-bound at every batch.
  With T*k -> 0 and N_act = N it reduces to `ridge_batch` (R*q/2).
  """
  return _substitute(_compute_crossover_batch(), values)


def memory_limit_rate(**values) -> sp.Expr:
  """`lim B->oo` of the memory-bound aggregate rate: `BW/(T*k)` tokens/s.

  Weights are shared by ever more sequences; each still reads its own K/V.
  """
  return _substitute(_memory_limit_rate(), values)


def max_batch_for_token_gap(**values) -> sp.Expr:
  """Largest batch whose step floor stays within a token-gap target `t_gap`.

  `min((t_gap*BW - N*q)/(T*k), t_gap*F/(2*N_act))`: memory time and compute time
  each solved for B at `t_gap`. A value < 1 means even one sequence misses
  the target (the weights alone take longer than `t_gap` to read).
  """
  return _substitute(_max_batch_for_token_gap(), values)
