"""Several chips: per-chip traffic, collectives, their time, and the step.

A replica of the model spans `tp * pp * ep` chips; `dp` replicas serve
independent batches. The layout rules, stated once here and shared by the
planner, the sweeps and the sharded toy:

  * Tensor parallel `tp` (Megatron): Q/K/V projections split by heads, the
    output projection by rows, the MLP's up projection by columns and its
    down projection by rows. Each block then needs two all-reduces of the
    (rows, D) activations (after attention and after the MLP); a
    reduce-scatter + all-gather pair moves the same bytes (AR = RS + AG).
  * K/V: heads split across `tp`; once `tp` exceeds the K/V heads each head is
    replicated `tp / H_kv` times, so a chip keeps `Max(1/tp, 1/u_kv)` of the
    K/V, `u_kv` the K/V heads. MLA keeps one latent shared by all heads:
    `u_kv = 1`, replicated on every tensor rank. Sliding windows cap the
    retained tokens per block (already in k) and split by heads like full
    attention. Recurrent (SSM) state splits by channels (`u_kv` = channels).
  * Embedding table and LM head: split by vocabulary across `tp`. The lookup
    is a masked gather plus one all-reduce of (rows, D); the logits are
    all-gathered, (rows, V).
  * Pipeline `pp`: consecutive blocks per stage; block weights and K/V divide
    by `pp`; the embedding table sits on the first stage and the LM head on
    the last (a tied table on both), so the busiest chip is an end stage's;
    one hand-off of (rows, D) between consecutive stages. A decode step
    of `m_mb` microbatches takes `Max(m_mb, pp)` stage times plus the
    hand-offs (the bubble is `1 - m_mb / Max(m_mb, pp)`).
  * Expert parallel `ep` (MoE): routed experts spread over `ep` groups of
    `tp * pp` chips; everything else is replicated over the groups, and a
    replica's sequences split over them (attention data-parallel). Per MoE
    block two all-to-alls (dispatch, combine) each send
    `rows * K * D * a * (ep - 1) / ep` bytes per chip.
  * Data parallel `dp`: independent replicas; fleet rate = dp x replica rate.

Collective times, alpha-beta (per chip sending at `W_ic`, `t_hop` per step,
`t_base` per collective: NCCL's base latency, 6.6 us for its LL ring):
ring all-reduce `t_base + 2 (n-1)/n S/W + 2 h t_hop`, h the ring steps of one
reduce-scatter (n - 1 on a switched fabric; on a torus, rings per axis in
turn, `sum(axis - 1)` steps with the same bandwidth term); tree (recursive
halving and doubling, Rabenseifner) `2 log2(n)` steps; one-shot (every chip
sends its S to every other directly, switched fabrics only)
`t_base + (n-1) S/W + t_hop`; "best" takes the cheaper of ring and one-shot
where one-shot is possible (`x_os`), as NCCL picks per message size;
all-gather half of each; all-to-all `t_base + (n-1)/n S/W + (n-1) t_hop`
(pairwise on a switched fabric). Communication adds to the step (`o_ovl = 0`, serial) or
hides up to the floor (`o_ovl = 1`: the larger binds).
"""

from __future__ import annotations

import functools
from typing import Literal

import sympy as sp

from jaxroof.symbolic import architecture
from jaxroof.symbolic import cost_model
from jaxroof.symbolic import prefill as prefill_formulas
from jaxroof.symbolic.symbols import (A_f, A_t, B, BW, C, D, F, K, L_moe, N, N_act, N_x, P, S_b, T,
                                      V, W_e, W_h, W_ic, W_res, W_x, a_act, dp, ep, eta_comm, h_tp,
                                      k, m_mb, n_blk, n_r, o_ovl, pp, q, s, t_base, t_comm, t_floor,
                                      t_hand, t_hop, t_stage, tp, u_kv, w, x_os, x_tie)

# The figures of the link a replica's collectives run over (`parallel.layout.links`).
LINK_SYMBOLS: tuple[sp.Symbol, ...] = (W_ic, t_hop, t_base, h_tp, x_os)

