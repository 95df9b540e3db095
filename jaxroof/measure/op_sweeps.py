"""Measured sweeps of the operations: the linear layer and decode attention.

Per op, the computation is the kernel module's jnp `reference` compiled by XLA
(backend "xla", every device, the CPU included) or its Pallas kernel (backend
"pallas", GPU and TPU only: interpreted Pallas timings mean nothing). The
kernel modules are imported only when an op sweep runs. Inputs rotate between
calls where caches would flatter the result; every figure is a
`jaxroof.measure.measurement.Measurement`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxroof import errors
from jaxroof.measure import measurement
from jaxroof.measure.step_sweeps import (STATISTIC, load_average, lower_quartile, pattern,
                                         recorded_spread, round_spread)
from jaxroof.symbolic import formulas
from jaxroof.timing import time_call
from jaxroof.toy import config as config_lib
from jaxroof.toy import model as model_lib


def _platform() -> str:
  return jax.default_backend()


def _check_backend(backend: str) -> None:
  errors.require_choice("backend", backend, measurement.BACKENDS)
  if backend == "pallas" and _platform() == "cpu":
    raise errors.InputError("backend='pallas' is not allowed on the CPU: Pallas only interprets "
                            "there and interpreted timings mean nothing; use backend='xla'.")


def _op_fn(op: str, backend: str) -> Callable[..., Any]:
  """The computation of an op on a backend (kernel modules imported here)."""
  if op == "linear":
    from kernels import linear as module  # Deferred: see module docstring.

    return module.reference if backend == "xla" else module.linear
  from kernels import decode_attention as module  # Deferred, likewise.

  if backend == "xla":
    return module.reference
  return module.decode_attention


@functools.cache
def _sequenced(fn: Callable[..., Any]) -> Callable[..., Any]:
  """`device_timing.in_sequence` jitted once per op (jit keys the shapes)."""
  from kernels import device_timing  # Deferred: see module docstring.

  return jax.jit(device_timing.in_sequence(fn))


def _time_op(op: str, backend: str, arg_sets: Sequence[tuple], *, shapes: dict[str, int],
             dtype: str, flops: float, traffic: float, warmup: int, repeats: int,
             fn: Callable[..., Any] | None = None) -> measurement.Measurement:
  """Per-call time of an op from calls inside one jit, never from dispatch.

  On the CPU, one straight-line jit calls the op on each rotated argument
  set in turn (`device_timing.in_sequence`), as a decode step runs its
  operations; `repeats` such sequences are timed and divided by their
  length. Elsewhere a single op lasts about as long as dispatching it, so it
  is timed as a loop of dependent calls (`device_timing.time_chained`),
  which charges launches, never dispatch.
  """
  from kernels import device_timing  # Deferred: see module docstring.

  fn = fn or _op_fn(op, backend)
  if _platform() == "cpu":
    count = len(arg_sets)
    timing = time_call(_sequenced(fn), [(tuple(arg_sets),)], warmup=warmup, repeats=repeats)
    timing = device_timing.per_call(
        timing, count, f"one jit calling the op on {count} rotated argument "
        "sets in sequence (each call waits on the last), wall-clock with "
        f"block_until_ready, median of {repeats} sequences after {warmup} "
        "warm-up, divided by the sequence length")
  else:
    timing = device_timing.time_chained(fn, arg_sets[0], feed=device_timing.perturb_first,
                                        warmup=warmup, repeats=repeats)
  return measurement.labelled(timing, op=op, shapes=shapes, dtype=dtype, backend=backend,
                              flops=flops, bytes=traffic)


MEMORY_LIMIT_BYTES = 4e9  # Operands of one timed op on a 24 GB, 2 GB-budget machine.


def require_memory(nbytes: float, what: str, limit: float = MEMORY_LIMIT_BYTES) -> None:
  """Refuses, before allocating, operands over `limit` (their analytic bytes)."""
  if nbytes > limit:
    raise errors.InputError(f"{what} needs about {nbytes / 1e9:,.1f} GB of operands, over "
                            f"the {limit / 1e9:g} GB limit: use smaller sizes.")


def linear_args(rows: int, d_in: int, d_out: int, dtype: Any, sets: int,
                seed: int = 0) -> list[tuple[jax.Array, jax.Array]]:
  """`sets` independent (x, w) pairs: x (rows, d_in), w (d_in, d_out)."""
  return [(measurement.filler(
      (rows, d_in), dtype, seed + 2 * i), measurement.filler(
          (d_in, d_out), dtype, seed + 2 * i + 1) / math.sqrt(d_in)) for i in range(sets)]


def linear_analytic(rows: int, d_in: int, d_out: int, itemsize: int) -> tuple[float, float]:
  """(FLOPs, bytes) of x @ w: `formulas.linear_flops` and `formulas.linear_bytes`
  (the weights once, x read, the output written)."""
  return (float(formulas.linear_flops(d_in * d_out, rows)),
          float(formulas.linear_bytes(rows, d_in, d_out, itemsize)))


def linear_sweep(
    rows: Sequence[int],
    *,
    d_in: int,
    d_out: int,
    dtype: Any = jnp.float32,
    backend: str = "xla",
    phase: str = "decode",
    warmup: int = 2,
    repeats: int = 10,
    progress: Callable[[str], None] | None = None,
) -> list[measurement.Measurement]:
  """Times x (rows, d_in) @ w (d_in, d_out) for each row count."""
  _check_backend(backend)
  dtype = jnp.dtype(dtype)
  records = []
  for m in errors.require_positive_ints("rows", rows):
    flops, traffic = linear_analytic(m, d_in, d_out, dtype.itemsize)
    require_memory(2 * traffic, f"linear rows={m} d_in={d_in} d_out={d_out}")
    args = linear_args(m, d_in, d_out, dtype, sets=2)
    record = _time_op("linear", backend, args, shapes={"rows": m, "d_in": d_in,
                                                       "d_out": d_out}, dtype=dtype.name,
                      flops=flops, traffic=traffic, warmup=warmup, repeats=repeats)
    records.append(dataclasses.replace(record, extra={"phase": phase}))
    if progress:
      progress(f"linear {phase} rows={m}: {record.median_s * 1e3:.3f} ms")
  return records


def attention_args(batch: int, context: int, heads: int, kv_heads: int, head_dim: int, dtype: Any,
                   sets: int, seed: int = 0):
  """`sets` independent (q, k, v, lengths) of decode attention, all full."""
  shape = (batch, context, kv_heads, head_dim)
  return [(measurement.filler((batch, heads, head_dim), dtype,
                              seed + 3 * i), measurement.filler(shape, dtype, seed + 3 * i + 1),
           measurement.filler(shape, dtype, seed + 3 * i + 2), jnp.full(
               (batch,), context, jnp.int32)) for i in range(sets)]


def attention_analytic(batch: int, context: int, heads: int, kv_heads: int, head_dim: int,
                       itemsize: int) -> tuple[float, float]:
  """(FLOPs, bytes) of one layer's decode attention: `formulas.attention_flops`
  and `formulas.attention_bytes` (the retained K/V, the queries and outputs)."""
  return (float(formulas.attention_flops(batch, context, heads, head_dim)),
          float(formulas.attention_bytes(batch, context, heads, kv_heads, head_dim, itemsize)))


def attention_sweep(
    points: Sequence[tuple[int, int]],
    *,
    heads: int,
    kv_heads: int,
    head_dim: int,
    dtype: Any = jnp.float32,
    backend: str = "xla",
    warmup: int = 2,
    repeats: int = 10,
    progress: Callable[[str], None] | None = None,
) -> list[measurement.Measurement]:
  """Times one layer's decode attention at each (batch, context) point."""
  _check_backend(backend)
  dtype = jnp.dtype(dtype)
  records = []
  for batch, context in points:
    nbytes = formulas.retained_kv_bytes(
        batch, context, formulas.kv_bytes_per_position(1, kv_heads, head_dim, dtype.itemsize))
    sets = 2 if nbytes < 256e6 else 1
    flops, traffic = attention_analytic(batch, context, heads, kv_heads, head_dim, dtype.itemsize)
    require_memory(
        sets * traffic, f"decode_attention batch={batch} context={context} "
        f"heads={heads} kv_heads={kv_heads} head_dim={head_dim}")
    args = attention_args(batch, context, heads, kv_heads, head_dim, dtype, sets)
    record = _time_op(
        "decode_attention", backend, args, shapes={
            "batch": batch, "context": context, "heads": heads, "kv_heads": kv_heads,
            "head_dim": head_dim
        }, dtype=dtype.name, flops=flops, traffic=traffic, warmup=warmup, repeats=repeats)
    records.append(record)
    if progress:
      progress(f"decode_attention batch={batch} context={context}: "
               f"{record.median_s * 1e3:.3f} ms")
    del args
  return records


