"""The load model: its formulas checked symbolically and against textbook queues, its
chain against Erlang C, and its largest rate at the edge of the targets."""

from __future__ import annotations

import math

import numpy as np
import pytest
import sympy as sp

from jaxroof.symbolic import load_formulas as lf
from jaxroof.symbolic import load_model as lm
from jaxroof.symbolic import request_formulas
from jaxroof.symbolic import symbols as S

NO_TARGETS = lm.Targets(token_gap_s=math.inf, ttft_s=None, itl_quantile=None)


def _erlang_c(c: int, rate: float, hold: float) -> tuple[float, float]:
  """Independently: M/M/c's probability of waiting and mean wait (the Erlang B recursion)."""
  a = rate * hold
  b = 1.0
  for n in range(1, c + 1):
    b = a * b / (n + a * b)
  waits = b / (1 - a / c * (1 - b))
  return waits, waits * hold / (c - a)


def _fixed_holds(c: int, hold: float, top: int | None = None) -> lm.States:
  """States of a queue of c servers with fixed holds (G = 1: the hold is the service)."""
  n = lm.integer_states(top or c + 3)
  R, S_ = 1, n.size
  return lm.States(n=n, step=np.full((R, S_), 1e-9), extra=np.zeros((R, S_)), admit=np.full(
      (R, S_), hold), chunk=np.full((R, S_), np.nan), idle=np.full(R, hold), candidates=np.ones(
          (R, S_), dtype=bool))


@pytest.mark.parametrize("c", [1, 2, 8, 32, 128])
@pytest.mark.parametrize("rho", [0.5, 0.8, 0.95])
def test_the_chain_with_fixed_holds_is_erlang_c(c, rho):
  hold = 10.0
  rate = rho * c / hold
  out = lm.evaluate(_fixed_holds(c, hold), [rate], 1, NO_TARGETS)
  p_wait, mmc = _erlang_c(c, rate, hold)
  j = c - 1  # The candidate B = c.
  assert out["p_wait"][0, j] == pytest.approx(p_wait, rel=1e-9)
  assert out["mean_running"][0, j] == pytest.approx(rate * hold, rel=1e-9)  # Little.
  # Deterministic holds: M/M/c's wait corrected (Cosmetatos), never above it.
  ratio = out["slot_wait_s"][0, j] / mmc
  assert 0.5 - 1e-9 <= ratio <= 1.0
  if c == 1:
    assert ratio == pytest.approx(0.5)  # Exactly M/D/1 (Pollaczek-Khinchine).


def test_cosmetatos_is_half_at_one_server_and_at_full_load():
  rho = sp.Symbol("rho", positive=True)
  assert sp.simplify(lf.cosmetatos(rho, 1) - sp.Rational(1, 2)) == 0
  assert sp.limit(lf.cosmetatos(rho, S.B), rho, 1) == sp.Rational(1, 2)
  # Exponential holds (cv2 = 1): M/M/c itself.
  assert sp.simplify(lf.service_variability(rho, S.B, 1) - 1) == 0


def test_the_slot_fill_rate_turns_the_slots_over():
  """lam * hold(B) = B, hold at the loaded gap t / (1 - lam x)."""
  rate = lf.slot_fill_rate()
  hold = lf.hold_time(S.D_pf, lf.loaded_gap(S.t, rate, S.t_x), S.n_out)
  values = {S.D_pf: 0.4, S.t: 0.02, S.t_x: 0.05, S.n_out: 200, S.B: 64}
  assert float((rate * hold).subs(values)) == pytest.approx(64.0, rel=1e-12)
  # Without prefill interference it is B / (admit + (G - 1) t).
  g = sp.Symbol("g", positive=True)  # G - 1 outputs after the first.
  free = rate.subs({S.t_x: 0, S.n_out: g + 1})
  assert sp.simplify(free - S.B / (S.D_pf + g * S.t)) == 0


def test_the_loaded_gap_is_the_request_formula():
  assert sp.simplify(lf.loaded_gap() - request_formulas.loaded_token_gap(S.t, S.lam, S.t_x)) == 0


def test_md1_tail_is_cramer_lundberg():
  """The decay root solves u (e^x - 1) = x; at light load the tail's weight tends to 0 and
  the tail is steeper; the p90 of a lone M/D/1 wait is below its exponential stand-in."""
  for u in (0.2, 0.6, 0.9):
    x = sp.nsolve(lf.md1_decay(sp.Symbol("x"), u), sp.Symbol("x"), 2.0 / u)
    assert float(lf.md1_decay(x, u)) == pytest.approx(0.0, abs=1e-12)
    weight = float(lf.md1_tail_weight(x, u))
    assert 0 < weight < 1
  service, rate = 1.0, 0.8
  mean = float(request_formulas.md1_wait(rate, service))
  exp_p90 = mean / 0.8 * math.log(0.8 / 0.1)
  ours = lm._wait_quantile(
      np.array([0.0]),
      np.array([0.0]),
      np.array([0.8]),  # noqa: SLF001
      np.array([service]),
      np.array([[rate]]),
      0.9)
  assert 0 < float(ours[0, 0]) < exp_p90


def test_nodes_stand_for_the_integers_between_them():
  """A long range on nodes 0.5% apart gives the integers' answer within 0.5%."""
  c, hold = 2000, 10.0
  exact = lm.evaluate(_fixed_holds(c, hold, c), [0.97 * c / hold], 1, NO_TARGETS)
  n = lm.node_states(c, exact=128)
  assert n.size < c / 3 and n[-1] == c
  nodes = lm.evaluate(
      lm.States(n=n, step=np.full((1, n.size), 1e-9), extra=np.zeros((1, n.size)), admit=np.full(
          (1, n.size), hold), chunk=np.full((1, n.size), np.nan), idle=np.full(1, hold),
                candidates=np.ones((1, n.size), dtype=bool)), [0.97 * c / hold], 1, NO_TARGETS)
  for key in ("p_wait", "mean_running", "slot_wait_s"):
    assert nodes[key][0, -1] == pytest.approx(exact[key][0, -1], rel=5e-3), key


