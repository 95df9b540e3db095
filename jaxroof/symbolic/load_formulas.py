"""The load model's formulas (sympy): a replica's running count as a birth-death chain.

`jaxroof.symbolic.load_model` evaluates them, lambdified once each (the `*_model`
functions), over a replica's occupancies; its docstring tells the model whole.

References:
  Cosmetatos, G. P. (1976), "Some approximate equilibrium results for the
  multi-server queue (M/G/r)", Operational Research Quarterly 27(3), 615-620.
  Lee, A. M. and Longton, P. A. (1959), "Queueing processes associated with
  airline passenger check-in", Operational Research Quarterly 10(1), 56-71.
  Asmussen, S. (2003), Applied Probability and Queues, 2nd ed., Springer (the
  Cramer-Lundberg tail of M/D/1's wait).
"""

from __future__ import annotations

import functools

import sympy as sp

from jaxroof.symbolic import request_formulas
from jaxroof.symbolic.lambdify import lambdified
from jaxroof.symbolic.symbols import (B, D_pf, cv2_hold, lam, n_out, n_run, p_q, p_w, t, t_c,
                                      t_hold, t_m, t_w, t_x)

Expr = sp.Expr


def _s(*values) -> list[Expr]:
  return [sp.sympify(v) for v in values]


def loaded_gap(t: Expr = t, lam: Expr = lam, x: Expr = t_x) -> Expr:
  """Mean gap between a user's tokens at one occupancy: `t/(1 - lam*x)`.

  Iterations carry prompts at rate lam, each adding x seconds to the
  iterations it joins: in a long interval of length T, lam*T*x of it is the
  prompts', so the decode steps of t seconds are stretched by 1/(1 - lam*x)
  (`request_formulas.loaded_token_gap` with the prompt's added time).
  """
  return request_formulas.loaded_token_gap(t, lam, x)


def hold_time(admit: Expr = D_pf, gap: Expr = t, G: Expr = n_out) -> Expr:
  """Seconds a request holds its slot: its prompt's service, then G - 1 gaps."""
  admit, gap, G = _s(admit, gap, G)
  return admit + (G - 1) * gap


def birth_death_ratio(lam: Expr = lam, hold: Expr = t_hold, n: Expr = n_run) -> Expr:
  """pi(n) / pi(n - 1) of the running count: arrivals at lam, departures n / hold(n)."""
  lam, hold, n = _s(lam, hold, n)
  return lam * hold / n


def slot_utilisation(lam: Expr = lam, hold: Expr = t_hold, B: Expr = B) -> Expr:
  """The B slots' utilisation at full occupancy, `lam*hold/B` (the queue's rho; the
  chain is stable while it is < 1)."""
  return birth_death_ratio(lam, hold, B)


def waiting_mass(rho: Expr) -> Expr:
  """pi(n >= B) / pi(B): every state where an arrival finds the slots full, `1/(1 - rho)`."""
  return 1 / (1 - sp.sympify(rho))


def queue_length(rho: Expr) -> Expr:
  """Mean requests queued, over pi(B): `sum_j j*rho**j = rho/(1 - rho)**2`."""
  rho = sp.sympify(rho)
  return rho / (1 - rho)**2


def cosmetatos(rho: Expr, c: Expr = B) -> Expr:
  """W(M/D/c) / W(M/M/c), Cosmetatos's approximation:
  `(1 + (1 - rho)*(c - 1)*(sqrt(4 + 5c) - 2)/(16*rho*c))/2`; exactly 1/2 at c = 1
  (Pollaczek-Khinchine) and at rho -> 1."""
  rho, c = _s(rho, c)
  return (1 + (1 - rho) * (c - 1) * (sp.sqrt(4 + 5 * c) - 2) / (16 * rho * c)) / 2


def service_variability(rho: Expr, c: Expr = B, cv2: Expr = cv2_hold) -> Expr:
  """W(M/G/c) / W(M/M/c) for holds of squared coefficient of variation cv2: Cosmetatos's
  M/D/c factor at cv2 = 0 (at most 1: at light load and many servers the
  approximation passes 1, where the wait is negligible anyway), 1 at cv2 = 1 (M/M/c),
  linear between (Lee and Longton's `(1 + cv2)/2` with the deterministic end
  corrected)."""
  cv2 = sp.sympify(cv2)
  return cv2 + (1 - cv2) * sp.Min(1, cosmetatos(rho, c))


