"""One replica's load, as `serving`, `pools` and `simulate` ask it: the load model
(`jaxroof.symbolic.load_model`) over the replica's costs at each occupancy
(`jaxroof.parallel.replica_load`), for a model's `ServingInputs`.

`answer` gives the largest rate meeting the targets, the number of running sequences
that gives it (`max_running`, the value to give an engine), the scheduling that gives it,
and the rate at which those slots fill; `at_rate` what the replica does at a load.
The planner asks the same functions over its grid, so the answers agree.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from jaxroof import errors
from jaxroof.parallel import replica_load
from jaxroof.serving import requests
from jaxroof.symbolic import load_model
from jaxroof.symbolic.step_model import StepModel

EXACT_STATES = 1024  # Running counts taken one by one; beyond, nodes 0.5% apart.
SEARCH_LIMIT = 1 << 16  # Sequences: the most slots searched where memory sets no limit.
BINDS_STEP = 1e-4  # How far past the max rate (relative, past its precision) `binds` looks.


@dataclasses.dataclass(frozen=True)
class Answer:
  """A replica's answer: the costs at each occupancy, the scheduling chosen, the load
  model's inputs under it and the largest rate with its B."""

  costs: replica_load.Costs
  scheduling: replica_load.Scheduling
  states: load_model.States
  best: load_model.MaxRate
  targets: load_model.Targets
  output_tokens: int
  cv2: float

  @property
  def max_running(self) -> int:
    return int(self.best.B[0])

  @property
  def max_rate(self) -> float:
    return float(self.best.rate[0])

  @property
  def column(self) -> int:
    return int(self.best.column[0])

  def slot_fill_rate(self) -> float:
    """The rate at which the chosen B slots turn over when all are held."""
    if self.column < 0:
      return 0.0
    return float(load_model.slot_fill(self.states, self.output_tokens)[0, self.column])

  def at(self, rate: float) -> dict[str, float]:
    """The load model at `rate` with the chosen B (floats)."""
    out = load_model.at(self.states, [max(rate, 1e-12)], np.array([self.column]),
                        self.output_tokens, self.targets, self.cv2)
    return {k: float(v[0]) for k, v in out.items()}

  def itl_p99(self, rate: float) -> float:
    return load_model.itl_quantile(self.states, max(rate, 1e-12), self.column, self.output_tokens,
                                   0.99)


def costs(model: StepModel, inputs: requests.ServingInputs, *, prompt_tokens: int,
          output_tokens: int, top: int | None = None, include: int | None = None,
          microbatches: int = 1) -> replica_load.Costs:
  """The replica's costs at running counts 1 .. `top` (default: what memory holds), with
  `include` among them."""
  limit = inputs.max_batch_in_memory if top is None else top
  top = SEARCH_LIMIT if limit is None else max(int(limit), 1)
  n = load_model.node_states(top, exact=EXACT_STATES,
                             include=None if include is None else np.array([float(include)]))
  cost = inputs.cost_model()
  if inputs.grows:
    context = replica_load.mean_context(prompt_tokens, output_tokens)
  else:  # A fixed K/V per sequence: a decode row reads it whole, a prompt writes it.
    per_token = inputs.kv_per_sequence_bytes / prompt_tokens
    cost = dataclasses.replace(cost, constants={**cost.constants, "k_full": per_token})
    context = float(prompt_tokens)
  return replica_load.costs(cost, model, n, prompt_tokens=prompt_tokens, context=context,
                            microbatches=microbatches)


