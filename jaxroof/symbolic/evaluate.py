"""Lambdify once: sympy expressions as fast numpy (sweeps) or JAX (jit, grad) functions.

`lambdified(outputs, inputs, backend)` is the one place a formula becomes a
numeric function; every evaluator in the package is built on it, with one
calling convention: keyword arguments named like the input symbols, a dict of
named outputs back. Inputs broadcast against each other, so a (batch,
context) grid is two arrays.

`step_model(backend)` is the decode step of `jaxroof.symbolic.formulas`:
inputs (SI units) B sequences, T retained tokens per sequence, N weights read
per step, q bytes per weight, k KV bytes per token, BW bytes/s, F FLOP/s
(`inf` for a memory-only model), N_act weights multiplied per token (dense:
N; MoE: active weights, while N counts the weights the step actually reads).
"""

from __future__ import annotations

import functools
from typing import Any

import sympy as sp

from jaxroof.symbolic import cost_model
from jaxroof.symbolic import formulas
from jaxroof.symbolic.lambdify import (  # noqa: F401  (re-exported: the public helpers)
    Backend, Evaluator, formula_function, lambdified)
from jaxroof.symbolic.symbols import (A_t, B, BW, F, N, N_act, T, k, q, with_dense_default)

INPUTS: tuple[sp.Symbol, ...] = (B, T, N, q, k, BW, F, N_act, A_t)
OUTPUT_NAMES: tuple[str,
                    ...] = ("weight_bytes", "kv_bytes", "traffic_bytes", "memory_s", "compute_s",
                            "step_s", "aggregate_tokens_per_s", "per_sequence_tokens_per_s")


def step_outputs(bound: str = "per_op") -> dict[str, sp.Expr]:
  """Named expressions of one decode step (the `Estimate` columns): the cost
  model's iteration with B decode rows at context T (`cost_model.decode_outputs`)."""
  return cost_model.decode_outputs(bound)


def _dense_default(evaluator: Evaluator) -> Evaluator:
  """Accepts `N_act=None` (or no N_act) as a dense model, and no `A_t` as 0
  (attention FLOPs left out, as the lesson's raw numbers have none)."""

  def evaluate(**values: Any) -> dict[str, Any]:
    values = with_dense_default(values)
    if values.get("A_t") is None:
      values = {**values, "A_t": 0.0}
    return evaluator(**values)

  return evaluate


@functools.cache
def step_model(backend: Backend = "numpy", bound: str = "per_op") -> Evaluator:
  """The step model: `f(B=, T=, N=, q=, k=, BW=, F=, N_act=None, A_t=None)` -> outputs.

  Keys of the result are `OUTPUT_NAMES`; `N_act=None` means dense (`N_act = N`);
  `bound` is the cost model's "per_op" (default) or "fused".
  """
  return _dense_default(lambdified(step_outputs(bound), INPUTS, backend))


SUMMARY_INPUTS: tuple[sp.Symbol, ...] = (N, q, T, k, BW, F, N_act)
SUMMARY_NAMES: tuple[str, ...] = (
    "weight_kv_crossover_batch",
    "memory_limit_tokens_per_s",
    "compute_crossover_batch",
)


@functools.cache
def summary_model(backend: Backend = "numpy", bound: str = "per_op") -> Evaluator:
  """The solved quantities of `jaxroof.symbolic.solved`, lambdified like `step_model`.

  Returns `f(N=, q=, T=, k=, BW=, F=, N_act=None)` -> dict keyed by
  `SUMMARY_NAMES`. A compute crossover <= 0 (or non-finite) means memory binds
  at every batch; one below 1 means compute binds at every batch. Under the
  per-operation bound the compute crossover is the linear layers'
  (`cost_model.decode_compute_crossover_batch`).
  """
  from jaxroof.symbolic import solved  # Deferred: solving costs ~0.1 s, once.

  exprs = dict(
      zip(SUMMARY_NAMES, (solved.weight_kv_crossover_batch(), solved.memory_limit_rate(),
                          cost_model.decode_compute_crossover_batch(bound))))
  return _dense_default(lambdified(exprs, SUMMARY_INPUTS, backend))


@functools.cache
def communication_model(backend: Backend = "numpy") -> Evaluator:
  """Adds communication to a step: `f(B=, t_floor=, t_comm=, o_ovl=)` ->
  `step_s`, `aggregate_tokens_per_s`, `per_sequence_tokens_per_s`.

  `jaxroof.symbolic.collectives.with_overlap`: serial at `o_ovl = 0`.
  """
  from jaxroof.symbolic import collectives  # Deferred: single-chip users never need it.
  from jaxroof.symbolic.symbols import o_ovl, t_comm, t_floor

  step = collectives.with_overlap(t_floor, t_comm, o_ovl)
  outputs = {
      "step_s": step, "aggregate_tokens_per_s": formulas.aggregate_rate(B, step),
      "per_sequence_tokens_per_s": formulas.per_sequence_rate(step)
  }
  return lambdified(outputs, (B, t_floor, t_comm, o_ovl), backend)