# Operation sweeps in rounds, for the calibration's fit -------------------------

# Operand bytes rotated between calls on a CPU: four times a 32 MB last-level
# cache, so weights stream from memory as in a step, not from the cache.
_ROTATE_BYTES = 128 * 2**20
_MAX_SETS = 16


@dataclasses.dataclass(frozen=True, order=True)
class OpPoint:
  """One operation at one shape: a linear layer or a layer's decode attention.

  `linear`: sizes = (rows, d_in, d_out). `decode_attention`: sizes = (batch,
  context, heads, kv_heads, head_dim).
  """

  op: str
  sizes: tuple[int, ...]


def linear_points(config: config_lib.ToyConfig, rows: Sequence[int]) -> list[OpPoint]:
  """The toy step's linear layers (distinct shapes) at each row count M."""
  c = config
  shapes = sorted({(c.width, c.num_heads * c.head_dim), (c.width, c.num_kv_heads * c.head_dim),
                   (c.num_heads * c.head_dim, c.width), (c.width, c.mlp_dim), (c.mlp_dim, c.width),
                   (c.width, c.vocab_size)})
  return [OpPoint("linear", (m, d_in, d_out)) for d_in, d_out in shapes for m in rows]


def attention_points(config: config_lib.ToyConfig, grid: Sequence[tuple[int,
                                                                        int]]) -> list[OpPoint]:
  """The toy step's decode attention (one layer) at (batch, context)."""
  c = config
  return [
      OpPoint("decode_attention", (b, t, c.num_heads, c.num_kv_heads, c.head_dim)) for b, t in grid
  ]


