"""The serving decision: how many sequences to run, and how much load that takes.

The lesson's rule, "choose concurrency using TTFT, token gaps and memory headroom, not
the weight-only roofline alone", made computable for any step model (bound or
calibrated) through the one load model (`jaxroof.serving.load`):

  * the number of running sequences (`max_running`, the value an engine's max
    sequences takes) is the one that gives the largest rate meeting the targets (the
    mean token gap, TTFT at p90 and the inter-token gap at p99) within memory, and so is
    the scheduling (whole prompts per iteration, or chunks of a token budget);
  * that rate (`max_arrival_rate_per_s`) does not depend on the rate asked at; the
    rate at which the slots fill when all are held (`slot_capacity_per_s`) is
    labelled as such: past it the queue for a slot grows without bound;
  * what binds the max rate: token_gap, ttft, itl_p99 or slots; memory where the
    chosen number is what memory holds; compute or communication where the gap target
    (mean or p99) binds and that makes the step;
  * at the asked rate (`operating_point`) the load model gives the running sequences,
    the gap, TTFT (mean and p90) and the p99 gap: "ok" where they meet the targets,
    "infeasible" where one misses (the reason names it), "unstable" only past the
    slots' fill rate.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxroof import errors
from jaxroof.serving import elasticity
from jaxroof.serving import load as load_lib
from jaxroof.serving import requests
from jaxroof.symbolic import load_model
from jaxroof.symbolic import request_formulas
from jaxroof.symbolic.evaluate import formula_function
from jaxroof.symbolic.step_model import StepModel

_SLACK = 1e-9  # Relative: a gap equal to the target (12 ms at B = 32) meets it.


def decide(model: StepModel, inputs: requests.ServingInputs, *, prompt_tokens: int,
           output_tokens: int, token_gap_s: float, ttft_s: float | None = None,
           arrival_rate: float = 0.0, window_s: float = 0.0,
           aggregate_tokens_per_s: float | None = None, with_elasticities: bool = True,
           prefill_batch: int = 1, scheduler: str | None = None, token_budget: int | None = None,
           hold_cv2: float = 0.0) -> dict[str, Any]:
  """The decision for requests of P prompt and G output tokens, and its load.

  Returns the JSON `decision` block: `max_running` (= `batch`), `scheduler`,
  `token_budget`, `max_arrival_rate_per_s`, `slot_capacity_per_s`, `binds`, `step_s`,
  `aggregate_tokens_per_s`, `per_sequence_tokens_per_s`, `ttft_s` (mean, at
  `arrival_rate`), `status` ("ok", "infeasible" or "unstable") and `reason`, the
  `operating_point` and `elasticities` at the chosen number (unless
  `with_elasticities` is False). Quantities a status leaves undefined are None.
  """
  errors.require_positive("token_gap", token_gap_s)
  if ttft_s is not None:
    errors.require_positive("ttft", ttft_s)
  if aggregate_tokens_per_s is not None:
    errors.require_positive("aggregate_tokens_per_s", aggregate_tokens_per_s)
  errors.require_non_negative("arrival_rate", arrival_rate)
  errors.require_non_negative("batching_window", window_s)
  prompt_tokens, output_tokens = requests.check_lengths(inputs, prompt_tokens, output_tokens)
  prefill_batch = errors.require_positive_int("prefill_batch", prefill_batch)
  memory_limit = inputs.max_batch_in_memory
  out: dict[str, Any] = {
      "batch": None, "max_running": None, "binds": None, "step_s": None,
      "aggregate_tokens_per_s": None, "per_sequence_tokens_per_s": None, "ttft_s": None,
      "max_arrival_rate_per_s": None, "slot_capacity_per_s": None, "status": "ok", "reason": "",
      "load_model": load_model.MODEL, "queue_model": load_model.MODEL,
      "prefill_batch": prefill_batch, "memory_limit_batch": memory_limit,
      "arrival_rate_per_s": arrival_rate
  }
  if memory_limit is not None and memory_limit < 1:
    out.update(status="infeasible", binds="memory",
               reason="the weights and one sequence's allocated K/V do not fit in memory")
    return out
  a = load_lib.answer(model, inputs, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                      token_gap_s=token_gap_s, ttft_s=ttft_s, scheduler=scheduler,
                      token_budget=token_budget, cv2=hold_cv2)
  c = a.costs
  gap_ok = c.step[0] <= token_gap_s * (1 + _SLACK)
  out["token_gap_limit_batch"] = int(c.n[gap_ok].max()) if gap_ok.any() else 0
  out["prefill_service_s"] = float(c.alone[0])
  out.update(a.scheduling.as_dict())
  if a.column < 0:
    out.update(status="infeasible", binds=_light_load_miss(a, ttft_s),
               reason=_light_load_reason(a, token_gap_s, ttft_s))
    return out
  batch = a.max_running
  step = float(c.step[0, a.column])
  binds = load_lib.binds(a)
  if memory_limit is not None and batch >= memory_limit and binds in ("slots", "ttft"):
    binds = "memory"
  terms = requests.decode_terms(model, inputs, float(batch),
                                mean_context(inputs, prompt_tokens, output_tokens))
  memory_s = terms["memory_s"] if "memory_s" in terms else terms["weight_s"] + terms["kv_s"]
  compute_bound = terms["compute_s"] >= memory_s
  gap_binds = binds in ("token_gap", "itl_p99")  # The gap target, at its mean or its p99.
  if gap_binds and terms["comm_s"] >= max(terms["compute_s"], memory_s):
    binds = "communication"
  elif gap_binds and compute_bound:
    binds = "compute"
  max_rate = a.max_rate
  fill = a.slot_fill_rate()
  point = load_lib.point(a, arrival_rate) if arrival_rate > 0 else load_lib.point(a, 1e-9)
  if arrival_rate <= 0:
    point["arrival_rate_per_s"] = 0.0
  out.update(batch=batch, max_running=batch, binds=binds, step_s=step,
             aggregate_tokens_per_s=batch / step, per_sequence_tokens_per_s=1 / step,
             max_arrival_rate_per_s=max_rate, slot_capacity_per_s=fill,
             compute_bound=bool(compute_bound), comm_s_at_batch=terms["comm_s"],
             loaded_token_gap_s=point["token_gap_s"], ttft_s=point["ttft_s"],
             ttft_p90_s=point["ttft_p90_s"], itl_p99_s=point["itl_p99_s"],
             utilisation=_prefill_share(a, arrival_rate, point["stable"]), operating_point=point)
  if inputs.comm is not None or inputs.replicas > 1:
    out.update(comm_s=terms["comm_s"], chips=inputs.chips_per_replica * inputs.replicas,
               replicas=inputs.replicas,
               fleet_aggregate_tokens_per_s=batch / step * inputs.replicas,
               fleet_max_arrival_rate_per_s=max_rate * inputs.replicas)
  if with_elasticities:
    k = inputs.k if inputs.grows else inputs.kv_per_sequence_bytes
    out["elasticities"] = elasticity.row_elasticities(
        model, [batch], N=inputs.N, q=inputs.q, T=mean_context(inputs, prompt_tokens,
                                                               output_tokens), k=k, BW=inputs.BW,
        F=inputs.F, N_act=None if inputs.N_act == inputs.N else inputs.N_act, L=inputs.layers)[0]
  if arrival_rate > 0:
    _status(out, point, a, arrival_rate, token_gap_s, ttft_s)
  if aggregate_tokens_per_s is not None:
    out["meets_aggregate_target"] = batch / step >= aggregate_tokens_per_s * (1 - _SLACK)
    if not out["meets_aggregate_target"] and out["status"] == "ok":
      out.update(
          status="infeasible",
          reason=(f"{batch / step:,.0f} tokens/s at batch {batch} is below the "
                  f"{aggregate_tokens_per_s:,.0f} tokens/s aggregate target"))
  return out


def _status(out: dict[str, Any], point: dict[str, Any], a: load_lib.Answer, rate: float,
            token_gap_s: float, ttft_s: float | None) -> None:
  """The status at the asked rate: ok where every target holds, infeasible where one
  misses (named), unstable only past the slots' fill rate."""
  if not point["stable"]:
    out.update(status="unstable", reason=point["reason"])
    return
  misses = []
  if point["token_gap_s"] > token_gap_s * (1 + _SLACK):
    misses.append(f"mean token gap {point['token_gap_s'] * 1e3:.4g} ms over the "
                  f"{token_gap_s * 1e3:g} ms target")
  if ttft_s is not None and point["ttft_p90_s"] > ttft_s * (1 + _SLACK):
    misses.append(f"p90 TTFT {point['ttft_p90_s'] * 1e3:.4g} ms over the {ttft_s * 1e3:g} ms "
                  f"target ({point['slot_wait_s'] * 1e3:.4g} ms of its mean waiting for one of "
                  f"the {a.max_running} slots)")
  if point["itl_p99_s"] is not None and point["itl_p99_s"] > token_gap_s * (1 + _SLACK):
    misses.append(f"p99 inter-token gap {point['itl_p99_s'] * 1e3:.4g} ms over the "
                  f"{token_gap_s * 1e3:g} ms target")
  if rate > a.max_rate * (1 + 1e-6):
    why = "; ".join(misses) or f"{load_lib.binds(a)} binds there"
    out.update(status="infeasible",
               reason=f"{rate:g} requests/s is past the max rate {a.max_rate:.4g}/s: {why}")


