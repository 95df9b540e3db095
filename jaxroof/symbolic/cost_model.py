"""The one cost model of a scheduler iteration: every consumer's step time.

An iteration holds decode rows (one token each, each attending to its own
context) and prefill chunks (c prompt tokens after o already done), on one
chip's share of a layout. Every step time in jaxroof comes from here: a decode
step is an iteration with no chunks, a prefill one with no decode rows; the
simulator, `serving`, `batch_sweep`, the planner and the fits evaluate these
expressions, lambdified once (`lambdified`, numpy or JAX).

Operations, each with its bytes and FLOPs (uniform routing and the layer
schedule's kinds stated in the docstrings below):

  linear     the blocks' weight-streaming linear layers: the weights read every
             iteration (`W_b`) plus the routed experts the iteration's tokens
             touch (`expected_distinct_experts` of E, top-K, uniform routing),
             2 FLOPs per active block weight per token (`N_b`);
  head       the LM head (or a tied embedding) at the rows that sample a token,
             `2*N_h` FLOPs each, its weights read once, plus the embedding rows
             looked up (`r_e` bytes per token, untied tables);
  attention  the K/V each decode row attends to and each chunk reads or writes,
             per layer-kind group (full; windowed: sliding or chunked, spans
             capped; MLA's latent), plus the recurrent state of every sequence;
             FLOPs per (query, key) pair per group: `4*H*d` per block for full
             and windowed, MLA absorbed `2*H*(2*r_kv + d_rope)` in decode and
             the chosen form in prefill (MHA: `2*H*(d_qk + d_v)` plus the
             prefix latent's up-projection `2*r_kv*H*(d_nope + d_v)` per
             position); linear-attention and Mamba blocks add state bytes and
             no quadratic term (their scan FLOPs are left out);
  comm       the collectives of the pass (`t_comm`, alpha-beta,
             `parallel.pass_comm_s`), hidden under the rest by `o_ovl`.

Bounds:
  "per_op" (default)  each operation is its own roofline, run one after the
                      other: `sum(Max(bytes/BW, FLOPs/F))`. A decode step's
                      attention stays memory-bound while a prefill chunk's
                      linear layers are compute-bound; the sum keeps that
                      trade-off, which chunked prefill is about.
  "fused"             one roofline over the whole iteration,
                      `Max(sum bytes/BW, sum FLOPs/F)`: the optimistic bound
                      (every operation overlapping every other perfectly).
Communication is serial at `o_ovl = 0` and hides under the rest up to the
larger at `o_ovl = 1` (`parallel.with_overlap`); nothing else overlaps.

Calibrated (`calibrated_terms`): per-operation efficiencies. Weights (linear
and head) at eta_w*BW, attention bytes at eta_kv*BW, linear FLOPs at eta_f*F (attention's at its kernels' rate F_attn),
weights and FLOPs combined by the fitted p-norm (p = 1 + r_ovl), attention
bytes on top, plus the fixed costs per iteration, per layer and per sequence
(t0_seq, 0 unless fitted), and attention FLOPs at their own eta_attn*F_attn on top
where an engine's attention kernel was measured (0: with the linear layers' at
eta_f). Each cost term is registered once (`terms.py`). An engine's own terms
reach this model through its `terms.Extension`: named seconds on top, a
replacement of how the weights are read, named expressions beside the step
(`calibrated_terms(extensions)`). The calibrated decode step and the calibrated
prefill of users' rows are this iteration specialised by substitution
(`calibrated_decode_outputs`, `calibrated_prefill_outputs`).
"""

from __future__ import annotations

import functools
from typing import Literal

import numpy as np
import sympy as sp

from jaxroof.symbolic import architecture
from jaxroof.symbolic import formulas
from jaxroof.symbolic import prefill
from jaxroof.symbolic import terms as terms_lib
from jaxroof.symbolic.lambdify import Backend, Evaluator, lambdified
from jaxroof.symbolic.symbols import (A_t, A_w, B, BW, E, F, F_attn, H, K, L, L_attn, N, N_act, N_b,
                                      N_h, O_up, P, S_full, S_mla, S_win, T, V_full, V_mla, V_win,
                                      W, W_b, W_h, W_x, X_full, X_mla, X_win, a_full, a_mla, a_win,
                                      ap_mla, c_chunk, d, eta_attn, eta_f, eta_f_prefill, eta_kv,
                                      eta_w, k, k_full, k_mla, k_win, n_dec, n_pre, n_samp, n_seq,
                                      N_xb, o_chunk, o_ovl, q, r_e, r_ovl, s_st, t0_layer, t0_seq,
                                      t0_step, t_comm, u_mla)
