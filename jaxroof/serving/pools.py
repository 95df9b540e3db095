"""Prefill and decode tuned apart: their crossovers, and split pools vs one shared pool.

Prefill reuses each weight across the prompt's tokens, decode across the
batch's sequences, so the two turn compute-bound at different sizes: prefill
at a prompt of about `R*q/2` tokens (fewer once attention FLOPs count),
decode at a batch of sequences that K/V reads push far higher (or never).

Chips needed to serve `arrival_rate` requests/s at both a TTFT and a
token-gap target (DistServe's goodput-per-chip view, with this package's
M/D/1 queueing model and bound or calibrated steps):

  split    prefill chips: each an M/D/1 server of one-prompt prefills, as many
           as keep mean TTFT on target; decode chips: each runs the largest
           batch meeting the token gap with no prefill interference, and
           carries up to batch / ((G-1)*step) requests/s, less where the wait
           for a decode slot (`symbolic.slot_queue`) passes its share of the
           TTFT target (the first token reaches the user from the decode
           pool; the shares `slot_queue.WAIT_SHARES` are searched, the fewest
           chips win). A prompt's K/V moves to
           the decode pool over the network joining them (`kv_link_bytes_per_s`,
           each chip its own share; free when no figure is given), after its
           prefill and before its first token: it counts in TTFT.
  shared   every chip prefills (with priority) and decodes: its token gaps
           stretch by 1/(1 - lam*D) and its slots must carry the load; the
           fewest chips for which `decision.decide` finds a batch.

Goodput per chip = arrival rate / chips.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from jaxroof import errors
from jaxroof.serving import decision
from jaxroof.serving import queueing
from jaxroof.serving import requests
from jaxroof.symbolic import prefill as prefill_formulas
from jaxroof.symbolic import slot_queue
from jaxroof.symbolic import symbols as S
from jaxroof.symbolic.evaluate import lambdified
from jaxroof.symbolic.step_model import StepModel

MAX_CHIPS = 100_000

SHARED_WINS = (
    "loose token-gap target: prefill interruptions (a 1/(1 - lam*D) stretch) cost little",
    "short prompts: prefill is a small share of each chip's time",
    "low rates: a split needs at least one chip of each kind, a shared pool one chip",
    "moving K/V between pools costs a transfer over the network joining them (in TTFT)",
)
SPLIT_WINS = (
    "tight token-gap target: decode chips never pause for a prefill",
    "long prompts: prefill load is large and decode batches would be interrupted often",
    "tight TTFT at high load: prefill chips can be added without shrinking decode batches",
    "each pool can pick its own batch, parallelism and precision (not modelled here)",
)


def crossovers(model: StepModel, inputs: requests.ServingInputs, *, prompt_tokens: int,
               output_tokens: int) -> dict[str, Any]:
  """Prefill crossover in prompt tokens per step vs decode crossover in sequences per step."""
  bw, flops = model.scaled_ceilings(inputs.BW, inputs.F)
  out: dict[str, Any] = {
      "prefill_tokens_per_step_linear": None, "prefill_tokens_per_step_with_attention": None,
      "decode_sequences_per_step": None
  }
  if math.isfinite(flops):
    ridge = flops / bw
    out["prefill_tokens_per_step_linear"] = float(_linear_crossover_model()(R=ridge,
                                                                            q=inputs.q)["prompt"])
    pair = (prefill_formulas.pair_flops_at(inputs.attention_terms, prompt_tokens)
            if inputs.attention_terms else inputs.pair_flops)
    k = inputs.k if inputs.grows else inputs.kv_per_sequence_bytes / prompt_tokens
    if pair > 0:
      prompts = _attention_crossover_model()(R=ridge, q=inputs.q, N=inputs.N, N_act=inputs.N_act,
                                             k=k, A_f=pair)
      out["prefill_tokens_per_step_with_attention"] = float(prompts["with_attention"])
      out["attention_overtakes_linear_at_prompt"] = max(float(prompts["attention_overtakes"]), 0.0)
    context = decision.mean_context(inputs, prompt_tokens, output_tokens)
    summary = model.summary(N=inputs.N, q=inputs.q, T=context,
                            k=inputs.k if inputs.grows else inputs.kv_per_sequence_bytes, BW=bw,
                            F=flops, N_act=inputs.N_act, L=inputs.layers)
    cross = summary["compute_crossover_batch"]
    out["decode_sequences_per_step"] = cross if math.isfinite(cross) and cross > 0 else None
  return out


@functools.cache
def _linear_crossover_model():
  """The prompt at which a one-sequence prefill turns compute-bound, linear layers only."""
  return lambdified({"prompt": prefill_formulas.compute_bound_prompt_linear()}, (S.R, S.q))


@functools.cache
def _attention_crossover_model():
  """The same crossover with attention, and where attention FLOPs overtake the linear."""
  return lambdified(
      {
          "with_attention": prefill_formulas.compute_bound_prompt_with_attention(),
          "attention_overtakes": prefill_formulas.attention_overtakes_linear_prompt()
      }, (S.R, S.q, S.N, S.N_act, S.k, S.A_f))


def _ceil(x: float) -> int:
  return int(math.ceil(x - 1e-9))


def compare(model: StepModel, inputs: requests.ServingInputs, *, prompt_tokens: int,
            output_tokens: int, arrival_rate: float, ttft_s: float, token_gap_s: float,
            window_s: float = 0.0, kv_link_bytes_per_s: float | None = None,
            kv_link_note: str = "") -> dict[str, Any]:
  """Replicas, chips and goodput per chip for split and shared pools at one rate and
  two targets. A "chip" in `split`/`shared` is one replica of `inputs`' layout;
  `*_gpus` count its tp*pp*ep devices."""
  errors.require_positive("arrival_rate", arrival_rate)
  kw = dict(prompt_tokens=prompt_tokens, output_tokens=output_tokens)
  single = float(requests.prefill(inputs, prompt_tokens, 1.0, model)["prefill_s"])
  transfer_s = 0.0
  if kv_link_bytes_per_s is not None:
    errors.require_positive("kv_link_bytes_per_s", kv_link_bytes_per_s)
    k = inputs.k * prompt_tokens if inputs.grows else inputs.kv_per_sequence_bytes
    transfer_s = float(k) / kv_link_bytes_per_s
  decode_only = decision.decide(model, inputs, token_gap_s=token_gap_s, with_elasticities=False,
                                **kw)
  split: dict[str, Any] = {"feasible": False}
  if decode_only["status"] == "ok":
    batch, step = decode_only["batch"], decode_only["step_s"]
    full = decision.shared_capacity(step, 0.0, batch, output_tokens)  # Every slot held.
    for share in slot_queue.WAIT_SHARES:  # The TTFT target, split between the two queues.
      budget = (1 - share) * ttft_s - transfer_s
      per_prefill_chip = (queueing.max_arrival_rate(budget, single, window_s) if budget > single +
                          window_s else 0.0)
      per_decode_chip = float(
          slot_queue.decode_pool_rate(step, batch, output_tokens, token_gap_s, share * ttft_s,
                                      np.array([full]))[0])
      if per_prefill_chip <= 0 or per_decode_chip <= 0:
        continue
      prefill_chips = _ceil(arrival_rate / per_prefill_chip)
      decode_chips = _ceil(arrival_rate / per_decode_chip)
      chips = prefill_chips + decode_chips
      if split["feasible"] and chips >= split["chips"]:
        continue
      wait = slot_queue.decode_pool_at(step, batch, output_tokens, arrival_rate / decode_chips)
      split = {
          "feasible": True, "prefill_chips": prefill_chips, "decode_chips": decode_chips,
          "chips": chips, "decode_batch": batch, "prefill_rate_per_chip": per_prefill_chip,
          "decode_rate_per_chip": per_decode_chip, "decode_capacity_per_chip": full,
          "slot_wait_share": share, "slot_wait_s": float(wait["slot_wait_s"]),
          "slot_utilisation": float(wait["slot_utilisation"]
                                   ), "goodput_per_chip": arrival_rate / chips,
          "kv_transfer_s": transfer_s, "prefill_gpus": prefill_chips * inputs.chips_per_replica,
          "decode_gpus": decode_chips * inputs.chips_per_replica,
          "gpus": chips * inputs.chips_per_replica
      }
    if not split["feasible"]:
      split["reason"] = "prefill alone (with the K/V transfer) misses the TTFT target"
  else:
    split["reason"] = decode_only["reason"]
  shared: dict[str,
               Any] = {"feasible": False, "reason": f"no feasible pool up to {MAX_CHIPS} chips"}

  def works(chips: int) -> dict[str, Any] | None:
    d = decision.decide(model, inputs, token_gap_s=token_gap_s, ttft_s=ttft_s,
                        arrival_rate=arrival_rate / chips, window_s=window_s,
                        with_elasticities=False, **kw)
    return d if d["status"] == "ok" else None

  chips = 1
  while chips <= MAX_CHIPS and works(chips) is None:
    chips *= 2
  if chips <= MAX_CHIPS:
    lo = chips // 2  # works(lo) failed (or lo == 0).
    while chips - lo > 1:
      mid = (lo + chips) // 2
      lo, chips = (lo, mid) if works(mid) is not None else (mid, chips)
    d = works(chips)
    shared = {
        "feasible": True, "chips": chips, "batch": d["batch"], "binds": d["binds"],
        "ttft_s": d["ttft_s"], "token_gap_s": d["loaded_token_gap_s"],
        "goodput_per_chip": arrival_rate / chips, "gpus": chips * inputs.chips_per_replica
    }
  winner = None
  if split["feasible"] and shared["feasible"]:
    winner = ("shared" if shared["chips"] < split["chips"] else
              "split" if split["chips"] < shared["chips"] else "tie")
  elif split["feasible"] or shared["feasible"]:
    winner = "split" if split["feasible"] else "shared"
  return {
      "arrival_rate_per_s": arrival_rate, "ttft_target_s": ttft_s,
      "token_gap_target_s": token_gap_s, "prefill_service_s": single, "split": split,
      "shared": shared, "fewer_chips": winner, "chips_per_replica": inputs.chips_per_replica,
      "kv_transfer": {
          "bytes_per_s": kv_link_bytes_per_s, "seconds": transfer_s,
          "note": kv_link_note or
                  ("assumed free (no link figure)" if kv_link_bytes_per_s is None else "")
      }, "queue_model": queueing.MODEL, "assumptions_favouring_shared": list(SHARED_WINS),
      "assumptions_favouring_split": list(SPLIT_WINS)
  }
