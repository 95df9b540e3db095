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

Calibrated: the calibrated step's form (`calibrated`), per-operation
efficiencies: weights (linear and head) at eta_w*BW, attention bytes at
eta_kv*BW, all FLOPs at eta_f*F, weights and FLOPs combined by the fitted
p-norm, attention bytes on top, plus the fixed costs per iteration, per
layer and (an engine's, t0_seq, 0 unless fitted) per sequence, a CPU's re-pack of the
linear weights from two rows (r_pack, 0 unless a profile fitted it), and an engine's GEMM
reading them again per m_pass rows past the first (0: no limit; vLLM CPU's oneDNN: 256 or
320), and an
engine's attention kernel timing its FLOPs at its own eta_attn*F, on top (0: with the
linear layers' at eta_f; vLLM CPU's: about 0.27), and the first c_llc bytes of the weights
read from an engine's CPU cache at bw_llc (0: none; the AMX Xeon's: 50-110 MB at 22 GB/s;
s_lru of them lost per byte the weights exceed c_llc: 1 an LRU under the steps' cyclic scan),
and an engine's elementwise kernels at t_act per row and activation element (A_w per token;
0: none; vLLM CPU's on the AMX Xeon: about 1.5 ns). Beside the step, `cold_cache_s`: what
the same step pays more when its cache went cold (an engine after an idle gap), its cached
bytes read from memory; the simulator charges it as part of an idle engine's wake.
"""

from __future__ import annotations

import functools
from typing import Literal

import numpy as np
import sympy as sp

from jaxroof.symbolic import architecture
from jaxroof.symbolic import calibrated
from jaxroof.symbolic import prefill
from jaxroof.symbolic.lambdify import Backend, Evaluator, lambdified
from jaxroof.symbolic.symbols import (A_w, BW, E, F, F_attn, K, L, N_b, N_h, O_up, S_full, S_mla,
                                      S_win, T, V_full, V_mla, V_win, W, W_b, W_h, W_x, X_full,
                                      X_mla, X_win, a_full, a_mla, a_win, ap_mla, c_chunk, eta_f,
                                      eta_kv, eta_w, k_full, k_mla, k_win, n_dec, n_pre, n_samp,
                                      n_seq, o_chunk, o_ovl, r_e, s_st, t0_layer, t0_seq, t0_step,
                                      t_act, t_comm, u_mla)

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
                                a_win, a_mla, ap_mla, u_mla, s_st, A_w, L, BW, F, F_attn)
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


def calibrated_terms() -> dict[str, sp.Expr]:
  """Named expressions of a calibrated iteration (`calibrated`'s form, per operation)."""
  ops = operations()
  # An engine's cached bytes (c_llc, less s_lru per byte past it) at bw_llc, the rest at eta_w*BW.
  weight_s = calibrated.weight_read_time(ops["linear"][0] + ops["head"][0], eta_w * BW)
  kv_s = ops["attention"][0] / (eta_kv * BW)
  # An engine's attention kernel at its own FLOP efficiency (eta_attn; 0: with the linear
  # layers' FLOPs at eta_f).
  shared_attention_flops, attention_s = calibrated.attention_split(ops["attention"][1])
  compute_s = (ops["linear"][1] + ops["head"][1] + shared_attention_flops) / (eta_f * F)
  # An engine's per-sequence work each iteration (t0_seq: 0 unless fitted to a real engine).
  fixed_s = t0_step + L * t0_layer + t0_seq * n_seq
  # An engine's elementwise kernels, per row and activation element (t_act: 0 unless measured).
  elementwise_s = t_act * tokens() * A_w
  linear_s = calibrated.overlap(weight_s, compute_s)
  # XLA:CPU's re-pack of the linear layers' weights for two or more rows (r_pack = 0 on
  # devices whose kernels stream them as stored).
  repack_s = calibrated.repack_time(tokens(), ops["linear"][0])
  # An engine's GEMM reading the linear weights again per m_pass rows (0: off).
  passes_s = calibrated.weight_passes(tokens(), ops["linear"][0])
  floor_s = fixed_s + linear_s + kv_s + attention_s + repack_s + passes_s + elementwise_s
  # Not in the step: what the same step pays more after the engine idled and its cache went
  # cold (the simulator's wake adds it; 0 where c_llc = 0).
  cold_cache_s = calibrated.cold_cache_time(ops["linear"][0] + ops["head"][0], eta_w * BW)
  return {
      "weight_s": weight_s, "kv_s": kv_s, "attention_s": attention_s, "compute_s": compute_s,
      "fixed_s": fixed_s, "linear_s": linear_s, "repack_s": repack_s, "weight_passes_s": passes_s,
      "elementwise_s": elementwise_s, "floor_s": floor_s, "cold_cache_s": cold_cache_s,
      "comm_s": t_comm, "step_s": with_overlap(floor_s, t_comm, o_ovl)
  }


def terms(kind: str, bound: Bound = "per_op") -> dict[str, sp.Expr]:
  """`bound_terms(bound)` for kind "bound", else `calibrated_terms()`."""
  return bound_terms(bound) if kind == "bound" else calibrated_terms()


@functools.cache
def evaluator(kind: str, bound: Bound = "per_op", backend: Backend = "numpy",
              step_only: bool = False) -> Evaluator:
  """`f(**INPUTS[, factors]) -> {name: value}`, lambdified once per (kind, bound)."""
  exprs = terms(kind, bound)
  if step_only:
    exprs = {"step_s": exprs["step_s"]}
  inputs = (INPUTS if kind == "bound" else INPUTS + calibrated.FACTORS + calibrated.REGIME_FACTORS +
            calibrated.ENGINE_FACTORS)
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
                     N_h, W_h, r_e, k_win, k_mla, a_win, a_mla, ap_mla, u_mla, s_st)
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