# A CPU op's calls in one timed sequence last about this long (a longer op
# gets fewer sets: compute-bound, it gains nothing from rotating operands).
_SEQUENCE_S = 0.02


def _rotated_sets(per_set_bytes: float, planned_s: float | None = None) -> int:
  """Argument sets whose bytes together defeat a CPU's last-level cache,
  fewer when `planned_s` per call would make a sequence long."""
  if _platform() != "cpu":
    return 1  # Chained timing uses one set (see `_time_op`).
  sets = min(_MAX_SETS, max(2, math.ceil(_ROTATE_BYTES / per_set_bytes)))
  if planned_s:
    sets = min(sets, max(1, math.ceil(_SEQUENCE_S / planned_s)))
  return int(sets)


def measure_op(point: OpPoint, dtype: Any, backend: str, *, warmup: int, repeats: int,
               seed: int = 0, planned_s: float | None = None) -> measurement.Measurement:
  """Times one operation point, its operands made afresh and freed after.

  `repeats` is the number of timed calls wanted; on a CPU they are made as
  sequences over the rotated sets (`_time_op`), at least three sequences.
  `planned_s`, a guess of one call's time, keeps a sequence short.
  """
  dtype = jnp.dtype(dtype)
  fn = None
  if point.op == "linear":
    m, d_in, d_out = point.sizes
    flops, traffic = linear_analytic(m, d_in, d_out, dtype.itemsize)
    sets = _rotated_sets((m * d_in + d_in * d_out) * dtype.itemsize, planned_s)
    require_memory(sets * traffic, f"linear rows={m} d_in={d_in} d_out={d_out}")
    args = linear_args(m, d_in, d_out, dtype, sets, seed)
    shapes = {"rows": m, "d_in": d_in, "d_out": d_out}
  else:
    batch, context, heads, kv_heads, head_dim = point.sizes
    flops, traffic = attention_analytic(batch, context, heads, kv_heads, head_dim, dtype.itemsize)
    sets = _rotated_sets(traffic, planned_s)
    require_memory(sets * traffic, f"decode_attention batch={batch} "
                   f"context={context}")
    shapes = {
        "batch": batch, "context": context, "heads": heads, "kv_heads": kv_heads,
        "head_dim": head_dim
    }
    if backend == "xla":  # As the toy step runs it (see `toy_attention`).
      args = toy_attention_args(batch, context, heads, kv_heads, head_dim, dtype, sets, seed)
      fn = toy_attention
    else:
      args = attention_args(batch, context, heads, kv_heads, head_dim, dtype, sets, seed)
  if _platform() == "cpu":
    repeats = max(3, math.ceil(repeats / sets))
  start = time.perf_counter()
  record = _time_op(point.op, backend, args, shapes=shapes, dtype=dtype.name, flops=flops,
                    traffic=traffic, warmup=warmup, repeats=repeats, fn=fn)
  elapsed = time.perf_counter() - start
  del args
  measurement.release_memory()
  return dataclasses.replace(
      record,
      extra={**record.extra, "arg_sets": sets, "elapsed_s": elapsed, "load_avg_1m": load_average()})


