"""A fleet of alike replicas behind a router, simulated together; and the largest rate
that still meets the SLOs.

`simulate_fleet` runs N replicas of `simulator` (each its own scheduler, pages
and clock) in one event loop: the next event is either the next arrival, which
the router sends to a replica given every replica's state at that instant, or
the iteration of the replica whose clock is earliest. Routers:

  * "round_robin": request i to replica i mod N;
  * "least_outstanding": to the replica with the fewest requests arrived and not
    finished (ties: the lowest index);
  * "power_of_two": two distinct replicas drawn at random (seeded), the one with
    fewer outstanding (ties: the first drawn).

One replica under round robin runs exactly as `simulator.simulate`.
`find_max_rate` bisects the arrival rate with the seeded simulator for the
largest rate whose SLO percentiles hold.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import functools
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxroof.errors import InputError, require_choice, require_positive_int
from jaxroof.serving import metrics
from jaxroof.serving import simulator
from jaxroof.serving.arrivals import Workload

ROUTERS: tuple[str, ...] = ("round_robin", "least_outstanding", "power_of_two")
CONTINUOUS = ("iteration", "chunked", "vllm")


class _Member(simulator._Sim):  # noqa: SLF001 (the fleet drives the replica's own loop)
  """One replica of the fleet: its arrivals are the requests the router sends it."""

  def __init__(self, w: Workload, r: simulator.Replica, scheduler: str):
    super().__init__(w, r, scheduler, None)
    self.pending: collections.deque[int] = collections.deque()
    self.assigned: list[int] = []
    self.finish_times: list[float] = []
    self.itl = np.empty(16)
    self.itl_needed = 0

  def assign(self, i: int) -> None:
    self.pending.append(i)
    self.assigned.append(i)
    self.itl_needed += max(self.output_l[i] - 1, 0)
    need = self.itl_needed
    if need > len(self.itl):
      grown = np.empty(max(need, 2 * len(self.itl)))
      grown[:self.n_itl] = self.itl[:self.n_itl]
      self.itl = grown
    if not self.busy:
      self.now = max(self.now, self.arrival_l[i])

  @property
  def busy(self) -> bool:
    return bool(self.running or self.waiting or self.pending)

  def outstanding(self, at_s: float) -> int:
    return len(self.assigned) - bisect.bisect_right(self.finish_times, at_s)

  def _arrive(self) -> None:
    while self.pending and self.arrival_l[self.pending[0]] <= self.now:
      self.waiting.append(self.pending.popleft())

  def _finish(self, done: list[int], padding: bool) -> None:
    self.finish_times.extend([self.now] * len(done))
    super()._finish(done, padding)

  def step(self) -> None:
    self._arrive()
    if not self.running and not self.waiting:
      self.now = max(self.now, self.arrival_l[self.pending[0]])
      return
    dec, chunks = self._plan_continuous()
    if not len(dec) and not chunks:
      if not self.running and not self.waiting:  # Prefilled one-token requests, all done.
        return
      raise InputError("the replica cannot admit the next request (no free K/V pages)")
    self._iterate(dec, chunks, False)


@dataclasses.dataclass(eq=False)
class FleetRun:
  """The fleet's per-request times (as `simulator.Run`) and each replica's run."""

  fleet: simulator.Run
  replicas: list[simulator.Run]
  assignment: np.ndarray  # Replica of each request.
  router: str
  wall_s: float


def _route(router: str, members: list[_Member], i: int, at_s: float,
           rng: np.random.Generator) -> int:
  n = len(members)
  if router == "round_robin" or n == 1:
    return i % n
  if router == "least_outstanding":
    loads = [m.outstanding(at_s) for m in members]
    return int(np.argmin(loads))
  a, b = rng.choice(n, size=2, replace=False)
  return int(b) if members[b].outstanding(at_s) < members[a].outstanding(at_s) else int(a)


def simulate_fleet(workload: Workload, replica: simulator.Replica, replicas: int, *,
                   scheduler: str = "iteration", router: str = "round_robin", seed: int = 0,
                   pipeline: int = 1,
                   stop: Callable[[list[simulator._Sim]], bool] | None = None) -> FleetRun:
  """Runs `workload` on `replicas` alike replicas behind `router`.

  `pipeline` > 1: every `pipeline` consecutive members are the microbatches of one
  pipelined replica (`replica.per_microbatch`): a prompt one of them prefills holds every
  stage it crosses, so the others' next iterations wait as long as the prefill adds to its
  own. `stop(members)`, asked every `simulator.STOP_EVERY` steps, ends the run early."""
  replicas = require_positive_int("replicas", replicas)
  require_choice("router", router, ROUTERS)
  require_choice("scheduler", scheduler, simulator.SCHEDULERS)
  if scheduler not in CONTINUOUS:
    raise InputError(
        f"scheduler={scheduler!r} is not allowed behind a router: a fleet "
        f"simulates continuous batching ({', '.join(CONTINUOUS)}).", field="scheduler")
  simulator.validate(workload, replica, scheduler)
  start = time.perf_counter()
  members = [_Member(workload, replica, scheduler) for _ in range(replicas)]
  if pipeline > 1:
    for k, m in enumerate(members):
      mates = [x for x in members[k - k % pipeline:k - k % pipeline + pipeline] if x is not m]
      m.on_prefill = functools.partial(_stall, mates)
  rng = np.random.default_rng(seed)
  steps = 0
  arrival = workload.arrival_s.astype(float).tolist()
  assignment = np.zeros(len(arrival), np.int64)
  nxt = 0
  while True:
    busy = [m for m in members if m.busy]
    clock = min((m.now for m in busy), default=math.inf)
    if nxt < len(arrival) and arrival[nxt] <= clock:
      k = _route(router, members, nxt, arrival[nxt], rng)
      assignment[nxt] = k
      members[k].assign(nxt)
      nxt += 1
      continue
    if not busy:
      break
    min(busy, key=lambda m: m.now).step()
    steps += 1
    # Asked as often per engine as one engine's run asks (every STOP_EVERY of its steps).
    if stop is not None and steps % (simulator.STOP_EVERY * len(members)) == 0 and stop(members):
      break
  runs = [m.result() for m in members]
  return FleetRun(fleet=_merge(workload, members, runs, assignment), replicas=runs,
                  assignment=assignment, router=router, wall_s=time.perf_counter() - start)


def _stall(mates: list[_Member], seconds: float) -> None:
  """The other microbatches of a pipelined replica wait behind a prefill."""
  for m in mates:
    if m.busy and seconds > 0:
      m.now += seconds


def _merge(w: Workload, members: list[_Member], runs: list[simulator.Run],
           assignment: np.ndarray) -> simulator.Run:
  n = len(w)
  first, finish, emitted = np.full(n, np.nan), np.full(n, np.nan), np.zeros(n, np.int64)
  for k, run in enumerate(runs):
    mine = assignment == k
    first[mine], finish[mine] = run.first_token_s[mine], run.finish_s[mine]
    emitted[mine] = run.emitted[mine]
  cat = lambda name: np.concatenate([getattr(r, name) for r in runs])  # noqa: E731
  return simulator.Run(arrival_s=w.arrival_s.astype(float), first_token_s=first, finish_s=finish,
                       prompt_tokens=w.prompt_tokens, output_tokens=w.output_tokens,
                       emitted=emitted, itl_s=cat("itl_s"),
                       iterations=sum(r.iterations for r in runs),
                       prefill_tokens=sum(r.prefill_tokens for r in runs),
                       preemptions=sum(r.preemptions for r in runs), history_s=cat("history_s"),
                       pages_in_use=cat("pages_in_use"), queue_length=cat("queue_length"),
                       running=cat("running"), decoding=cat("decoding"), step_s=cat("step_s"))


def replica_metrics(fleet: FleetRun, **targets: Any) -> list[dict[str, Any]]:
  """Each replica's serving metrics over the requests routed to it."""
  out = []
  for k, run in enumerate(fleet.replicas):
    mine = fleet.assignment == k
    m = metrics.run_metrics(run, requests=mine, **targets)
    m.update(metrics.iteration_means(run))
    out.append({
        "replica": k, "requests": int(mine.sum()), "iterations": run.iterations,
        "preemptions": run.preemptions, "metrics": m
    })
  return out


