"""The step model, lambdified once: numpy for sweeps, JAX for jit and grad.

`step_model(backend)` turns the sympy expressions of `jaxroof.symbolic.formulas` into
one vectorised function of the inputs below; nothing here retypes a formula.
Inputs broadcast against each other, so a (batch, context) grid is two arrays.

Inputs (SI units): B sequences, T retained tokens per sequence, N weights read
per step, q bytes per weight, k KV bytes per token, BW bytes/s, F FLOP/s
(`inf` for a memory-only model), N_act weights multiplied per token (dense: N;
MoE: active weights, while N counts the weights the step actually reads).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Literal

import sympy as sp

from jaxroof.symbolic import formulas
from jaxroof.symbolic.symbols import B, BW, F, N, N_act, T, k, q

INPUTS: tuple[sp.Symbol, ...] = (B, T, N, q, k, BW, F, N_act)


def _outputs() -> dict[str, sp.Expr]:
  """Named expressions of one decode step (the `Estimate` columns)."""
  traffic = formulas.step_traffic(B, N, q, T, k)
  memory_s = formulas.memory_time(traffic, BW)
  compute_s = formulas.compute_time(B, N_act, F)
  step_s = sp.Max(memory_s, compute_s)
  return {
      "weight_bytes": formulas.weight_traffic(N, q),
      "kv_bytes": formulas.retained_kv_bytes(B, T, k),
      "traffic_bytes": traffic,
      "memory_s": memory_s,
      "compute_s": compute_s,
      "step_s": step_s,
      "aggregate_tokens_per_s": formulas.aggregate_rate(B, step_s),
      "per_sequence_tokens_per_s": formulas.per_sequence_rate(step_s),
  }


OUTPUT_NAMES: tuple[str, ...] = tuple(_outputs())

StepModel = Callable[..., dict[str, object]]


@functools.cache
def step_model(backend: Literal["numpy", "jax"] = "numpy") -> StepModel:
  """The step model as a vectorised function of `INPUTS` (keyword N_act).

  Returns a function `f(B, T, N, q, k, BW, F, N_act=None)` -> dict of arrays
  keyed by `OUTPUT_NAMES`; `N_act=None` means dense (`N_act = N`). The JAX form
  is jit-compiled and differentiable.
  """
  if backend not in ("numpy", "jax"):
    raise ValueError(f"{backend=} is not allowed: use 'numpy' or 'jax'.")
  outputs = _outputs()
  fn = sp.lambdify(INPUTS, tuple(outputs.values()), modules=backend, cse=True)
  if backend == "jax":
    import jax  # Deferred: numpy sweeps should not pay for jax start-up.

    fn = jax.jit(fn)

  def evaluate(B, T, N, q, k, BW, F, N_act=None):
    values = fn(B, T, N, q, k, BW, F, N if N_act is None else N_act)
    return dict(zip(OUTPUT_NAMES, values))

  return evaluate


SUMMARY_NAMES: tuple[str, ...] = (
    "weight_kv_crossover_batch",
    "memory_limit_tokens_per_s",
    "compute_crossover_batch",
)


@functools.cache
def summary_model(backend: Literal["numpy", "jax"] = "numpy") -> StepModel:
  """The solved quantities of `jaxroof.symbolic.solved`, lambdified like `step_model`.

  Returns `f(N, q, T, k, BW, F, N_act=None)` -> dict keyed by `SUMMARY_NAMES`
  (`N_act=None`: dense). A compute crossover <= 0 (or non-finite) means memory
  binds at every batch; one below 1 means compute binds at every batch.
  """
  from jaxroof.symbolic import solved  # Deferred: solving costs ~0.1 s, once.

  exprs = (
      solved.weight_kv_crossover_batch(),
      solved.memory_limit_rate(),
      solved.compute_crossover_batch(),
  )
  fn = sp.lambdify((N, q, T, k, BW, F, N_act), exprs, modules=backend, cse=True)

  def evaluate(N, q, T, k, BW, F, N_act=None):
    return dict(zip(SUMMARY_NAMES, fn(N, q, T, k, BW, F, N if N_act is None else N_act)))

  return evaluate
