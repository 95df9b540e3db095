"""The planner's search: each group's largest rate within the targets, by branch and bound.

Every group (`plan_grid.Grid`) is first bounded cheaply over the planner's batch grid:
its max rate is at most what its slots turn over at the decode step alone,
`B / (D + (G - 1) step(B))` (D the prompt alone, no queue, no prefill stretch), and at
most what the token-gap target lets it decode, `n_gap / ((G - 1) gap)` (n_gap the
first batch whose decode step passes the target: a mean gap within the target keeps the
mean occupancy below it), with 10% to spare. Groups are then evaluated exactly with the
one load model (`replica_load.choose`: every scheduling, every running count that fits)
in order of their bound's objective, a batch of groups at a time, until the next
group's bound cannot beat the plans already found. The exact answer of a group is the
one `serving` gives for the same layout.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from jaxroof.parallel import replica_load
from jaxroof.parallel.plan_grid import Grid
from jaxroof.symbolic import load_model
from jaxroof.symbolic.step_model import StepModel

BATCH_GROUPS = (16, 32, 64, 128)  # Groups evaluated exactly at once: few first, then more.
BOUND_SPARE = 1.1  # The bound's margin over the occupancy argument (see the docstring).
STATE_RATIO = 1.005  # Running counts past 128 are nodes this far apart.


@dataclasses.dataclass(frozen=True)
class Workload:
  """What every group serves: P, G, the mean decode context, the targets, the spread of
  the holds, the schedulings offered and the running counts allowed (None: any)."""

  prompt_tokens: int
  output_tokens: int
  context: float
  targets: load_model.Targets
  cv2: float
  schedulings: tuple[replica_load.Scheduling, ...]
  batches: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class Bound:
  """The cheap pass: per group the bound on its max rate (0 where even light load misses
  a target), and the batch-grid configurations that can meet the targets at light load."""

  rate: np.ndarray
  light: np.ndarray  # Groups whose one sequence and whose prompt alone meet the targets.
  configurations: int
  meeting: int
  one_step: np.ndarray  # The decode step of one sequence, per group.
  alone: np.ndarray  # The prompt alone, per group.
  valid: np.ndarray  # Groups with a running count that fits.
  decode_rate: np.ndarray  # The bound of a decode-only replica (prompts arrive prefilled).


@dataclasses.dataclass(frozen=True)
class Found:
  """One group's exact answer: its scheduling, max rate, chosen B (`column` of `states`)
  and the load model's inputs (one row) for its operating point."""

  group: int
  scheduling: replica_load.Scheduling
  rate: float
  B: int
  column: int
  states: load_model.States
  step_s: float
  alone_s: float


def _valid(grid: Grid, index: np.ndarray, n: np.ndarray, batches: np.ndarray | None) -> np.ndarray:
  """(len(index), S): the running counts that fit memory and split evenly over the
  microbatches and expert groups."""
  whole = grid.microbatches[index] * grid.ep[index]
  ok = (n[None, :] <= grid.max_batch[index, None]) & (np.mod(n[None, :], whole[:, None]) == 0)
  if batches is not None:
    ok &= np.isin(n, batches)[None, :]
  return ok


def bound(grid: Grid, model: StepModel, work: Workload, batches: np.ndarray) -> Bound:
  """The cheap pass over the batch grid (see the module docstring)."""
  index = np.arange(grid.size)
  n = np.asarray(batches, dtype=float)
  c = replica_load.costs(grid.cost(index), model, n, prompt_tokens=work.prompt_tokens,
                         context=work.context, microbatches=grid.microbatches[:, None])
  valid = _valid(grid, index, n, work.batches)
  gap, ttft = work.targets.token_gap_s, work.targets.ttft_s
  G = work.output_tokens
  with np.errstate(divide="ignore", invalid="ignore"):
    slots = np.where(valid, n[None, :] / (c.alone[:, None] + (G - 1) * c.step), 0.0)
    over = valid & (c.step > gap)
    first_over = np.where(over.any(axis=1), n[np.argmax(over, axis=1)], np.inf)
    by_gap = first_over / ((G - 1) * gap)
  one = c.step[:, 0] <= gap * (1 + load_model.SLACK)  # n = 1 is the grid's first batch.
  light = one & valid.any(axis=1) & ((ttft is None) | (c.alone <= (ttft or 0) *
                                                       (1 + load_model.SLACK)))
  # Prefill takes at least the prompt alone per request: lam * D < 1.
  by_prefill = 1 / c.alone
  # Where no scheduling's iteration carrying prefill meets the gap target with one
  # sequence running, such iterations must stay under 1% of all for the p99 gap: a prompt
  # takes at least P / budget of them, iterations come at most every decode step.
  smallest = min(s.token_budget or work.prompt_tokens for s in work.schedulings)
  first = replica_load.slow_at_one_any(c, work.schedulings)
  rare = 0.01 / (c.step[:, 0] * max(work.prompt_tokens / max(smallest - 1, 1), 1.0))
  by_itl = np.where(first <= gap * (1 + load_model.SLACK), np.inf, rare)
  rate = np.where(light,
                  BOUND_SPARE * np.minimum.reduce([slots.max(axis=1), by_gap, by_prefill, by_itl]),
                  0.0)
  with np.errstate(divide="ignore", invalid="ignore"):
    decode_slots = np.where(valid, n[None, :] / ((G - 1) * c.step), 0.0).max(axis=1)
  decode_rate = np.where(one & valid.any(axis=1), BOUND_SPARE * np.minimum(decode_slots, by_gap),
                         0.0)
  return Bound(decode_rate=decode_rate, rate=rate, light=light, configurations=int(valid.sum()),
               meeting=int(valid[light].sum()), one_step=c.step[:, 0], alone=c.alone,
               valid=valid.any(axis=1))