def _prefill_share(a: load_lib.Answer, rate: float, stable: bool) -> float | None:
  """Share of the replica's time prompts take at `rate` (lam x the time one adds), at the
  mean occupancy; None past the slots' fill rate (unstable: no steady occupancy)."""
  if rate <= 0 or a.column < 0:
    return 0.0
  if not stable:
    return None
  return float(rate * a.at(rate)["extra_s"])


def _light_load_miss(a: load_lib.Answer, ttft_s: float | None) -> str:
  c = a.costs
  if c.step[0, 0] > a.targets.token_gap_s * (1 + _SLACK):
    return "token_gap"
  if ttft_s is not None and a.states.idle[0] > ttft_s * (1 + _SLACK):
    return "ttft"
  return "itl_p99"


def _light_load_reason(a: load_lib.Answer, token_gap_s: float, ttft_s: float | None) -> str:
  c = a.costs
  if c.step[0, 0] > token_gap_s * (1 + _SLACK):
    return (f"even one sequence's mean token gap ({c.step[0, 0] * 1e3:.4g} ms) exceeds the "
            f"{token_gap_s * 1e3:g} ms target")
  if ttft_s is not None and a.states.idle[0] > ttft_s * (1 + _SLACK):
    return (f"the prompt's prefill alone ({a.states.idle[0] * 1e3:.4g} ms, "
            f"{a.scheduling.scheduler}) exceeds the {ttft_s * 1e3:g} ms TTFT target")
  return ("no rate keeps the targets: an iteration carrying prefill exceeds the token-gap "
          "target at the p99 inter-token gap, and TTFT or the slots leave no room")


def mean_context(inputs: requests.ServingInputs, prompt_tokens: float,
                 output_tokens: float) -> float:
  """Mean retained tokens over the decode steps (`request_formulas.mean_context`; 1 for a
  fixed K/V per sequence, which `kv_per_sequence_bytes` already holds)."""
  if not inputs.grows:
    return 1.0
  return float(formula_function(request_formulas.mean_context)(prompt_tokens, output_tokens))


def frontier(model: StepModel, inputs: requests.ServingInputs, batch_sizes, *, prompt_tokens: int,
             output_tokens: int) -> dict[str, np.ndarray]:
  """Aggregate and per-sequence decode rates (1/mean step) over batch, for the plot."""
  batch = np.asarray(batch_sizes, dtype=float)
  decode = requests.decode_time(model, inputs, batch, prompt_tokens, output_tokens)
  step = decode / (output_tokens - 1)
  return {
      "batch": batch, "step_s": step, "aggregate_tokens_per_s": batch / step,
      "per_sequence_tokens_per_s": 1 / step
  }