Algorithm = Literal["best", "ring", "tree"]
ALGORITHMS: tuple[str, ...] = ("best", "ring", "tree")


# Per-chip shares.
def chips_per_replica() -> sp.Expr:
  """Chips one replica spans."""
  return tp * pp * ep


def per_chip_weights(N: sp.Expr = N, N_x: sp.Expr = N_x) -> sp.Expr:
  """Weights one chip holds or reads: the dense part over tp*pp, experts also over ep."""
  return (N - N_x) / (tp * pp) + N_x / (tp * pp * ep)


def kv_share() -> sp.Expr:
  """Share of a sequence's K/V one tensor rank keeps (replicated once tp > u_kv)."""
  return sp.Max(1 / tp, 1 / u_kv)


def rows_per_pass(B: sp.Expr = B) -> sp.Expr:
  """Rows one chip processes per microbatch pass (sequences split over ep groups)."""
  return B / (m_mb * ep)


def per_chip_kv_bytes(B: sp.Expr = B) -> sp.Expr:
  """K/V bytes one chip reads in one microbatch pass of its stage."""
  return rows_per_pass(B) * T * k * kv_share() / pp


def path_inputs() -> dict[str, sp.Expr]:
  """Single-device step inputs that give one microbatch's path through pp stages.

  With one microbatch the token gap is `pp` stage times, and `pp * Max(a, b)
  = Max(pp a, pp b)`: the step model evaluated with these N, k and N_act
  (and the B sequences) plus the path's communication is `decode_outputs`.
  """
  return {"N": pp * per_chip_weights(), "k": k * kv_share() / ep, "N_act": N_act / (tp * ep)}


# Memory of the busiest chip.
def end_stage_weight_bytes() -> sp.Expr:
  """Embedding and LM-head bytes on the busiest stage, before the tp split.

  One stage (pp = 1) stores the table and an untied head once:
  `W_e + (1 - x_tie) W_h`. With pp > 1 the first stage holds the table, the
  last the head (a tied table's copy: `W_h = W_e`), and the larger binds.
  `W_h`: the LM head's bytes, the table's when tied (`x_tie = 1`).
  """
  return sp.Piecewise((W_e + (1 - x_tie) * W_h, sp.Eq(pp, 1)), (sp.Max(W_e, W_h), True))


def chip_weight_bytes() -> sp.Expr:
  """Resident weight bytes on the busiest chip (an end stage): the blocks' dense part over
  tp*pp, routed experts also over ep, the end stage's table or head over tp (split by
  vocabulary, replicated over the ep groups). `W_res`: every stored weight's bytes."""
  ends = W_e + (1 - x_tie) * W_h  # Stored once.
  blocks = W_res - W_x - ends
  return blocks / (tp * pp) + W_x / (tp * pp * ep) + end_stage_weight_bytes() / tp


def chip_kv_bytes_per_sequence() -> sp.Expr:
  """Allocated K/V bytes of one sequence a chip keeps (`s` per sequence, whole model)."""
  return s * kv_share() / pp


def chip_memory_bytes(B: sp.Expr = B) -> sp.Expr:
  """Bytes on the busiest chip with B sequences per replica (split over the ep groups)."""
  return chip_weight_bytes() + B / ep * chip_kv_bytes_per_sequence()


def replica_capacity_sequences() -> sp.Expr:
  """Sequences a replica fits: each ep group's busiest chip fits
  `architecture.capacity_sequences` of its K/V share beside its weights (< 0: none)."""
  return ep * architecture.capacity_sequences(C, w, chip_weight_bytes(),
                                              chip_kv_bytes_per_sequence())


# The chip-memory inputs, in the order `parallel.layout.chip_memory` passes them.
CHIP_MEMORY_SYMBOLS: tuple[sp.Symbol,
                           ...] = (C, w, W_res, W_x, W_e, W_h, x_tie, s, tp, pp, ep, u_kv)


