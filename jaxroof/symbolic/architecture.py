"""Formulas for real architectures: KV per layer kind, paging, MoE, quantization.

Each function returns a sympy expression built on `jaxroof.symbolic.formulas` (so the
full-attention K/V term and the weight traffic are written once, there).
Arguments default to named positive symbols, so a call with no arguments gives
the closed form and numbers give a number. Units are SI: bytes, tokens.

Per-layer terms (a model sums them over its layer schedule):
  full attention   2*H_kv*d*b bytes per retained token;
  sliding window   the same per token, for at most W tokens;
  latent (MLA)     (r_kv + d_rope)*b bytes per retained token;
  recurrent (SSM)  d_inner*(d_state + d_conv)*b bytes per sequence, fixed;
  chunked local    the same per token as full, for at most W_chunk tokens;
  linear attention (Gated DeltaNet) H_lv*d_lk*d_lv*b_s + conv window, fixed;
  Mamba-2          H_m*d_m*d_state*b_s + conv window, fixed.

Recurrent states keep their matrix in the state dtype (b_s bytes, fp32 in
most engines) and their convolution window (d_conv taps per channel) in b.
"""

from __future__ import annotations

from collections.abc import Callable

import sympy as sp

from jaxroof.symbolic import formulas
from jaxroof.symbolic.lambdify import formula_function
from jaxroof.symbolic.symbols import (  # noqa: F401  (re-exported for callers)
    ARCHITECTURE as QUANTITIES, B, C, E, G, H, H_kv, K, L_moe, M_new, N_exp, N_fixed, T, W, W_res,
    b, bits, d, d_conv, d_inner, d_qk, d_rope, d_state, d_v, k, p, q, r_kv, s, s_b, w, P, H_lk,
    H_lv, H_m, W_chunk, b_s, c_state, d_lk, d_lv, d_m, n_g, N, N_lp, q_lp)

Expr = sp.Expr


def _s(*values) -> list[Expr]:
  return [sp.sympify(v) for v in values]


def full_attention_kv_per_token(H_kv: Expr = H_kv, d: Expr = d, b: Expr = b) -> Expr:
  """K/V bytes per retained token of ONE full-attention block: `2*H_kv*d*b`."""
  return formulas.kv_bytes_per_position(1, H_kv, d, b)


def windowed_tokens(T: Expr = T, W: Expr = W) -> Expr:
  """Tokens a sliding-window block retains: `Min(T, W)` (a rolling buffer)."""
  T, W = _s(T, W)
  return sp.Min(T, W)


def mla_kv_per_token(r_kv: Expr = r_kv, d_rope: Expr = d_rope, b: Expr = b) -> Expr:
  """Bytes per retained token of ONE MLA block: the latent plus the RoPE key.

  MLA caches one compressed vector per token shared by all heads (r_kv
  coordinates) and one decoupled RoPE key (d_rope), not per-head K and V.
  """
  r_kv, d_rope, b = _s(r_kv, d_rope, b)
  return (r_kv + d_rope) * b


def mla_expanded_kv_per_token(H: Expr = H, d_qk: Expr = d_qk, d_v: Expr = d_v, b: Expr = b) -> Expr:
  """Bytes per token of the same block if it cached per-head K and V (MHA)."""
  H, d_qk, d_v, b = _s(H, d_qk, d_v, b)
  return H * (d_qk + d_v) * b


def ssm_state_bytes(
    d_inner: Expr = d_inner,
    d_state: Expr = d_state,
    d_conv: Expr = d_conv,
    b: Expr = b,
) -> Expr:
  """Recurrent state of ONE Mamba block per sequence, whatever its length.

  The SSM state (d_inner x d_state) plus the convolution window
  (d_inner x d_conv), as Hugging Face's and mamba_ssm's caches hold them.
  """
  d_inner, d_state, d_conv, b = _s(d_inner, d_state, d_conv, b)
  return d_inner * (d_state + d_conv) * b


def kv_bytes(tokens: Expr = T, per_token: Expr = k) -> Expr:
  """Bytes one sequence keeps for `tokens` tokens at `per_token` bytes each."""
  return formulas.retained_kv_bytes(1, tokens, per_token)


def reserved_tokens(T: Expr = T, M_new: Expr = M_new) -> Expr:
  """Tokens an engine reserves for a sequence: retained now plus its allowance.

  Reserving for the maximum output length holds memory before the tokens
  that will use it exist.
  """
  T, M_new = _s(T, M_new)
  return T + M_new


def paged_tokens(T: Expr = T, p: Expr = p) -> Expr:
  """Token slots allocated in pages of p tokens: `ceiling(T/p)*p` (>= T)."""
  T, p = _s(T, p)
  return sp.ceiling(T / p) * p