def wait_quantile(W: Expr = t_w, p0: Expr = p_w, p: Expr = p_q) -> Expr:
  """The p-quantile of a wait with mean W that is positive with probability p0 and
  exponential when positive: `W/p0 * log(p0/(1 - p))` where p0 > 1 - p, else 0."""
  W, p0, p = _s(W, p0, p)
  return sp.Piecewise((W / p0 * sp.log(p0 / (1 - p)), p0 > 1 - p), (0, True))


def md1_decay(x: Expr, u: Expr) -> Expr:
  """The Cramer-Lundberg equation of M/D/1's wait, zero at its tail's decay: with x =
  theta x service, `u*(exp(x) - 1) - x` (u = lam x service < 1; one positive root)."""
  x, u = _s(x, u)
  return u * (sp.exp(x) - 1) - x


def md1_tail_weight(x: Expr, u: Expr) -> Expr:
  """C in M/D/1's wait tail P(W > t) ~ C exp(-theta t), at the root x of `md1_decay`:
  `(1 - u)/(u*exp(x) - 1)` (Cramer-Lundberg; Asmussen, Applied Probability and Queues)."""
  x, u = _s(x, u)
  return (1 - u) / (u * sp.exp(x) - 1)


def iteration_moments(m: Expr, step: Expr = t, first: Expr = t_x,
                      more: Expr = t_m) -> tuple[Expr, Expr]:
  """(E[T], E[T**2]) of an iteration `step + first*(K > 0) + more*(K - 1)+` that K ~
  Poisson(m) whole prompts join: with p = 1 - exp(-m), E[(K - 1)+] = m - p and
  E[((K - 1)+)**2] = m**2 - m + p."""
  m, step, first, more = _s(m, step, first, more)
  p = 1 - sp.exp(-m)
  added = first * p + more * (m - p)
  added2 = first**2 * p + 2 * first * more * (m - p) + more**2 * (m**2 - m + p)
  return step + added, step**2 + 2 * step * added + added2


def residual(mean: Expr = t, second: Expr | None = None) -> Expr:
  """Mean wait of an arrival for the iteration under way to end: `E[T**2]/(2 E[T])`
  (an arrival lands in a long iteration more often: length-biased); half an iteration
  of fixed length (`second` None)."""
  mean = sp.sympify(mean)
  second = mean**2 if second is None else sp.sympify(second)
  return second / (2 * mean)


def others_in_iteration(lam: Expr = lam, biased: Expr = t, more: Expr = t_m) -> Expr:
  """Seconds the other prompts admitted with a prompt add to its iteration (the
  iteration-level scheduler): those that arrived during the iteration it landed in,
  `lam*biased` (`biased` = E[T**2]/E[T], the length-biased iteration), `more` each."""
  lam, biased, more = _s(lam, biased, more)
  return lam * biased * more


def burst_excess(lam: Expr = lam, x: Expr = t_x, own: Expr = D_pf, gap: Expr = t) -> Expr:
  """Seconds a request's decode gaps add past G - 1 mean gaps (whole prompts): prompts
  arrive during its own prefill iteration (`own`, longer than the mean `gap`) and join
  the next, which lengthens it, so more arrive during that one: `lam*x*(own - gap)`
  over the geometric series `1/(1 - lam*x)`."""
  lam, x, own, gap = _s(lam, x, own, gap)
  return lam * x * (own - gap) / (1 - lam * x)


def residual_quantile(q: Expr, step: Expr, loaded: Expr, share: Expr) -> Expr:
  """The q-quantile of the wait for the iteration under way to end when a time `share`
  is in iterations of length `loaded` (carrying prompts) and the rest in decode-only
  ones of length `step`: an arrival's residual is uniform over the iteration it lands
  in. Solves `share*(1 - r/loaded)+ + (1 - share)*(1 - r/step)+ = 1 - q`."""
  q, step, loaded, share = _s(q, step, loaded, share)
  long_only = loaded * (1 - (1 - q) / share)
  both = q / (share / loaded + (1 - share) / step)
  return sp.Piecewise((long_only, long_only >= step), (both, True))