# Collectives: bytes.
def tp_allreduce_bytes(rows: sp.Expr) -> sp.Expr:
  """Bytes of one tensor-parallel all-reduce operand: (rows, D) activations."""
  return rows * D * a_act


def tp_allreduces_per_pass() -> sp.Expr:
  """All-reduces on one token's path: 2 per block and 1 for the embedding lookup."""
  return 2 * n_blk + 1


def tp_bytes_per_pass(rows: sp.Expr) -> sp.Expr:
  """All-reduced bytes on one pass over `rows` rows: decode B rows, prefill P*B rows."""
  return tp_allreduces_per_pass() * tp_allreduce_bytes(rows)


def alltoall_bytes_per_token() -> sp.Expr:
  """Bytes one token sends out of its chip per MoE block (dispatch + combine), top-K."""
  return 2 * alltoall_bytes_per_chip(1)


def logits_gather_bytes(rows: sp.Expr) -> sp.Expr:
  """Bytes of the gathered logits (rows, V)."""
  return rows * V * a_act


def alltoall_bytes_per_chip(rows: sp.Expr) -> sp.Expr:
  """Bytes one chip sends in one MoE all-to-all (dispatch or combine), top-K."""
  return rows * K * D * a_act * (ep - 1) / ep


def handoff_bytes(rows: sp.Expr) -> sp.Expr:
  return rows * D * a_act


# Collectives: time.
def _log2(x: sp.Expr) -> sp.Expr:
  return sp.log(x) / sp.log(2)


def _base(n: sp.Expr) -> sp.Expr:
  """The base latency of a collective over n ranks: none for one rank (no call)."""
  return sp.Min(n - 1, 1) * t_base


def allreduce_time(S: sp.Expr = S_b, n: sp.Expr = n_r, algorithm: Algorithm = "best",
                   steps: sp.Expr | None = None) -> sp.Expr:
  """Time of an all-reduce of S bytes over n ranks (alpha-beta; see the module docstring).

  `steps`: ring steps of one reduce-scatter (default n - 1; a torus's per-axis
  sum `h_tp` for the tensor-parallel ranks).
  """
  steps = n - 1 if steps is None else steps
  bandwidth = 2 * (n - 1) / n * S / W_ic
  ring = _base(n) + bandwidth + 2 * steps * t_hop
  if algorithm == "ring":
    return ring
  if algorithm == "tree":
    return _base(n) + bandwidth + 2 * _log2(n) * t_hop
  one_shot = _base(n) + (n - 1) * S / W_ic + sp.Min(n - 1, 1) * t_hop
  return sp.Piecewise((sp.Min(ring, one_shot), x_os > sp.Rational(1, 2)), (ring, True))


def allgather_time(S: sp.Expr = S_b, n: sp.Expr = n_r, algorithm: Algorithm = "best",
                   steps: sp.Expr | None = None) -> sp.Expr:
  """Time of an all-gather whose gathered result is S bytes (also a reduce-scatter of S)."""
  steps = n - 1 if steps is None else steps
  bandwidth = (n - 1) / n * S / W_ic
  ring = _base(n) + bandwidth + steps * t_hop
  if algorithm == "ring":
    return ring
  if algorithm == "tree":
    return _base(n) + bandwidth + _log2(n) * t_hop
  direct = _base(n) + bandwidth + sp.Min(n - 1, 1) * t_hop  # Every share read directly.
  return sp.Piecewise((sp.Min(ring, direct), x_os > sp.Rational(1, 2)), (ring, True))


def alltoall_time(sent: sp.Expr, n: sp.Expr = n_r) -> sp.Expr:
  """Pairwise all-to-all: each chip sends `sent` bytes in n - 1 exchanges."""
  return _base(n) + sent / W_ic + (n - 1) * t_hop


def handoff_time(S: sp.Expr = S_b) -> sp.Expr:
  """Point-to-point send of S bytes to the next stage, one hop."""
  return t_base + S / W_ic + t_hop