def answer(model: StepModel, inputs: requests.ServingInputs, *, prompt_tokens: int,
           output_tokens: int, token_gap_s: float, ttft_s: float | None,
           scheduler: str | None = None, token_budget: int | None = None, cv2: float = 0.0,
           max_running: int | None = None, ttft_quantile: float = 0.9,
           itl_quantile: float | None = 0.99, microbatches: int = 1) -> Answer:
  """The largest rate one replica serves within the targets, the slots and scheduling that
  give it (`replica_load.choose`; `max_running` fixes the slots); a rate of 0 where
  nothing meets them."""
  c = costs(model, inputs, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
            top=None if max_running is None else max(max_running, inputs.max_batch_in_memory or 0),
            include=max_running, microbatches=microbatches)
  targets = load_model.Targets(token_gap_s=token_gap_s, ttft_s=ttft_s, ttft_quantile=ttft_quantile,
                               itl_quantile=itl_quantile)
  schedulings = replica_load.options(scheduler, token_budget)
  candidates = np.ones((1, c.n.size), dtype=bool)
  if max_running is not None:
    candidates = (c.n == max_running)[None, :]
  if token_budget is not None and not np.any(token_budget - c.n >= 1):
    raise errors.InputError(
        f"token_budget={token_budget} cannot hold one prompt token beside even one running "
        "sequence: give a budget > 1 (tokens per iteration).", field="token_budget")
  choice = replica_load.choose(c, schedulings, candidates, output_tokens, targets, cv2)
  return Answer(costs=c, scheduling=choice.scheduling[0], states=choice.states, best=choice.best,
                targets=targets, output_tokens=output_tokens, cv2=cv2)


def binds(a: Answer) -> str:
  """What stops the rate rising past the max rate at the chosen B: "token_gap", "ttft",
  "itl_p99" or "slots" (the slots fill: the queue for one grows without bound)."""
  if a.column < 0:
    return "none"
  out = a.at(a.max_rate * (1 + BINDS_STEP))
  targets = a.targets
  if out["stable"] < 1:
    return "slots"
  if out["token_gap_s"] > targets.token_gap_s * (1 + load_model.SLACK):
    return "token_gap"
  if (targets.itl_quantile is not None and
      out["slow_itl_share"] > (1 - targets.itl_quantile) * (1 + load_model.SLACK)):
    return "itl_p99"
  if targets.ttft_s is not None and out["ttft_q_s"] > targets.ttft_s * (1 + load_model.SLACK):
    return "ttft"
  return "slots"


def point(a: Answer, rate: float) -> dict[str, Any]:
  """What the replica does at `rate` with the chosen B: running sequences, the gap (mean),
  TTFT (mean and p90, with the slot wait and the prefill wait), the p99 inter-token gap,
  the slots' utilisation; `stable` False past the slots' fill rate (values None)."""
  out: dict[str, Any] = {
      "arrival_rate_per_s": rate, "max_running": a.max_running, "model": load_model.MODEL,
      "stable": False, "running_batch": None, "token_gap_s": None, "ttft_s": None,
      "ttft_p90_s": None, "itl_p99_s": None, "slot_wait_s": None, "prefill_wait_s": None,
      "slot_utilisation": None, "prefill_service_s": None, "step_s": None
  }
  if a.column < 0:
    out["reason"] = "no number of running sequences meets the targets at any load"
    return out
  at = a.at(rate)
  fill = a.slot_fill_rate()
  if at["stable"] < 1 or not math.isfinite(at["ttft_s"]):
    out["reason"] = (f"{rate:g} requests/s is at or past the rate the {a.max_running} slots "
                     f"fill at ({fill:.4g}/s, each held for its prefill and G - 1 gaps): the "
                     "queue for a slot grows without bound (unstable)")
    return out
  step = float(np.interp(at["mean_running"], a.states.n, a.states.step[0]))
  out.update(stable=True, running_batch=at["mean_running"], token_gap_s=at["token_gap_s"],
             ttft_s=at["ttft_s"], ttft_p90_s=at["ttft_q_s"], itl_p99_s=a.itl_p99(rate),
             slot_wait_s=at["slot_wait_s"], prefill_wait_s=at["prefill_wait_s"],
             slot_utilisation=at["slot_utilisation"], prefill_service_s=at["service_s"],
             step_s=step, p_wait=at["p_wait"])
  return out
