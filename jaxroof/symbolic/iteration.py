"""One scheduler iteration of raw numbers: the cost model with one full-attention group.

The toy server, its twin and the raw-number replica describe a model by a few
numbers: N weights of q bytes, N_act multiplied per token, k K/V bytes per
token, L blocks of H heads of d coordinates. Their iteration is the one cost
model (`jaxroof.symbolic.cost_model`) with those numbers substituted: the
weights in the linear operation, the K/V and `4*L*H*d` FLOPs per pair in one
full-attention group, no LM head or experts of their own. The mix is

  n_dec      decode rows, attending to S_dec positions in all;
  n_pre      prompt tokens in prefill chunks, S_pre_att (query, key) pairs,
             S_pre_kv K/V positions read or written (each chunk of c tokens
             after o attends to `o*c + c*(c+1)/2` pairs and touches o + c).

Bound: the cost model's "per_op" by default (or "fused"); calibrated: its
calibrated form. Lambdified once; the simulator calls it with scalars.
"""

from __future__ import annotations

import functools
from typing import Any

import sympy as sp

from jaxroof.symbolic import calibrated
from jaxroof.symbolic import cost_model
from jaxroof.symbolic import prefill
from jaxroof.symbolic.lambdify import Evaluator, lambdified
from jaxroof.symbolic.symbols import (BW, F, H, L, N, N_act, S_dec, S_pre_att, S_pre_kv, c_chunk, d,
                                      k, n_dec, n_pre, o_chunk, q)
from jaxroof.symbolic import symbols as S

MIX: tuple[sp.Symbol, ...] = (n_dec, S_dec, n_pre, S_pre_att, S_pre_kv)
MODEL: tuple[sp.Symbol, ...] = (N, q, k, BW, F, N_act, L, H, d)
INPUTS: tuple[sp.Symbol, ...] = MIX + MODEL
MODEL_NAMES: tuple[str, ...] = tuple(str(s) for s in MODEL)


def chunk_attended_pairs(o: sp.Expr = o_chunk, c: sp.Expr = c_chunk) -> sp.Expr:
  """Query-key pairs of a causal prefill chunk: c queries after o done ones,
  `o*c + c*(c+1)/2` (`cost_model.chunk_pairs` of a full-attention block)."""
  return sp.expand(cost_model.chunk_pairs("full", sp.sympify(o), sp.sympify(c)))


def chunk_kv_positions(o: sp.Expr = o_chunk, c: sp.Expr = c_chunk) -> sp.Expr:
  """Positions of K/V a chunk touches: the o-token prefix read, its c written."""
  return cost_model.chunk_kv_positions("full", sp.sympify(o), sp.sympify(c))


def raw_substitution() -> dict[sp.Symbol, sp.Expr]:
  """The cost model's inputs in terms of the raw numbers and the raw mix."""
  zero = {
      x: sp.S.Zero for x in (S.S_win, S.S_mla, S.X_win, S.X_mla, S.V_win, S.V_mla, S.O_up, S.W_x,
                             S.N_h, S.W_h, S.r_e, S.k_win, S.k_mla, S.a_win, S.a_mla, S.ap_mla,
                             S.u_mla, S.s_st, S.n_seq, S.t_comm, S.o_ovl, S.eta_attn, S.A_w, S.N_xb)
  }  # The toy twin fits its own six factors: no per-sequence or attention-kernel term.
  return {
      **zero, S.n_samp: n_dec + n_pre, S.S_full: S_dec, S.X_full: S_pre_att, S.V_full: S_pre_kv,
      S.W_b: N * q, S.N_b: N_act, S.E: sp.S.One, S.K: sp.S.One, S.k_full: k,
      S.a_full: L * prefill.full_attention_pair_flops(H, d), S.F_attn: F
  }


@functools.cache
def step_expression(kind: str) -> sp.Expr:
  """The step time of one iteration ("bound": per_op; else calibrated), in raw terms.

  Symbols are replaced structurally (`xreplace`): `subs` takes seconds on the calibrated
  form for the same expression."""
  terms = cost_model.bound_terms() if kind == "bound" else cost_model.calibrated_terms()
  return sp.sympify(terms["step_s"]).xreplace(raw_substitution())


@functools.cache
def _step_only(kind: str) -> Evaluator:
  inputs = INPUTS if kind == "bound" else INPUTS + calibrated.FACTORS
  return lambdified({"step_s": step_expression(kind)}, inputs)


@functools.cache
def chunk_model() -> Evaluator:
  """`f(o_chunk=, c_chunk=) -> {"attended": ..., "kv_positions": ...}` (numpy)."""
  return lambdified({"attended": chunk_attended_pairs(), "kv_positions": chunk_kv_positions()},
                    (o_chunk, c_chunk))


def iteration_expression(kind: str, factors: dict[str, float] | None = None) -> sp.Expr:
  """The step-time expression of one iteration (factors substituted if given)."""
  expr = step_expression(kind)
  if factors:
    expr = expr.xreplace({sp.Symbol(n, positive=True): sp.Float(v) for n, v in factors.items()})
  return expr


def step_time_function(kind: str, model_values: dict[str, float],
                       factors: dict[str, float] | None = None):
  """A fast `f(n_dec, S_dec, n_pre, S_pre_att, S_pre_kv) -> seconds` for one model.

  The lambdified expression is called with the model's constants bound once;
  arguments may be scalars or arrays (broadcast).
  """
  evaluator = _step_only("bound" if kind == "bound" else "calibrated")
  fixed: dict[str, Any] = {name: float(model_values[name]) for name in MODEL_NAMES}
  if kind != "bound":
    fixed.update({n: float(factors[n]) for n in calibrated.FACTOR_NAMES})

  def step_s(n_dec, S_dec, n_pre, S_pre_att, S_pre_kv):
    return evaluator(n_dec=n_dec, S_dec=S_dec, n_pre=n_pre, S_pre_att=S_pre_att, S_pre_kv=S_pre_kv,
                     **fixed)["step_s"]

  return step_s