def toy_attention(q: jax.Array, k_rows: jax.Array, v_rows: jax.Array, mask: jax.Array) -> jax.Array:
  """One layer's decode attention exactly as the toy's step computes it.

  XLA's operations on a CPU are the step's own: its head-major K/V rows
  (`jaxroof.toy.cache`) and its arrangement of the products, so the
  operation fit sees what the step runs (the kernel module's reference
  reads another layout).
  """
  return model_lib._attention_rows(q, k_rows, v_rows, mask)  # noqa: SLF001


def toy_attention_args(batch: int, context: int, heads: int, kv_heads: int, head_dim: int,
                       dtype: Any, sets: int, seed: int = 0):
  """`sets` (q, K rows, V rows, mask) of `toy_attention`, every slot read."""
  rows = (batch * kv_heads, context, head_dim)
  mask = jnp.ones((1, context), bool)
  return [(measurement.filler((batch, 1, heads, head_dim), dtype, seed + 3 * i),
           pattern(rows, dtype, seed + 3 * i + 1), pattern(rows, dtype, seed + 3 * i + 2), mask)
          for i in range(sets)]


_GUESS_FLOPS = 1e11
_GUESS_BYTES_PER_S = 3e10


def _guess_op_s(point: OpPoint) -> float:
  """A rough first guess of an operation's time, only to plan its repeats:
  100 GFLOP/s and 30 GB/s, whichever binds (a 2-core CPU reads weights at
  about 40 GB/s: a slower guess plans too few calls for `min_timed_s`)."""
  if point.op == "linear":
    m, d_in, d_out = point.sizes
    return max(2 * m * d_in * d_out / _GUESS_FLOPS, 4 * d_in * d_out / _GUESS_BYTES_PER_S, 1e-5)
  batch, context, heads, kv_heads, head_dim = point.sizes
  return max(8 * batch * context * kv_heads * head_dim / _GUESS_BYTES_PER_S, 1e-5)


def _interleaved(points: Sequence[OpPoint], rng: np.random.Generator) -> list[int]:
  """A random order that alternates between the operations.

  So a round cut short by its deadline still holds every operation (each
  factor's fit needs its own), not only whichever came first.
  """
  groups = [
      list(rng.permutation([i for i, p in enumerate(points) if p.op == op]))
      for op in sorted({p.op for p in points})
  ]
  order = []
  while any(groups):
    for group in groups:
      if group:
        order.append(int(group.pop(0)))
  return order