def path_comm_s(rows: sp.Expr, algorithm: Algorithm = "best") -> sp.Expr:
  """Communication on one microbatch's path through every stage (no hand-offs).

  Tensor all-reduces and the logits gather over tp; the MoE all-to-alls over
  ep (two per MoE block).
  """
  tensor = (
      tp_allreduces_per_pass() * allreduce_time(tp_allreduce_bytes(rows), tp, algorithm, h_tp) +
      allgather_time(logits_gather_bytes(rows), tp, algorithm, h_tp))
  experts = 2 * L_moe * alltoall_time(alltoall_bytes_per_chip(rows), ep)
  return tensor + experts


def handoffs_s(rows: sp.Expr) -> sp.Expr:
  """Hand-offs along one microbatch's path: pp - 1 of them."""
  return (pp - 1) * handoff_time(handoff_bytes(rows))


# The step.
def with_overlap(floor: sp.Expr = t_floor, comm: sp.Expr = t_comm,
                 overlap: sp.Expr = o_ovl) -> sp.Expr:
  """Step time with communication: serial at overlap 0, the larger at 1
  (`cost_model.with_overlap`, the one definition)."""
  return cost_model.with_overlap(floor, comm, overlap)


def calibrated_with_comm(floor: sp.Expr = t_floor, comm: sp.Expr = t_comm,
                         overlap: sp.Expr = o_ovl) -> sp.Expr:
  """A calibrated step plus communication run at a fraction eta_comm of its modelled speed.

  `comm` is the analytic collective time (`path_comm_s`, bandwidth and
  per-hop latency at the datasheet link figures); a measured layout fits
  eta_comm in (0, 1], the one factor both terms share (per-collective
  software overhead and link efficiency are not separable from step times).
  """
  return with_overlap(floor, comm / eta_comm, overlap)


def pipeline_step(stage: sp.Expr = t_stage, hand: sp.Expr = t_hand) -> sp.Expr:
  """A decode step (one token per sequence) through pp stages, m_mb microbatches."""
  return sp.Max(m_mb, pp) * stage + (pp - 1) * hand


def bubble_fraction() -> sp.Expr:
  """Share of a stage's time idle in a decode step (0 once m_mb >= pp)."""
  return 1 - m_mb / sp.Max(m_mb, pp)


def _stage_terms(bound: str, rows: sp.Expr, context: sp.Expr, weight_bytes: sp.Expr, n_act: sp.Expr,
                 k_chip: sp.Expr, a_chip: sp.Expr) -> dict[str, sp.Expr]:
  """The one cost model's decode iteration (`cost_model`) for one chip's stage."""
  subs = {
      **cost_model.decode_specialisation(rows, context, weight_bytes, n_act, k_chip, a_chip),
      t_comm: 0, o_ovl: 0
  }
  terms = cost_model.bound_terms(bound)
  return {name: sp.sympify(terms[name]).subs(subs) for name in ("memory_s", "compute_s", "floor_s")}


def decode_outputs(algorithm: Algorithm = "best", bound: str = "per_op") -> dict[str, sp.Expr]:
  """Named per-chip expressions of one decode step of one replica.

  A stage's floor is the one cost model's decode iteration on one chip's
  share (`cost_model.decode_specialisation`: weights, K/V and `A_t`
  attention FLOPs per retained token split like the heads); `comm_s` is the
  communication on a token's path (per step), `step_s` the token gap; the
  rates are per replica (times dp for the fleet).
  """
  rows = rows_per_pass()
  stage_terms = _stage_terms(bound, rows, T,
                             per_chip_weights() * q, N_act / (tp * pp),
                             k * kv_share() / pp, A_t / (tp * pp))
  memory, compute = stage_terms["memory_s"], stage_terms["compute_s"]
  stage_comm = path_comm_s(rows, algorithm) / pp
  stage = with_overlap(stage_terms["floor_s"], stage_comm, o_ovl)
  hand = handoff_time(handoff_bytes(rows))
  step = pipeline_step(stage, hand)
  passes = sp.Max(m_mb, pp)
  return {
      "weight_bytes": per_chip_weights() * q,
      "kv_bytes": per_chip_kv_bytes() * m_mb,
      "memory_s": passes * memory,
      "compute_s": passes * compute,
      "comm_s": passes * stage_comm + (pp - 1) * hand,
      "step_s": step,
      "aggregate_tokens_per_s": B / step,
      "per_sequence_tokens_per_s": 1 / step,
      "bubble_fraction": bubble_fraction(),
  }


