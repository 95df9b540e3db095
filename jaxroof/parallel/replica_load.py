"""A replica's costs at each occupancy, from the one cost model, for the load model.

`jaxroof.symbolic.load_model` needs, at each running count n: the decode iteration
(`step`), the time one admitted prompt adds to the iterations it joins (`extra`), the
prompt's own service once it has a slot (`admit`) and, where prompts are chunked, the
iteration that carries a chunk. Every one is the cost model's iteration
(`IterationModel.evaluate`) of a mix: n decode rows at the requests' mean context
(`request_formulas.mean_context`, P + G/2), beside one whole prompt (the
iteration-level scheduler: every waiting prompt joins the next iteration whole) or one
chunk of a token budget (chunked prefill: each iteration takes its decodes and fills
the budget with prompt tokens, a chunk costed at the middle of its prompt).

A pipelined replica of m microbatches in flight runs n/m rows per pass; its token gap is
one pass (every stage holds one microbatch), and a prompt runs in one microbatch's pass,
holding every stage it crosses: the other microbatches wait behind it (with m = pp the
pipeline has no slack), so a prompt's added time stretches every microbatch's gap, as
on one chip.

The constants of the cost model may be arrays of shape (R, 1): then R configurations
(layouts, formats) are costed at once over the states, (R, S).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxroof import errors
from jaxroof.specs.iteration_model import IterationModel
from jaxroof.symbolic import load_model
from jaxroof.symbolic import request_formulas
from jaxroof.symbolic.evaluate import formula_function
from jaxroof.symbolic.step_model import StepModel

SCHEDULERS: tuple[str, ...] = ("iteration", "chunked")
# Token budgets a chunked scheduler may be given (vLLM's max_num_batched_tokens), largest
# first: the largest whose chunk iteration meets the token-gap target is chosen.
TOKEN_BUDGETS: tuple[int, ...] = (8192, 4096, 2048, 1024, 512, 256)
TIE = 1e-4  # Max rates this close (relative) tie: the earlier scheduling offered wins.


@dataclasses.dataclass(frozen=True)
class Scheduling:
  """How a replica admits prompts: "iteration" (whole prompts join the next iteration)
  or "chunked" (each iteration filled to `token_budget` tokens)."""

  scheduler: str
  token_budget: int | None = None

  def __post_init__(self):
    errors.require_choice("scheduler", self.scheduler, SCHEDULERS)
    if self.scheduler == "chunked":
      errors.require_positive_int("token_budget", self.token_budget)
    elif self.token_budget is not None:
      raise errors.InputError(
          f"token_budget={self.token_budget} applies only to the chunked scheduler "
          "(the iteration scheduler prefills each prompt whole).", field="token_budget")

  def as_dict(self) -> dict[str, Any]:
    return {"scheduler": self.scheduler, "token_budget": self.token_budget}


def options(scheduler: str | None = None, token_budget: int | None = None) -> list[Scheduling]:
  """The schedulings a plan may choose from: every one, or those the user fixed (a budget
  alone fixes the chunked scheduler)."""
  if token_budget is not None:
    if scheduler not in (None, "chunked"):
      raise errors.InputError(
          f"token_budget={token_budget} with scheduler={scheduler!r}: a token budget is the "
          "chunked scheduler's; give scheduler=chunked or leave the budget out.",
          field="token_budget")
    return [Scheduling("chunked", errors.require_positive_int("token_budget", token_budget))]
  if scheduler == "iteration":
    return [Scheduling("iteration")]
  chunked = [Scheduling("chunked", b) for b in TOKEN_BUDGETS]
  if scheduler == "chunked":
    return chunked
  if scheduler is not None:
    errors.require_choice("scheduler", scheduler, SCHEDULERS)
  return [Scheduling("iteration")] + chunked


def mean_context(prompt_tokens: float, output_tokens: float) -> float:
  """The requests' mean decode context, P + G/2 (`request_formulas.mean_context`)."""
  return float(formula_function(request_formulas.mean_context)(prompt_tokens, output_tokens))


