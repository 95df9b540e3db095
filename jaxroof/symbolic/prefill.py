"""Prefill of a P-token prompt for B sequences, with causal attention: every formula once.

Conventions (analytic bound, the lesson's assumptions otherwise):
  * linear layers: a multiply and an add per active weight per prompt token,
    `2*N_act*P*B` FLOPs, the weights read once for the whole prefill;
  * causal attention counts the lower triangle, diagonal included: query i
    (1-based) attends to i keys, so a sequence has `P*(P+1)/2` (query, key)
    pairs. Each pair costs `A_f` FLOPs summed over the blocks: for a full or
    sliding-window block `4*H*d` (QK^T and PV, a multiply and an add per
    coordinate), so `A_f*P*(P+1)/2 = 2*L*H*d*P*(P+1)` for L full blocks.
    Softmax, scaling and masking arithmetic are omitted;
  * memory moves the weights once plus the K/V the prompt writes, `B*P*k`
    (activations are omitted: a separate term a caller may add);
  * the floor is `Max(memory time, compute time)`.

Architecture terms come from the layer schedule (`attention_terms`): a
sliding window caps the attended span at W keys, MLA attends in its latent
space (absorbed form), and recurrent (SSM) blocks have no quadratic term.

Chunked prefill with chunk C: each of the P/C chunks re-reads the weights,
reads the K/V its predecessors wrote and writes its own; attention FLOPs add up
to the one-pass total, so only memory time grows as C shrinks.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import sympy as sp

from jaxroof.symbolic import formulas
from jaxroof.symbolic.symbols import (A_f, B, BW, C_chunk, F, H, N, N_act, P, R, W, d, d_qk, d_rope,
                                      d_v, j, k, q, r_kv, t, x_over)

Expr = sp.Expr


def _s(*values) -> list[Expr]:
  return [sp.sympify(v) for v in values]


def linear_flops(P: Expr = P, B: Expr = B, N_act: Expr = N_act) -> Expr:
  """Linear-layer FLOPs of a prefill: `2*N_act*P*B` (every prompt token of every sequence)."""
  P, B = _s(P, B)
  return formulas.linear_flops(N_act, P * B)


def attended_pairs(P: Expr = P, W: Expr | None = None) -> Expr:
  """(query, key) pairs of one causal sequence of P tokens, diagonal included.

  Full attention: `Sum(j, (j, 1, P)) = P*(P+1)/2`. With a sliding window of W
  keys, query j attends to `Min(j, W)`: the full triangle up to W, then W
  keys for each later query.
  """
  full, windowed = _pairs_closed_forms()
  if W is None:
    return full.subs(_P, sp.sympify(P))
  return windowed.subs({_P: sp.sympify(P), _W: sp.sympify(W)})


_P, _W = P, W  # The closed forms below are in these; callers' arguments replace them.


@functools.cache
def _pairs_closed_forms() -> tuple[Expr, Expr]:
  """`Sum(j, (j, 1, P))` and `Sum(Min(j, W), (j, 1, P))`, summed once."""
  full = sp.factor(sp.summation(j, (j, 1, _P)))
  capped = sp.summation(j, (j, 1, _W)) + sp.summation(_W, (j, _W + 1, _P))
  return full, sp.Piecewise((full, _P <= _W), (sp.expand(capped), True))


def chunk_local_pairs(P: Expr = P, W: Expr = W) -> Expr:
  """(query, key) pairs of one sequence when blocks attend only within chunks
  of W tokens (Llama 4's chunked attention): a causal triangle per full chunk
  plus one for the remainder."""
  P, W = _s(P, W)
  full, rest = sp.floor(P / W), P - sp.floor(P / W) * W
  return full * attended_pairs(W) + rest * (rest + 1) / 2


def full_attention_pair_flops(H: Expr = H, d: Expr = d) -> Expr:
  """FLOPs per (query, key) pair of ONE full or sliding block: `4*H*d`.

  `Q K^T` and `P V` each take a multiply and an add per query head and
  coordinate; the same per-pair count as decode (`formulas.attention_flops`).
  """
  return formulas.attention_flops(1, 1, H, d)


def mla_pair_flops(H: Expr = H, r_kv: Expr = r_kv, d_rope: Expr = d_rope) -> Expr:
  """FLOPs per (query, key) pair of ONE MLA block attending in latent space.

  Absorbed form: each query head scores the cached latent plus RoPE key
  (`r_kv + d_rope` coordinates) and mixes the latent values (`r_kv`), a
  multiply and an add each: `2*H*(2*r_kv + d_rope)`.
  """
  H, r_kv, d_rope = _s(H, r_kv, d_rope)
  return 2 * H * (2 * r_kv + d_rope)


def mla_mha_pair_flops(H: Expr = H, d_qk: Expr = d_qk, d_v: Expr = d_v) -> Expr:
  """FLOPs per (query, key) pair of ONE MLA block in the MHA form: `2*H*(d_qk + d_v)`.

  The latent is up-projected to per-head keys (d_qk = nope + rope coordinates)
  and values (d_v), then attention runs as multi-head attention: fewer FLOPs
  per pair than the absorbed form (DeepSeek-V3: 81,920 against 278,528), which
  is why engines prefill in this form and decode in the absorbed one.
  """
  H, d_qk, d_v = _s(H, d_qk, d_v)
  return 2 * H * (d_qk + d_v)


def mla_upprojection_flops(H: Expr = H, r_kv: Expr = r_kv, d_qk: Expr = d_qk, d_rope: Expr = d_rope,
                           d_v: Expr = d_v) -> Expr:
  """FLOPs to up-project ONE cached latent position to per-head K and V (MHA form).

  `2*r_kv*H*((d_qk - d_rope) + d_v)`: the RoPE key is stored as it is. A
  chunk's own tokens are projected inside the linear layers (their weights
  are in N_act); the prefix it attends to is projected again per chunk.
  """
  H, r_kv, d_qk, d_rope, d_v = _s(H, r_kv, d_qk, d_rope, d_v)
  return 2 * r_kv * H * ((d_qk - d_rope) + d_v)


def attention_flops(P: Expr = P, B: Expr = B, A_f: Expr = A_f, W: Expr | None = None) -> Expr:
  """Causal attention FLOPs of a prefill: `B*A_f*pairs` (softmax omitted).

  With `A_f = 4*L*H*d` (L full blocks) this is `2*L*H*d*P*(P+1)*B`.
  """
  B, A_f = _s(B, A_f)
  return B * A_f * attended_pairs(P, W)


def masked_attention_flops(P: Expr = P, S: Expr = P, B: Expr = B, A_f: Expr = A_f) -> Expr:
  """Attention FLOPs a dense masked kernel executes: every one of P queries
  against all S key slots, `B*A_f*P*S`, masked scores included.

  What a kernel without causal tiling (the toy, LLM-Viewer without flash
  attention) performs; `attention_flops` counts only the useful lower
  triangle, about half of it when S = P.
  """
  P, S, B, A_f = _s(P, S, B, A_f)
  return B * A_f * P * S


def kv_written_bytes(P: Expr = P, B: Expr = B, k: Expr = k) -> Expr:
  """K/V bytes a prefill writes: every prompt position of every sequence, `B*P*k`."""
  return formulas.retained_kv_bytes(B, P, k)


def traffic(P: Expr = P, B: Expr = B, N: Expr = N, q: Expr = q, k: Expr = k) -> Expr:
  """Bytes a prefill moves: the weights once plus the K/V written (activations omitted)."""
  return formulas.weight_traffic(N, q) + kv_written_bytes(P, B, k)


def memory_time(P: Expr = P, B: Expr = B, N: Expr = N, q: Expr = q, k: Expr = k,
                BW: Expr = BW) -> Expr:
  """Seconds to move the prefill's traffic at BW."""
  return formulas.memory_time(traffic(P, B, N, q, k), BW)


