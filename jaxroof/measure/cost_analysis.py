"""XLA's own count of FLOPs and bytes, next to the step model's.

The step model counts what the lesson counts: weights read once (`N*q`),
each sequence's K/V read once (`B*T*k`), `2*N*B` linear FLOPs. The compiled
executable's cost analysis counts what XLA will actually do: activations,
outputs, layout copies, upcasts, and (for the toy decode step) the K/V cache
written back. Their ratio is the lesson's "actual kernel traffic", one
measurement that can invalidate a roofline estimate.

Compiled counts come from `jit(fn).lower(*args).compile().cost_analysis()`,
lowered ones (before XLA's backend passes) from the lowered module. Inputs
can be `jax.ShapeDtypeStruct`s, so nothing large is allocated. Interpreted
Pallas calls must not be analysed this way (their loop is counted once).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jaxroof.measure import op_sweeps
from jaxroof.measure import step_sweeps


def _as_dict(analysis: Any) -> Mapping[str, Any]:
  """cost_analysis() is a dict in recent jax, a one-item list in older."""
  if isinstance(analysis, Sequence) and not isinstance(analysis, Mapping):
    analysis = analysis[0] if analysis else {}
  return analysis or {}


def cost_of(executable: Any) -> dict[str, float | None]:
  """FLOPs and bytes accessed of a lowered or compiled computation."""
  analysis = _as_dict(executable.cost_analysis())

  def number(key: str) -> float | None:
    value = analysis.get(key)
    return None if value is None else float(value)

  return {"flops": number("flops"), "bytes_accessed": number("bytes accessed")}


def xla_costs(fn: Callable[..., Any], *args: Any) -> dict[str, dict]:
  """Lowered and compiled costs of `jit(fn)(*args)` (args may be shapes)."""
  lowered = jax.jit(fn).lower(*args)
  return {"lowered": cost_of(lowered), "compiled": cost_of(lowered.compile())}


def _ratio(numerator: float | None, denominator: float) -> float | None:
  return None if numerator is None or not denominator else (numerator / denominator)


@dataclasses.dataclass(frozen=True)
class CostRow:
  """XLA's and the step model's counts of one computation."""

  op: str
  shapes: Mapping[str, int]
  dtype: str
  analytic_flops: float
  analytic_bytes: float
  compiled: Mapping[str, float | None]
  lowered: Mapping[str, float | None] | None
  counts: str  # What the analytic bytes include.

  @property
  def flops_ratio(self) -> float | None:
    return _ratio(self.compiled["flops"], self.analytic_flops)

  @property
  def bytes_ratio(self) -> float | None:
    return _ratio(self.compiled["bytes_accessed"], self.analytic_bytes)

  def to_json(self) -> dict[str, Any]:
    return {
        **dataclasses.asdict(self), "flops_ratio": self.flops_ratio,
        "bytes_ratio": self.bytes_ratio, "device_kind": jax.devices()[0].device_kind,
        "jax_version": jax.__version__, "what": "XLA compiled cost analysis / analytic count"
    }


def _shape(shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(shape, dtype)


def linear_cost(rows: int, d_in: int, d_out: int, dtype: Any = jnp.float32) -> CostRow:
  """x (rows, d_in) @ w (d_in, d_out) through the XLA reference."""
  from kernels import linear  # Deferred: see `jaxroof.measure.op_sweeps`.

  dtype = jnp.dtype(dtype)
  costs = xla_costs(linear.reference, _shape((rows, d_in), dtype), _shape((d_in, d_out), dtype))
  flops, traffic = op_sweeps.linear_analytic(rows, d_in, d_out, dtype.itemsize)
  return CostRow("linear", {"rows": rows, "d_in": d_in, "d_out": d_out}, dtype.name, flops, traffic,
                 costs["compiled"], costs["lowered"], "weights once, x read, output written")


def attention_cost(batch: int, context: int, heads: int, kv_heads: int, head_dim: int,
                   dtype: Any = jnp.float32) -> CostRow:
  """One layer's decode attention through the XLA reference."""
  from kernels import decode_attention  # Deferred, likewise.

  dtype = jnp.dtype(dtype)
  kv = _shape((batch, context, kv_heads, head_dim), dtype)
  costs = xla_costs(decode_attention.reference, _shape((batch, heads, head_dim), dtype), kv, kv,
                    _shape((batch,), jnp.int32))
  flops, traffic = op_sweeps.attention_analytic(batch, context, heads, kv_heads, head_dim,
                                                dtype.itemsize)
  return CostRow("decode_attention", {
      "batch": batch, "context": context, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim
  }, dtype.name, flops, traffic, costs["compiled"], costs["lowered"],
                 "K/V read once, queries read, outputs written")


def decode_step_cost(bench: step_sweeps.DecodeStepBench, batch: int, context: int) -> CostRow:
  """The toy decode step as timed (donated cache), compiled by XLA.

  XLA's cost analysis counts the body of a while loop once. When the step
  runs its blocks as a loop (the toy's `lax.scan`), the analytic side counts
  the output head and one block, with one block's K/V, to compare like with
  like.
  """
  executable = bench.compile(batch, context)
  looped = "while(" in executable.as_text()
  flops, traffic = bench.analytic(batch, context, 1 if looped else None)
  scope = ("output head + one block (XLA counts the loop over blocks once)"
           if looped else "whole step")
  return CostRow("decode_step",
                 {"batch": batch, "context": context, "layers": bench.config.num_blocks},
                 jnp.dtype(bench.dtype).name, flops, traffic, cost_of(executable), None,
                 f"{scope}: weights N*q + K/V B*T*k (T = context + 1); "
                 "FLOPs 2*N*B")


HEADERS = ("op", "shapes", "dtype", "analytic GFLOP", "XLA GFLOP", "FLOP ratio", "analytic MB",
           "XLA MB", "bytes ratio")


def table_rows(rows: Sequence[CostRow]) -> list[list[str]]:
  """Display cells (MB = 1e6 B)."""

  def fmt(value: float | None, scale: float, spec: str) -> str:
    return "n/a" if value is None else format(value / scale, spec)

  return [[
      r.op, " ".join(f"{k}={v}" for k, v in r.shapes.items()), r.dtype,
      fmt(r.analytic_flops, 1e9, ",.4f"),
      fmt(r.compiled["flops"], 1e9, ",.4f"),
      fmt(r.flops_ratio, 1, ".3f"),
      fmt(r.analytic_bytes, 1e6, ",.2f"),
      fmt(r.compiled["bytes_accessed"], 1e6, ",.2f"),
      fmt(r.bytes_ratio, 1, ".3f")
  ] for r in rows]