from jaxroof.symbolic.terms import eta_comm, eta_moe, m_moe

Bound = Literal["per_op", "fused"]
BOUNDS: tuple[str, ...] = ("per_op", "fused")
MlaPrefill = Literal["mha", "absorbed"]
MLA_PREFILL: tuple[str, ...] = ("mha", "absorbed")
OPERATIONS: tuple[str, ...] = ("linear", "head", "attention")

# What an iteration is: its rows and the keys they attend to, per group.
MIX: tuple[sp.Symbol, ...] = (n_dec, n_pre, n_samp, n_seq, S_full, S_win, S_mla, X_full, X_win,
                              X_mla, V_full, V_win, V_mla, O_up)
# What a model on a chip's share of a layout is.
MODEL: tuple[sp.Symbol, ...] = (W_b, W_x, E, K, N_b, N_h, W_h, r_e, k_full, k_win, k_mla, a_full,
                                a_win, a_mla, ap_mla, u_mla, s_st, A_w, L, BW, F, F_attn, N_xb)
COMM: tuple[sp.Symbol, ...] = (t_comm, o_ovl)
INPUTS: tuple[sp.Symbol, ...] = MIX + MODEL + COMM
MIX_NAMES: tuple[str, ...] = tuple(str(s) for s in MIX)
MODEL_NAMES: tuple[str, ...] = tuple(str(s) for s in MODEL)

ASSUMPTIONS: dict[str, str] = {
    "per_op": "analytic bound, sum of per-operation rooflines (linear layers, LM head, "
              "attention with its K/V, each Max(bytes/BW, FLOPs/F), one after another)",
    "fused": "analytic bound, one roofline over the iteration (Max(all bytes/BW, all "
             "FLOPs/F)): optimistic, every operation overlapping every other",
    "routing": "MoE: uniform, independent routing; a block reads the experts the "
               "iteration's tokens touch, E*(1 - (1 - K/E)**tokens)",
    "mla": "MLA: absorbed form in decode (attention over the cached latent); prefill in the "
           "MHA form by default (per-head K and V up-projected from the latent, as vLLM's "
           "MLA backend does: fewer FLOPs per pair when queries are many)",
    "omitted": "softmax, norms, activations' traffic, recurrent scan FLOPs and launches "
               "omitted (a calibrated model's fixed costs stand for the launches)",
    "comm": "communication serial with the iteration unless an overlap fraction is given",
}


def with_overlap(floor: sp.Expr, comm: sp.Expr, overlap: sp.Expr) -> sp.Expr:
  """A step with communication: serial at overlap 0, the larger of the two at 1."""
  with sp.evaluate(False):  # Min of two large sums: sympy's comparisons would take seconds.
    return floor + comm - overlap * sp.Min(floor, comm)


def tokens() -> sp.Expr:
  """Rows the linear layers multiply: every decode row and every prompt token."""
  return n_dec + n_pre


def operations() -> dict[str, tuple[sp.Expr, sp.Expr]]:
  """Each operation class's (bytes, FLOPs) in one iteration."""
  experts = W_x * architecture.expected_distinct_experts(tokens(), E, K) / E
  linear = (W_b + experts, 2 * N_b * tokens())
  head = (W_h + r_e * tokens(), 2 * N_h * n_samp)
  attention_bytes = (k_full * (S_full + V_full) + k_win * (S_win + V_win) + k_mla *
                     (S_mla + V_mla) + s_st * n_seq)
  attention_flops = (a_full * (S_full + X_full) + a_win * (S_win + X_win) + a_mla * S_mla +
                     ap_mla * X_mla + u_mla * O_up)
  return {"linear": linear, "head": head, "attention": (attention_bytes, attention_flops)}