def compute_time(P: Expr = P, B: Expr = B, N_act: Expr = N_act, A_f: Expr = A_f,
                 F: Expr = F) -> Expr:
  """Seconds of linear plus causal-attention arithmetic at F."""
  (F,) = _s(F)
  return (linear_flops(P, B, N_act) + attention_flops(P, B, A_f)) / F


def floor(P: Expr = P, B: Expr = B, N: Expr = N, q: Expr = q, k: Expr = k, BW: Expr = BW,
          F: Expr = F, N_act: Expr = N_act, A_f: Expr = A_f) -> Expr:
  """Optimistic prefill time: `Max(memory time, compute time)`."""
  return sp.Max(memory_time(P, B, N, q, k, BW), compute_time(P, B, N_act, A_f, F))


def _positive_root(equation: sp.Eq, unknown: sp.Symbol) -> Expr:
  """The one root that is positive for positive symbols.

  sympy cannot always decide a root's sign (a quadratic with a negative root
  product has one positive root, but both look undecided), so undecided roots
  are tried at a sample of distinct positive values.
  """
  roots = [r for r in sp.solve(equation, unknown, check=False, simplify=False) if not r.is_negative]
  if len(roots) > 1:
    sample = {
        s: sp.Rational(i + 2, 3)
        for i, s in enumerate(sorted(equation.free_symbols - {unknown}, key=str))
    }
    roots = [r for r in roots if complex(r.subs(sample)).real > 0]
  if len(roots) != 1:
    raise ArithmeticError(f"expected one non-negative root for {unknown}, got {roots}")
  return roots[0]


