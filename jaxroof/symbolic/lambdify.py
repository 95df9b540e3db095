"""Lambdify once: sympy expressions as fast numpy (sweeps) or JAX (jit, grad) functions.

`lambdified(outputs, inputs, backend)` is the one place a formula becomes a
numeric function; every evaluator in the package is built on it, with one
calling convention: keyword arguments named like the input symbols, a dict of
named outputs back. Inputs broadcast against each other, so a (batch,
context) grid is two arrays. A leaf of the symbolic layer: it imports no other
jaxroof module, so every formula module may use it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import sympy as sp

Backend = Literal["numpy", "jax"]
Evaluator = Callable[..., dict[str, Any]]


def lambdified(outputs: Mapping[str, sp.Expr], inputs: Sequence[sp.Symbol],
               backend: Backend = "numpy") -> Evaluator:
  """Named sympy expressions as one vectorised function of named inputs.

  Returns `f(**values) -> {output name: value}`, values keyed by the input
  symbols' names. The JAX form is jit-compiled and differentiable; numpy
  evaluation never imports jax.
  """
  if backend not in ("numpy", "jax"):
    raise ValueError(f"{backend=} is not allowed: use 'numpy' or 'jax'.")
  names = tuple(outputs)
  input_names = tuple(str(s) for s in inputs)
  fn = sp.lambdify(tuple(inputs), tuple(outputs.values()), modules=backend, cse=True)
  if backend == "jax":
    import jax  # Deferred: numpy evaluation should not pay for jax start-up.

    fn = jax.jit(fn)

  def evaluate(**values: Any) -> dict[str, Any]:
    missing = [n for n in input_names if n not in values]
    if missing:
      raise TypeError(f"missing inputs {missing}; expected {list(input_names)}")
    return dict(zip(names, fn(*(values[n] for n in input_names))))

  return evaluate


@functools.cache
def formula_function(formula: Callable[..., sp.Expr],
                     backend: Backend = "numpy") -> Callable[..., Any]:
  """A formula function's closed form as a numeric function of its own
  arguments, in order (their defaults are the symbols): `lambdified` once."""
  symbols = tuple(p.default for p in inspect.signature(formula).parameters.values())
  fn = lambdified({"value": formula()}, symbols, backend)
  names = tuple(str(s) for s in symbols)

  def evaluate(*args: Any) -> Any:
    return fn(**dict(zip(names, args)))["value"]

  return evaluate