def bound_terms(bound: Bound = "per_op") -> dict[str, sp.Expr]:
  """Named expressions of an iteration's analytic bound (seconds, bytes, FLOP).

  `<op>_bytes`, `<op>_flops`, `<op>_memory_s`, `<op>_compute_s` and `<op>_s`
  (its roofline) per operation; `memory_s` and
  `compute_s` the totals at BW and F; `floor_s` without communication;
  `comm_s`; `step_s`.
  """
  if bound not in BOUNDS:
    raise ValueError(f"bound={bound!r} is not allowed: use one of {BOUNDS}.")
  ops = operations()
  rate = {"attention": F_attn}  # Attention at its kernels' dtype (F_attn), the rest at F.
  out: dict[str, sp.Expr] = {}
  for name, (nbytes, flops) in ops.items():
    out[f"{name}_bytes"], out[f"{name}_flops"] = nbytes, flops
    out[f"{name}_memory_s"], out[f"{name}_compute_s"] = nbytes / BW, flops / rate.get(name, F)
    out[f"{name}_s"] = sp.Max(nbytes / BW, flops / rate.get(name, F))
  out["memory_s"] = sum(b for b, _ in ops.values()) / BW
  out["compute_s"] = sum(f / rate.get(name, F) for name, (_, f) in ops.items())
  if bound == "per_op":
    out["floor_s"] = sum(out[f"{name}_s"] for name in ops)
  else:
    out["floor_s"] = sp.Max(out["memory_s"], out["compute_s"])
  out["comm_s"] = t_comm
  out["step_s"] = with_overlap(out["floor_s"], t_comm, o_ovl)
  return out


# The calibrated iteration's own cost terms (the core's; an extension adds its engine's).
CALIBRATED_TERMS: tuple[sp.Symbol, ...] = (eta_w, eta_kv, eta_f, t0_step, t0_layer, r_ovl, t0_seq,
                                           eta_attn, eta_moe, m_moe, eta_comm)
Extensions = tuple[str, ...]


def overlap(a: sp.Expr, b: sp.Expr) -> sp.Expr:
  """The p-norm of two times, p = 1 + r_ovl, written so that no power underflows: a
  kernel overlapping them perfectly takes the larger (r_ovl -> oo), one that does not
  takes the sum (r_ovl -> 0)."""
  p = 1 + r_ovl
  with sp.evaluate(False):  # Powers of large sums: sympy's sign checks would take seconds.
    larger = sp.Max(a, b)
    return larger * ((a / larger)**p + (b / larger)**p)**(1 / p)


def _switch(eta: sp.Expr) -> sp.Expr:
  """1 for an efficiency in (0, 1] (the term is used), 0 at 0 (absent)."""
  return sp.ceiling(sp.Min(1, eta))


def attention_split(flops: sp.Expr) -> tuple[sp.Expr, sp.Expr]:
  """Attention FLOPs as (the share left with the linear layers, their own time in seconds).

  An engine whose attention kernel runs at eta_attn*F_attn takes `flops / (eta_attn*F_attn)`
  on top of the linear layers; eta_attn = 0 keeps them with the linear layers' FLOPs at
  eta_f*F_attn (the switch ceiling(min(1, eta_attn)) is 1 for any eta_attn in (0, 1], 0 at 0).
  """
  on = _switch(eta_attn)
  return (1 - on) * flops, on * flops / (sp.Max(eta_attn, 1e-30) * F_attn)


def linear_weights() -> sp.Expr:
  """Block weights multiplied per token, the routed experts' weighted by their own rate: the
  dense GEMMs' `N_b - N_xb` and the routed experts' grouped GEMMs' `N_xb` at eta_moe of the
  dense rate (eta_moe = 1: as the dense ones, `N_b`). At 2 FLOPs each per token and eta_f*F
  they give the linear layers' compute time."""
  return N_b - N_xb + N_xb / eta_moe


def expert_padding() -> sp.Expr:
  """The grouped expert GEMMs' padding, in weights-times-rows: each routed expert the
  iteration's tokens touch (`expected_distinct_experts`) multiplies `m_moe` rows more than
  its share `tokens*K/E` (a tile's rows per expert), its `N_xb/K` weights at the experts'
  rate: `N_xb/K * E_touched * m_moe / eta_moe` (0 at m_moe = 0, or a dense model). So
  the experts' FLOP rate falls as `M_e / (M_e + m_moe)` with their rows M_e = tokens*K/E."""
  touched = architecture.expected_distinct_experts(tokens(), E, K)
  return N_xb / K * touched * m_moe / eta_moe


