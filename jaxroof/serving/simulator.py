"""Discrete-event simulation of one serving replica under continuous batching.

The replica runs iterations back to back. Each iteration's time comes from the
one cost model (`jaxroof.specs.iteration_model.IterationModel` over
`jaxroof.symbolic.cost_model`, bound or calibrated) evaluated for that
iteration's actual mix: each decode row's context (windows capped per layer
kind), each prefill chunk's offset and length, the experts its tokens touch. Three schedulers (all deterministic):

  * "static": when the replica is idle, wait a batching window after the
    first waiting request (or until `max_running` wait), then run that fixed
    batch: one prefill iteration of all prompts, then decode iterations until
    its longest member ends. Finished members stay as padding rows (their
    row and retained K/V still cost time); nothing enters until the batch ends.
    K/V pages for prompt + output are reserved up front (no preemption).
  * "iteration" (Orca): between iterations finished sequences leave and
    waiting ones enter (first come, first served, while a slot and pages for
    the prompt are free); a new sequence's whole prompt is prefilled in the
    iteration it enters, alongside the running decodes.
  * "chunked" (Sarathi): as "iteration", with a token budget per iteration:
    every decode takes one token, prefill chunks fill the rest.
  * "vllm": vLLM V1's own scheduler (`jaxroof.serving.vllm_scheduler`, point
    by point against its source): running requests first in admission
    order, K/V blocks allocated per scheduled chunk, preemption of the last
    running request, no admission in a step that preempted.

K/V lives in pages of `page_tokens` positions. Admission waits for pages
for the prompt; a decode that needs a new page when none is free preempts the
latest-admitted sequence (vLLM's default, recompute): its pages are freed,
it returns to the front of the queue, and on readmission its prompt and the
tokens it already emitted are prefilled again (counted as prefill work), which
yields its next token.

Token times follow vLLM's `bench serve`: TTFT from arrival to the first
token, ITL between successive tokens of a request, TPOT = (E2EL - TTFT) /
(output - 1), E2EL from arrival to the last token.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from collections.abc import Callable

import numpy as np

from jaxroof.errors import InputError, require_choice, require_positive_int
from jaxroof.serving import vllm_scheduler
from jaxroof.serving.arrivals import Workload
from jaxroof.specs.iteration_model import IterationModel
from jaxroof.symbolic.step_model import StepModel

SCHEDULERS: tuple[str, ...] = ("static", "iteration", "chunked", "vllm")
STOP_EVERY = 256  # Iterations between a run's early-stop checks.


@dataclasses.dataclass(frozen=True)
class KernelCache:
  """An engine that builds its matmul kernels for each row count and keeps the last
  `capacity` counts: an iteration at a row count not among them pays `seconds_per_row` x
  its rows more.

  vLLM's CPU linear layer keeps 32 oneDNN primitives per weight, one per row count
  (`ops.create_onednn_mm(weight, 32)`); a step whose token count is new (two prompts
  arriving together) builds one in every linear layer, at a cost that grows with the rows
  (measured on the engine's served steps).
  """

  capacity: int
  seconds_per_row: float
  warm: tuple[int, ...] = ()  # Row counts built before the run, least recently used first.


@dataclasses.dataclass(frozen=True)
class Replica:
  """One replica: its iteration time and its K/V memory.

  Attributes:
    cost: the iteration's cost model (one chip's share of the replica).
    step_model: bound (per_op or fused) or calibrated.
    total_pages: K/V pages that fit in memory.
    page_tokens: positions per page.
    max_running: most sequences running at once.
    max_context: the model's longest sequence (prompt + output), or None.
    token_budget: tokens per iteration for "chunked" and "vllm".
    batch_window_s: the static scheduler's batching window.
    padded_to: for a fixed-shape server (the toy server): prompt length ->
      padded length of its prefill call. When set, the iteration is costed as
      computed, not as logical tokens: every decode iteration computes all
      `max_running` rows over `max_context` slots, and each prefill runs its
      padded tokens over `max_context` slots.
    description: what the replica is (model, device, step model), for JSON.
    prefilled: a split plan's decode replica: a request arrives with its prompt's
      K/V and its first token (a prefill pool made them), so admitting it costs
      no prefill: it takes pages for its prompt, its first token reaches the
      user at admission, and it decodes from the next iteration. A preempted
      request lost its K/V and is prefilled again here, as anywhere.
    kernel_cache: an engine's kernels built per row count (`KernelCache`), or None.
    wake_s: seconds an iteration pays when the replica was idle before it (nothing running
      or waiting): an engine waking from its wait (vLLM CPU's served prefill of a short
      prompt after an idle gap, against the same prefill beside a running decode;
      measured by probing the engine after an idle gap). 0: none (every analytic model).
  """

  cost: IterationModel
  step_model: StepModel
  total_pages: int
  page_tokens: int
  max_running: int
  max_context: int | None = None
  token_budget: int = 512
  batch_window_s: float = 0.0
  padded_to: Callable[[int], int] | None = None
  description: dict = dataclasses.field(default_factory=dict)
  prefilled: bool = False
  kernel_cache: KernelCache | None = None
  wake_s: float = 0.0


@dataclasses.dataclass(eq=False)
class Run:
  """Per-request times (s, from time 0) and the replica's history."""

  arrival_s: np.ndarray
  first_token_s: np.ndarray
  finish_s: np.ndarray
  prompt_tokens: np.ndarray
  output_tokens: np.ndarray
  emitted: np.ndarray  # Tokens each request emitted (== output_tokens when done).
  itl_s: np.ndarray  # Every gap between successive tokens, all requests.
  iterations: int
  prefill_tokens: int  # Including recomputation after preemption.
  preemptions: int
  history_s: np.ndarray  # Iteration end times.
  pages_in_use: np.ndarray  # Per iteration (during it).
  queue_length: np.ndarray  # Waiting requests at each iteration's start.
  running: np.ndarray  # Sequences in each iteration.
  decoding: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))  # Decode rows.
  step_s: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))  # Durations.
  wall_s: float = 0.0
  kernel_builds: int = 0  # Iterations that built kernels (`Replica.kernel_cache`).
  wakes: int = 0  # Iterations that began on an idle replica (`Replica.wake_s`).
  rows: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))  # Tokens per step.
  kernel_rows: tuple[int, ...] = ()  # The kernel cache at the end, least recently used first.


