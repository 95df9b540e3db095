"""Time to first token under load: an M/D/1 prefill server, means only.

Stated model (`jaxroof.symbolic.request_formulas`): requests arrive as a Poisson
process at `arrival_rate`; a prefill takes a fixed `service_s`; prefills run
one at a time with priority over decode steps. Then

  mean wait  = lam*D**2 / (2*(1 - lam*D)),   valid only while lam*D < 1,
  mean TTFT  = wait + batching window + D.

With a batched prefill (`batch` prompts per prefill of `service_s`, the
batching window collecting them), batches queue instead: arrival rate
lam/batch, utilisation lam*D/batch, the same M/D/1 wait; the speed-up is
whatever `prefill(P, batch) < batch * prefill(P, 1)` gives.

Past `lam*D >= 1` the queue grows without bound: the result says "unstable"
and carries no TTFT (never a NaN or a negative wait). Percentiles need the
simulator; these are means.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from jaxroof import errors
from jaxroof.symbolic import request_formulas
from jaxroof.symbolic.evaluate import formula_function, lambdified
from jaxroof.symbolic.symbols import D_pf, lam, t_ttft, t_window

MODEL = ("M/D/1 prefill server: Poisson arrivals, deterministic prefill time, one "
         "prefill at a time with priority over decode; means, not percentiles")


@functools.cache
def _evaluators():
  inputs = (lam, D_pf, t_window, t_ttft)
  return lambdified(
      {
          "utilisation": request_formulas.utilisation(),
          "wait_s": request_formulas.md1_wait(),
          "ttft_s": request_formulas.ttft(),
          "max_rate": request_formulas.max_arrival_rate_for_ttft(),
      }, inputs)


@functools.cache
def _utilisation():
  return lambdified({"utilisation": request_formulas.utilisation()}, (lam, D_pf))


@dataclasses.dataclass(frozen=True)
class QueueResult:
  """Mean TTFT of one prefill server at one load."""

  arrival_rate_per_s: float
  service_s: float
  window_s: float
  utilisation: float  # lam * D; >= 1 is unstable.
  stable: bool
  wait_s: float | None  # None when unstable.
  ttft_s: float | None  # None when unstable.
  gather_s: float = 0.0  # Mean wait for a prefill batch of several prompts to gather.

  @property
  def status(self) -> str:
    return "stable" if self.stable else "unstable"


def ttft(arrival_rate: float, service_s: float, window_s: float = 0.0,
         batch: int = 1) -> QueueResult:
  """Mean TTFT at `arrival_rate` requests/s, prefill `service_s` of `batch`
  prompts at once, batching window `window_s`."""
  batch = errors.require_positive_int("prefill_batch", batch)
  errors.require_non_negative("arrival_rate", arrival_rate)
  arrival_rate = arrival_rate / batch  # Batches of prompts are what queue.
  errors.require_positive("service_s", service_s)
  errors.require_non_negative("batching_window", window_s)
  rho = float(_utilisation()(lam=arrival_rate, D_pf=service_s)["utilisation"])
  if rho >= 1:  # Checked first: the wait's formula divides by 1 - rho.
    return QueueResult(arrival_rate * batch, service_s, window_s, rho, False, None, None)
  out = _evaluators()(lam=arrival_rate, D_pf=service_s, t_window=window_s, t_ttft=1.0)
  gather = 0.0
  if batch > 1:  # Prompts wait for the batch to gather (serving.gathering_time).
    gather = (math.inf if arrival_rate == 0 else float(
        formula_function(request_formulas.gathering_time)(batch, arrival_rate * batch)))
  return QueueResult(arrival_rate * batch, service_s, window_s, rho, True, float(out["wait_s"]),
                     float(out["ttft_s"]) + gather, gather)


def max_arrival_rate(ttft_target_s: float, service_s: float, window_s: float = 0.0,
                     batch: int = 1) -> float:
  """Largest arrival rate (requests/s) whose mean TTFT meets the target.

  0 when even an idle server misses it (window + prefill > target); always
  below the capacity 1/D.
  """
  errors.require_positive("ttft target", ttft_target_s)
  errors.require_positive("service_s", service_s)
  errors.require_non_negative("batching_window", window_s)
  if window_s + service_s >= ttft_target_s:
    return 0.0
  out = _evaluators()(lam=0.0, D_pf=service_s, t_window=window_s, t_ttft=ttft_target_s)
  rate = batch * float(out["max_rate"])
  rate = rate if math.isfinite(rate) and rate > 0 else 0.0
  if batch == 1 or rate == 0.0:
    return rate
  # Batches gather faster at higher rates but queue longer: the largest rate meeting
  # the target, searched below the rate that meets it without gathering.
  meets = lambda r: ttft(r, service_s, window_s, batch).ttft_s <= ttft_target_s  # noqa: E731
  grid = rate * np.geomspace(1e-6, 1.0, 241)[::-1]
  ok = next((i for i, r in enumerate(grid) if meets(r)), None)
  if ok is None:
    return 0.0
  if ok == 0:
    return rate
  lo, hi = grid[ok], grid[ok - 1]
  for _ in range(60):
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if meets(mid) else (lo, mid)
  return float(lo)


def capacity(service_s: float, batch: int = 1) -> float:
  """Arrival rate at which the prefill server saturates: batch/D."""
  errors.require_positive("service_s", service_s)
  return batch / service_s
