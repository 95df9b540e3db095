"""The decode-step model: every formula once, as a sympy expression.

Each function returns an expression. Arguments default to the shared symbols
of `jaxroof.symbolic.symbols`, so a call with no arguments gives the closed form, and
numbers give a number (`weight_traffic(8e9, 2) == 1.6e10`). Units are SI:
bytes, seconds, FLOP.

Assumptions shared by the step model, from the lesson:
  * every participating weight is read from memory once per step and reused by
    all B rows (no on-chip residency across steps, ideal tile reuse);
  * each sequence's retained K/V is read once per step;
  * attention FLOPs, activations, KV writes, launches and communication are
    omitted, so times are optimistic floors, not predictions.
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy as sp

from jaxroof.symbolic.symbols import (B, BW, F, H, H_kv, L, N, N_act, P, T, b, d, g, k, q, t_queue,
                                      t_window)

Expr = sp.Expr


def _s(*values) -> list[sp.Expr]:
  return [sp.sympify(v) for v in values]


def weight_traffic(N: Expr = N, q: Expr = q) -> Expr:
  """Bytes of weights read per step: `N*q` (weights read once, reused by B)."""
  N, q = _s(N, q)
  return N * q


def linear_flops(N: Expr = N, B: Expr = B) -> Expr:
  """FLOPs of the linear layers for B rows: a multiply and an add per weight."""
  N, B = _s(N, B)
  return 2 * N * B


def weight_only_intensity(B: Expr = B, q: Expr = q) -> Expr:
  """Linear FLOPs per weight byte, `2*B/q`: B FLOP/byte in BF16 (q = 2)."""
  weights = sp.Symbol("N", positive=True)  # Cancels: intensity is N-free.
  return sp.simplify(linear_flops(weights, B) / weight_traffic(weights, q))


def ridge_point(F: Expr = F, BW: Expr = BW) -> Expr:
  """The device's FLOPs per byte at which compute and memory take equally long."""
  F, BW = _s(F, BW)
  return F / BW


def kv_bytes_per_position(L: Expr = L, H_kv: Expr = H_kv, d: Expr = d, b: Expr = b) -> Expr:
  """KV bytes one processed position keeps: K and V, per block, head, coordinate.

  Full attention only; Q is temporary and not counted.
  """
  L, H_kv, d, b = _s(L, H_kv, d, b)
  return 2 * L * H_kv * d * b


def positions_with_kv(P: Expr = P, g: Expr = g) -> Expr:
  """Positions holding K/V after a P-token prompt and g emitted outputs.

  Ordinary causal decoding, no speculation: the last emitted token has not
  been fed back yet, so it has no K/V.
  """
  P, g = _s(P, g)
  return P + g - 1


def retained_kv_bytes(B: Expr = B, T: Expr = T, k: Expr = k) -> Expr:
  """KV bytes read per step when all B sequences retain T tokens of k bytes."""
  B, T, k = _s(B, T, k)
  return B * T * k


def retained_kv_bytes_unequal(contexts: Sequence[Expr], k: Expr = k) -> Expr:
  """KV bytes read per step for sequences with unequal retained lengths."""
  (k,) = _s(k)
  return k * sp.Add(*_s(*contexts))


def step_traffic(B: Expr = B, N: Expr = N, q: Expr = q, T: Expr = T, k: Expr = k) -> Expr:
  """Bytes read per decode step: the weights once plus every sequence's K/V."""
  return weight_traffic(N, q) + retained_kv_bytes(B, T, k)


def memory_time(traffic: Expr | None = None, BW: Expr = BW) -> Expr:
  """Seconds to move `traffic` bytes (default: `step_traffic()`) at BW."""
  traffic = step_traffic() if traffic is None else sp.sympify(traffic)
  (BW,) = _s(BW)
  return traffic / BW


def compute_time(B: Expr = B, N: Expr = N, F: Expr = F) -> Expr:
  """Seconds of linear-layer arithmetic for B rows at F FLOP/s."""
  (F,) = _s(F)
  return linear_flops(N, B) / F


def step_floor(
    B: Expr = B,
    N: Expr = N,
    q: Expr = q,
    T: Expr = T,
    k: Expr = k,
    BW: Expr = BW,
    F: Expr = F,
    N_act: Expr = N_act,
) -> Expr:
  """Optimistic decode-step time: the larger of memory and compute time.

  Memory moves the N weights read plus the K/V; compute multiplies the N_act
  active weights per token (a dense model has N_act = N; an MoE model reads
  more weights than each token multiplies).
  """
  return sp.Max(memory_time(step_traffic(B, N, q, T, k), BW), compute_time(B, N_act, F))


def aggregate_rate(B: Expr = B, t: Expr | None = None) -> Expr:
  """Tokens per second over the batch: each step yields one token per sequence."""
  t = step_floor(B=B) if t is None else sp.sympify(t)
  return sp.sympify(B) / t


def per_sequence_rate(t: Expr | None = None) -> Expr:
  """Tokens per second one user sees: one token per step."""
  t = step_floor() if t is None else sp.sympify(t)
  return 1 / t


def prefill_time(P: Expr = P, N: Expr = N, q: Expr = q, BW: Expr = BW, F: Expr = F) -> Expr:
  """Optimistic prefill of one P-token prompt: weights read once, shared by P rows.

  The same two floors as a decode step with the prompt's positions as rows
  (attention over the prompt and the K/V writes are omitted).
  """
  return sp.Max(memory_time(weight_traffic(N, q), BW), compute_time(P, N, F))


def time_to_first_token(prefill: Expr | None = None, t_window: Expr = t_window,
                        t_queue: Expr = t_queue) -> Expr:
  """Seconds from arrival to the first output: wait for a slot, the batching
  window, then the prompt's prefill (default: `prefill_time()`)."""
  prefill = prefill_time() if prefill is None else sp.sympify(prefill)
  t_window, t_queue = _s(t_window, t_queue)
  return t_queue + t_window + prefill


def attention_flops(B: Expr = B, T: Expr = T, H: Expr = H, d: Expr = d) -> Expr:
  """FLOPs of decode attention: one query row per sequence over T positions.

  `Q K^T` and `P V` each take a multiply and an add per (head, position,
  coordinate): 4*B*H*T*d, H query heads. Softmax arithmetic is omitted.
  """
  B, T, H, d = _s(B, T, H, d)
  return 4 * B * H * T * d


def attention_bytes(
    B: Expr = B,
    T: Expr = T,
    H: Expr = H,
    H_kv: Expr = H_kv,
    d: Expr = d,
    b: Expr = b,
) -> Expr:
  """Bytes decode attention moves: each sequence's K/V once, its query and output.

  `2*B*T*H_kv*d*b` (the retained K/V, per layer) plus `2*B*H*d*b`.
  """
  B, T, H, H_kv, d, b = _s(B, T, H, H_kv, d, b)
  kv = retained_kv_bytes(B, T, kv_bytes_per_position(1, H_kv, d, b))
  return kv + 2 * B * H * d * b


def linear_bytes(M: Expr, K: Expr, N: Expr, b: Expr = b) -> Expr:
  """Bytes a linear layer x(M,K) @ w(K,N) moves: weights once, x read, output written."""
  M, K, N, b = _s(M, K, N, b)
  return weight_traffic(K * N, b) + M * K * b + M * N * b