def validate(workload: Workload, replica: Replica, scheduler: str) -> None:
  """One-line errors for requests that can never be served."""
  require_choice("scheduler", scheduler, SCHEDULERS)
  require_positive_int("max_running", replica.max_running)
  require_positive_int("token_budget", replica.token_budget)
  if replica.prefilled and scheduler not in ("iteration", "chunked"):
    raise InputError(
        f"scheduler={scheduler!r} is not allowed for a decode pool's replica (prompts arrive "
        "prefilled): iteration or chunked.", field="scheduler")
  total = workload.prompt_tokens + workload.output_tokens
  worst = int(np.argmax(total))
  if replica.max_context is not None and total[worst] > replica.max_context:
    raise InputError(
        f"prompt_tokens + output_tokens = {int(total[worst])} (request {worst}) is not "
        f"allowed: the model's context is {replica.max_context} tokens.", field="prompt_tokens")
  need = -(-int(total[worst]) // replica.page_tokens)
  if need > replica.total_pages:
    raise InputError(
        f"prompt_tokens + output_tokens = {int(total[worst])} (request {worst}) can never fit: "
        f"it needs {need} K/V pages of {replica.page_tokens} tokens, memory holds "
        f"{replica.total_pages}.", field="prompt_tokens")


def simulate(workload: Workload, replica: Replica, scheduler: str = "iteration",
             progress: Callable[[int], None] | None = None,
             stop: Callable[[_Sim], bool] | None = None) -> Run:
  """Runs the workload to completion on the replica; see the module docstring. `stop`,
  asked every `STOP_EVERY` iterations, ends the run early when it says the outcome is
  known (requests left unfinished)."""
  validate(workload, replica, scheduler)
  start = time.perf_counter()
  sim = _Sim(workload, replica, scheduler, progress)
  sim.stop = stop
  sim.run()
  out = sim.result()
  out.wall_s = time.perf_counter() - start
  return out


class _Sim:
  """The simulation's state; `run` is the event loop (one pass per iteration).

  Decoding sequences are updated together as a numpy index array (rebuilt
  only when membership changes); prefill bookkeeping is plain Python.
  """

  def __init__(self, w: Workload, r: Replica, scheduler: str, progress):
    n = len(w)
    self.r, self.scheduler, self.progress = r, scheduler, progress
    self.p = r.page_tokens
    self.arrival = w.arrival_s.astype(float)
    self.arrival_l = self.arrival.tolist()
    self.prompt = w.prompt_tokens.astype(np.int64)
    self.output = w.output_tokens.astype(np.int64)
    self.prompt_l, self.output_l = self.prompt.tolist(), self.output.tolist()
    self.kv = np.zeros(n, np.int64)  # Positions holding K/V.
    self.pages = np.zeros(n, np.int64)
    self.emitted = np.zeros(n, np.int64)
    self.last_s = np.zeros(n)
    self.first_s = np.full(n, np.nan)
    self.finish_s = np.full(n, np.nan)
    self.target = list(self.prompt_l)  # Tokens to prefill before decoding.
    self.done_pre = [0] * n  # Of target, prefilled.
    self.itl = np.empty(int(np.maximum(self.output - 1, 0).sum()))
    self.n_itl = 0
    self.free = r.total_pages
    self.now = 0.0
    self.next_arrival = 0
    self.waiting: collections.deque[int] = collections.deque()
    self.running: list[int] = []  # Admission order (latest last).
    self.prefilling: list[int] = []  # Admission order.
    self.decoding: list[int] = []
    self.dec = np.zeros(0, np.int64)
    self.dirty = False
    self.finished = 0
    self.iterations = self.prefill_tokens = self.preemptions = 0
    self.hist_t, self.hist_pages, self.hist_queue, self.hist_running = [], [], [], []
    self.hist_decoding, self.hist_step, self.hist_rows = [], [], []
    cost, model = r.cost, r.step_model
    self.step_of = lambda mix: float(cost.evaluate(mix, model, step_only=True)["step_s"])
    warm = r.kernel_cache.warm[-r.kernel_cache.capacity:] if r.kernel_cache else ()
    self.built: collections.OrderedDict[int, None] = collections.OrderedDict.fromkeys(warm)
    self.kernel_builds = 0
    self.idle = True  # Nothing ran before the first iteration.
    self.wakes = 0
    self.stop: Callable[[_Sim], bool] | None = None
    # Called with the seconds an iteration's prefill adds to it (a pipelined replica's
    # other microbatches wait that long behind it); None: nothing else waits.
    self.on_prefill: Callable[[float], None] | None = None

  # Queue and memory.
  def _arrive(self) -> None:
    n = len(self.arrival_l)
    while self.next_arrival < n and self.arrival_l[self.next_arrival] <= self.now:
      self.waiting.append(self.next_arrival)
      self.next_arrival += 1

  def _allocate(self, i: int, positions: int) -> bool:
    need = -(-positions // self.p) - int(self.pages[i])
    if need > self.free:
      return False
    if need > 0:
      self.free -= need
      self.pages[i] += need
    return True

  def _release(self, i: int) -> None:
    self.free += int(self.pages[i])
    self.pages[i] = 0

  def _decodes(self) -> np.ndarray:
    if self.dirty:
      self.dec = np.asarray(self.decoding, np.int64)
      self.dirty = False
    return self.dec

  def _grow_decodes(self) -> np.ndarray:
    """Gives every decode its next page, preempting (latest admitted first) if short."""
    while True:
      dec = self._decodes()
      crossing = dec[self.kv[dec] % self.p == 0]
      if len(crossing) <= self.free or not self.running:
        self.pages[crossing] += 1
        self.free -= len(crossing)
        return dec
      self.preempt(self.running.pop())

  def preempt(self, victim: int) -> None:
    """Recompute preemption: free its pages, reset it, back to the front of the queue."""
    self._release(victim)
    self.kv[victim] = 0
    self.done_pre[victim] = 0
    self.target[victim] = self.prompt_l[victim] + int(self.emitted[victim])
    if victim in self.prefilling:
      self.prefilling.remove(victim)
    else:
      self.decoding.remove(victim)
      self.dirty = True
    self.waiting.appendleft(victim)
    self.preemptions += 1

  # Iteration planning.
  def _plan_continuous(self):
    """(decode index array, [(request, offset, chunk)]) for the next iteration."""
    if self.scheduler == "vllm":
      return vllm_scheduler.plan(self)
    if self.r.prefilled:
      self._admit_prefilled()
    dec = self._grow_decodes()
    chunked = self.scheduler == "chunked"
    budget = self.r.token_budget - len(dec) if chunked else math.inf
    chunks = []
    for i in self.prefilling:  # Partially prefilled sequences continue first.
      if budget <= 0:
        break
      c = min(self.target[i] - self.done_pre[i], budget)
      chunks.append((i, self.done_pre[i], c))
      budget -= c
    while self.waiting and len(self.running) < self.r.max_running and budget > 0:
      i = self.waiting[0]
      if self.r.prefilled and not self.emitted[i]:
        break  # Arrived prefilled: `_admit_prefilled` takes it, next iteration.
      if not self._allocate(i, self.target[i]):
        break
      self.waiting.popleft()
      self.running.append(i)
      self.prefilling.append(i)
      c = min(self.target[i], budget)
      chunks.append((i, 0, c))
      budget -= c
    return dec, chunks

  def _admit_prefilled(self) -> None:
    """A decode pool's admissions (`Replica.prefilled`): requests that arrive with their
    prompt's K/V and first token join the decodes without a prefill."""
    while self.waiting and len(self.running) < self.r.max_running:
      i = self.waiting[0]
      if self.emitted[i] or not self._allocate(i, self.target[i]):
        return  # A preempted request is prefilled again (the normal path).
      self.waiting.popleft()
      self.running.append(i)
      self.kv[i] = self.done_pre[i] = self.target[i]
      self.first_s[i] = self.last_s[i] = self.now
      self.emitted[i] = 1
      if self.output_l[i] <= 1:
        self._finish([i], False)
      else:
        self.decoding.append(i)
        self.dirty = True

  # The loop.
  def run(self) -> None:
    n = len(self.arrival_l)
    static = self.scheduler == "static"
    batch: list[int] = []
    while self.finished < n:
      if (self.stop is not None and self.iterations % STOP_EVERY == 0 and self.iterations and
          self.stop(self)):
        return
      self._arrive()
      if static:
        if not batch:
          batch = self._form_static_batch()
          if not batch:
            continue
          self._iterate(np.zeros(0, np.int64), [(i, 0, self.prompt_l[i]) for i in batch], True)
          batch_arr = np.asarray(batch, np.int64)
        else:
          self._iterate(batch_arr, [], True)
        if self.finished_all(batch_arr):
          for i in batch:
            self._release(i)
          batch = []
        continue
      if not self.running and not self.waiting:
        self.now = max(self.now, self.arrival_l[self.next_arrival])
        self.idle = True
        continue
      dec, chunks = self._plan_continuous()
      if not len(dec) and not chunks:
        if not self.running and not self.waiting:  # Prefilled one-token requests, all done.
          continue
        raise InputError("the replica cannot admit the next request (no free K/V pages)")
      self._iterate(dec, chunks, False)

  def finished_all(self, batch: np.ndarray) -> bool:
    return bool(np.all(self.emitted[batch] >= self.output[batch]))

  def _form_static_batch(self) -> list[int]:
    if not self.waiting:
      self.now = max(self.now, self.arrival_l[self.next_arrival])
      self.idle = True
      return []
    close = self.arrival_l[self.waiting[0]] + self.r.batch_window_s
    while (len(self.waiting) < self.r.max_running and self.next_arrival < len(self.arrival_l) and
           self.arrival_l[self.next_arrival] <= close):
      self.now = max(self.now, self.arrival_l[self.next_arrival])
      self._arrive()
    if len(self.waiting) < self.r.max_running:
      self.now = max(self.now, close)
    batch = []
    while self.waiting and len(batch) < self.r.max_running:
      i = self.waiting[0]
      if not self._allocate(i, self.prompt_l[i] + self.output_l[i]):
        break
      batch.append(self.waiting.popleft())
    return batch

  def _iterate(self, dec: np.ndarray, chunks: list, padding: bool) -> None:
    self.hist_queue.append(len(self.waiting))
    self.hist_pages.append(self.r.total_pages - self.free)
    self.hist_running.append(len(dec) + len(chunks))
    if self.r.padded_to is not None:
      mix = self._padded_mix(len(dec), chunks)
    elif chunks:
      ch = np.asarray(chunks, float)
      mix = self.r.cost.mix(self.kv[dec] + 1, ch[:, 1], ch[:, 2])
    else:
      mix = self.r.cost.mix(self.kv[dec] + 1)
    step = self.step_of(mix)
    if self.on_prefill is not None and chunks and self.r.padded_to is None:
      self.on_prefill(step - (self.step_of(self.r.cost.mix(self.kv[dec] + 1)) if len(dec) else 0.0))
    rows = len(dec) + sum(c for _, _, c in chunks)
    self.hist_rows.append(rows)
    if self.r.kernel_cache is not None:
      step += self._kernel_build(rows)
    if self.idle:
      self.idle = False
      if self.r.wake_s:
        step += self.r.wake_s
        self.wakes += 1
    n_dec = len(dec)
    self.hist_decoding.append(n_dec)
    self.hist_step.append(step)
    if not math.isfinite(step) or step <= 0:
      raise InputError(f"the iteration time {step!r} is not a positive number: check the "
                       "model's inputs (bandwidth, FLOP rate, sizes)")
    self.now += step
    self.iterations += 1
    self.hist_t.append(self.now)
    if n_dec:
      self.kv[dec] += 1
      live = dec[self.emitted[dec] < self.output[dec]] if padding else dec
      if len(live):
        m = len(live)
        self.itl[self.n_itl:self.n_itl + m] = self.now - self.last_s[live]
        self.n_itl += m
        self.last_s[live] = self.now
        self.emitted[live] += 1
        done = live[self.emitted[live] >= self.output[live]]
        if len(done):
          self._finish(done.tolist(), padding)
    for i, _, c in chunks:
      self.done_pre[i] += c
      self.kv[i] += c
      self.prefill_tokens += c
      if self.done_pre[i] == self.target[i]:
        if self.emitted[i] == 0:
          self.first_s[i] = self.now
        else:
          self.itl[self.n_itl] = self.now - self.last_s[i]
          self.n_itl += 1
        self.last_s[i] = self.now
        self.emitted[i] += 1
        if not padding:
          self.prefilling.remove(i)
        if self.emitted[i] >= self.output_l[i]:
          self._finish([i], padding)
        elif not padding:
          self.decoding.append(i)
          self.dirty = True
    if self.progress is not None and self.iterations % 256 == 0:
      self.progress(self.finished)

  def _kernel_build(self, rows: int) -> float:
    """Seconds an iteration of `rows` rows spends building kernels (least recently used
    row counts leave the cache first)."""
    cache = self.r.kernel_cache
    if rows in self.built:
      self.built.move_to_end(rows)
      return 0.0
    self.built[rows] = None
    if len(self.built) > cache.capacity:
      self.built.popitem(last=False)
    self.kernel_builds += 1
    return cache.seconds_per_row * rows

  def _padded_mix(self, n_dec: int, chunks: list) -> dict[str, float]:
    """The mix a fixed-shape server computes (see `Replica.padded_to`): every
    decode row over every slot, each prompt padded and attending to every slot."""
    r = self.r
    slots, width = r.max_running, r.max_context
    mix = r.cost.mix()
    if n_dec:
      mix.update(n_dec=float(slots), n_samp=float(slots), S_full=float(slots * width))
    for _, _, c in chunks:
      padded = r.padded_to(c)
      mix["n_pre"] += padded
      mix["n_samp"] += 1.0
      mix["X_full"] += float(padded * width)
      mix["V_full"] += float(width)
    return mix

  def _finish(self, done: list[int], padding: bool) -> None:
    for i in done:
      self.finish_s[i] = self.now
      self.finished += 1
      if not padding:
        self._release(i)
        self.running.remove(i)
        if i in self.decoding:
          self.decoding.remove(i)
          self.dirty = True

  def result(self) -> Run:
    if self.progress is not None:
      self.progress(self.finished)
    return Run(arrival_s=self.arrival, first_token_s=self.first_s, finish_s=self.finish_s,
               prompt_tokens=self.prompt, output_tokens=self.output, emitted=self.emitted,
               itl_s=self.itl[:self.n_itl], iterations=self.iterations,
               prefill_tokens=self.prefill_tokens, preemptions=self.preemptions,
               history_s=np.asarray(self.hist_t), pages_in_use=np.asarray(self.hist_pages),
               queue_length=np.asarray(self.hist_queue), running=np.asarray(self.hist_running),
               decoding=np.asarray(self.hist_decoding), step_s=np.asarray(self.hist_step),
               kernel_builds=self.kernel_builds, wakes=self.wakes, rows=np.asarray(self.hist_rows),
               kernel_rows=tuple(self.built))