@functools.cache
def compute_bound_prompt_linear() -> Expr:
  """Prompt tokens at which a one-sequence prefill turns compute-bound, linear only.

  Weights read (`N*q/BW`) equal linear FLOPs (`2*N*P/F`) at `P = R*q/2`, with
  `F = R*BW`; K/V writes and attention are left out, as in the lesson.
  """
  eq = sp.Eq(formulas.memory_time(formulas.weight_traffic(N, q), BW),
             formulas.compute_time(P, N, R * BW))
  return _positive_root(eq, P)


@functools.cache
def compute_bound_prompt_with_attention() -> Expr:
  """Prompt tokens at which a one-sequence prefill turns compute-bound, with
  causal attention FLOPs and K/V writes (`sympy.solve` of a quadratic in P)."""
  eq = sp.Eq(memory_time(P, 1, N, q, k, BW), compute_time(P, 1, N_act, A_f, R * BW))
  return _positive_root(eq, P)


@functools.cache
def attention_overtakes_linear_prompt() -> Expr:
  """Prompt length at which causal attention FLOPs equal linear FLOPs:
  `4*N_act/A_f - 1` (`N_act/(L*H*d) - 1` for L full blocks)."""
  eq = sp.Eq(attention_flops(P, 1, A_f), linear_flops(P, 1, N_act))
  return _positive_root(eq, P)


def chunk_memory_time(j: Expr = j, C: Expr = C_chunk, B: Expr = B, N: Expr = N, q: Expr = q,
                      k: Expr = k, BW: Expr = BW) -> Expr:
  """Memory time of chunk j (1-based): weights again, the `(j-1)*C` positions
  already written read back, its own C positions written."""
  j, C, B = _s(j, C, B)
  read = formulas.retained_kv_bytes(B, (j - 1) * C, k)
  return formulas.memory_time(traffic(C, B, N, q, k) + read, BW)


def chunk_compute_time(j: Expr = j, C: Expr = C_chunk, B: Expr = B, N_act: Expr = N_act,
                       A_f: Expr = A_f, F: Expr = F) -> Expr:
  """Compute time of chunk j: its C tokens' linear FLOPs, and attention of its
  C queries over the `(j-1)*C` earlier keys plus its own causal triangle."""
  j, C, B, A_f, F = _s(j, C, B, A_f, F)
  pairs = C * (j - 1) * C + attended_pairs(C)
  return (linear_flops(C, B, N_act) + B * A_f * pairs) / F


@functools.cache
def _chunked_totals() -> tuple[Expr, Expr]:
  chunks = P / C_chunk  # C divides P (a caller rounds the chunk count up).
  memory = sp.simplify(sp.summation(chunk_memory_time(), (j, 1, chunks)))
  compute = sp.simplify(sp.summation(chunk_compute_time(), (j, 1, chunks)))
  return memory, compute


def chunked_memory_time() -> Expr:
  """Memory time of all P/C chunks, in closed form (`sympy.summation`):
  `(P/C)*(N*q + B*k*P/2)/BW + B*k*P/(2*BW)`; it falls as C grows."""
  return _chunked_totals()[0]


def chunked_compute_time() -> Expr:
  """Compute time of all chunks (`sympy.summation`): equal to the one-pass
  compute time, because the chunks' attention pairs add up to `P*(P+1)/2`."""
  return _chunked_totals()[1]