def slo_values(run: simulator.Run, percentile: float) -> dict[str, float | None]:
  """TTFT, TPOT and ITL at `percentile` over a run's completed requests."""
  per = metrics.per_request(run.arrival_s, run.first_token_s, run.finish_s, run.output_tokens)
  pick = lambda x: (
      float(np.percentile(x, percentile))  # noqa: E731
      if np.size(x) else None)
  return {"ttft_s": pick(per["ttft_s"]), "tpot_s": pick(per["tpot_s"]), "itl_s": pick(run.itl_s)}


def meets_slo(run: simulator.Run, percentile: float, targets: dict[str, float | None]) -> bool:
  """Every request completed and each given target held at `percentile`."""
  if not np.all(np.isfinite(run.finish_s)):
    return False
  values = slo_values(run, percentile)
  return all(limit is None or (values[name] is not None and values[name] <= limit)
             for name, limit in targets.items())


def find_max_rate(run_at: Callable[[float], simulator.Run], *, start_rate: float, percentile: float,
                  targets: dict[str, float | None], rel_tol: float = 0.01,
                  max_runs: int = 40) -> dict[str, Any]:
  """The largest arrival rate (the fleet's) whose SLO percentiles hold, by bisection.

  `run_at(rate)` simulates the seeded workload at `rate`; the rate is doubled or
  halved from `start_rate` until it brackets the edge, then bisected to
  `rel_tol`. Returns `max_rate_per_s` (None when even the smallest tried fails)
  and every rate tried with its verdict.
  """
  if not any(v is not None for v in targets.values()):
    raise InputError("find_max_rate needs at least one target (TTFT, TPOT or ITL).", field="ttft_s")
  if not 0 < percentile < 100:
    raise InputError(f"slo_percentile={percentile!r} is not allowed: give a number in "
                     "(0, 100).", field="slo_percentile")
  tried: list[dict[str, Any]] = []

  def ok(rate: float) -> bool:
    run = run_at(rate)
    verdict = meets_slo(run, percentile, targets)
    tried.append({"rate_per_s": rate, "meets": verdict, **slo_values(run, percentile)})
    return verdict

  lo, hi = None, None
  rate = start_rate
  if ok(rate):
    lo = rate
    while hi is None and len(tried) < max_runs // 2:
      rate *= 2
      lo, hi = (rate, None) if ok(rate) else (lo, rate)
  else:
    hi = rate
    while lo is None and len(tried) < max_runs // 2:
      rate /= 2
      lo, hi = (rate, hi) if ok(rate) else (None, rate)
  if lo is None:
    return {"max_rate_per_s": None, "tried": tried, "bracket": [None, hi]}
  if hi is None:
    return {
        "max_rate_per_s": lo, "tried": tried, "bracket": [lo, None],
        "note": "the targets held at every rate tried (the largest is reported)"
    }
  while hi - lo > rel_tol * lo and len(tried) < max_runs:
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if ok(mid) else (lo, mid)
  return {"max_rate_per_s": lo, "tried": tried, "bracket": [lo, hi]}
