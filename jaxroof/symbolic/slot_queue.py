"""The decode-slot queue evaluated: a replica's mean TTFT with its wait for a slot,
and the largest arrival rate that keeps it on target.

A shared replica runs at most B sequences; a request holds its slot from its
prefill to its last token (`request_formulas.slot_hold_time`). Near the slots'
capacity the wait for a free one (`request_formulas.slot_wait`, G/G/c) grows
without bound, which M/D/1 on the prefill alone cannot see: a plan at 99.9% of
its slots' capacity looked fine to the mean TTFT and its simulated p90 grew
with the length of the run. The wait has no closed-form inverse in the rate, so
the largest rate meeting a target is found by vectorised bisection (the waits
rise with the rate). The planner and the serving decision both ask here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from jaxroof.symbolic import request_formulas
from jaxroof.symbolic import symbols as S
from jaxroof.symbolic.lambdify import lambdified

BISECTIONS = 32  # Halvings of the rate interval: 2**-32 of it, far below any dp step.
WAIT_SHARES = (0.1, 0.25, 0.5)  # Shares of a split plan's TTFT target it may spend waiting
# for a decode slot; the rest goes to the prefill queue, the prefill and the K/V transfer.
MODEL = ("decode slots: G/G/c wait for one of the batch's B slots (Sakasegawa's "
         "approximation, Poisson arrivals; hold-time variance from the output lengths), each "
         "held from prefill to "
         "last token; then the M/D/1 prefill queue")


@functools.cache
def _shared():
  hold = request_formulas.slot_hold_time()
  return lambdified(
      {
          "ttft_s": request_formulas.loaded_ttft(),
          "slot_wait_s": request_formulas.slot_wait(hold=hold),
          "slot_utilisation": request_formulas.slot_utilisation(hold=hold),
          "hold_s": hold,
      }, (S.t, S.lam, S.D_pf, S.B, S.n_out, S.t_window, S.cv2_hold))


@functools.cache
def _decode_pool():
  hold = request_formulas.decode_pool_hold_time()
  return lambdified(
      {
          "slot_wait_s": request_formulas.slot_wait(hold=hold),
          "slot_utilisation": request_formulas.slot_utilisation(hold=hold),
          "tpot_s": request_formulas.decode_pool_tpot(),
      }, (S.t, S.lam, S.B, S.n_out, S.cv2_hold))


@functools.cache
def _wait():
  return lambdified(
      {
          "slot_wait_s": request_formulas.slot_wait(),
          "slot_utilisation": request_formulas.slot_utilisation(),
      }, (S.lam, S.t_hold, S.B, S.cv2_hold))


def wait_for_slot(rate, hold_s, batch, cv2: float = 0.0) -> dict[str, np.ndarray]:
  """`slot_wait_s` and `slot_utilisation` of `batch` slots, each held `hold_s` seconds
  (squared coefficient of variation `cv2`), at `rate` requests/s (the wait is
  meaningful only where the utilisation is < 1)."""
  with np.errstate(divide="ignore", invalid="ignore"):
    return _wait()(lam=rate, t_hold=hold_s, B=batch, cv2_hold=cv2)


def shared_at(step_s, prefill_s, batch, output_tokens: int, rate,
              cv2: float = 0.0) -> dict[str, np.ndarray]:
  """A shared replica at `rate` requests/s: `ttft_s` (slot wait + M/D/1 prefill queue
  + the prompt's iteration), `slot_wait_s`, `slot_utilisation`, `hold_s`; the waits
  are meaningful only where `slot_utilisation < 1`."""
  with np.errstate(divide="ignore", invalid="ignore"):
    return _shared()(t=step_s, lam=rate, D_pf=prefill_s, B=batch, n_out=float(output_tokens),
                     t_window=0.0, cv2_hold=cv2)


def decode_pool_at(step_s, batch, output_tokens: int, rate,
                   cv2: float = 0.0) -> dict[str, np.ndarray]:
  """A decode-only replica (a split plan's decode pool) at `rate`: the wait for a slot,
  held for the request's n_out - 1 steps, the slots' utilisation and the mean TPOT."""
  with np.errstate(divide="ignore", invalid="ignore"):
    return _decode_pool()(t=step_s, lam=rate, B=batch, n_out=float(output_tokens), cv2_hold=cv2)


def largest_rate(meets: Callable[[np.ndarray, np.ndarray], np.ndarray],
                 upper: np.ndarray) -> np.ndarray:
  """The largest rate in (0, upper] with `meets(rate, index)` (true below some rate,
  false above), per element, by bisection; 0 where `upper <= 0`. `index` selects the
  elements `rate` belongs to, so `meets` can slice its other arrays."""
  upper = np.asarray(upper, dtype=float)
  found = np.zeros_like(upper)
  live = np.nonzero(upper > 0)[0]
  if live.size == 0:
    return found
  lo, hi = np.zeros(live.size), upper[live]
  top = meets(hi, live)
  for _ in range(BISECTIONS):
    mid = (lo + hi) / 2
    ok = meets(mid, live)
    lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
  found[live] = np.where(top, upper[live], lo)
  return found


def shared_rate_for_ttft(step_s, prefill_s, batch, output_tokens: int, ttft_s: float, upper,
                         cv2: float = 0.0) -> np.ndarray:
  """The largest rate <= `upper` whose mean TTFT with the slot wait meets `ttft_s`
  with the slots under full use (`shared_at`)."""
  step_s, prefill_s, batch = (np.broadcast_to(np.asarray(a, dtype=float), np.shape(upper))
                              for a in (step_s, prefill_s, batch))

  def meets(rate, i):
    at = shared_at(step_s[i], prefill_s[i], batch[i], output_tokens, rate, cv2)
    return (at["slot_utilisation"] < 1) & (at["ttft_s"] > 0) & (at["ttft_s"] <= ttft_s)

  return largest_rate(meets, upper)


def decode_pool_rate(step_s, batch, output_tokens: int, token_gap_s: float, max_wait_s: float,
                     upper, cv2: float = 0.0) -> np.ndarray:
  """The largest rate <= `upper` at which a decode pool's slot wait is at most
  `max_wait_s` and its mean TPOT, the step plus the wait spread over the request's
  n_out - 1 gaps, meets `token_gap_s`."""
  step_s, batch = (
      np.broadcast_to(np.asarray(a, dtype=float), np.shape(upper)) for a in (step_s, batch))

  def meets(rate, i):
    at = decode_pool_at(step_s[i], batch[i], output_tokens, rate, cv2)
    wait = at["slot_wait_s"]
    return ((at["slot_utilisation"] < 1) & (wait >= 0) & (wait <= max_wait_s) &
            (at["tpot_s"] <= token_gap_s))

  return largest_rate(meets, upper)
