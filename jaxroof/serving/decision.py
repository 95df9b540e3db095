"""The serving decision: the largest decode concurrency that meets the targets.

The lesson's rule, "choose concurrency using TTFT, token gaps and memory
headroom, not the weight-only roofline alone", made computable for any step
model (bound or calibrated):

  * token gap: the largest B whose mean token gap (unloaded decode step over
    the request's contexts, stretched by prefills at the given load) meets
    the target; found by bisection, since the gap rises with B;
  * memory: the largest B whose weights + allocated K/V (paged, with the
    output reservation) + workspace fit (`specs.step_inputs`);
  * the decision is the smaller; what binds is "memory", or "token_gap" --
    "compute" when the step there is compute-bound (faster arithmetic, not
    bandwidth, would move it);
  * TTFT at the load (M/D/1, `queueing`) must meet its target, else the
    decision is "infeasible" and binds "ttft"; a load at or past the prefill
    server's capacity is "unstable";
  * the load limit: the smaller of the arrival rate that keeps mean TTFT on
    target and the rate the chip sustains with B slots,
    `1/(D + (G-1)*step/B)`.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from jaxroof import errors
from jaxroof.serving import elasticity
from jaxroof.serving import queueing
from jaxroof.serving import requests
from jaxroof.symbolic import request_formulas
from jaxroof.symbolic import slot_queue
from jaxroof.symbolic.evaluate import formula_function, lambdified
from jaxroof.symbolic.step_model import StepModel
from jaxroof.symbolic.symbols import B, D_pf, n_out, t

SEARCH_LIMIT = 1 << 20  # Sequences: the search stops here when nothing else binds.
_SLACK = 1e-9  # Relative: a gap equal to the target (12 ms at B = 32) meets it.


@functools.cache
def _capacity_model():
  return lambdified({"rate": request_formulas.shared_capacity_rate()}, (t, D_pf, B, n_out))


def shared_capacity(step_s: float, prefill_s: float, batch: float, output_tokens: int) -> float:
  """Requests/s one chip sustains with `batch` decode slots (`shared_capacity_rate`)."""
  return float(_capacity_model()(t=step_s, D_pf=prefill_s, B=batch, n_out=output_tokens)["rate"])


def _largest_meeting(meets, hi: int) -> int:
  """Largest integer B in [1, hi] with meets(B), for meets true then false; 0 if none."""
  if not meets(1):
    return 0
  lo = 1
  step = 1
  while lo + step <= hi and meets(lo + step):
    lo += step
    step *= 2
  top = min(lo + step, hi + 1)  # meets(top) is false (or top is past hi).
  while top - lo > 1:
    mid = (lo + top) // 2
    lo, top = (mid, top) if meets(mid) else (lo, mid)
  return lo


def decide(model: StepModel, inputs: requests.ServingInputs, *, prompt_tokens: int,
           output_tokens: int, token_gap_s: float, ttft_s: float | None = None,
           arrival_rate: float = 0.0, window_s: float = 0.0,
           aggregate_tokens_per_s: float | None = None, with_elasticities: bool = True,
           prefill_batch: int = 1) -> dict[str, Any]:
  """The decision for requests of P prompt and G output tokens at a load.

  Returns the JSON `decision` block: `batch`, `binds`, `step_s`,
  `aggregate_tokens_per_s`, `per_sequence_tokens_per_s`, `ttft_s`,
  `max_arrival_rate_per_s`, plus `status` ("ok", "infeasible" or
  "unstable"), `reason`, the candidate limits and `elasticities` at the
  chosen batch (unless `with_elasticities` is False). Quantities a status
  leaves undefined are None, never NaN.
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
  kwargs = dict(prompt_tokens=prompt_tokens, output_tokens=output_tokens, arrival_rate=arrival_rate,
                window_s=window_s, prefill_batch=prefill_batch)
  base = requests.evaluate(model, inputs, [1], **kwargs)
  queue = base["queue"]
  single = base["single_prefill_s"]
  out: dict[str, Any] = {
      "batch": None,
      "binds": None,
      "step_s": None,
      "aggregate_tokens_per_s": None,
      "per_sequence_tokens_per_s": None,
      "ttft_s": queue.ttft_s,
      "max_arrival_rate_per_s": None,
      "status": "ok",
      "reason": "",
      "queue_model": queueing.MODEL,
      "prefill_service_s": single,
      "utilisation": queue.utilisation,
      "prefill_batch": prefill_batch,
  }
  ttft_rate = (queueing.max_arrival_rate(ttft_s, single, window_s, prefill_batch)
               if ttft_s is not None else queueing.capacity(single, prefill_batch))
  out["ttft_limited_arrival_rate_per_s"] = ttft_rate
  if not queue.stable:
    out.update(
        status="unstable", binds="ttft",
        reason=(f"arrival rate {arrival_rate:g}/s x prefill {single:.4g} s / {prefill_batch} "
                f"prompt(s) per prefill = utilisation "
                f"{queue.utilisation:.3g} >= 1: the prefill queue grows without bound "
                f"(capacity {queueing.capacity(single, prefill_batch):.4g} requests/s)"))
    return out

  def gap(batch: int) -> float:
    return float(requests.evaluate(model, inputs, [batch], **kwargs)["mean_token_gap_s"][0])

  memory_limit = inputs.max_batch_in_memory
  hi = SEARCH_LIMIT if memory_limit is None else max(memory_limit, 1)
  gap_limit = _largest_meeting(lambda b: gap(b) <= token_gap_s * (1 + _SLACK), hi)
  out["token_gap_limit_batch"] = gap_limit
  out["memory_limit_batch"] = memory_limit
  if memory_limit is not None and memory_limit < 1:
    out.update(status="infeasible", binds="memory",
               reason="the weights and one sequence's allocated K/V do not fit in memory")
    return out
  if gap_limit == 0:
    out.update(
        status="infeasible", binds="token_gap",
        reason=(f"even one sequence's mean token gap ({gap(1) * 1e3:.4g} ms) exceeds the "
                f"{token_gap_s * 1e3:g} ms target"))
    return out
  batch = gap_limit
  if memory_limit is not None and memory_limit <= gap_limit:
    binds = "memory"
    batch = memory_limit
  elif gap_limit >= SEARCH_LIMIT:
    binds = "search_limit"
  else:
    binds = "token_gap"
  at = requests.evaluate(model, inputs, [batch], **kwargs)
  step = float(at["unloaded_token_gap_s"][0])
  context = mean_context(inputs, prompt_tokens, output_tokens)
  k = inputs.k if inputs.grows else inputs.kv_per_sequence_bytes
  terms = requests.decode_terms(model, inputs, float(batch), context)
  memory_s = terms["memory_s"] if "memory_s" in terms else terms["weight_s"] + terms["kv_s"]
  compute_bound = terms["compute_s"] >= memory_s
  comm = terms["comm_s"]
  if binds == "token_gap" and comm >= max(terms["compute_s"], memory_s):
    binds = "communication"
  elif binds == "token_gap" and compute_bound:
    binds = "compute"
  shared = shared_capacity(step, single / prefill_batch, batch, output_tokens)
  # The load limit: prompts joining the running iterations at this batch (`capacity_rate`).
  capacity = capacity_rate(model, inputs, max_batch=batch, prompt_tokens=prompt_tokens,
                           output_tokens=output_tokens)
  out.update(batch=int(batch), binds=binds, step_s=step, aggregate_tokens_per_s=batch / step,
             per_sequence_tokens_per_s=1 / step,
             loaded_token_gap_s=float(at["mean_token_gap_s"][0]),
             max_arrival_rate_per_s=min(ttft_rate, capacity), shared_capacity_per_s=shared,
             capacity_per_s=capacity, compute_bound=compute_bound)
  if inputs.comm is not None or inputs.replicas > 1:
    out.update(comm_s=comm, chips=inputs.chips_per_replica * inputs.replicas,
               replicas=inputs.replicas,
               fleet_aggregate_tokens_per_s=batch / step * inputs.replicas,
               fleet_max_arrival_rate_per_s=min(ttft_rate, capacity) * inputs.replicas)
  if with_elasticities:
    out["elasticities"] = elasticity.row_elasticities(
        model, [batch], N=inputs.N, q=inputs.q, T=context, k=k, BW=inputs.BW, F=inputs.F,
        N_act=None if inputs.N_act == inputs.N else inputs.N_act, L=inputs.layers)[0]
  out["operating_point"] = operating_point(model, inputs, prompt_tokens=prompt_tokens,
                                           output_tokens=output_tokens, arrival_rate=arrival_rate,
                                           max_batch=batch)
  if ttft_s is not None and queue.ttft_s > ttft_s * (1 + _SLACK):
    out.update(
        status="infeasible", binds="ttft", reason=(
            f"mean TTFT at {arrival_rate:g} requests/s is {queue.ttft_s * 1e3:.4g} ms, over the "
            f"{ttft_s * 1e3:g} ms target (largest rate meeting it: {ttft_rate:.4g}/s)"))
  elif not out["operating_point"]["stable"] and arrival_rate < capacity:
    out.update(status="unstable", reason=out["operating_point"]["reason"])
  elif (ttft_s is not None and out["operating_point"]["ttft_s"] is not None and
        out["operating_point"]["ttft_s"] > ttft_s * (1 + _SLACK)):
    op = out["operating_point"]
    out.update(
        status="infeasible", binds="ttft",
        reason=(f"mean TTFT at the operating point is {op['ttft_s'] * 1e3:.4g} ms, over the "
                f"{ttft_s * 1e3:g} ms target: {op['slot_wait_s'] * 1e3:.4g} ms of it waiting for "
                f"one of the {batch} slots ({op['slot_utilisation']:.3g} held)"))
  elif arrival_rate >= capacity:
    out.update(
        status="unstable",
        reason=(f"{arrival_rate:g} requests/s is at or past what batch {batch} sustains "
                f"({capacity:.4g}/s: prefill plus the request's share of decode steps)"))
  if aggregate_tokens_per_s is not None:
    out["meets_aggregate_target"] = batch / step >= aggregate_tokens_per_s * (1 - _SLACK)
    if not out["meets_aggregate_target"] and out["status"] == "ok":
      out.update(
          status="infeasible",
          reason=(f"{batch / step:,.0f} tokens/s at batch {batch} is below the "
                  f"{aggregate_tokens_per_s:,.0f} tokens/s aggregate target"))
  return out