# `linear_weights()` and `expert_padding()` as positive symbols while the iteration is built
# (sympy then combines its positive times quickly), replaced, unevaluated, once it is built.
_N_LINEAR = sp.Dummy("N_linear", positive=True)
_N_PADDING = sp.Dummy("N_padding", positive=True)


def _plain_read(nbytes: sp.Expr, rate: sp.Expr) -> sp.Expr:
  return nbytes / rate


def _weight_read(extensions: Extensions):
  readers = [(n, e.weight_read) for n in extensions
             if (e := terms_lib.extension(n)).weight_read is not None]
  if len(readers) > 1:
    raise ValueError(f"extensions {[n for n, _ in readers]} each replace the weights' read")
  return readers[0][1] if readers else _plain_read


def calibrated_terms(extensions: Extensions = ()) -> dict[str, sp.Expr]:
  """Named expressions of a calibrated iteration, with the named engines' extensions.

  `weight_s`, `kv_s`, `attention_s`, `compute_s`, `fixed_s`, `linear_s`, each
  extension's named seconds, `floor_s` (their sum), its named expressions beside the
  step, `comm_s` and `step_s`.
  """
  return dict(_calibrated_terms(tuple(extensions)))


@functools.cache
def _calibrated_terms(extensions: Extensions) -> dict[str, sp.Expr]:
  ops = operations()
  read = _weight_read(extensions)
  weight_bytes = ops["linear"][0] + ops["head"][0]
  weight_s = read(weight_bytes, eta_w * BW)
  kv_s = ops["attention"][0] / (eta_kv * BW)
  shared_attention_flops, attention_s = attention_split(ops["attention"][1])
  compute_s = ((2 * _N_LINEAR * tokens() + 2 * _N_PADDING + ops["head"][1]) / (eta_f * F) +
               shared_attention_flops / (eta_f * F_attn))
  fixed_s = t0_step + L * t0_layer + t0_seq * n_seq
  linear_s = overlap(weight_s, compute_s)
  parts = terms_lib.IterationParts(tokens=tokens(), linear_bytes=ops["linear"][0],
                                   weight_bytes=weight_bytes, weight_rate=eta_w * BW, read=read,
                                   A_w=A_w)
  extra: dict[str, sp.Expr] = {}
  beside: dict[str, sp.Expr] = {}
  for name in extensions:
    extension = terms_lib.extension(name)
    extra.update(extension.seconds(parts))
    beside.update(extension.beside(parts))
  floor_s = fixed_s + linear_s + kv_s + attention_s + sum(extra.values())
  out = {
      "weight_s": weight_s, "kv_s": kv_s, "attention_s": attention_s, "compute_s": compute_s,
      "fixed_s": fixed_s, "linear_s": linear_s, **extra, "floor_s": floor_s, **beside,
      "comm_s": t_comm / eta_comm, "step_s": with_overlap(floor_s, t_comm / eta_comm, o_ovl)
  }
  with sp.evaluate(False):
    done = {_N_LINEAR: linear_weights(), _N_PADDING: expert_padding()}
    return {name: sp.sympify(e).xreplace(done) for name, e in out.items()}


def extension_terms(extensions: Extensions) -> tuple[sp.Symbol, ...]:
  """The named extensions' term symbols, in order."""
  return tuple(t.symbol for n in extensions for t in terms_lib.extension(n).terms)


def terms(kind: str, bound: Bound = "per_op", extensions: Extensions = ()) -> dict[str, sp.Expr]:
  """`bound_terms(bound)` for kind "bound", else `calibrated_terms(extensions)`."""
  return bound_terms(bound) if kind == "bound" else calibrated_terms(extensions)


@functools.cache
def evaluator(kind: str, bound: Bound = "per_op", backend: Backend = "numpy",
              step_only: bool = False, extensions: Extensions = ()) -> Evaluator:
  """`f(**INPUTS[, terms]) -> {name: value}`, lambdified once per (kind, bound, extensions)."""
  exprs = terms(kind, bound, extensions)
  if step_only:
    exprs = {"step_s": exprs["step_s"]}
  inputs = (INPUTS if kind == "bound" else INPUTS + CALIBRATED_TERMS + extension_terms(extensions))
  return lambdified(exprs, inputs, backend)