def _replica_states(B: int = 64) -> lm.States:
  """A replica whose decode step grows with its occupancy and whose prompts stretch it."""
  n = lm.integer_states(B)
  step = (0.010 + 0.0002 * n)[None, :]
  return lm.States(n=n, step=step, extra=np.full((1, B), 0.02), admit=step + 0.05, chunk=np.full(
      (1, B), np.nan), idle=np.array([0.05]), candidates=np.ones((1, B), dtype=bool))


def test_the_largest_rate_is_the_edge_of_the_targets():
  states = _replica_states()
  targets = lm.Targets(token_gap_s=0.02, ttft_s=0.5)
  best = lm.max_rate(states, 128, targets)
  assert best.rate[0] > 0 and 1 <= best.B[0] <= 64
  column = best.column
  at = lm.at(states, best.rate, column, 128, targets)
  past = lm.at(states, best.rate * 1.001, column, 128, targets)
  assert at["meets"][0] == 1 and past["meets"][0] == 0
  # No other B meets past the largest rate.
  assert not lm.evaluate(states, best.rate * 1.001, 128, targets)["meets"].any()
  # The rate rises with looser targets.
  looser = lm.max_rate(states, 128, lm.Targets(token_gap_s=0.04, ttft_s=1.0))
  assert looser.rate[0] > best.rate[0]


def test_gap_ttft_and_occupancy_rise_with_the_rate():
  states = _replica_states()
  rates = np.array([1.0, 5.0, 10.0, 15.0])
  out = [lm.at(states, [r], np.array([63]), 128, NO_TARGETS) for r in rates]
  assert all(o["stable"][0] == 1 for o in out)
  for key in ("token_gap_s", "ttft_s", "mean_running", "slot_wait_s"):
    values = [o[key][0] for o in out]
    assert values == sorted(values), key


def test_the_p99_gap_counts_iterations_carrying_prompts():
  """Whole prompts add 20 ms to the iterations they join: the p99 inter-token gap is the
  step while prompts are rare, and a step with one prompt once they join 1% or more of
  the iterations."""
  states = _replica_states()
  light = lm.itl_quantile(states, 0.001, 63, 128)
  heavy = lm.itl_quantile(states, 20.0, 63, 128)
  assert light < 0.0232  # Decode-only iterations at the occupancy of a light load.
  assert heavy >= 0.010 + 0.02


def test_iteration_moments_are_the_poisson_sums():
  """E[T], E[T**2] of `step + first*(K > 0) + more*(K - 1)+`, K ~ Poisson(m), summed
  term by term; `joined_extra` is the time each prompt adds on average."""
  m, step, first, more = 0.7, 0.002, 0.005, 0.009
  ks = np.arange(60)
  pmf = np.array([math.exp(-m) * m**k / math.factorial(k) for k in ks])
  T = step + first * (ks > 0) + more * np.maximum(ks - 1, 0)
  mean, second = (float(e) for e in lf.iteration_moments(m, step, first, more))
  assert mean == pytest.approx(float(pmf @ T), rel=1e-12)
  assert second == pytest.approx(float(pmf @ T**2), rel=1e-12)
  per_prompt = float(lf.joined_extra(m, first, more))
  assert per_prompt * m == pytest.approx(mean - step, rel=1e-12)
  # Light load: the first prompt's cost; heavy: each further one's.
  assert float(lf.joined_extra(1e-6, first, more)) == pytest.approx(first, rel=1e-5)
  assert float(lf.joined_extra(1e4, first, more)) == pytest.approx(more, rel=1e-3)


def test_the_residual_is_length_biased():
  """Iterations of 1 ms (90% of them) and 10 ms: a Poisson arrival waits E[T^2]/(2E[T]),
  found by sampling arrivals over a long run of such iterations."""
  rng = np.random.default_rng(0)
  lengths = np.where(rng.random(200_000) < 0.9, 0.001, 0.010)
  ends = np.cumsum(lengths)
  arrivals = rng.random(100_000) * ends[-1]
  waits = ends[np.searchsorted(ends, arrivals)] - arrivals
  mean, second = float(np.mean(lengths)), float(np.mean(lengths**2))
  assert float(np.mean(waits)) == pytest.approx(float(lf.residual(mean, second)), rel=0.02)
  share = float(np.sum(lengths[lengths > 0.005]) / np.sum(lengths))
  q90 = float(lf.residual_quantile(0.9, 0.001, 0.010, share))
  assert float(np.quantile(waits, 0.9)) == pytest.approx(q90, rel=0.02)
  assert float(lf.residual(0.004)) == pytest.approx(0.002)  # Fixed length: half of it.


def test_a_burst_follows_a_long_iteration():
  """Arrivals during an iteration of `own` seconds join the next: its length, and each
  next one's, exceed the mean by lam*x times the previous excess; the sum is the
  geometric series `burst_excess`."""
  lam_, x, own, gap = 50.0, 0.006, 0.010, 0.002
  excess, total = own - gap, 0.0
  for _ in range(200):
    excess *= lam_ * x
    total += excess
  assert float(lf.burst_excess(lam_, x, own, gap)) == pytest.approx(total, rel=1e-9)