def loaded_gap(model: StepModel, inputs: requests.ServingInputs, *, running: float,
               arrival_rate: float, prompt_tokens: int,
               output_tokens: int) -> tuple[float, float, float]:
  """(step, token gap, mixed iteration) with `running` sequences decoding at a load.

  step: the mean decode iteration over the requests' contexts; mixed: one
  iteration of those rows beside one prompt's prefill. An iteration-level
  scheduler admits the prompts that arrived during the last iteration, so an
  iteration of length g carries k ~ Poisson(lam*g) prompts and the gap is the
  fixed point `g = sum_k Poisson(k; lam*g) * T(running, k)`, T from the cost
  model (a second prompt in one iteration can cost more than the first: the
  first may hide under the weight reads, the second cannot). Infinite when the
  prompts alone outrun the replica.
  """
  context = mean_context(inputs, prompt_tokens, output_tokens)
  step = float(
      requests.decode_steps(model, inputs, [max(running, 1e-9)], prompt_tokens,
                            output_tokens).mean())
  with_prompts = lambda k: requests.mixed_iteration_s(  # noqa: E731
      model, inputs, decode_rows=running, context=context, prompt_tokens=prompt_tokens,
      prefill_sequences=k)
  mixed = float(with_prompts(1.0))
  if arrival_rate <= 0:
    return step, step, mixed
  base = step - float(with_prompts(0.0))  # The mean over contexts less the mean context's.
  gap = step
  for _ in range(200):
    mean = arrival_rate * gap
    if mean > _POISSON_LIMIT:  # Many prompts per iteration: their count barely varies.
      new = float(with_prompts(mean)) + base
    else:
      k = np.arange(0.0, math.ceil(mean + 12.0 * math.sqrt(mean) + 12.0))
      weights = np.exp(k * math.log(max(mean, 1e-300)) - mean - _log_factorial(k))
      new = float(np.dot(weights, np.asarray(with_prompts(k), dtype=float)) + base)
    if new > _UNSTABLE * step:  # The prompts outrun the replica: no fixed point.
      return step, math.inf, mixed
    if abs(new - gap) <= 1e-9 * new:
      return step, new, mixed
    gap = new
  return step, gap, mixed


