"""The calibrated prefill: a whole prompt batch in one pass, with fitted factors.

Users' measurements include first-token latencies (a prefill of B prompts of
P tokens). Their calibrated time is built from the same formulas as the
decode step (`jaxroof.symbolic.calibrated`), with the prompt's positions as
rows and a FLOP efficiency of its own, because prefill matmuls are large and
run at a different fraction of F than decode's skinny ones:

  weight_s  = N*q / (eta_w*BW)                   weights read once
  linear_s  = 2*N_act*B*P / (eta_f_prefill*F)    linear FLOPs
  attn_s    = L_attn * sum_{t=1..P} attention_flops(B, t, H, d)
              / (eta_f_prefill*F)                causal attention FLOPs
  prefill_s = t0_step + L*t0_layer + pnorm(weight_s, linear_s) + attn_s

The fixed costs and the overlap are the decode step's (one pass through the
layers either way). K/V writes and activations are absorbed by the factors.
"""

from __future__ import annotations

import functools
from typing import Literal

import sympy as sp

from jaxroof.symbolic import calibrated
from jaxroof.symbolic import formulas
from jaxroof.symbolic.lambdify import lambdified
from jaxroof.symbolic.symbols import (B, BW, F, H, L, L_attn, N, N_act, P, d, eta_f_prefill, eta_w,
                                      q, r_ovl, t0_layer, t0_step)

FACTORS: tuple[sp.Symbol, ...] = (eta_w, eta_f_prefill, t0_step, t0_layer, r_ovl)
FACTOR_NAMES: tuple[str, ...] = tuple(str(s) for s in FACTORS)
INPUTS: tuple[sp.Symbol, ...] = (B, P, N, q, BW, F, N_act, L, L_attn, H, d)
INPUT_NAMES: tuple[str, ...] = tuple(str(s) for s in INPUTS)

ASSUMPTIONS: tuple[str, ...] = (
    "prefill of B prompts of P tokens in one pass: weights read once, linear "
    "FLOPs 2*N_act*B*P and causal attention FLOPs at eta_f_prefill of F",
    "fixed costs per pass and per layer, and the overlap of weight reads and "
    "FLOPs, are the decode step's; K/V writes and activations are absorbed",
)


def causal_attention_flops(B: sp.Expr = B, P: sp.Expr = P, H: sp.Expr = H,
                           d: sp.Expr = d) -> sp.Expr:
  """FLOPs of causal attention over a P-token prompt, per block.

  Position t attends to the t positions up to it: the decode formula summed
  over t = 1..P, i.e. 2*B*H*d*P*(P + 1).
  """
  position = sp.Symbol("position", positive=True, integer=True)
  return sp.factor(sp.summation(formulas.attention_flops(B, position, H, d), (position, 1, P)))


def _terms() -> dict[str, sp.Expr]:
  """The calibrated prefill's named expressions."""
  weight_s = formulas.memory_time(formulas.weight_traffic(N, q), eta_w * BW)
  linear_s = formulas.compute_time(B * P, N_act, eta_f_prefill * F)
  attention_s = L_attn * causal_attention_flops(B, P, H, d) / (eta_f_prefill * F)
  fixed_s = t0_step + L * t0_layer
  overlapped = calibrated._overlap(weight_s, linear_s)  # pylint: disable=protected-access
  prefill_s = fixed_s + overlapped + attention_s
  return {
      "weight_s": weight_s, "compute_s": linear_s, "attention_s": attention_s, "fixed_s": fixed_s,
      "linear_s": overlapped, "step_s": prefill_s
  }


def calibrated_prefill() -> sp.Expr:
  """The calibrated prefill time as one sympy expression (seconds)."""
  return _terms()["step_s"]


@functools.cache
def prefill_model(backend: Literal["numpy", "jax"] = "numpy"):
  """The calibrated prefill's terms as a vectorised function, lambdified once.

  Returns `f(**values) -> dict` of `INPUT_NAMES` and `FACTOR_NAMES` values.
  """
  return lambdified(_terms(), INPUTS + FACTORS, backend)
