"""The load model: how much load one replica takes, and what the load does to it.

A replica with at most B sequences running (its slots) serves requests of a
P-token prompt and G outputs arriving at rate lam (Poisson). Its running count n
is a birth-death chain: a request arrives at lam and takes a slot if one is free
(else it queues); with n running, requests leave at n / hold(n), a request
holding its slot for its prompt's service and G - 1 token gaps at the loaded gap
of that occupancy (`hold_time`). Everything the replica does at a load comes
from the chain's stationary distribution and the cost model's iteration at each
occupancy (the caller evaluates it): the mean occupancy, the slots' utilisation,
the gap a user sees (TPOT), TTFT (the wait for a slot, the wait for the
prefill, the iteration under way, the service) with its p90, the share of
inter-token gaps over the target (p99 ITL), and the largest rate that meets the
targets. The formulas (sympy) are `jaxroof.symbolic.load_formulas`, named below
in backquotes; a pool of servers behind one queue is `load_pools`.

Per occupancy n the caller gives: `step` the decode iteration of n rows;
`extra` the time one admitted prompt adds to the iterations it joins; `admit`
the prompt's own service once it has a slot; `chunk` the iteration that
carries a chunk of a prompt (chunked states) or None (whole prompts join one
iteration, the iteration-level scheduler). Then (`loaded_gap`) a decode token
waits `t/(1 - lam*t_x)`: iterations carry prompts at rate lam, each adding t_x.
Whole prompts that join one iteration together add unequal times: the first
hides under the decode's weight reads (the roofline's max), each further one adds
its full cost (`more`); K ~ Poisson(lam x gap) join an iteration, so the time
per prompt is `joined_extra` of the two, the gap a fixed point (`JOIN_ROUNDS`).

Deterministic holds: the chain's queue is M/M/c-like (B servers, state-dependent
holds). The wait of M/D/c is Cosmetatos's correction of M/M/c's
(`cosmetatos`); a spread of output lengths (squared coefficient of variation
cv2) interpolates to M/M/c at cv2 = 1 (`service_variability`). The states
below B are insensitive to the hold's distribution (as Erlang's loss system
is), which the chain keeps.

Evaluation is vectorised: rows (configurations) by states (occupancies). States
are integers, or for a long range nodes on a grid, each node standing for the
integers since the previous one (the chain's log-probability taken linear
between nodes, each segment summed as a geometric series). For a row, one pass
over its states gives every candidate B at once: the chain's weights below B do
not depend on B. The largest rate is found by a geometric bisection over lam of
"some candidate B meets every target" (each B's metrics rise with lam), O(S)
per row and step; the B it picks is the one with the largest max rate (ties:
the smaller).

References: `load_formulas`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics

import numpy as np

from jaxroof.symbolic import load_formulas as lf

JOIN_ROUNDS = 4  # Fixed-point rounds of the gap with prompts joining one iteration.
BISECTIONS = 17  # Geometric halvings of [upper * 1e-7, upper]: to 1.2e-4 relative.
FLOOR = 1e-7  # The smallest rate tried, as a share of the upper bound.
POISSON_TERMS = 16  # Prompts per iteration counted exactly for the p99 gap (beyond: none).
SLACK = 1e-9  # Relative: a value equal to its target meets it.
MODEL = ("birth-death chain over the running count n <= B (arrivals at lam; departures "
         "n / hold(n), hold = the prompt's service + (G - 1) x the loaded gap at n, prompts "
         "joining an iteration Poisson); queue waits M/M/c-like, corrected to deterministic "
         "holds (Cosmetatos); TTFT = slot wait + prefill wait + the length-biased residual "
         "iteration + service; p90 TTFT from the waits' exponential tail; TPOT the "
         "token-weighted mean gap; p99 ITL from the share of iterations carrying prefill")


# Inputs.
@dataclasses.dataclass(frozen=True)
class States:
  """Per-occupancy costs of R configurations (rows) at S running counts (columns).

  Attributes:
    n: (S,) running counts, whole and increasing, n[0] = 1; a node stands for the
      integers since the previous one.
    step: (R, S) decode iteration of n rows, s.
    extra: (R, S) time one admitted prompt adds to the iterations it joins, s.
    admit: (R, S) the prompt's own service once it has a slot, s.
    chunk: (R, S) an iteration carrying a prefill chunk, s; NaN where whole prompts
      join one iteration (no chunking at that occupancy).
    idle: (R,) a prompt's service on an idle replica, s.
    candidates: (R, S) the running counts allowed as the slots B.
    service: (R, S) the prompt's own time to its first token once its prefill starts, s,
      where it differs from `admit` (chunks: its last, partial chunk takes an iteration
      of its own unless another prompt fills it); None: `admit`.
    extra_alone: (R, S) what a prompt adds when no other is prefilling (its last chunk
      alone in an iteration), s, where it differs from `extra` (the prompts queued
      back to back); the load model weighs the two by the prefill's busy share. None:
      `extra`.
    more: (R, S) what each further whole prompt joining the same iteration adds, s
      (`joined_extra`), where it differs from `extra`; None: `extra`.
  """

  n: np.ndarray
  step: np.ndarray
  extra: np.ndarray
  admit: np.ndarray
  chunk: np.ndarray
  idle: np.ndarray
  candidates: np.ndarray
  service: np.ndarray | None = None
  extra_alone: np.ndarray | None = None
  more: np.ndarray | None = None

  @property
  def chunked(self) -> np.ndarray:
    return np.isfinite(self.chunk)

  def rows(self, index) -> States:
    """The rows `index` (an index array or a mask)."""
    return dataclasses.replace(
        self, step=self.step[index], extra=self.extra[index], admit=self.admit[index],
        chunk=self.chunk[index], idle=self.idle[index], candidates=self.candidates[index],
        service=None if self.service is None else self.service[index],
        extra_alone=None if self.extra_alone is None else self.extra_alone[index],
        more=None if self.more is None else self.more[index])

  def only(self, column: np.ndarray) -> States:
    """The same rows with one candidate each (`column`, per row)."""
    mask = np.zeros_like(self.candidates)
    mask[np.arange(len(column)), column] = True
    return dataclasses.replace(self, candidates=mask & self.candidates)


@dataclasses.dataclass(frozen=True)
class Targets:
  """The targets a load must meet: the mean token gap (TPOT), TTFT at `ttft_quantile`
  and the inter-token gap at `itl_quantile` within the token-gap target (None: not
  checked)."""

  token_gap_s: float
  ttft_s: float | None = None
  ttft_quantile: float = 0.9
  itl_quantile: float | None = 0.99


def integer_states(top: int) -> np.ndarray:
  """Every running count 1 .. top."""
  return np.arange(1, max(int(top), 1) + 1, dtype=float)


def node_states(top: int, exact: int = 128, ratio: float = 1.005,
                include: np.ndarray | None = None) -> np.ndarray:
  """Running counts 1 .. `exact`, then nodes `ratio` apart up to `top` (and `include`)."""
  top = max(int(top), 1)
  whole = np.arange(1, min(exact, top) + 1, dtype=float)
  if top > exact:
    count = int(math.ceil(math.log(top / exact) / math.log(ratio)))
    grid = np.unique(np.round(exact * ratio**np.arange(1, count + 1)))
    whole = np.concatenate([whole, grid[grid <= top], [float(top)]])
  if include is not None:
    whole = np.concatenate([whole, np.asarray(include, dtype=float)])
  return np.unique(whole[(whole >= 1) & (whole <= top)])


# The chain.
def _poisson_tail(mean: np.ndarray, kmin: np.ndarray) -> np.ndarray:
  """P(K >= kmin), K Poisson with `mean`; kmin <= 0 gives 1; kmin past the counted
  terms gives 0."""
  mean, kmin = np.broadcast_arrays(mean, kmin)
  tail = np.where(kmin <= 0, 1.0, 0.0)
  mid = np.nonzero((kmin >= 1) & (kmin <= POISSON_TERMS))
  if not mid[0].size:
    return tail
  x, k = mean[mid], kmin[mid]
  pmf = np.exp(-x)
  cdf = np.zeros_like(x)
  below = np.zeros_like(x)  # P(K < k).
  for i in range(int(k.max())):
    cdf = cdf + pmf
    below = np.where(k == i + 1, cdf, below)
    pmf = pmf * x / (i + 1)
  tail[mid] = np.clip(1.0 - below, 0.0, 1.0)
  return tail


def _segments(n: np.ndarray, C: np.ndarray):
  """Each segment's log-mass (states n[j-1] + 1 .. n[j], log-probability C linear
  between nodes) and the share of the way from n[j-1] to n[j] of its mean state."""
  d = np.diff(np.concatenate([[0.0], n]))[None, :]
  prev = np.concatenate([np.zeros_like(C[:, :1]), C[:, :-1]], axis=1)
  delta = (C - prev) / d
  small = np.abs(delta) < 1e-9
  safe = np.where(small, 1.0, delta)
  # sum_{i=1..d} exp(prev + i*delta), written around whichever end is larger.
  up = C + np.log(np.where(small, d, -np.expm1(-d * safe) / -np.expm1(-safe)))
  down = prev + safe + np.log(np.where(small, d, np.expm1(d * safe) / np.expm1(safe)))
  log_mass = np.where(small, C + np.log(d), np.where(delta >= 0, up, down))
  # Mean state, as a share of the segment: d - E[j], E[j] over j = 0 .. d-1 weighted
  # exp(-j*delta).
  with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
    back = 1 / np.expm1(safe) - d / np.expm1(d * safe)
  back = np.where(small | ~np.isfinite(back), (d - 1) / 2, back)
  return log_mass, np.clip((d - back) / d, 0.0, 1.0)


def evaluate(states: States, rate, output_tokens: int, targets: Targets, cv2: float = 0.0,
             brief: bool = False) -> dict[str, np.ndarray]:
  """Every candidate B of every row at `rate` (per row, requests/s): (R, S) arrays.

  Keys: `stable`, `mean_running`, `slot_utilisation` (mean running / B),
  `token_gap_s` (TPOT: the token-weighted mean gap), `ttft_s` (mean), `ttft_q_s` (at
  `targets.ttft_quantile`), `slot_wait_s`, `prefill_wait_s`, `service_s` (the
  prompt's own service, arrival-averaged), `p_wait` (share of requests waiting for a
  slot), `slow_itl_share` (share of inter-token gaps over the token-gap target),
  `rho` (the slots' utilisation at full occupancy) and `meets`; with `brief`, only what
  `meets` needs (`stable`, `rho`, `token_gap_s`, `slow_itl_share`, `p_wait`,
  `slot_wait_s`, `ttft_q_s` where a TTFT target is given, and `meets`).
  """
  G = float(output_tokens)
  n = np.asarray(states.n, dtype=float)
  lam_ = np.asarray(rate, dtype=float).reshape(-1, 1)
  step, extra, admit, chunk = states.step, states.extra, states.admit, states.chunk
  chunked = np.isfinite(chunk)
  with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
    st = _state(states, lam_, G, targets.ttft_quantile)
    extra, more, gap, hold = st["extra"], st["more"], st["gap"], st["hold"]
    prefill_u = np.where(chunked, lam_ * admit, 0.0)  # A chunked prompt's server's load.
    ok = (lam_ * extra < 1) & (prefill_u < 1) & (gap > 0) & np.isfinite(hold)
    ok = np.logical_and.accumulate(ok, axis=1)  # A B past an unstable occupancy fails.
    gap = np.where(ok, gap, np.inf)
    hold = np.where(ok, hold, np.inf)
    # log pi: sum over m <= n of log(lam*hold(m)) (linear between nodes) - log(n!).
    L = np.log(lam_ * hold)
    d = np.diff(np.concatenate([[0.0], n]))
    Lprev = np.concatenate([L[:, :1], L[:, :-1]], axis=1)
    inc = d * Lprev + (d + 1) / 2 * (L - Lprev) - np.diff(_log_factorial(np.concatenate([[0.0], n
                                                                                        ])))
    C = np.cumsum(np.where(ok, inc, np.nan), axis=1)
    C = np.where(np.isfinite(C), C, -np.inf)
    shift = np.maximum(np.max(C, axis=1, keepdims=True), 0.0)
    log_mass, share = _segments(n, np.where(np.isfinite(C), C, -1e300))
    mass = np.where(np.isfinite(C), np.exp(log_mass - shift), 0.0)
    mass0 = np.exp(-shift)
    point = np.where(np.isfinite(C), np.exp(C - shift), 0.0)  # The state n itself.

    def avg(f):  # A per-state quantity averaged over each segment.
      prev = np.concatenate([f[:, :1], f[:, :-1]], axis=1)
      return prev + (f - prev) * share

    rate_n = n / st["request_gap"]  # Tokens per second at n.
    # A lone prompt's last chunk takes an iteration of its own; behind another prompt its
    # chunks share iterations (the prefill's busy share weighs the two).
    service = admit if states.service is None else (admit + (1 - np.clip(lam_ * admit, 0.0, 1.0)) *
                                                    (states.service - admit))
    q = targets.ttft_quantile
    with_ttft = not brief or targets.ttft_s is not None
    with_itl = not brief or targets.itl_quantile is not None
    slow = (_slow_share(lam_, step, states.extra, more, admit, chunk, gap, targets.token_gap_s)
            if with_itl else np.zeros_like(gap))
    rho = lam_ * hold / n
    cum = lambda f: np.cumsum(mass * avg(f), axis=1)  # noqa: E731
    c_mass = np.cumsum(mass, axis=1)
    c_n = cum(np.broadcast_to(n, mass.shape))
    c_rate = cum(rate_n)
    c_slow = cum(rate_n * slow) if with_itl else np.zeros_like(c_n)
    queue = lf.queue_model()(rho=rho, B=np.broadcast_to(n, rho.shape), cv2_hold=cv2)
    stable = ok & (rho < 1) & np.isfinite(C)  # pi(B) may underflow far above the mode.
    tail = np.where(stable, point * rho * queue["waiting"], 0.0)  # States past B.
    waiting = np.where(stable, point * queue["waiting"], 0.0)  # States >= B.
    Z = mass0 + c_mass + tail
    idle = states.idle.reshape(-1, 1)
    # An arrival at a state below B starts at once; at B or above it waits, then starts
    # as a slot frees (taken at B's costs).
    arrive = lambda c, f, f0: (mass0 * f0 + c - point * f + waiting * f) / Z  # noqa: E731
    tokens = c_rate + tail * rate_n
    out = {
        "stable": stable,
        "rho": rho,
        "token_gap_s": (c_n + tail * n) / tokens,
        "slow_itl_share": (c_slow + tail * rate_n * slow) / tokens,
        "p_wait": waiting / Z,
    }
    mmc = point * queue["queue"] / Z / lam_
    out["slot_wait_s"] = np.where(stable, mmc * queue["variability"], np.inf)
    if with_ttft:
      base_q = st["residual_q"] + service + st["others"] + st["spread"]
      u = arrive(cum(prefill_u), prefill_u, 0.0)
      out["ttft_q_s"] = arrive(cum(base_q), base_q, idle) + _wait_quantile(
          out["slot_wait_s"], out["p_wait"], u, None, lam_, q)
    if not brief:
      out["mean_running"] = (c_n + tail * n) / Z
      out["extra_s"] = (cum(extra) + tail * extra) / Z  # A prompt's added time, over states.
      out["slot_utilisation"] = out["mean_running"] / n
      pre_wait = np.where(chunked, lf.md1_model()(lam=lam_, D_pf=admit)["wait"], 0.0)
      out["prefill_wait_s"] = arrive(cum(pre_wait), pre_wait, 0.0)
      out["service_s"] = arrive(cum(service), service, idle)
      base = st["residual"] + service + st["others"]
      out["ttft_s"] = (arrive(cum(base), base, idle) + out["slot_wait_s"] + out["prefill_wait_s"])
    gap_ok = out["token_gap_s"] <= targets.token_gap_s * (1 + SLACK)
    ttft_ok = (True if targets.ttft_s is None else out["ttft_q_s"] <= targets.ttft_s * (1 + SLACK))
    itl_ok = (True if targets.itl_quantile is None else out["slow_itl_share"]
              <= (1 - targets.itl_quantile) * (1 + SLACK))
    out["meets"] = states.candidates & stable & gap_ok & ttft_ok & itl_ok
    if with_ttft:
      out["meets"] &= np.isfinite(out["ttft_q_s"])
  return out


def _joined(states: States, lam_) -> tuple[np.ndarray, np.ndarray]:
  """(the time a prompt adds at rate `lam_`, each further joining prompt's) per state:
  a chunked prompt's blended with its last chunk alone by the prefill's busy share;
  whole prompts' by `joined_extra` at the gap's fixed point."""
  lam_ = np.asarray(lam_, dtype=float)
  lam_ = lam_ if lam_.ndim == 2 else lam_.reshape(-1, 1)  # Per row, or per state (R, S).
  extra = states.extra
  if states.extra_alone is not None:  # Idle prefill between prompts: the last chunk alone.
    busy = np.clip(lam_ * states.admit, 0.0, 1.0)
    extra = extra + (1 - busy) * (states.extra_alone - extra)
  if states.more is None:
    return extra, np.broadcast_to(extra, np.broadcast_shapes(extra.shape, lam_.shape))
  first = extra
  more = np.where(np.isfinite(states.chunk), first, np.maximum(states.more, first))
  gap = states.step / (1 - lam_ * first)
  for _ in range(JOIN_ROUNDS):
    m = np.maximum(lam_ * np.where(gap > 0, gap, np.inf), 1e-12)
    extra = np.where(np.isfinite(m), lf.joined_model()(m=m, t_x=first, t_m=more)["extra"], more)
    gap = states.step / (1 - lam_ * extra)
  return extra, more


def _state(states: States, lam_, G: float, q: float) -> dict[str, np.ndarray]:
  """Per state at rate `lam_` ((R, 1) or (R, S)): `extra`, `more` (`_joined`); `gap` the
  loaded gap; `excess` the burst after a request's own prefill (`burst_excess`) and
  `request_gap` its mean gap with it; `hold`; the TTFT's `residual` (and its q-quantile
  `residual_q`), the joining `others` and their `spread` at the quantile (zero for
  chunked states: their prompts queue for the prefill instead)."""
  lam_ = np.asarray(lam_, dtype=float)
  lam_ = lam_ if lam_.ndim == 2 else lam_.reshape(-1, 1)
  extra, more = _joined(states, lam_)
  step, admit = states.step, states.admit
  chunked = np.isfinite(states.chunk)
  at = lf.state_model()(t=step, lam=lam_, t_x=extra, D_pf=admit, n_out=G)
  gap = at["gap"]
  m = np.clip(lam_ * np.where(gap > 0, gap, np.inf), 1e-12, 1e300)
  it = lf.iteration_model()(m=m, t=step, t_x=states.extra, t_m=more, lam=lam_, D_pf=admit, x=extra,
                            q=q, z=statistics.NormalDist().inv_cdf(q))
  live = ~chunked & np.isfinite(gap) & (gap > 0)
  excess = np.where(live, np.maximum(np.nan_to_num(it["excess"], nan=np.inf), 0.0), 0.0)
  excess = np.where(np.isfinite(gap), excess, np.inf)
  request_gap = gap + excess / max(G - 1.0, 1.0)
  return {
      "extra": extra, "more": more, "gap": gap, "excess": excess, "request_gap": request_gap,
      "hold": at["hold"] + excess, "residual": np.where(live, it["residual"],
                                                        gap * _residual_factor()),
      "residual_q": np.where(live, it["residual_q"], gap * q),
      "others": np.where(live, it["others"], 0.0), "spread": np.where(live, it["spread"], 0.0)
  }


def _wait_quantile(slot_wait, p_wait, u, service, lam_, q: float) -> np.ndarray:
  """The q-quantile of the wait before a prompt's first chunk: the slot's (positive with
  probability p_wait, then exponential) and the chunked prefill's M/D/1 (tail
  C exp(-theta t), `md1_decay`, u its load, service / u its service) together, from
  P(W > t) ~ p_wait exp(-t p_wait / slot_wait) + C exp(-theta t) = 1 - q (Newton, where
  the prefill queues at all; elsewhere the slot's alone)."""
  del service  # The prefill's service is u / lam.
  with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
    slot = lf.quantile_model()(t_w=slot_wait, p_w=np.clip(p_wait, 1e-300, 1.0), p_q=q)["q"]
    shape = np.broadcast_shapes(np.shape(slot_wait), np.shape(u), np.shape(lam_))
    t = np.array(np.broadcast_to(slot, shape), dtype=float)
    u = np.broadcast_to(np.clip(u, 0.0, 1.0 - 1e-12), shape)
    live = u > 1e-9
    if live.any():
      u_, w_, p_ = u[live], np.broadcast_to(slot_wait, shape)[live], np.broadcast_to(p_wait,
                                                                                     shape)[live]
      d = u_ / np.broadcast_to(lam_, shape)[live]  # The prefill's service, s.
      x = 2 * np.log(2 / u_) + 1  # Right of the root.
      for _ in range(12):
        at = lf.md1_tail_model()(x=x, u=u_)
        x = x - at["f"] / at["df"]
      weight = lf.md1_tail_model()(x=x, u=u_)["weight"]
      theta = x / d
      rate_slot = np.where(w_ > 0, np.clip(p_, 1e-300, 1.0) / w_, np.inf)
      pre = np.where(weight > 1 - q, np.log(weight / (1 - q)) / theta, 0.0)
      tl = np.maximum(t[live], pre)  # Each tail alone is below 1 - q here: solve to the right.
      for _ in range(8):
        tails = p_ * np.exp(-rate_slot * tl) + weight * np.exp(-theta * tl)
        slope = -(p_ * rate_slot * np.exp(-rate_slot * tl) + weight * theta * np.exp(-theta * tl))
        step_ = np.where(slope < 0, (tails - (1 - q)) / slope, 0.0)
        tl = np.maximum(tl - np.nan_to_num(step_, nan=0.0, posinf=0.0, neginf=0.0), 0.0)
      t[live] = tl
  return np.where(np.isfinite(np.broadcast_to(slot_wait, shape)), t, np.inf)


@functools.cache
def _residual_factor() -> float:
  return float(lf.residual(1))


def _log_factorial(n: np.ndarray) -> np.ndarray:
  return np.array([math.lgamma(x + 1.0) for x in n])


def _slow_share(lam_, step, extra, more, admit, chunk, gap, target: float) -> np.ndarray:
  """Share of iterations at each occupancy longer than the token-gap target.

  Chunked: an iteration carries a chunk with the prefill's busy share (`busy_share`, the
  prompt's server busy lam*admit of the time); whole prompts: K ~ Poisson(lam*gap)
  prompts join an iteration of `step + extra + (K - 1)*more` (K > 0)."""
  chunked = np.isfinite(chunk)
  u = np.clip(lam_ * admit, 0.0, 1.0)
  busy = lf.busy_model()(u=u, t_c=np.where(chunked, chunk, 1.0), t=step)["share"]
  over = lambda x: (x > target * (1 + SLACK)).astype(float)  # noqa: E731
  by_chunk = busy * over(np.where(chunked, chunk, 0.0)) + (1 - busy) * over(step)
  top = target * (1 + SLACK)
  room = (top - step - extra) / np.where(more > 0, more, np.inf)
  kmin = np.where(more > 0, np.floor(room) + 2, POISSON_TERMS + 1)  # No extra: never slow.
  kmin = np.where(step + extra > top, 1, kmin)
  kmin = np.where(step > top, 0, kmin)
  kmin = np.where(np.isfinite(kmin), kmin, POISSON_TERMS + 1)
  by_prompt = _poisson_tail(lam_ * gap, kmin)
  return np.where(chunked, by_chunk, by_prompt)


def slot_fill(states: States, output_tokens: int, joined: bool = True) -> np.ndarray:
  """(R, S): `slot_fill_rate` at each candidate B (requests/s); with `joined`, the time
  a prompt adds at that rate (`joined_extra`, a fixed point), else the first prompt's
  (an upper bound)."""
  B_ = np.broadcast_to(states.n, states.step.shape)
  extra, admit = states.extra, states.admit
  rounds = JOIN_ROUNDS + 1 if joined and states.more is not None else 1
  with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
    for round_ in range(rounds):
      out = lf.fill_model()(D_pf=admit, t=states.step, t_x=extra, n_out=float(output_tokens), B=B_)
      rate = np.asarray(out["rate"], dtype=float)
      rate = np.where(np.isfinite(rate) & (rate > 0), rate, 0.0)
      if round_ < rounds - 1:  # The hold at this rate: joined prompts, the burst after one's own.
        st = _state(states, rate, float(output_tokens), 0.9)
        extra, admit = st["extra"], states.admit + st["excess"]
  return rate


@dataclasses.dataclass(frozen=True)
class MaxRate:
  """The largest rate per row meeting the targets, and the B that gives it.

  `rate` (R,) requests/s (0 where nothing meets); `column` (R,) the state index of
  the chosen B (-1 where nothing meets); `B` (R,) its value (0 where none)."""

  rate: np.ndarray
  column: np.ndarray
  B: np.ndarray


def max_rate(states: States, output_tokens: int, targets: Targets, cv2: float = 0.0,
             upper: np.ndarray | None = None) -> MaxRate:
  """The largest rate at which some candidate B of each row meets `targets`, by a
  geometric bisection; the chosen B is the smallest that meets at that rate (the B
  of the largest max rate)."""
  if upper is None:
    fill = np.where(states.candidates, slot_fill(states, output_tokens, joined=False), 0.0)
    upper = np.max(fill, axis=1, initial=0.0)
  upper = np.asarray(upper, dtype=float)
  rows = len(upper)
  live = upper > 0
  lo = np.where(live, upper * FLOOR, 0.0)
  hi = upper.copy()

  def meets(rate):
    return evaluate(states, np.where(live, rate, 1.0), output_tokens, targets, cv2,
                    brief=True)["meets"]

  feasible = live & meets(lo).any(axis=1)
  top = feasible & meets(hi * (1 - 1e-12)).any(axis=1)
  for _ in range(BISECTIONS):
    mid = np.sqrt(lo * np.where(live, hi, 1.0))
    ok = meets(mid).any(axis=1)
    lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
  rate = np.where(top, upper * (1 - 1e-12), lo)
  final = meets(np.where(feasible, rate, 1.0)) & feasible[:, None]
  column = np.where(final.any(axis=1), np.argmax(final, axis=1), -1)
  rate = np.where(column >= 0, rate, 0.0)
  B = np.where(column >= 0, np.asarray(states.n)[np.maximum(column, 0)], 0.0)
  del rows  # Unused.
  return MaxRate(rate=rate, column=column, B=B)


def at(states: States, rate, column: np.ndarray, output_tokens: int, targets: Targets,
       cv2: float = 0.0) -> dict[str, np.ndarray]:
  """`evaluate`'s values of each row's chosen B (`column`) at `rate` (R,)."""
  out = evaluate(states, rate, output_tokens, targets, cv2)
  idx = np.maximum(np.asarray(column), 0)[:, None]
  return {
      k: np.take_along_axis(np.asarray(v, dtype=float), idx, axis=1)[:, 0] for k, v in out.items()
  }


def itl_quantile(states: States, rate: float, column: int, output_tokens: int,
                 quantile: float = 0.99, row: int = 0) -> float:
  """The inter-token gap at `quantile` of one row's chosen B at `rate`: token-weighted
  over the occupancies below B, each iteration decode-only or carrying prefill
  (a chunk, or K ~ Poisson(lam*gap) whole prompts)."""
  B = int(column)
  one = states.rows([row])
  lam_ = float(rate)
  n = np.asarray(one.n[:B + 1], dtype=float)
  step, first, admit = one.step[0, :B + 1], one.extra[0, :B + 1], one.admit[0, :B + 1]
  chunk = one.chunk[0, :B + 1]
  with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
    st = _state(one, np.array([[lam_]]), float(output_tokens), 0.9)
    more, gap, hold = (st[k][0, :B + 1] for k in ("more", "gap", "hold"))
    request_gap = st["request_gap"][0, :B + 1]
    L = np.log(lam_ * hold)
    d = np.diff(np.concatenate([[0.0], n]))
    Lprev = np.concatenate([L[:1], L[:-1]])
    C = np.cumsum(d * Lprev + (d + 1) / 2 * (L - Lprev) -
                  np.diff(_log_factorial(np.concatenate([[0.0], n]))))
    rho = lam_ * hold[-1] / n[-1]
    w = np.exp(C - np.max(C)) * d
    w[-1] = w[-1] / max(1 - rho, 1e-12)  # The queue's states run at B.
    w = w * n / request_gap  # Tokens per second at each occupancy.
  values, weights = [step], [w]
  chunked = np.isfinite(chunk)
  u = np.clip(lam_ * admit, 0.0, 1.0)
  busy = np.where(chunked,
                  lf.busy_model()(u=u, t_c=np.where(chunked, chunk, 1.0), t=step)["share"], 0.0)
  weights[0] = w * (1 - busy)
  values.append(np.where(chunked, chunk, 0.0))
  weights.append(w * busy)
  mean = lam_ * gap
  pmf = np.exp(-mean)
  for k in range(POISSON_TERMS):
    if k:
      values.append(step + first + (k - 1) * more)
      weights.append(np.where(chunked, 0.0, w * pmf))
    else:
      weights[0] = np.where(chunked, weights[0], w * pmf)
    pmf = pmf * mean / (k + 1)
  v, wt = np.concatenate(values), np.concatenate(weights)
  keep = np.isfinite(v) & (wt > 0)
  v, wt = v[keep], wt[keep]
  if not v.size:
    return math.nan
  order = np.argsort(v)
  cdf = np.cumsum(wt[order]) / np.sum(wt)
  return float(v[order][min(np.searchsorted(cdf, quantile), len(v) - 1)])
