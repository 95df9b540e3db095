"""Counting the matrix-multiply FLOPs a toy computation actually performs.

Walks the jaxpr of a traced function and adds `2 * output size * contracted
size` for every `dot_general` (einsum and matmul lower to it), multiplying by
a loop's trip count (a `scan`, e.g. `generate`'s steps). Element-wise work
(softmax, norms, RoPE) is not counted, as the symbolic model omits it too.
This is an independent count to hold `jaxroof.symbolic.formulas` against.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.extend.core  # noqa: F401  (ClosedJaxpr, Jaxpr)

from jaxroof.toy.weights import Params


def _inner_jaxprs(eqn: Any):
  for value in eqn.params.values():
    for item in value if isinstance(value, (tuple, list)) else (value,):
      if isinstance(item, jax.extend.core.ClosedJaxpr):
        yield item.jaxpr
      elif isinstance(item, jax.extend.core.Jaxpr):
        yield item


def _jaxpr_dot_flops(jaxpr: Any) -> int:
  total = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      (lhs_contract, _), _ = eqn.params["dimension_numbers"]
      lhs_shape = eqn.invars[0].aval.shape
      contracted = math.prod(lhs_shape[i] for i in lhs_contract)
      total += 2 * math.prod(eqn.outvars[0].aval.shape) * contracted
      continue
    trips = eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1
    total += trips * sum(_jaxpr_dot_flops(inner) for inner in _inner_jaxprs(eqn))
  return total


def dot_flops(fn: Callable[..., Any], *args: Any) -> int:
  """FLOPs of every matrix multiply `fn(*args)` performs (traced, not run)."""
  return _jaxpr_dot_flops(jax.make_jaxpr(fn)(*args).jaxpr)


def matmul_weights(params: Params) -> int:
  """Weights that multiply activations: projections, MLP and output head.

  Norm scales multiply element-wise and the embedding is a lookup, so
  neither counts.
  """
  return params.unembed.size + sum(x.size for blk in params.blocks
                                   for x in (blk.wq, blk.wk, blk.wv, blk.wo, blk.w_up, blk.w_down))