def prefill_outputs(algorithm: Algorithm = "best", bound: str = "per_op") -> dict[str, sp.Expr]:
  """One prompt of P tokens through the replica: the cost model's operations and
  communication.

  The prompt's P rows pass the pp stages in series (no microbatching), each
  stage reading its weights once; linear FLOPs `2*P*N_act` and causal
  attention `A_f*P*(P+1)/2` split over tp*ep (K/V writes left out); per_op:
  the two rooflines summed, fused: one; the tensor all-reduces carry (P, D)
  activations.
  """
  weights = pp * per_chip_weights() * q / BW
  linear = 2 * P * N_act / (tp * ep * F)
  attention = prefill_formulas.attention_flops(P, 1, A_f) / (tp * ep * F)
  memory, compute = weights, linear + attention
  floor = (sp.Max(weights, linear) + attention if bound == "per_op" else sp.Max(memory, compute))
  comm = path_comm_s(P, algorithm) + handoffs_s(P)
  return {
      "prefill_memory_s": memory, "prefill_compute_s": compute, "prefill_comm_s": comm,
      "prefill_s": with_overlap(floor, comm, o_ovl)
  }


def pass_comm_s(rows: sp.Expr = B, algorithm: Algorithm = "best") -> sp.Expr:
  """Communication of one pass of `rows` token rows through a replica (one microbatch).

  The rows split over the ep groups (`rows_per_pass` at m_mb = 1); the tensor
  and expert collectives on the path plus the pp - 1 hand-offs. At rows = B
  it is `decode_outputs`' `comm_s` with one microbatch; the serving layer
  takes it per decode step (B rows), per batched prefill (P*B rows) and per
  simulator iteration (its decode plus prefill-chunk tokens).
  """
  per_group = rows / ep
  return path_comm_s(per_group, algorithm) + handoffs_s(per_group)


def fleet_rate(per_replica: sp.Expr) -> sp.Expr:
  """Tokens per second of dp replicas."""
  return dp * per_replica


# The degree beyond which communication binds.
def _tp_comm_and_memory(latency: bool) -> tuple[sp.Expr, sp.Expr]:
  """Decode on tp chips, pp = ep = m = 1, tp <= u_kv, ring all-reduces only."""
  hop = t_hop if latency else 0
  one = 2 * (tp - 1) / tp * tp_allreduce_bytes(B) / W_ic + 2 * (tp - 1) * hop
  comm = tp_allreduces_per_pass() * one
  memory = (N * q + B * T * k) / (tp * BW)
  return comm, memory


@functools.cache
def comm_bound_degree(latency: bool = True) -> sp.Expr:
  """The tp at which the all-reduces take as long as the per-chip memory time.

  Solved with `sympy.solve` from `_tp_comm_and_memory` (memory-bound decode,
  tp within the K/V heads, logits gather left out); beyond it communication
  binds. Without latency: `1 + M W / X` in closed form.
  """
  comm, memory = _tp_comm_and_memory(latency)
  roots = [r for r in sp.solve(sp.Eq(comm, memory), tp) if _may_be_positive(r)]
  if len(roots) != 1:
    raise ArithmeticError(f"expected one positive root for tp, got {roots}")
  return sp.simplify(roots[0])


def _may_be_positive(expr: sp.Expr) -> bool:
  value = expr.subs({s: 1 for s in expr.free_symbols})
  return bool(sp.re(sp.N(value)) > 0)


def comm_bound_equation(latency: bool = True) -> tuple[sp.Expr, sp.Expr]:
  """(communication, memory) time as functions of tp: the defining equation's sides."""
  return _tp_comm_and_memory(latency)