_POISSON_LIMIT = 200.0  # Mean prompts per iteration above which k is taken as its mean.
_UNSTABLE = 1e4  # A gap this many steps long means the prompts outrun the replica.


def capacity_rate(model: StepModel, inputs: requests.ServingInputs, *, max_batch: int,
                  prompt_tokens: int, output_tokens: int) -> float:
  """Requests/s a replica sustains with `max_batch` sequences always running.

  The largest lam with `lam*(G - 1)*gap(max_batch, lam) <= max_batch`
  (`loaded_gap`: prompts join the running iterations), found by bisection.
  """
  G = output_tokens

  def excess(lam: float) -> float:
    gap = loaded_gap(model, inputs, running=float(max_batch), arrival_rate=lam,
                     prompt_tokens=prompt_tokens, output_tokens=output_tokens)[1]
    return lam * (G - 1) * gap - max_batch

  step = loaded_gap(model, inputs, running=float(max_batch), arrival_rate=0.0,
                    prompt_tokens=prompt_tokens, output_tokens=output_tokens)[0]
  lo, hi = 0.0, max_batch / ((G - 1) * step)
  for _ in range(40):  # To 1e-12 of the upper bound.
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if excess(mid) < 0 else (lo, mid)
  return lo


def _log_factorial(k: np.ndarray) -> np.ndarray:
  return np.array([math.lgamma(x + 1.0) for x in k])


