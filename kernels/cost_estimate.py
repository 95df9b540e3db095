"""The `pl.CostEstimate` each kernel gives the compiler: the roofline's own counts.

FLOPs and bytes come from the sympy formulas the model uses for the same operation
(`jaxroof.symbolic.formulas`), so the scheduling hint XLA and Mosaic get and the bound
jaxroof predicts with are one count, as jax's own Pallas ops pass theirs
(`ops/tpu/flash_attention.py`, `megablox/gmm.py`). The counts are the operation's useful
work: each weight and K/V byte read once, queries, inputs and outputs in the operands'
dtype. A config's padded query rows, float32 partial sums of splits and block-table reads
are not in them, and attention counts every position the cache can hold (the lengths are
values, not shapes: unknown when the call is traced).

Transcendentals are the softmax's exponentials, one per (query head, position) score;
the roofline leaves them out (`formulas.attention_flops` omits softmax arithmetic), so
they are counted here.
"""

from __future__ import annotations

from jax.experimental import pallas as pl

from jaxroof.symbolic import formulas


def attention(*, batch: int, heads: int, kv_heads: int, positions: int, head_dim: int,
              itemsize: int) -> pl.CostEstimate:
  """Decode attention of `batch` query rows over `positions` K/V positions each.

  `formulas.attention_flops` (4*B*H*T*d) and `formulas.attention_bytes` (the K/V once,
  the query and the output), with T = positions.
  """
  flops = formulas.attention_flops(batch, positions, heads, head_dim)
  nbytes = formulas.attention_bytes(batch, positions, heads, kv_heads, head_dim, itemsize)
  return pl.CostEstimate(flops=int(flops), transcendentals=batch * heads * positions,
                         bytes_accessed=int(nbytes))


def linear(*, m: int, k: int, n: int, itemsize: int) -> pl.CostEstimate:
  """x (m, k) @ w (k, n): `formulas.linear_flops` (2*N*B, N = k*n weights, B = m rows)
  and `formulas.linear_bytes` (the weights once, x read, the output written)."""
  return pl.CostEstimate(flops=int(formulas.linear_flops(k * n, m)), transcendentals=0,
                         bytes_accessed=int(formulas.linear_bytes(m, k, n, itemsize)))