@dataclasses.dataclass(frozen=True)
class Costs:
  """The cost model at each occupancy of R configurations (see the module docstring).

  `n` (S,); `step`, `whole` (R, S): decode-only and with one whole prompt (`more`: what
  a second adds); `alone` (R,):
  the whole prompt on an idle replica; `per_pass` (R, 1): decode rows per pass at n = 1
  (1/m). Chunk iterations are costed on demand (`chunked`)."""

  cost: IterationModel
  model: StepModel
  n: np.ndarray
  prompt_tokens: int
  context: float
  per_pass: np.ndarray
  step: np.ndarray
  whole: np.ndarray
  alone: np.ndarray
  more: np.ndarray | None = None  # (R, S): what a second whole prompt adds beside the first.

  def _time(self, **mix: Any) -> np.ndarray:
    out = self.cost.evaluate(self.cost.uniform_mix(**mix), self.model, step_only=True)
    return np.asarray(out["step_s"], dtype=float)

  def chunk(self, budget: int, last: bool = False) -> tuple[np.ndarray, ...]:
    """(chunk tokens, the iteration carrying them, the whole prompt's chunked service
    on an idle replica) for `budget` tokens per iteration: (R, S), (R, S), (R,); with
    `last`, also the iteration carrying a prompt's last, partial chunk (R, S)."""
    P = float(self.prompt_tokens)
    rows = self.n[None, :] * self.per_pass
    tokens = np.minimum(budget - rows, P)
    size = np.maximum(tokens, 1.0)
    t = self._time(decode_rows=rows, context=self.context, prefill_sequences=1.0,
                   prompt_tokens=size, prefill_done=np.maximum((P - size) / 2, 0.0))
    if last:
      rest = np.maximum(P - np.floor(P / size) * size, 1.0)
      tail = self._time(decode_rows=rows, context=self.context, prefill_sequences=1.0,
                        prompt_tokens=rest, prefill_done=P - rest)
    first = min(float(budget), P)
    lone = self._time(decode_rows=0.0, context=self.context, prefill_sequences=1.0,
                      prompt_tokens=first, prefill_done=max((P - first) / 2, 0.0))
    # Alone, a prompt takes floor(P / budget) full chunks and one iteration of the rest.
    full, left = divmod(P, first)
    end = (self._time(decode_rows=0.0, context=self.context, prefill_sequences=1.0,
                      prompt_tokens=left, prefill_done=P - left) if left else 0.0)
    alone = (full * np.asarray(lone, dtype=float).reshape(-1) +
             np.asarray(end, dtype=float).reshape(-1))
    alone = np.broadcast_to(alone, self.alone.shape)
    return (tokens, t, alone, np.broadcast_to(tail, np.shape(t))) if last else (tokens, t, alone)


def costs(cost: IterationModel, model: StepModel | None, n: np.ndarray, *, prompt_tokens: int,
          context: float, microbatches: Any = 1.0) -> Costs:
  """The decode iteration and the one with a whole prompt at each occupancy `n`, and the
  prompt alone; `microbatches` (scalar or (R, 1)) splits the rows of a pass."""
  model = model or StepModel.bound()
  n = np.asarray(n, dtype=float)
  per_pass = 1.0 / np.asarray(microbatches, dtype=float).reshape(-1, 1)
  rows = n[None, :] * per_pass
  c = Costs(cost=cost, model=model, n=n, prompt_tokens=int(prompt_tokens), context=float(context),
            per_pass=per_pass, step=np.zeros(0), whole=np.zeros(0), alone=np.zeros(0))
  step = c._time(decode_rows=rows, context=float(context))  # noqa: SLF001
  whole = c._time(
      decode_rows=rows,
      context=float(context),
      prefill_sequences=1.0,  # noqa: SLF001
      prompt_tokens=float(prompt_tokens))
  two = c._time(
      decode_rows=rows,
      context=float(context),
      prefill_sequences=2.0,  # noqa: SLF001
      prompt_tokens=float(prompt_tokens))
  alone = c._time(
      decode_rows=0.0,
      context=float(context),
      prefill_sequences=1.0,  # noqa: SLF001
      prompt_tokens=float(prompt_tokens))
  shape = np.broadcast_shapes(np.shape(step), np.shape(whole), np.shape(two),
                              (per_pass.shape[0], n.size))
  step, whole = np.broadcast_to(step, shape), np.broadcast_to(whole, shape)
  more = np.broadcast_to(two, shape) - whole
  alone = np.broadcast_to(np.asarray(alone, dtype=float).reshape(-1), (shape[0],))
  return dataclasses.replace(c, step=step, whole=whole, alone=alone, more=more)


