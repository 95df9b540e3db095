"""A whole request and time to first token under load: every formula once.

A request of a P-token prompt and n_out outputs at decode batch B is its
prefill (which yields output 1), then n_out - 1 decode steps; step j (1-based)
feeds output j back and attends over `P + j` positions, so the context grows
by one each step. The decode step is the bound of `jaxroof.symbolic.formulas`,
`Max((N*q + B*k*T)/BW, 2*N_act*B/F)`: memory time rises with T, compute time
does not, so the first steps may be compute-bound and the rest memory-bound.
The sum is written in closed form with `sympy.summation` over the
memory-bound steps.

Time to first token = queueing wait + batching window + prefill. The prefill
server is M/D/1 (Poisson arrivals at rate lam, deterministic service D): mean
wait `lam*D**2/(2*(1 - lam*D))`, valid only while `lam*D < 1`. A replica's whole
load (its slots, the gap at each occupancy, TTFT's waits and their percentiles) is
the load model's (`load_model`), which builds on these.
"""

from __future__ import annotations

import functools

import sympy as sp

from jaxroof.symbolic import formulas
from jaxroof.symbolic.symbols import (B, BW, D_pf, F, N, N_act, P, j, k, lam, n_out, q, t, t_ttft,
                                      t_window)

Expr = sp.Expr


def decode_step_at(j: Expr = j) -> Expr:
  """Bound decode step j of a request: the step floor at context `P + j`."""
  return formulas.step_floor(B, N, q, P + sp.sympify(j), k, BW, F, N_act)


def mean_context(P: Expr = P, G: Expr = n_out) -> Expr:
  """Mean context of a request's decode steps, tokens: step j attends `P + j` for
  j = 1 .. G - 1, whose mean is `P + G / 2`."""
  P, G = _s(P, G)
  return P + G / 2


def _memory_step(j: Expr = j) -> Expr:
  return formulas.memory_time(formulas.step_traffic(B, N, q, P + sp.sympify(j), k), BW)


def _compute_step() -> Expr:
  return formulas.compute_time(B, N_act, F)


@functools.cache
def compute_bound_steps() -> Expr:
  """Decode steps of a request (of n_out - 1) whose compute time exceeds memory time.

  Memory time rises with j, so these are the first ones: the j with
  `memory(P + j) < compute`, counted and clamped to [0, n_out - 1].
  """
  # Linear in j: `solve_linear` gives the one root without sympy.solve's checks.
  unknown, crossing = sp.solve_linear(_memory_step() - _compute_step(), symbols=[j])
  if unknown != j:
    raise ArithmeticError(f"memory = compute is not linear in j: {crossing}")
  return sp.Min(sp.Max(sp.ceiling(crossing) - 1, 0), n_out - 1)


@functools.cache
def decode_time() -> Expr:
  """Seconds of a request's n_out - 1 decode steps, in closed form.

  `g0*compute + Sum(memory(P + j), (j, g0 + 1, n_out - 1))`, g0 the
  compute-bound steps (`compute_bound_steps`); the sum by `sympy.summation`.
  """
  g0 = compute_bound_steps()
  memory = sp.summation(_memory_step(), (j, g0 + 1, n_out - 1))
  return g0 * _compute_step() + memory


def request_time(prefill: Expr) -> Expr:
  """Service time of a request: its prefill then its decode steps (no waiting)."""
  return sp.sympify(prefill) + decode_time()


def mean_token_gap() -> Expr:
  """Mean gap between a user's tokens after the first: decode time / (n_out - 1)."""
  return decode_time() / (n_out - 1)


def md1_wait(lam: Expr = lam, D: Expr = D_pf) -> Expr:
  """Mean wait in an M/D/1 queue: `lam*D**2/(2*(1 - lam*D))` (lam*D < 1 only)."""
  lam, D = _s(lam, D)
  return lam * D**2 / (2 * (1 - lam * D))


def _s(*values) -> list[Expr]:
  return [sp.sympify(v) for v in values]


def ttft(lam: Expr = lam, D: Expr = D_pf, t_window: Expr = t_window) -> Expr:
  """Mean time to first token: M/D/1 wait, batching window, then the prefill D."""
  return formulas.time_to_first_token(D, t_window, md1_wait(lam, D))


def gathering_time(B: Expr = B, lam: Expr = lam) -> Expr:
  """Mean wait for a batch of B prompts to gather at rate lam: `(B - 1)/(2*lam)`.

  The first arrival waits for the other B - 1 (`(B - 1)/lam`), the last for
  none; on average half of that. 3.5 s for B = 8 at 1 request/s.
  """
  B, lam = _s(B, lam)
  return (B - 1) / (2 * lam)


def utilisation(lam: Expr = lam, D: Expr = D_pf) -> Expr:
  """Fraction of time the prefill server is busy, `lam*D`; >= 1 is unstable."""
  lam, D = _s(lam, D)
  return lam * D


@functools.cache
def max_arrival_rate_for_ttft() -> Expr:
  """Largest arrival rate whose mean TTFT meets `t_ttft` (`sympy.solve`):
  `2*a/(D*(D + 2*a))` with `a = t_ttft - t_window - D`, the wait allowed.
  Meaningful only when a > 0 (otherwise no load meets the target)."""
  roots = sp.solve(sp.Eq(ttft(), t_ttft), lam)
  if len(roots) != 1:
    raise ArithmeticError(f"expected one root for lam, got {roots}")
  return sp.factor(roots[0])


def loaded_token_gap(t: Expr = t, lam: Expr = lam, D: Expr = D_pf) -> Expr:
  """Mean token gap when prefills share the chip with priority: `t/(1 - lam*D)`.

  Prefills take the fraction lam*D of the chip's time; decode steps run in
  the rest, so each user's step of t seconds is stretched by 1/(1 - lam*D).
  """
  t, lam, D = _s(t, lam, D)
  return t / (1 - utilisation(lam, D))