def chunked_time() -> Expr:
  """Chunked prefill floor: `Max(total memory, total compute)` of the chunks.

  A floor: the sum of each chunk's own Max is at least this, equal when one
  term binds every chunk (`chunk_times` evaluates that sum numerically).
  """
  memory, compute = _chunked_totals()
  return sp.Max(memory, compute)


@functools.cache
def smallest_chunk_for_overhead() -> Expr:
  """Chunk size below which chunking costs more than `x_over` over one pass.

  Solves `chunked memory time = (1 + x_over)*t` for C, with t the one-pass
  floor (`floor()` substituted by the caller). Only memory time grows as C
  shrinks, so past this C the chunked floor stays within the overhead.
  """
  return _positive_root(sp.Eq(chunked_memory_time(), (1 + x_over) * t), C_chunk)


# Per-layer-kind attention terms ----------------------------------------------


@dataclasses.dataclass(frozen=True)
class AttentionTerm:
  """Attention of the blocks of one kind: FLOPs per pair, summed over the blocks."""

  kind: str
  layers: int
  pair_flops: float  # All blocks of this kind, per (query, key) pair.
  window: int | None  # Keys a query attends to at most; None: the whole prefix.
  convention: str
  chunk: int | None = None  # Attends only within chunks of this many tokens.


# Blocks whose mixing has no term quadratic in the prompt length.
_NO_QUADRATIC = ("recurrent", "mamba2", "linear_attention", "mlp_only")


def attention_terms(spec: Any) -> tuple[AttentionTerm, ...]:
  """The prefill attention terms of a model's layer schedule (a `ModelSpec`).

  The one mapping from layer kind to attention FLOPs:
    full       `4*H*d` per pair per block, every earlier key;
    sliding    the same, at most `sliding_window` keys;
    mla        `2*H*(2*r_kv + d_rope)` per pair per block (latent space);
    chunked    `4*H*d` per pair per block, keys of the query's own chunk only;
    recurrent, mamba2, linear_attention, mlp_only
               none (no quadratic term; scan and state FLOPs are left out).
  An unknown kind raises `ValueError` naming it, so a new kind cannot be
  silently counted as free.
  """
  terms = []
  for kind in dict.fromkeys(spec.layer_kinds):
    layers = list(spec.layer_kinds).count(kind)
    if kind in ("full", "sliding"):
      a = spec.attention
      per_block = full_attention_pair_flops(a.num_heads, a.head_dim)
      window = a.sliding_window if kind == "sliding" else None
      convention = "4*H*d per pair (QK^T, PV), softmax omitted"
    elif kind == "mla":
      m = spec.mla
      per_block = mla_pair_flops(m.num_heads, m.kv_lora_rank, m.qk_rope_head_dim)
      window = None
      convention = "2*H*(2*r_kv + d_rope) per pair, latent (absorbed) form"
    elif kind == "chunked":
      a = spec.attention
      per_block = full_attention_pair_flops(a.num_heads, a.head_dim)
      terms.append(
          AttentionTerm(kind, layers, float(layers * per_block), None,
                        "4*H*d per pair, within chunks of chunk_size tokens", int(a.chunk_size)))
      continue
    elif kind in _NO_QUADRATIC:
      continue
    else:
      raise ValueError(f"layer kind {kind!r} has no prefill attention term: add it to "
                       "jaxroof.symbolic.prefill.attention_terms")
    terms.append(AttentionTerm(kind, layers, float(layers * per_block), window, convention))
  return tuple(terms)


def attention_flops_of(terms: Sequence[AttentionTerm], P: float, B: float = 1) -> float:
  """Causal attention FLOPs of a prefill for a model's attention terms."""
  total = 0.0
  for term in terms:
    if term.chunk is not None:
      total += float(B * term.pair_flops * chunk_local_pairs(P, term.chunk))
    else:
      total += float(attention_flops(P, B, term.pair_flops, term.window))
  return total


def pair_flops_at(terms: Sequence[AttentionTerm], P: float) -> float:
  """Equivalent full-attention `A_f` at prompt length P: attention FLOPs over
  `P*(P+1)/2` pairs (equals the sum of `pair_flops` with no sliding window)."""
  return attention_flops_of(terms, P) / float(attended_pairs(P))