# How a decode row's context and a prefill chunk map onto a group's spans.
def decode_keys(group: str, T: sp.Expr = T, W: sp.Expr = W) -> sp.Expr:
  """Keys one decode row with T retained positions reads per block of `group`.

  full and MLA: T; sliding: `Min(T, W)` (a rolling window); chunked: the
  chunk-sized buffer it holds, `Min(T, W)` (`architecture.chunked_tokens`).
  """
  if group in ("full", "mla"):
    return T
  if group == "sliding":
    return architecture.windowed_tokens(T, W)
  if group == "chunked":
    return architecture.chunked_tokens(T, W)
  raise ValueError(f"group={group!r} is not a layer-kind group")


def chunk_pairs(group: str, o: sp.Expr = o_chunk, c: sp.Expr = c_chunk, W: sp.Expr = W) -> sp.Expr:
  """Causal (query, key) pairs of a chunk of c tokens after o, per block of `group`.

  The prompt's pairs up to o + c less those up to o, with the prompt-level
  closed forms of `prefill` (full, sliding window, chunked-local).
  """
  if group in ("full", "mla"):
    return prefill.attended_pairs(o + c) - prefill.attended_pairs(o)
  if group == "sliding":
    return prefill.attended_pairs(o + c, W) - prefill.attended_pairs(o, W)
  if group == "chunked":
    return prefill.chunk_local_pairs(o + c, W) - prefill.chunk_local_pairs(o, W)
  raise ValueError(f"group={group!r} is not a layer-kind group")


def chunk_kv_positions(group: str, o: sp.Expr = o_chunk, c: sp.Expr = c_chunk,
                       W: sp.Expr = W) -> sp.Expr:
  """K/V positions a chunk touches per block: the prefix it reads (capped by a
  window or chunk) plus the c positions it writes."""
  if group in ("full", "mla"):
    return o + c
  return decode_keys(group, o, W) + c


@functools.cache
def span_evaluator(group: str) -> Evaluator:
  """`f(T=, o_chunk=, c_chunk=, W=) -> {"keys", "pairs", "kv_positions"}` (numpy)."""
  return lambdified(
      {
          "keys": decode_keys(group), "pairs": chunk_pairs(group),
          "kv_positions": chunk_kv_positions(group)
      }, (T, o_chunk, c_chunk, W))


def decode_specialisation(B: sp.Expr, context: sp.Expr, weight_bytes: sp.Expr, N_act: sp.Expr,
                          k: sp.Expr, A: sp.Expr) -> dict[sp.Symbol, sp.Expr]:
  """Substitutions that make an iteration the decode step of B rows at one context.

  Weights read (`weight_bytes`, routed experts already counted) and the
  `N_act` weights multiplied per row go to the linear operation; `k` bytes
  and `A` attention FLOPs per retained token and row to one full group; no
  prefill, no LM head of its own (its weights are in `weight_bytes`, its
  FLOPs in `N_act`: the same intensity, so a separate roofline would agree).
  """
  zero = {
      s: 0 for s in (n_pre, X_full, X_win, X_mla, V_full, V_win, V_mla, O_up, S_win, S_mla, W_x,
                     N_h, W_h, r_e, k_win, k_mla, a_win, a_mla, ap_mla, u_mla, s_st, N_xb)
  }
  return {
      **zero, n_dec: B, n_samp: B, n_seq: B, S_full: B * context, W_b: weight_bytes, E: 1, K: 1,
      N_b: N_act, k_full: k, a_full: A, F_attn: F
  }