def busy_share(u: Expr, chunk: Expr = t_c, step: Expr = t) -> Expr:
  """Share of iterations that carry a prefill chunk when prefill keeps the replica busy
  a share u of the time, a chunk iteration lasting `chunk` and a decode-only one
  `step`."""
  u, chunk, step = _s(u, chunk, step)
  return (u / chunk) / (u / chunk + (1 - u) / step)


def slot_fill_rate(admit: Expr = D_pf, t: Expr = t, x: Expr = t_x, G: Expr = n_out,
                   B: Expr = B) -> Expr:
  """The rate at which B full slots turn over: lam with `lam*hold(B) = B`, the hold at
  the loaded gap `t/(1 - lam*x)` (the smaller root of the quadratic, written without
  dividing by x): `2B/(a + sqrt(a**2 - 4*admit*x*B))`, `a = admit + (G - 1)*t + B*x`.
  Past it the queue for a slot grows without bound."""
  admit, t, x, G, B = _s(admit, t, x, G, B)
  a = admit + (G - 1) * t + B * x
  return 2 * B / (a + sp.sqrt(a**2 - 4 * admit * x * B))


def joined_extra(m: Expr, first: Expr = t_x, more: Expr = t_m) -> Expr:
  """Mean time a prompt adds when K ~ Poisson(m) whole prompts join each iteration, the
  first adding `first` and each further one `more`: E[first*(K > 0) + more*(K - 1)+]/m
  `= more + (1 - exp(-m))/m*(first - more)`; `first` at light load, `more` at heavy."""
  m, first, more = _s(m, first, more)
  return more + (1 - sp.exp(-m)) / m * (first - more)


def poisson_pmf(k: Expr, mean: Expr) -> Expr:
  """P(K = k) of a Poisson count with the given mean (prompts joining one iteration)."""
  k, mean = _s(k, mean)
  return mean**k * sp.exp(-mean) / sp.factorial(k)


# Lambdified once (the load model evaluates them over its states).
@functools.cache
def state_model():
  gap = loaded_gap()
  return lambdified({"gap": gap, "hold": hold_time(D_pf, gap, n_out)}, (t, lam, t_x, D_pf, n_out))


@functools.cache
def iteration_model():
  m, q, z, x = sp.symbols("m q z x", positive=True)
  mean, second = iteration_moments(m)
  p = 1 - sp.exp(-m)
  loaded = t + t_x + t_m * (m - p) / p  # E[T | K > 0].
  biased = second / mean
  others = others_in_iteration(lam, biased, t_m)
  own = D_pf + others
  return lambdified(
      {
          "mean": mean, "residual": residual(mean, second), "others": others,
          "excess": burst_excess(lam, x, own, mean), "residual_q": residual_quantile(
              q, t, loaded, p * loaded / mean), "spread": z * t_m * sp.sqrt(lam * biased)
      }, (m, t, t_x, t_m, lam, D_pf, x, q, z))


@functools.cache
def joined_model():
  m = sp.Symbol("m", positive=True)
  return lambdified({"extra": joined_extra(m)}, (m, t_x, t_m))


@functools.cache
def queue_model():
  rho = sp.Symbol("rho", positive=True)
  return lambdified(
      {
          "waiting": waiting_mass(rho), "queue": queue_length(rho),
          "variability": service_variability(rho, B, cv2_hold)
      }, (rho, B, cv2_hold))


@functools.cache
def quantile_model():
  return lambdified({"q": wait_quantile()}, (t_w, p_w, p_q))


@functools.cache
def md1_tail_model():
  x, u = sp.symbols("x u", positive=True)
  f = md1_decay(x, u)
  return lambdified({"f": f, "df": sp.diff(f, x), "weight": md1_tail_weight(x, u)}, (x, u))


@functools.cache
def fill_model():
  return lambdified({"rate": slot_fill_rate()}, (D_pf, t, t_x, n_out, B))


@functools.cache
def busy_model():
  u = sp.Symbol("u", positive=True)
  return lambdified({"share": busy_share(u)}, (u, t_c, t))


@functools.cache
def md1_model():
  return lambdified({"wait": request_formulas.md1_wait(lam, D_pf)}, (lam, D_pf))
