"""An engine's memory reservation: the K/V memory it leaves, and the sequences that run.

A serving engine sizes its K/V cache by a rule of its own (`engines/data/published/
engine_defaults.json` states each with its source). One form covers them, in the
registered memory terms (`terms.py`):

  held   = W_res + m_act * n_bud * D + m_graph      weights, workspace, graphs (per chip)
  kv     = u_mem * (C - x_free * held) - (1 - x_free) * held

vLLM (`x_free = 0`): `gpu_memory_utilization * C` less the weights and the peak
activations of a dummy batch of `max_num_batched_tokens` tokens; SGLang: its
`mem_fraction_static * C` less the weights (its workspace outside that share);
TensorRT-LLM (`x_free = 1`): `kv_cache_free_gpu_memory_fraction` of what the weights
and workspace leave. The sequences a replica runs are then capped three ways:

  running = Min(n_max, floor(kv / s))

`n_max` the scheduler's cap (max_num_seqs, and the token budget where a decode row
takes one token of it), `s` the K/V bytes one sequence holds on the chip (its
reserved length; pooled over the expert-parallel groups by the caller).
"""

from __future__ import annotations

import functools

import sympy as sp

from jaxroof.symbolic.lambdify import Evaluator, lambdified
from jaxroof.symbolic.symbols import C, D, W_res, n_bud, n_max, s
from jaxroof.symbolic.terms import m_act, m_graph, u_mem, x_free


def held_bytes(W: sp.Expr = W_res, budget: sp.Expr = n_bud, width: sp.Expr = D) -> sp.Expr:
  """Bytes a chip holds outside its K/V cache: weights, workspace, graphs."""
  return W + m_act * budget * width + m_graph


def kv_memory(capacity: sp.Expr = C, W: sp.Expr = W_res, budget: sp.Expr = n_bud,
              width: sp.Expr = D) -> sp.Expr:
  """Bytes of K/V cache the engine's rule leaves on one chip (<= 0: none)."""
  held = held_bytes(W, budget, width)
  return u_mem * (capacity - x_free * held) - (1 - x_free) * held


def running_sequences(kv: sp.Expr, per_sequence: sp.Expr = s) -> sp.Expr:
  """Sequences a replica runs at once: its scheduler's cap, or what its K/V holds."""
  return sp.Min(n_max, sp.floor(kv / per_sequence))


INPUTS: tuple[sp.Symbol, ...] = (C, W_res, n_bud, D, u_mem, m_act, m_graph, x_free, s, n_max)


@functools.cache
def evaluator() -> Evaluator:
  """`f(C=, W_res=, n_bud=, D=, u_mem=, m_act=, m_graph=, x_free=, s=, n_max=)` ->
  `{"kv_bytes", "running"}` (running: of one chip's K/V; the caller pools ep groups)."""
  kv = kv_memory()
  return lambdified({"kv_bytes": kv, "running": running_sequences(kv)}, INPUTS)