def decode_outputs(bound: Bound = "per_op") -> dict[str, sp.Expr]:
  """A decode step of B rows at context T (`decode_specialisation`): the named
  outputs of `evaluate.step_model`, in (B, T, N, q, k, BW, F, N_act, A_t).

  With `A_t = 0` and the fused bound this is `formulas.step_floor` exactly.
  """
  from jaxroof.symbolic import formulas
  from jaxroof.symbolic.symbols import A_t, B, N, N_act, k, q

  subs = {
      **decode_specialisation(B, T, formulas.weight_traffic(N, q), N_act, k, A_t), t_comm: 0,
      o_ovl: 0
  }
  t = bound_terms(bound)
  step_s = t["floor_s"].subs(subs)
  return {
      "weight_bytes": formulas.weight_traffic(N, q),
      "kv_bytes": formulas.retained_kv_bytes(B, T, k),
      "traffic_bytes": formulas.step_traffic(B, N, q, T, k),
      "memory_s": t["memory_s"].subs(subs),
      "compute_s": t["compute_s"].subs(subs),
      "step_s": step_s,
      "aggregate_tokens_per_s": formulas.aggregate_rate(B, step_s),
      "per_sequence_tokens_per_s": formulas.per_sequence_rate(step_s),
  }


@functools.cache
def decode_compute_crossover_batch(bound: Bound = "per_op") -> sp.Expr:
  """Batch at which a decode step turns compute-bound.

  fused: total compute time reaches total memory time (`solved`); per_op: the
  linear layers' FLOPs reach their weight reads, `B = F*N*q/(2*BW*N_act)`
  (attention's own roofline is separate and, in decode, memory-bound unless
  its FLOPs per byte pass the ridge).
  """
  from jaxroof.symbolic import formulas
  from jaxroof.symbolic.symbols import B, N, N_act, q

  if bound == "fused":
    from jaxroof.symbolic import solved
    return solved.compute_crossover_batch()
  root = sp.solve(
      sp.Eq(formulas.memory_time(formulas.weight_traffic(N, q), BW),
            formulas.compute_time(B, N_act, F)), B)
  return root[0]


@functools.cache
def decode_max_batch_for_token_gap(bound: Bound = "per_op") -> sp.Expr:
  """Largest (real) batch whose decode step meets a gap `t_gap`, in closed form.

  per_op: the step is `Max(N*q/BW, 2*N_act*B/F) + B*T*Max(k/BW, A_t/F)`,
  linear in B on each branch (a + b*B = t_gap, root (t_gap - a)/b); the
  smaller holds.
  """
  from jaxroof.symbolic import formulas
  from jaxroof.symbolic.symbols import A_t, B, N, N_act, k, q, t_gap

  if bound == "fused":
    from jaxroof.symbolic import solved
    return solved.max_batch_for_token_gap()
  per_row = T * sp.Max(k / BW, A_t / F)
  memory = formulas.memory_time(formulas.weight_traffic(N, q), BW) + B * per_row
  compute = formulas.compute_time(B, N_act, F) + B * per_row
  # Each branch is linear in B, a + b*B = t_gap: its root, kept unsimplified so
  # that an infinite F (memory only) leaves finite terms.
  roots = [(t_gap - side.subs(B, 0)) / sp.diff(side, B) for side in (memory, compute)]
  return sp.Min(*roots)


@functools.cache
def _max_batch_evaluator(bound: Bound) -> tuple[Evaluator, tuple[str, ...]]:
  expr = decode_max_batch_for_token_gap(bound)
  symbols = tuple(sorted(expr.free_symbols, key=str))
  return lambdified({"batch": expr}, symbols), tuple(str(s) for s in symbols)


def max_batch_for_token_gap(bound: Bound = "per_op", **values: float) -> float:
  """`decode_max_batch_for_token_gap(bound)` at values given by symbol name (lambdified
  once per bound: a sweep asks it every time)."""
  evaluate, names = _max_batch_evaluator(bound)
  with np.errstate(divide="ignore", invalid="ignore"):  # F = inf: memory only.
    return float(evaluate(**{name: values[name] for name in names})["batch"])


# The calibrated step's specialisations: a decode step, a users' prefill row.
DECODE_INPUTS: tuple[sp.Symbol, ...] = (B, T, N, q, k, BW, F, N_act, L, A_t)
PREFILL_INPUTS: tuple[sp.Symbol, ...] = (B, P, N, q, BW, F, N_act, L, L_attn, H, d)
PREFILL_TERMS: tuple[sp.Symbol, ...] = (eta_w, eta_f_prefill, t0_step, t0_layer, r_ovl)