def states(c: Costs, scheduling: Scheduling, candidates: np.ndarray) -> load_model.States:
  """The load model's inputs for one scheduling; `candidates` (R, S) the allowed slots
  (a chunked replica's slots leave each pass room for a prompt's token)."""
  P = float(c.prompt_tokens)
  step, whole = c.step, c.whole
  if scheduling.scheduler == "iteration":
    nan = np.full(step.shape, np.nan)
    return load_model.States(n=c.n, step=step, extra=whole - step, admit=whole, chunk=nan,
                             idle=c.alone, candidates=candidates, more=c.more)
  tokens, chunk, alone, tail = c.chunk(scheduling.token_budget, last=True)
  fits = tokens >= P  # The whole prompt fits beside the decodes: no chunking here.
  room = tokens >= 1
  with np.errstate(divide="ignore", invalid="ignore"):
    per_chunk = np.where(room, chunk, np.inf)
    extra = np.where(fits, whole - step, P / np.maximum(tokens, 1.0) * (per_chunk - step))
    # A prompt's chunks take P / tokens iterations of the budget: a prompt finishing
    # inside an iteration leaves the rest of the budget to the next one.
    admit = np.where(fits, whole, P / np.maximum(tokens, 1.0) * per_chunk)
  # A pipelined replica's m microbatches each fill their own budget: a decode token's
  # gap may hold every microbatch's chunk (each stalls the stages the others cross).
  slow = step + (per_chunk - step) / c.per_pass
  # Its first token, once started: floor(P / chunk) full chunks and an iteration of the
  # rest (a lone prompt's last chunk is not shared).
  with np.errstate(divide="ignore", invalid="ignore"):
    size = np.maximum(tokens, 1.0)
    full = np.floor(P / size)
    rest = P - full * size
    service = np.where(fits, whole, full * per_chunk + np.where(rest > 0, tail, 0.0))
    alone_extra = np.where(fits, whole - step,
                           full * (per_chunk - step) + np.where(rest > 0, tail - step, 0.0))
  return load_model.States(n=c.n, step=step, extra=np.where(room, extra, np.inf),
                           admit=np.where(room, admit, np.inf), chunk=np.where(fits, np.nan,
                                                                               slow), idle=alone,
                           candidates=candidates & room, service=np.where(room, service, np.inf),
                           extra_alone=np.where(room, alone_extra, np.inf))


def _slow_at_one(c: Costs, option: Scheduling) -> np.ndarray:
  """(R,) the iteration carrying prefill with one sequence running, under `option`."""
  if option.scheduler == "iteration":
    return c.whole[:, 0]
  first = dataclasses.replace(c, n=c.n[:1], step=c.step[:, :1], whole=c.whole[:, :1])
  tokens, chunk, _ = first.chunk(option.token_budget)
  return np.where(tokens[:, 0] >= c.prompt_tokens, c.whole[:, 0], chunk[:, 0])


def slow_at_one_any(c: Costs, schedulings: Sequence[Scheduling]) -> np.ndarray:
  """(R,) the shortest iteration carrying prefill with one sequence running, over the
  schedulings offered."""
  return np.min([_slow_at_one(c, s) for s in schedulings], axis=0)


def _same_as_whole(c: Costs, option: Scheduling, candidates: np.ndarray) -> np.ndarray:
  """(R,) where a budget holds a whole prompt beside every candidate's decodes (the
  chunked scheduler then prefills as the iteration scheduler does)."""
  if option.scheduler == "iteration":
    return np.zeros(c.step.shape[0], dtype=bool)
  tokens = option.token_budget - c.n[None, :] * c.per_pass
  return np.all(~candidates | (tokens >= c.prompt_tokens), axis=1)


