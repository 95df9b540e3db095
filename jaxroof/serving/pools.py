"""Prefill and decode tuned apart: their crossovers, and split pools vs one shared pool.

Prefill reuses each weight across the prompt's tokens, decode across the
batch's sequences, so the two turn compute-bound at different sizes: prefill
at a prompt of about `R*q/2` tokens (fewer once attention FLOPs count),
decode at a batch of sequences that K/V reads push far higher (or never).

Replicas needed to serve `arrival_rate` requests/s at both a TTFT and a token-gap
target (DistServe's goodput-per-chip view), each from the one load model
(`jaxroof.serving.load`):

  shared   every replica prefills and decodes: the fewest replicas whose share of the
           rate is within one replica's max rate (the `serving` decision's).
  split    a prefill pool: one first-come-first-served queue in front of its replicas
           (as a disaggregation router keeps it), each prefilling one prompt at a time,
           M/D/c (`load_pools.pool_wait`); the prompt's K/V then crosses the network
           joining the pools (`kv_link_bytes_per_s`, each chip its own share; free when
           no figure is given); a decode pool of replicas whose requests arrive
           prefilled (`replica_load.decode_pool_states`: no prefill interference), each
           carrying the load model's max rate at the gap target with its slot wait
           within a share of the TTFT target. The TTFT target is split between the
           pools (the shares `WAIT_SHARES` are searched; the fewest replicas win): the
           prefill pool's p90 wait, its prefill and the transfer within the rest.

Goodput per chip = arrival rate / chips.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from jaxroof import errors
from jaxroof.parallel import replica_load
from jaxroof.serving import decision
from jaxroof.serving import load as load_lib
from jaxroof.serving import requests
from jaxroof.symbolic import load_model, load_pools
from jaxroof.symbolic import prefill as prefill_formulas
from jaxroof.symbolic import symbols as S
from jaxroof.symbolic.evaluate import lambdified
from jaxroof.symbolic.step_model import StepModel

MAX_CHIPS = 100_000
WAIT_SHARES = (0.1, 0.25, 0.5)  # Shares of the TTFT target a decode slot's p90 wait may take.

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


def prefill_pool(rate: float, service_s: float, budget_s: float) -> dict[str, Any] | None:
  """The fewest prefill replicas, one queue in front of them (M/D/c), whose p90 wait plus
  the prefill meets `budget_s` at `rate`; None where the prefill alone misses it."""
  if budget_s <= service_s:
    return None
  servers = max(_ceil(rate * service_s * (1 + 1e-12)), 1)
  if rate * service_s >= servers:
    servers += 1
  for _ in range(MAX_CHIPS):
    q = load_pools.pool_wait(rate, service_s, servers)
    if bool(q["stable"]) and float(q["wait_p90_s"]) + service_s <= budget_s:
      return {
          "replicas": servers, "wait_s": float(q["wait_s"]), "wait_p90_s": float(q["wait_p90_s"]),
          "p_wait": float(q["p_wait"]), "utilisation": rate * service_s / servers
      }
    servers += max(servers // 16, 1)
  return None


def decode_pool_rate(c: replica_load.Costs, output_tokens: int, token_gap_s: float,
                     wait_s: float) -> load_model.MaxRate:
  """A decode replica's max rate (prompts arrive prefilled) with its p90 slot wait within
  `wait_s`."""
  states = replica_load.decode_pool_states(c, np.ones((1, c.n.size), dtype=bool))
  return load_model.max_rate(states, output_tokens,
                             load_model.Targets(token_gap_s=token_gap_s, ttft_s=wait_s))


def compare(model: StepModel, inputs: requests.ServingInputs, *, prompt_tokens: int,
            output_tokens: int, arrival_rate: float, ttft_s: float, token_gap_s: float,
            window_s: float = 0.0, kv_link_bytes_per_s: float | None = None,
            kv_link_note: str = "") -> dict[str, Any]:
  """Replicas, chips and goodput per chip for split and shared pools at one rate and two
  targets. A "replica" in `split`/`shared` is one replica of `inputs`' layout (its
  `chips_per_replica` devices); `*_gpus` count those devices."""
  errors.require_positive("arrival_rate", arrival_rate)
  del window_s  # Unused: prompts are admitted as they arrive (the load model).
  work = dict(prompt_tokens=prompt_tokens, output_tokens=output_tokens)
  per = inputs.chips_per_replica
  transfer_s = 0.0
  if kv_link_bytes_per_s is not None:
    errors.require_positive("kv_link_bytes_per_s", kv_link_bytes_per_s)
    k = inputs.k * prompt_tokens if inputs.grows else inputs.kv_per_sequence_bytes
    transfer_s = float(k) / kv_link_bytes_per_s
  c = load_lib.costs(model, inputs, **work)
  single = float(c.alone[0])
  split: dict[str, Any] = {
      "feasible": False, "reason": "prefill alone (with the K/V transfer) "
                                   "misses the TTFT target"
  }
  for share in WAIT_SHARES:
    pre = prefill_pool(arrival_rate, single, (1 - share) * ttft_s - transfer_s)
    dec = decode_pool_rate(c, output_tokens, token_gap_s, share * ttft_s)
    rate_d = float(dec.rate[0])
    if pre is None or rate_d <= 0:
      if rate_d <= 0 and pre is not None:
        split["reason"] = "no decode batch meets the token gap with its slot wait in budget"
      continue
    decode_replicas = _ceil(arrival_rate / rate_d)
    replicas = pre["replicas"] + decode_replicas
    if split["feasible"] and replicas >= split["chips"]:
      continue
    states = replica_load.decode_pool_states(c, np.ones((1, c.n.size), dtype=bool))
    at = load_model.at(states, [arrival_rate / decode_replicas], dec.column, output_tokens,
                       load_model.Targets(token_gap_s=token_gap_s))
    split = {
        "feasible": True, "prefill_chips": pre["replicas"], "decode_chips": decode_replicas,
        "chips": replicas, "decode_batch": int(dec.B[0]), "max_running": int(dec.B[0]),
        "prefill_rate_per_chip": arrival_rate / pre["replicas"], "decode_rate_per_chip": rate_d,
        "max_rate_per_decode_replica_s": rate_d, "prefill_wait_p90_s": pre["wait_p90_s"],
        "prefill_utilisation": pre["utilisation"], "slot_wait_share": share, "slot_wait_s": float(
            at["slot_wait_s"][0]), "slot_utilisation": float(at["slot_utilisation"][0]),
        "token_gap_s": float(at["token_gap_s"][0]), "goodput_per_chip": arrival_rate / replicas,
        "kv_transfer_s": transfer_s, "prefill_gpus": pre["replicas"] * per,
        "decode_gpus": decode_replicas * per, "gpus": replicas * per
    }
  a = load_lib.answer(model, inputs, token_gap_s=token_gap_s, ttft_s=ttft_s, **work)
  shared: dict[str, Any] = {
      "feasible": False, "reason": "no number of running sequences meets the targets"
  }
  if a.max_rate > 0:
    replicas = _ceil(arrival_rate / a.max_rate)
    at = load_lib.point(a, arrival_rate / replicas)
    shared = {
        "feasible": True, "chips": replicas, "batch": a.max_running, "max_running": a.max_running,
        **a.scheduling.as_dict(), "binds": load_lib.binds(a), "max_rate_per_replica_s": a.max_rate,
        "ttft_s": at["ttft_s"], "ttft_p90_s": at["ttft_p90_s"], "token_gap_s": at["token_gap_s"],
        "goodput_per_chip": arrival_rate / replicas, "gpus": replicas * per
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
      "shared": shared, "fewer_chips": winner, "chips_per_replica": per, "kv_transfer": {
          "bytes_per_s": kv_link_bytes_per_s, "seconds": transfer_s,
          "note": kv_link_note or
                  ("assumed free (no link figure)" if kv_link_bytes_per_s is None else "")
      }, "queue_model": load_model.MODEL, "assumptions_favouring_shared": list(SHARED_WINS),
      "assumptions_favouring_split": list(SPLIT_WINS)
  }