def windowed_paged_tokens(T: Expr = T, W: Expr = W, p: Expr = p) -> Expr:
  """Token slots a sliding-window block holds in pages of p tokens.

  Up to the window, like `paged_tokens`; past it the last W tokens
  [T-W, T) span the pages from floor((T-W)/p) to floor((T-1)/p), which is one
  page more than W/p when the window is not page-aligned (pages are freed
  only once all their tokens have left the window).
  """
  T, W, p = _s(T, W, p)
  spanned = (sp.floor((T - 1) / p) - sp.floor((T - W) / p) + 1) * p
  return sp.Piecewise((paged_tokens(T, p), T <= W), (spanned, True))


def usable_kv_memory(C: Expr = C, w: Expr = w, W_res: Expr = W_res) -> Expr:
  """Bytes left for K/V: capacity less the workspace fraction and the weights."""
  C, w, W_res = _s(C, w, W_res)
  return C * (1 - w) - W_res


def capacity_sequences(C: Expr = C, w: Expr = w, W_res: Expr = W_res, s: Expr = s) -> Expr:
  """Sequences that fit: `floor((C*(1 - w) - W_res) / s)` (<= 0: none fit)."""
  (s,) = _s(s)
  return sp.floor(usable_kv_memory(C, w, W_res) / s)


def expected_distinct_experts(B: Expr = B, E: Expr = E, K: Expr = K) -> Expr:
  """Experts one MoE layer touches for B tokens, each routed to K of E.

  Assumes uniform, independent routing: an expert is missed by one token
  with probability 1 - K/E, by all B with (1 - K/E)**B. Equals K at B = 1
  and tends to E as B grows. Real routers are skewed, which touches fewer.
  """
  B, E, K = _s(B, E, K)
  return E * (1 - (1 - K / E)**B)


def moe_weights_read(
    B: Expr = B,
    N_fixed: Expr = N_fixed,
    N_exp: Expr = N_exp,
    L_moe: Expr = L_moe,
    E: Expr = E,
    K: Expr = K,
) -> Expr:
  """Weights a decode step reads: the fixed part plus every touched expert."""
  N_fixed, N_exp, L_moe = _s(N_fixed, N_exp, L_moe)
  return N_fixed + L_moe * N_exp * expected_distinct_experts(B, E, K)


def moe_weight_traffic(
    B: Expr = B,
    N_fixed: Expr = N_fixed,
    N_exp: Expr = N_exp,
    L_moe: Expr = L_moe,
    E: Expr = E,
    K: Expr = K,
    q: Expr = q,
) -> Expr:
  """Weight bytes per step of an MoE model: rises with B, unlike a dense one."""
  return formulas.weight_traffic(moe_weights_read(B, N_fixed, N_exp, L_moe, E, K), q)


def quantized_bytes_per_weight(bits: Expr = bits, G: Expr = G, s_b: Expr = s_b) -> Expr:
  """Bytes per weight with group scales: `bits/8 + s_b/G`.

  E.g. int4 with one 2-byte scale per 128 weights: 0.5 + 2/128 = 0.515625.
  The same holds for any block-scaled stored value, K/V elements included
  (fp8 K/V with a 1-byte scale per 32: 1.03125).
  """
  bits, G, s_b = _s(bits, G, s_b)
  return bits / 8 + s_b / G


def mixed_bytes_per_weight(N: Expr = N, N_lp: Expr = N_lp, q: Expr = q, q_lp: Expr = q_lp) -> Expr:
  """Bytes per weight over N weights of which N_lp are in a quantized format.

  `(N_lp*q_lp + (N - N_lp)*q) / N`: the rest keep q bytes each (bf16: 2).
  gpt-oss ships its experts in MXFP4 (q_lp = 0.53125) and the rest in bf16,
  so what a step reads per weight moves with the experts' share of N.
  """
  N, N_lp, q, q_lp = _s(N, N_lp, q, q_lp)
  return (N_lp * q_lp + (N - N_lp) * q) / N


def chunked_tokens(T: Expr = T, W_chunk: Expr = W_chunk) -> Expr:
  """Tokens a chunked-local-attention block keeps: `Min(T, W_chunk)`.

  A query attends only to the tokens of its own chunk of W_chunk positions
  (`chunked_attended_tokens`), so no block needs more than one chunk of
  K/V; engines hold a chunk-sized buffer (Hugging Face's chunked cache).
  """
  T, W_chunk = _s(T, W_chunk)
  return sp.Min(T, W_chunk)


def chunked_attended_tokens(T: Expr = T, W_chunk: Expr = W_chunk) -> Expr:
  """Positions the newest query of a chunked block attends to: its own chunk so far."""
  T, W_chunk = _s(T, W_chunk)
  return T - W_chunk * sp.floor((T - 1) / W_chunk)