@dataclasses.dataclass(frozen=True)
class Choice:
  """Each row's scheduling, its load-model inputs and its largest rate (`max_rate`)."""

  scheduling: list[Scheduling]
  states: load_model.States
  best: load_model.MaxRate


def choose(c: Costs, schedulings: Sequence[Scheduling], candidates: np.ndarray, output_tokens: int,
           targets: load_model.Targets, cv2: float = 0.0) -> Choice:
  """Per row, the scheduling with the largest max rate (`load_model.max_rate`), and its B.

  Offered: whole prompts and the two largest budgets whose iteration carrying prefill
  meets the token-gap target with one sequence running (one that misses it there keeps
  the p99 gap on target only while prefill is rare; a smaller budget adds more per
  prompt); where none does, whole prompts and the smallest budget. A budget that holds a whole
  prompt beside every candidate is the iteration scheduler and is left out when that is
  offered. Ties go to the earlier offered (whole prompts, then larger budgets).
  """
  R = c.step.shape[0]
  fallback = min(schedulings, key=lambda s: math.inf if s.token_budget is None else s.token_budget)
  whole_offered = any(s.scheduler == "iteration" for s in schedulings)
  budgets = np.zeros(R, dtype=int)  # Chunked schedulings offered so far, per row.
  pairs: list[tuple[int, np.ndarray]] = []  # (option index, rows).
  offered_any = np.zeros(R, dtype=bool)
  kept = []
  for option in schedulings:
    keep = _slow_at_one(c, option) <= targets.token_gap_s * (1 + load_model.SLACK)
    if whole_offered:
      keep &= ~_same_as_whole(c, option, candidates)
    if option.scheduler == "chunked":
      keep &= budgets < 2
      budgets += keep
    offered_any |= keep
    kept.append(keep)
  for k, option in enumerate(schedulings):
    keep = kept[k]
    if option == fallback or option.scheduler == "iteration":
      keep = keep | ~offered_any  # None meets at one sequence: whole prompts, the smallest budget.
    if keep.any():
      pairs.append((k, np.nonzero(keep)[0]))
  parts = [states(c, schedulings[k], candidates).rows(rows) for k, rows in pairs]
  stacked = load_model.States(
      n=c.n, step=np.concatenate([p.step for p in parts]),
      extra=np.concatenate([p.extra for p in parts]), admit=np.concatenate([p.admit for p in parts
                                                                           ]),
      chunk=np.concatenate([p.chunk for p in parts]), idle=np.concatenate([p.idle for p in parts]),
      candidates=np.concatenate([p.candidates for p in parts]),
      service=np.concatenate([p.admit if p.service is None else p.service for p in parts]),
      extra_alone=np.concatenate([
          p.extra if p.extra_alone is None else p.extra_alone for p in parts
      ]), more=np.concatenate([p.extra if p.more is None else p.more for p in parts]))
  best = load_model.max_rate(stacked, output_tokens, targets, cv2)
  owner = np.concatenate([rows for _, rows in pairs])
  option = np.concatenate([np.full(rows.size, k) for k, rows in pairs])
  pick = np.full(R, -1)
  for i in range(owner.size):  # The first of the largest, in the order offered.
    r = owner[i]
    if pick[r] < 0 or best.rate[i] > best.rate[pick[r]] * (1 + TIE):
      pick[r] = i
  return Choice(
      scheduling=[schedulings[option[i]] for i in pick], states=stacked.rows(pick),
      best=load_model.MaxRate(rate=best.rate[pick], column=best.column[pick], B=best.B[pick]))


def decode_pool_states(c: Costs, candidates: np.ndarray) -> load_model.States:
  """A split plan's decode replica: prompts arrive prefilled with their first token (a
  prefill pool made them), so a request adds nothing to the iterations and holds its
  slot for G - 1 gaps at the decode step of its occupancy."""
  zero = np.zeros_like(c.step)
  return load_model.States(n=c.n, step=c.step, extra=zero, admit=zero,
                           chunk=np.full(c.step.shape, np.nan), idle=np.zeros(c.step.shape[0]),
                           candidates=candidates)