def exact(grid: Grid, model: StepModel, work: Workload, index: np.ndarray, bound_rate: np.ndarray,
          decode_pool: bool = False, keep_rows: bool = False) -> list[Found | None]:
  """The load model's answer for the groups `index` (`replica_load.choose`; a split plan's
  decode pool with `decode_pool`: prompts arrive prefilled). Groups nothing meets are
  left out, or None with `keep_rows`."""
  G = work.output_tokens
  # The mean occupancy at the bound, with every gap at the target: slots past a few
  # spreads above it never fill, so they cannot raise the max rate.
  mean_running = bound_rate[index] * (G - 1) * work.targets.token_gap_s
  cap = np.ceil(1.5 * mean_running + 6 * np.sqrt(mean_running) + 16)
  cap = np.minimum(cap, grid.max_batch[index])
  top = int(max(np.max(cap, initial=1.0), 1.0))
  n = load_model.node_states(top, exact=128, ratio=STATE_RATIO, include=work.batches)
  c = replica_load.costs(grid.cost(index), model, n, prompt_tokens=work.prompt_tokens,
                         context=work.context, microbatches=grid.microbatches[index, None])
  candidates = _valid(grid, index, n, work.batches) & (n[None, :] <= cap[:, None])
  if decode_pool:
    states = replica_load.decode_pool_states(c, candidates)
    best = load_model.max_rate(states, G, work.targets, work.cv2)
    choice = replica_load.Choice(scheduling=[replica_load.Scheduling("iteration")] * len(index),
                                 states=states, best=best)
  else:
    choice = replica_load.choose(c, work.schedulings, candidates, G, work.targets, work.cv2)
  out = []
  for i, g in enumerate(index):
    column = int(choice.best.column[i])
    if column < 0 or choice.best.rate[i] <= 0:
      if keep_rows:
        out.append(None)
      continue
    out.append(
        Found(group=int(g), scheduling=choice.scheduling[i], rate=float(choice.best.rate[i]),
              B=int(choice.best.B[i]), column=column, states=choice.states.rows([i]),
              step_s=float(c.step[i, column]), alone_s=float(c.alone[i])))
  return out


def search(grid: Grid, model: StepModel, work: Workload, bound_: Bound, *,
           objective: Callable[[np.ndarray, np.ndarray],
                               np.ndarray], keep: int, per_device: bool = False,
           buckets: np.ndarray | None = None, allowed: np.ndarray | None = None,
           evaluate: Callable[[np.ndarray], list[Found]] | None = None,
           rates: np.ndarray | None = None) -> list[Found]:
  """The groups with the best `objective(group index, rate)` (smaller is better; inf:
  excluded), `keep` of them (per accelerator with `per_device`, or per value of
  `buckets`, an array over groups), by branch and bound: a group whose bound's objective
  is worse than its bucket's `keep`-th found is never evaluated. `evaluate` and `rates`
  (default: `exact` and the bound's rates) answer other questions of the groups (a split
  plan's decode pool)."""
  rates = bound_.rate if rates is None else rates
  evaluate = evaluate or (lambda index: exact(grid, model, work, index, rates))
  if buckets is None:
    buckets = grid.device if per_device else np.zeros(grid.size, dtype=int)
  live = rates > 0
  if allowed is not None:
    live &= allowed
  index = np.nonzero(live)[0]
  optimistic = objective(index, rates[index])
  index = index[np.isfinite(optimistic)]
  optimistic = optimistic[np.isfinite(optimistic)]
  order = np.argsort(optimistic, kind="stable")
  index, optimistic = index[order], optimistic[order]
  found: dict[int, list[tuple[float, Found]]] = {}

  def kth(bucket: int) -> float:
    values = found.get(bucket, [])
    return values[keep - 1][0] if len(values) >= keep else math.inf

  start, rounds = 0, 0
  while start < len(index):
    size = BATCH_GROUPS[min(rounds, len(BATCH_GROUPS) - 1)]
    rounds += 1
    block, bounds = index[start:start + size], optimistic[start:start + size]
    start += size
    limits = np.array([kth(int(buckets[g])) for g in block])
    block = block[bounds <= limits]
    if not block.size:
      if len(found) == 1 and len(np.unique(buckets[index])) == 1:
        break
      continue
    for f in evaluate(block):
      if f is None:
        continue
      value = float(objective(np.array([f.group]), np.array([f.rate]))[0])
      if math.isfinite(value):
        mine = found.setdefault(int(buckets[f.group]), [])
        mine.append((value, f))
        mine.sort(key=lambda vf: vf[0])
  out = [vf for values in found.values() for vf in values[:keep]]
  out.sort(key=lambda vf: vf[0])
  return [f for _, f in out]


def operating(f: Found, rate: float, work: Workload) -> dict[str, float]:
  """The load model at `rate` per replica for a found group's B and scheduling."""
  at = load_model.at(f.states, [rate], np.array([f.column]), work.output_tokens, work.targets,
                     work.cv2)
  out = {k: float(v[0]) for k, v in at.items()}
  out["itl_p99_s"] = load_model.itl_quantile(f.states, rate, f.column, work.output_tokens, 0.99)
  return out


def schedulings(scheduler: str | None,
                token_budget: int | None) -> Sequence[replica_load.Scheduling]:
  """`replica_load.options`, as a tuple."""
  return tuple(replica_load.options(scheduler, token_budget))