def operating_point(model: StepModel, inputs: requests.ServingInputs, *, prompt_tokens: int,
                    output_tokens: int, arrival_rate: float, max_batch: int) -> dict[str, Any]:
  """Where a continuous-batching replica runs at `arrival_rate`: Little's law's fixed point.

  With n sequences decoding, an iteration takes `step(n)` (the cost model at the
  requests' mean context) and admitting a prompt adds `extra(n) = mixed(n) -
  step(n)`. Prompts arrive at lam, so a token waits `gap(n) = step(n) / (1 -
  lam*extra(n))` on average, and each request decodes G - 1 tokens: n =
  lam*(G - 1)*gap(n), solved by bisection on [0, max_batch] (gap rises with
  n). TTFT is the wait for one of the `max_batch` slots (`slot_queue`, each held
  for the mixed iteration and G - 1 gaps) plus M/D/1 with the service time of
  that mixed iteration. Past `max_batch` (memory, the gap target) the load is
  unstable.
  """
  G = output_tokens

  def at(n: float) -> tuple[float, float, float]:
    return loaded_gap(model, inputs, running=n, arrival_rate=arrival_rate,
                      prompt_tokens=prompt_tokens, output_tokens=output_tokens)

  out: dict[str, Any] = {
      "arrival_rate_per_s": arrival_rate, "running_batch": None, "step_s": None,
      "token_gap_s": None, "ttft_s": None, "stable": False,
      "model": "Little's law fixed point, "
               "n = arrival_rate x (G - 1) x gap(n); TTFT: the wait for one of the "
               "batch's slots (G/G/c) then M/D/1 with the mixed iteration as service"
  }
  if arrival_rate <= 0:
    step, gap, mixed = at(0.0)
    out.update(running_batch=0.0, step_s=step, token_gap_s=gap, ttft_s=mixed, stable=True)
    return out
  excess = lambda n: arrival_rate * (G - 1) * at(n)[1] - n  # noqa: E731 (falls through 0)
  if not excess(float(max_batch)) <= 0:
    out["reason"] = (f"{arrival_rate:g} requests/s needs more than {max_batch} sequences "
                     "running at once (memory or the gap target): unstable")
    return out
  lo, hi = 0.0, float(max_batch)
  for _ in range(60):
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if excess(mid) > 0 else (lo, mid)
  n = hi
  step, gap, mixed = at(n)
  queue = queueing.ttft(arrival_rate, mixed, 0.0, 1)
  slots = slot_queue.wait_for_slot(arrival_rate, mixed + (G - 1) * gap, max_batch)
  wait, held = float(slots["slot_wait_s"]), float(slots["slot_utilisation"])
  stable = bool(queue.stable) and held < 1
  out.update(running_batch=n, step_s=step, token_gap_s=gap,
             ttft_s=queue.ttft_s + wait if stable else None, stable=stable, prefill_service_s=mixed,
             slot_wait_s=wait if stable else None, slot_utilisation=held)
  if not stable:
    out["reason"] = (f"{arrival_rate:g} requests/s holds {held:.3g} of the {max_batch} slots: "
                     "the wait for a slot grows without bound (unstable)")
  return out


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
