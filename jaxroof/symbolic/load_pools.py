"""One queue in front of alike servers of fixed service (a split plan's prefill pool).

M/D/c: Erlang C's probability of waiting and its mean wait corrected to deterministic
service by Cosmetatos (`load_formulas.service_variability`), the p90 from the wait's
exponential tail (`load_formulas.wait_quantile`); the fewest servers meeting a TTFT
budget at a rate, and the largest rate a pool of servers carries within one.
"""

from __future__ import annotations

import numpy as np

from jaxroof.symbolic import load_formulas as lf
from jaxroof.symbolic.load_model import BISECTIONS, SLACK


def pool_wait(rate, service, servers, cv2: float = 0.0) -> dict[str, np.ndarray]:
  """One queue in front of `servers` alike servers of fixed `service` (a split plan's
  prefill pool): Erlang C's probability of waiting and its mean wait, corrected to
  deterministic service (`service_variability`), and the wait's p90 (`wait_quantile`).
  Arrays broadcast; `stable` False where rate x service >= servers."""
  rate, service, servers = np.broadcast_arrays(
      *(np.asarray(x, dtype=float) for x in (rate, service, servers)))
  a = rate * service
  top = int(np.max(servers, initial=1))
  erlang_b = np.ones_like(a)
  for k in range(1, top + 1):  # Erlang B by its recursion, stopped at each pool's size.
    step = a * erlang_b / (k + a * erlang_b)
    erlang_b = np.where(k <= servers, step, erlang_b)
  rho = a / servers
  stable = rho < 1
  with np.errstate(divide="ignore", invalid="ignore"):
    p_wait = np.where(stable, erlang_b / (1 - rho * (1 - erlang_b)), 1.0)
    queue = lf.queue_model()(rho=np.where(stable, rho, 0.5), B=servers, cv2_hold=cv2)
    wait = np.where(stable, p_wait * service / (servers - a) * queue["variability"], np.inf)
    q90 = lf.quantile_model()(t_w=wait, p_w=np.clip(p_wait, 1e-300, 1.0), p_q=0.9)["q"]
  return {
      "p_wait": p_wait, "wait_s": wait, "wait_p90_s": np.where(stable, q90, np.inf),
      "stable": stable
  }


def fewest_servers(rate, service, budget, quantile: float = 0.9) -> np.ndarray:
  """Per element, the fewest servers of one queue (`pool_wait`) whose wait at `quantile`
  plus the service meets `budget` at `rate`; 0 where the service alone misses it."""
  rate, service, budget = np.broadcast_arrays(
      *(np.asarray(x, dtype=float) for x in (rate, service, budget)))
  del quantile  # `pool_wait` gives the p90.
  servers = np.maximum(np.floor(rate * service) + 1, 1.0)
  live = budget > service
  done = ~live
  for _ in range(200):
    q = pool_wait(rate, service, np.where(done, 1.0, servers))
    ok = q["stable"] & (q["wait_p90_s"] + service <= budget * (1 + SLACK))
    done |= ok
    if done.all():
      break
    servers = np.where(done, servers, servers + np.maximum(np.floor(servers / 16), 1.0))
  return np.where(live & done, servers, 0.0)


def pool_rate(servers, service, budget) -> np.ndarray:
  """Per element, the largest rate one queue over `servers` (`pool_wait`) carries with its
  p90 wait plus the service within `budget` (bisection; 0 where the service misses)."""
  servers, service, budget = np.broadcast_arrays(
      *(np.asarray(x, dtype=float) for x in (servers, service, budget)))
  hi = np.where(budget > service, servers / service, 0.0)
  lo = np.zeros_like(hi)
  for _ in range(BISECTIONS):
    mid = (lo + hi) / 2
    q = pool_wait(np.maximum(mid, 1e-300), service, servers)
    ok = q["stable"] & (q["wait_p90_s"] + service <= budget * (1 + SLACK))
    lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
  return lo
