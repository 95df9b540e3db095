"""One predictor for a published point: the one cost model, driven as the point was run.

Every value comes from iterations of the cost model (`published_setups.iteration`:
`rows` decode rows at the point's mean context `P + G/2`, `prompts` whole prompts of
P tokens), under an engine's terms (`kind="calibrated"`) or the analytic bound
(`kind="bound"`), vectorised over the points. How they are driven (`MODES`):

  step       a fixed batch's mean decode step: `t_d(b)` (static batching, lockstep)
  static     a fixed batch, prefilled together then decoded in lockstep: TTFT is the
             batch's prefill `t_p(b)`, the whole run `t_p(b) + (G - 1) t_d(b)`
  per_user   one request alone (batch 1): `G / (t_p(1) + (G - 1) t_d(1))` tokens/s
  closed     C clients, each sending its next request when the last ends
  saturated  every request at once (rate inf): the engine runs as many as it may
  open       requests arriving at a rate: the batch is the mean number in service

The last three share one continuous-batching model (`continuous`): B sequences run
(`running`: the clients, capped by the engine's max sequences and what its K/V memory
holds under its reservation rule, `symbolic/reservation.py`); an iteration holds their
decode rows, and a prompt's prefill adds `dp = t(B, 1 prompt) - t(B)` to the iteration
it joins (over `ceil(P / budget)` iterations with chunked prefill). Over a request's
G - 1 gaps the others' prefills are paid once each, so the token gap is
`t_d(B) + (B - 1) dp / (G - 1)`; TTFT is half an iteration's wait, the prompt's
iterations and the per-request cost t0_request; a slot turns over in
`R_slot = n_chunks t_d + dp + (G - 1) gap`. Closed loop, in steady state: its requests
turn over one by one (a client's next request arrives as its last ends, so the first
wave's lockstep does not last); a prompt waits for the prefills ahead of it at the
replica's rate X = B / R_slot (M/D/1, as an open loop's, at most half of the others');
C clients beyond the cap queue (Little: the cycle is C / X). A source whose protocol
measures a closed loop's first wave (`first_wave`, `engines.engine_rules`) moves in
waves as a saturating run does. Saturated (every request
submitted at once, moving in waves): X = B / R_slot; TTFT adds the
admission wait of N requests. Open loop at rate lambda per replica: B = 1 + lambda R
(a request meets the mean number in service), solved by iteration; past capacity the
TTFT depends on the run's length and is not predicted (NaN). Aggregate rates are
multiplied by the replicas sharing the load. Stage 2 checks `continuous` against the
simulator (the referee of the load model).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxroof.calibrate import published_setups as setups_lib
from jaxroof.calibrate.published_setups import Stacked
from jaxroof.engines.published import Point
from jaxroof.symbolic import reservation

MODES: tuple[str, ...] = ("step", "static", "per_user", "closed", "saturated", "open")
# Held per point with the fitted terms (`values`): the engine's scheduler and memory rule.
SETTINGS: tuple[str, ...] = ("n_max", "n_bud", "chunked", "reserve_full", "u_mem", "m_act",
                             "m_graph", "x_free", "first_wave")
_OPEN_ITERATIONS = 12


def mode_of(point: Point) -> str:
  """How a point was run (`MODES`)."""
  if point.metric == "step_s":
    return "step"
  if point.metric == "output_tokens_per_s_per_user":
    return "per_user"
  if point.batch is not None:
    return "static"
  if point.request_rate is None:
    return "closed"
  return "saturated" if math.isinf(point.request_rate) else "open"


def _modes(stacked: Stacked) -> dict[str, np.ndarray]:
  codes = np.asarray([mode_of(p) for p in stacked.points])
  return {m: codes == m for m in MODES}


def running(stacked: Stacked, values: Mapping[str, Any], kind: str) -> np.ndarray:
  """Sequences a replica may run at once: its scheduler's cap and what its K/V memory
  holds (`reservation.running_sequences`, K/V reserved for the whole request where the
  engine guarantees it, else for its mean length). The bound: all the memory the weights
  leave, each sequence at its shortest, no cap: never fewer."""
  p, g = stacked.prompt, stacked.output
  if kind == "bound":  # Every byte the weights leave, each sequence at its shortest.
    kv = stacked.capacity - stacked.weight_bytes
    return np.maximum(np.floor(kv / (stacked.kv_per_token * (p + 1))), 0.0)
  length = np.where(np.asarray(values["reserve_full"]) > 0, p + g, p + g / 2)
  out = reservation.evaluator()(C=stacked.capacity, W_res=stacked.weight_bytes,
                                n_bud=values["n_bud"], D=stacked.width, u_mem=values["u_mem"],
                                m_act=values["m_act"], m_graph=values["m_graph"],
                                x_free=values["x_free"], s=stacked.kv_per_token * length,
                                n_max=values["n_max"])
  return np.maximum(np.asarray(out["running"], dtype=float), 0.0)


def continuous(t: Any, batch: np.ndarray, *, prompt: np.ndarray, output: np.ndarray,
               budget: np.ndarray, chunked: np.ndarray, t0_request: Any, waves: np.ndarray,
               bound: bool = False) -> dict[str, np.ndarray]:
  """One continuous-batching replica at `batch` running sequences (the module docstring).

  `t(rows, prompts)` is the iteration time; `budget` the tokens an iteration holds
  (`chunked`: prompts split to fill it beside the decode rows; else whole prompts, at
  least one); `waves` where the requests move in step (fixed lengths, all submitted
  at once: a saturating run), else they turn over one by one (an open or a closed
  loop in steady state). The
  bound pays no other request's prefill and no queue. Returns the decode step, a
  prompt's added time, the token gap, TTFT (before any wait for a slot), a request's
  latency, the time a batch turns over in and the requests per second."""
  step = t(batch, 0.0)
  added = np.maximum(t(batch, 1.0) - step, 0.0)
  room = np.where(chunked > 0, np.maximum(budget - batch, 1.0), budget)
  per_iteration = np.where(chunked > 0, room / prompt, np.maximum(np.floor(room / prompt), 1.0))
  alone = np.maximum(np.ceil(1.0 / per_iteration), 1.0) * t(0.0, 1.0)  # Its own prefill.
  share = added + step / per_iteration  # One prompt's time in a busy engine.
  gaps = np.maximum(output - 1, 1.0)
  others = 0.0 if bound else np.where(waves, (batch - 1) / 2, batch - 1)
  gap = step + others * added / gaps
  queued = 0.0 if bound else np.where(waves, (batch - 1) / 2 * share, 0.0)
  ttft = t0_request + alone + queued
  turnover = np.where(waves, batch * share + (output - 1) * step,
                      share + (output - 1) * gap)  # A wave's, or one slot's.
  return {
      "step_s": step, "prefill_added_s": added, "prefill_share_s": share, "itl_s": gap,
      "ttft_s": ttft, "latency_s": ttft + (output - 1) * gap, "turnover_s": turnover,
      "requests_per_s": batch / turnover
  }


def prefill_wait(state: Mapping[str, np.ndarray], rate: np.ndarray,
                 batch: np.ndarray) -> np.ndarray:
  """A prompt arriving at `rate` per second: half an iteration, and the prefills ahead of
  it (M/D/1 on the prefill work, `rate * share` of the time busy), never more than half
  of the other running requests' prefills (all of them arriving together)."""
  share = state["prefill_share_s"]
  busy = np.minimum(rate * share, 0.99)
  queue = np.minimum(busy * share / (2 * (1 - busy)), np.maximum(batch - 1, 0.0) / 2 * share)
  return 0.5 * state["step_s"] + queue


