"""XLA:CPU as an engine: its GEMM re-packs the weights for a matmul of two or more rows.

XLA:CPU's GEMM packs the weight panel before a product of several rows, about 1.5
weight reads more than one row pays (fitted from the toy's linear layer at M >= 2,
`calibrate.op_fit`). One term, `r_pack` (0: no re-pack, as every device whose kernels
stream the weights as stored), and one formula, added to the calibrated iteration
through this module's extension:

  repack_s = r_pack * min(1, max(0, tokens - 1)) * linear weight bytes / (eta_w*BW)

(0 at one row, one re-pack at every whole count >= 2).
"""

from __future__ import annotations

import sympy as sp

from jaxroof.symbolic import terms

NAME = "xla_cpu"
r_pack = terms.register(
    "r_pack", "1", "weight re-pack of a matmul with two or more rows, in weight reads at "
    "eta_w*BW (0: none)", applies_to="linear", default=0.0, bounds=(0.0, 100.0), obtained="fitted",
    owner=NAME, label="weight re-pack from two rows (weight reads)")
TERM_NAMES: tuple[str, ...] = ("r_pack",)
ASSUMPTIONS: tuple[str, ...] = (
    "a matmul of two or more rows first re-packs the weights (XLA:CPU's GEMM): "
    "r_pack weight reads more from B = 2 on; crossovers and limits leave it out",)


def repack_time(rows: sp.Expr, weight_bytes: sp.Expr, rate: sp.Expr) -> sp.Expr:
  """Re-packing `weight_bytes` for a matmul of `rows` rows at `rate` (seconds)."""
  switch = sp.Min(1, sp.Max(0, rows - 1))
  return r_pack * switch * weight_bytes / rate


def _seconds(parts: terms.IterationParts) -> dict[str, sp.Expr]:
  return {"repack_s": repack_time(parts.tokens, parts.linear_bytes, parts.weight_rate)}


EXTENSION = terms.extend(
    terms.Extension(NAME, seconds=_seconds, memory=("repack_s",), assumptions=ASSUMPTIONS))


def readable() -> str:
  """The re-pack term in the decode step's symbols (for a reader)."""
  from jaxroof.symbolic.symbols import B, BW, N, eta_w, q  # The decode step's names.
  return str(repack_time(B, N * q, eta_w * BW))