def op_sweep(
    points: Sequence[OpPoint],
    *,
    dtype: Any = jnp.float32,
    backend: str = "xla",
    rounds: int = 3,
    warmup: int = 1,
    repeats: int = 2000,
    deadline: float | None = None,
    seed: int = 0,
    spread_limit: float = 0.08,
    max_extra_rounds: int = 2,
    min_timed_s: float = 0.1,
    always: Collection[OpPoint] = (),
    every_round: Collection[OpPoint] = (),
    progress: Callable[[str], None] | None = None,
    timed: dict[OpPoint, list[measurement.Measurement]] | None = None,
) -> list[measurement.Measurement]:
  """Times operations in rounds of random order; keeps each lower quartile.

  As `decode_step_sweep`: a burst of load hits a few samples of many points,
  points whose fastest rounds disagree by more than `spread_limit` are
  measured again, and nothing starts that would pass `deadline`
  (`time.monotonic()`). A point gets between 2 and `repeats` timed calls,
  enough to last `min_timed_s` (long calls need fewer): a cheap operation's
  median over 60 calls moved up to 40% between processes on a 2-core CPU,
  over 0.1 s of calls 5% (its setup costs about 0.2 s anyway). The `always`
  points are measured first and once even past the deadline (each fit's
  minimum).
  The `every_round` points open every planned round, so a deadline that cuts
  the last rounds short never leaves them one round: points a factor rests
  on alone (the linear layer at M = 1 decides `eta_w`), whose lower quartile
  over rounds then outvotes one disturbed round. `timed`, where given, holds
  each point's rounds and is extended in place: a later sweep of some of the
  points adds rounds to them (`summarized` gives the records of them all).
  Returns one record per measured point, in order.
  """
  _check_backend(backend)
  rng = np.random.default_rng(seed)
  measured = {} if timed is None else timed
  first = [i for i, p in enumerate(points) if p in always]
  opening = [i for i, p in enumerate(points) if p in every_round]
  passes = []
  for n in range(rounds):
    lead = first if n == 0 else []
    lead = lead + [i for i in opening if i not in lead]
    passes.append(lead + [i for i in _interleaved(points, rng) if i not in lead])
  for extra in range(max_extra_rounds + 1):
    if extra:
      passes = [
          rng.permutation([
              i for i, p in enumerate(points)
              if p in measured and round_spread([r.median_s for r in measured[p]]) > spread_limit
          ])
      ]
    for order in passes:
      for i in order:
        point = points[i]
        last = measured.get(point)
        cost = 2.0 if not last else last[-1].extra["elapsed_s"]
        if (deadline is not None and time.monotonic() + cost > deadline and
            not (point in always and not last)):
          continue
        planned = last[-1].median_s if last else _guess_op_s(point)
        count = int(min(repeats, max(2, math.ceil(min_timed_s / planned))))
        record = measure_op(point, dtype, backend, warmup=warmup, repeats=count, seed=seed,
                            planned_s=planned)
        measured.setdefault(point, []).append(record)
        if progress:
          progress(f"{point.op} {point.sizes}: {record.median_s * 1e3:.3f} ms")
  return summarized(points, measured)


def summarized(
    points: Sequence[OpPoint],
    timed: Mapping[OpPoint, Sequence[measurement.Measurement]]) -> list[measurement.Measurement]:
  """Each timed point's `lower_quartile` round, every round's median in `extra`."""
  out = []
  for point in points:
    if timed.get(point):
      chosen = lower_quartile(timed[point])
      medians = [r.median_s for r in timed[point]]
      out.append(
          dataclasses.replace(
              chosen, extra={
                  **chosen.extra, "round_medians_s": medians,
                  "round_spread": recorded_spread(medians), "statistic": STATISTIC
              }))
  return out