def closed_loop(state: Mapping[str, np.ndarray], clients: np.ndarray, cap: np.ndarray,
                bound: bool = False, no_wait: Any = False) -> dict[str, np.ndarray]:
  """C clients over a replica running `B = min(C, cap)`, in steady state: a request
  leaves when its last token comes and its client's next one arrives, so with fixed
  lengths the requests stay spread over a cycle and turn over one by one (the first
  wave's lockstep is a transient a benchmark's many requests average away). A prompt
  waits for the prefills ahead of it at the replica's rate (`prefill_wait`); clients
  beyond the cap wait for a slot (Little's law: a client's cycle is C / X). `no_wait`
  where the prompt's wait is already in the state's TTFT (a first wave's lockstep) or
  there is none (the bound). The bound waits for nothing (the cycle less a latency that
  is itself a bound is no bound on the wait)."""
  x = state["requests_per_s"]
  steady = ~np.asarray(no_wait, dtype=bool)
  ahead = np.where(steady, prefill_wait(state, x, np.minimum(clients, cap)), 0.0)
  latency = state["latency_s"] + ahead
  cycle = np.maximum(latency, clients / np.maximum(x, 1e-30))
  wait = np.where((clients > cap) & (not bound), cycle - latency, 0.0)
  return {"ttft_s": state["ttft_s"] + ahead + wait, "requests_per_s": clients / cycle}


def saturated(state: Mapping[str, np.ndarray], requests: np.ndarray,
              batch: np.ndarray) -> dict[str, np.ndarray]:
  """N requests at once on a replica running `batch`: beyond the first batch they wait
  for a slot, the i-th `(i - batch) / X` (N unknown: no TTFT)."""
  x = state["requests_per_s"]
  late = np.maximum(requests - batch, 0.0)
  with np.errstate(invalid="ignore", divide="ignore"):
    queued = np.where(late > 0, late * (late + 1) / (2 * requests * np.maximum(x, 1e-30)), 0.0)
  ttft = np.where(np.isfinite(requests), state["ttft_s"] + queued, np.nan)
  return {"ttft_s": ttft, "requests_per_s": x}


def open_loop(state: Mapping[str, np.ndarray], rate: np.ndarray,
              bound: bool = False) -> dict[str, np.ndarray]:
  """Poisson arrivals at `rate` per replica: a prompt waits for the prefills ahead of it
  (M/D/1 on the prefill work, `rate * share` of the time busy) and half an iteration."""
  wait = 0.0 if bound else prefill_wait(state, rate, np.inf)  # No cap on the queue.
  return {"ttft_s": state["ttft_s"] + wait}