def mamba1_state_bytes(
    d_inner: Expr = d_inner,
    d_state: Expr = d_state,
    d_conv: Expr = d_conv,
    b_s: Expr = b_s,
    b: Expr = b,
) -> Expr:
  """State of ONE Mamba-1 block per sequence with the SSM matrix in its own dtype.

  `ssm_state_bytes` with b_s bytes for the d_inner x d_state matrix and b
  for the d_inner x d_conv convolution window (equal when b_s = b).
  """
  d_inner, d_state, d_conv, b_s, b = _s(d_inner, d_state, d_conv, b_s, b)
  return d_inner * d_state * b_s + d_inner * d_conv * b


def linear_attention_state_bytes(
    H_lk: Expr = H_lk,
    H_lv: Expr = H_lv,
    d_lk: Expr = d_lk,
    d_lv: Expr = d_lv,
    d_conv: Expr = d_conv,
    b_s: Expr = b_s,
    b: Expr = b,
) -> Expr:
  """State of ONE Gated DeltaNet block per sequence, whatever its length.

  One d_lk x d_lv matrix per value head (H_lv*d_lk*d_lv elements, b_s
  bytes each) plus the short convolution window over the q, k and v
  channels ((2*H_lk*d_lk + H_lv*d_lv) channels x d_conv taps, b bytes).
  """
  H_lk, H_lv, d_lk, d_lv, d_conv, b_s, b = _s(H_lk, H_lv, d_lk, d_lv, d_conv, b_s, b)
  return H_lv * d_lk * d_lv * b_s + (2 * H_lk * d_lk + H_lv * d_lv) * d_conv * b


def mamba2_state_bytes(
    H_m: Expr = H_m,
    d_m: Expr = d_m,
    d_state: Expr = d_state,
    n_g: Expr = n_g,
    d_conv: Expr = d_conv,
    b_s: Expr = b_s,
    b: Expr = b,
) -> Expr:
  """State of ONE Mamba-2 block per sequence, whatever its length.

  The SSM state, H_m heads x d_m coordinates x d_state (b_s bytes each),
  plus the convolution window over x, B and C ((H_m*d_m + 2*n_g*d_state)
  channels x d_conv taps, b bytes).
  """
  H_m, d_m, d_state, n_g, d_conv, b_s, b = _s(H_m, d_m, d_state, n_g, d_conv, b_s, b)
  return H_m * d_m * d_state * b_s + (H_m * d_m + 2 * n_g * d_state) * d_conv * b


def hybrid_block_size(state: Expr = s, per_token: Expr = k, align: Expr = 16) -> Expr:
  """Tokens per attention page when one page must hold one layer's state.

  vLLM's hybrid rule (`HybridAttentionMambaModelConfig`): with `per_token`
  the K/V bytes of one token in one attention layer and `state` one layer's
  recurrent state, `align*ceiling(state/(align*per_token))` tokens, so both
  share one pool of equal pages (the state page padded up to it).
  """
  state, per_token, align = _s(state, per_token, align)
  return align * sp.ceiling(state / (align * per_token))


def recurrent_prefill_flops(P: Expr = P, n: Expr | None = None, c_state: Expr = c_state) -> Expr:
  """FLOPs a linear-attention or Mamba block spends on its state over a P-token prompt.

  `c_state*P*n` for a state of n elements: every prompt token updates and
  reads the whole state once, so the cost is linear in P, with no P**2
  term (chunked scan kernels reorder the work but keep this count's order).
  n defaults to a Gated DeltaNet state, H_lv*d_lk*d_lv (Mamba-2: H_m*d_m*d_state).
  """
  n = H_lv * d_lk * d_lv if n is None else n
  P, n, c_state = _s(P, n, c_state)
  return c_state * P * n


def attention_prefill_flops(P: Expr = P, H: Expr = H, d: Expr = d) -> Expr:
  """FLOPs of causal attention over a P-token prompt in ONE block: `2*H*d*P*(P + 1)`.

  `Q K^T` and `P V` over the P*(P + 1)/2 causal pairs, 2 FLOPs per
  multiply-add each, for H query heads of d coordinates: quadratic in P,
  which the recurrent blocks' `recurrent_prefill_flops` avoids.
  """
  P, H, d = _s(P, H, d)
  return 2 * H * d * P * (P + 1)


def numpy_function(formula: Callable[..., Expr]) -> Callable[..., object]:
  """`formula`'s closed form lambdified once for numpy (array arguments).

  The arguments are the formula's own, in order, so
  `numpy_function(expected_distinct_experts)(B_array, 8, 2)` evaluates the
  same expression sympy prints.
  """
  return formula_function(formula)