@functools.cache
def calibrated_decode_outputs(extensions: Extensions = ()) -> dict[str, sp.Expr]:
  """The calibrated decode step of B rows at context T: `calibrated_terms(extensions)`
  at `decode_specialisation`, as `decode_outputs` specialises the bound.

  Inputs `DECODE_INPUTS` (A_t: attention FLOPs per retained token and row, at eta_f
  with the linear layers' unless eta_attn is given), the core's `CALIBRATED_TERMS`,
  the extensions' terms (and A_w where one uses it). `memory_s` is the weights' and
  K/V's time plus the extensions' memory terms.
  """
  subs = {
      **decode_specialisation(B, T, formulas.weight_traffic(N, q), N_act, k, A_t), t_comm: 0,
      o_ovl: 0
  }
  t = {name: sp.sympify(e).xreplace(subs) for name, e in calibrated_terms(extensions).items()}
  memory = [t[m] for n in extensions for m in terms_lib.extension(n).memory]
  base = ("weight_s", "kv_s", "attention_s", "compute_s", "fixed_s", "linear_s", "floor_s",
          "comm_s", "step_s")
  step_s = t["floor_s"]
  return {
      "weight_bytes": formulas.weight_traffic(N,
                                              q), "kv_bytes": formulas.retained_kv_bytes(B, T, k),
      "traffic_bytes": formulas.step_traffic(B, N, q, T,
                                             k), "weight_s": t["weight_s"], "kv_s": t["kv_s"],
      "fixed_s": t["fixed_s"], "memory_s": t["weight_s"] + t["kv_s"] + sum(memory),
      "compute_s": t["compute_s"], "attention_s": t["attention_s"], "linear_s": t["linear_s"],
      "step_s": step_s, "aggregate_tokens_per_s": formulas.aggregate_rate(B, step_s),
      "per_sequence_tokens_per_s": formulas.per_sequence_rate(step_s),
      **{name: e for name, e in t.items() if name not in base}
  }


def prefill_specialisation(B: sp.Expr, P: sp.Expr, weight_bytes: sp.Expr, N_act: sp.Expr,
                           pair_flops: sp.Expr) -> dict[sp.Symbol, sp.Expr]:
  """Substitutions that make an iteration the prefill of B prompts of P tokens in one
  pass, as users' measured prefill rows are described: the weights read once, `N_act`
  weights multiplied per prompt token, `pair_flops` per causal (query, key) pair in one
  full group; no decode rows, no LM head of its own, no K/V bytes (their writes are
  absorbed by the factors, as the rows give no K/V size)."""
  zero = {
      s: 0 for s in (n_dec, S_full, S_win, S_mla, X_win, X_mla, V_full, V_win, V_mla, O_up, W_x,
                     N_h, W_h, r_e, k_full, k_win, k_mla, a_win, a_mla, ap_mla, u_mla, s_st, N_xb)
  }
  return {
      **zero, n_pre: B * P, n_samp: B, n_seq: B, X_full: B * prefill.attended_pairs(P),
      a_full: pair_flops, W_b: weight_bytes, E: 1, K: 1, N_b: N_act, F_attn: F
  }


@functools.cache
def calibrated_prefill_outputs() -> dict[str, sp.Expr]:
  """A users' prefill row (`prefill_specialisation`) under the calibrated iteration, in
  `PREFILL_INPUTS` and `PREFILL_TERMS`: the prefill's FLOPs at their own efficiency
  (eta_f and eta_attn both eta_f_prefill: the linear layers' with the weight reads by the
  p-norm, causal attention's on top); the fixed costs per pass and per layer and the
  overlap are the decode step's; no per-sequence cost."""
  pair_flops = L_attn * prefill.full_attention_pair_flops(H, d)
  subs = {
      **prefill_specialisation(B, P, formulas.weight_traffic(N, q), N_act, pair_flops), t_comm: 0,
      o_ovl: 0, eta_f: eta_f_prefill, eta_attn: eta_f_prefill, t0_seq: 0, eta_moe: 1, eta_comm: 1
  }
  t = {name: sp.sympify(e).xreplace(subs) for name, e in calibrated_terms().items()}
  return {
      "weight_s": t["weight_s"], "compute_s": t["compute_s"], "attention_s": t["attention_s"],
      "fixed_s": t["fixed_s"], "linear_s": t["linear_s"], "step_s": t["floor_s"]
  }