def predict(stacked: Stacked, values: Mapping[str, Any], *,
            kind: str = "calibrated") -> dict[str, np.ndarray]:
  """Every point's predicted metric (`value`, in its unit) and what it came from.

  `values`: the cost model's calibrated terms, t0_request and `SETTINGS` by name (floats
  or one entry per point) for kind "calibrated"; kind "bound" takes none of them (no
  fixed cost, no reservation, no cap, no other request's prefill in a gap)."""
  modes = _modes(stacked)
  p, g = stacked.prompt, stacked.output
  bound = kind == "bound"

  def t(rows, prompts):
    return setups_lib.iteration(stacked, values, rows, prompts, kind=kind)["step_s"]

  pts = stacked.points
  fixed = np.asarray([pt.batch or 1 for pt in pts], dtype=float)
  clients = np.asarray([pt.concurrency or 1 for pt in pts], dtype=float)
  requests = np.asarray([pt.requests or math.inf for pt in pts], dtype=float)
  rate = np.asarray([(pt.request_rate or 0.0) /
                     pt.replicas if pt.request_rate and math.isfinite(pt.request_rate) else 0.0
                     for pt in pts], dtype=float)
  replicas = np.asarray([pt.replicas for pt in pts], dtype=float)
  cap = np.maximum(running(stacked, values, kind), 1.0)
  t0_request = 0.0 if bound else np.asarray(values.get("t0_request", 0.0))
  budget = np.full(len(pts), np.inf) if bound else np.asarray(values["n_bud"], dtype=float)
  chunked = np.zeros(len(pts)) if bound else np.asarray(values["chunked"], dtype=float)
  # A closed loop measured over its first wave (`first_wave`, the source's protocol)
  # moves in step as a saturating run does; else it is in steady state.
  first = np.asarray(values.get("first_wave", 0.0), dtype=float) > 0
  waves = modes["saturated"] | (modes["closed"] & first & (not bound))

  def state_at(batch):
    return continuous(t, batch, prompt=p, output=g, budget=budget, chunked=chunked,
                      t0_request=t0_request, waves=waves, bound=bound)

  batch = np.select(
      [modes["closed"], modes["saturated"], modes["static"] | modes["step"]],
      [np.minimum(clients, cap), np.minimum(requests, cap), fixed], 1.0)
  open_ = modes["open"]
  if open_.any():  # B = 1 + lambda R(B), from below; capped.
    for _ in range(_OPEN_ITERATIONS):
      batch = np.where(open_, np.minimum(1.0 + rate * state_at(batch)["latency_s"], cap), batch)
  state = state_at(batch)
  served_max = state_at(cap)["requests_per_s"]
  overloaded = open_ & (rate >= served_max)
  prefill = t(0.0, fixed)  # A fixed batch prefilled together.
  closed = closed_loop(state, clients, cap, bound, no_wait=waves | bound)
  sat = saturated(state, requests, batch)
  ttft = np.select(
      [modes["closed"], modes["saturated"], open_ & ~overloaded, open_],
      [closed["ttft_s"], sat["ttft_s"],
       open_loop(state, rate, bound)["ttft_s"], np.nan], state["ttft_s"])
  # Open loop: the offered rate, or the most the replica serves (the bound: that most, an
  # upper bound whatever arrivals a finite run happened to draw).
  served = served_max if bound else np.minimum(rate, served_max)
  x = np.select([modes["closed"], modes["saturated"], open_],
                [closed["requests_per_s"], sat["requests_per_s"], served], state["requests_per_s"])
  itl, step = state["itl_s"], state["step_s"]
  e2e = ttft + (g - 1) * itl
  value = {
      "step_s": step,
      "itl_s": itl,
      "tpot_s": itl,
      "ttft_s": np.where(modes["static"], prefill, ttft),
      "e2e_latency_s": np.where(modes["static"], prefill + (g - 1) * step, e2e),
      "output_tokens_per_s": x * g * replicas,
      "output_tokens_per_s_per_user": g / (prefill + (g - 1) * step),
  }
  metric = np.asarray([pt.metric for pt in pts])
  return {
      **state, "batch": batch, "cap": cap, "ttft_s": ttft, "overloaded": overloaded,
      "value": np.select([metric == m for m in value], list(value.values()), np.nan)
  }


def relative_errors(stacked: Stacked, predicted: np.ndarray) -> np.ndarray:
  """|predicted / measured - 1| per point (NaN where nothing was predicted)."""
  measured = np.asarray([pt.value for pt in stacked.points], dtype=float)
  return np.abs(predicted / measured - 1.0)


def bound_ratio(stacked: Stacked, bound: np.ndarray) -> np.ndarray:
  """Measured over the bound for times, the bound over measured for rates: >= 1 when the
  bound is never faster than the measurement."""
  measured = np.asarray([pt.value for pt in stacked.points], dtype=float)
  seconds = np.asarray([pt.seconds for pt in stacked.points])
  return np.where(seconds, measured / bound, bound / measured)
