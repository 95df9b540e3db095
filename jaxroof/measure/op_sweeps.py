"""Measured sweeps: the linear layer, decode attention and the toy decode step.

Per op, the computation is the kernel module's jnp `reference` compiled by XLA
(backend "xla", every device, the CPU included) or its Pallas kernel (backend
"pallas", GPU and TPU only: interpreted Pallas timings mean nothing). The
kernel modules are imported only when an op sweep runs.

End to end, `DecodeStepBench` times the toy Transformer's jit-compiled decode
step at a (batch, context) point: a fixed-size cache of `context` filled
positions plus the slot the step writes, donated to the step so the update is
in place, as a server does. Every call decodes at the same context (the step's
length is reset), parameter copies and caches rotate between calls so the
CPU's last-level cache does not flatter weight streaming, and every figure is
a `jaxroof.measure.records.Measurement`.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxroof import errors
from jaxroof.symbolic import formulas
from jaxroof.measure import records as measure
from jaxroof.symbolic.evaluate import step_model
from jaxroof.toy import cache as cache_lib
from jaxroof.toy import config as config_lib
from jaxroof.toy import model as model_lib
from jaxroof.toy import weights as params_lib

# The calibration model: 30.4M weights read per step (122 MB in float32, well
# beyond a CPU's last-level cache), 4 KiB of K/V per position in float32
# (2 KiB in bfloat16): 250,000 retained tokens take 1 GB.
CALIBRATION = dataclasses.replace(
    config_lib.SMALL_12L, vocab_size=4096, num_blocks=4, num_heads=16,
    num_kv_heads=2, head_dim=64, width=1024, mlp_dim=2048)
# Two variants tell the fixed costs from weight streaming: the same blocks at
# half the depth (per-layer costs), and an eight times larger vocabulary,
# whose output head adds weights without adding layers (per-step costs).
SHALLOW = dataclasses.replace(CALIBRATION, num_blocks=2)
WIDE_VOCAB = dataclasses.replace(CALIBRATION, vocab_size=32_768)
MODELS: dict[str, config_lib.ToyConfig] = {
    "calibration": CALIBRATION, "shallow": SHALLOW, "wide_vocab": WIDE_VOCAB}

MAX_RETAINED_TOKENS = 250_000  # batch * context of the default grid.


@dataclasses.dataclass(frozen=True)
class StepInputs:
  """What the step model needs to know about a toy model at a dtype."""

  N: int  # Weights read per step: all but the embedding table.
  N_act: int  # Weights multiplied per token (dense: N).
  q: int  # Bytes per weight.
  k: int  # K/V bytes per retained position, all blocks.
  L: int  # Blocks.
  N_block: int  # Weights of one block (N - L*N_block: the output head).

  def to_json(self) -> dict[str, int]:
    return dataclasses.asdict(self)


def step_inputs(config: config_lib.ToyConfig, dtype: Any) -> StepInputs:
  """Counts the toy model's weights and K/V bytes without allocating them.

  The embedding table is a lookup (one row per sequence), not a weight read
  in full, so it is left out of N.
  """
  shapes = jax.eval_shape(
      lambda key: params_lib.init_params(config, key, dtype),
      jax.random.key(0))
  total = sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(shapes))
  read = total - math.prod(shapes.embed.shape)
  blocks = sum(math.prod(x.shape)
               for x in jax.tree_util.tree_leaves(shapes.blocks))
  itemsize = jnp.dtype(dtype).itemsize
  kv = formulas.kv_bytes_per_position(
      config.num_blocks, config.num_kv_heads, config.head_dim, itemsize)
  return StepInputs(N=read, N_act=read, q=itemsize, k=int(kv),
                    L=config.num_blocks, N_block=blocks // config.num_blocks)


def decode_grid(
    batches: Iterable[int],
    contexts: Iterable[int],
    max_tokens: int | None = MAX_RETAINED_TOKENS,
) -> list[tuple[int, int]]:
  """(batch, context) pairs with batch * context <= max_tokens (None: all)."""
  return [(b, c) for b, c in itertools.product(batches, contexts)
          if max_tokens is None or b * c <= max_tokens]


def _step(params, state, token):
  """One decode step that leaves the cache's length where it was.

  The next call then decodes at the same context, overwriting the same slot.
  """
  logits, new = model_lib.decode_step(params, state, token)
  return logits, dataclasses.replace(new, length=state.length)


class DecodeStepBench:
  """Times the toy model's decode step at (batch, context) points.

  Args:
    config: the toy model's sizes.
    dtype: weights and K/V.
    param_sets: weight copies rotated between calls (2 defeats caches).
    seed: seeds weights, caches and tokens.
    name: the model's label in the records.
  """

  def __init__(self, config: config_lib.ToyConfig = CALIBRATION,
               dtype: Any = jnp.float32, *, param_sets: int = 2,
               seed: int = 0, name: str = "calibration"):
    self.config = config
    self.dtype = dtype
    self.name = name
    self.seed = seed
    self.inputs = step_inputs(config, dtype)
    keys = jax.random.split(jax.random.key(seed), param_sets)
    self.params = [params_lib.init_params(config, key, dtype) for key in keys]
    self._step = jax.jit(_step, donate_argnums=1)
    self._pool: jax.Array | None = None
    self._compiled: dict[tuple[int, int], Any] = {}

  def model_point(self, batch: int, context: int) -> dict[str, float]:
    """Step-model inputs of a point: T counts the slot the step writes."""
    return {"B": batch, "T": context + 1, **self.inputs.to_json()}

  def analytic(self, batch: int, context: int, blocks: int | None = None
               ) -> tuple[float, float]:
    """The step model's (FLOPs, bytes) of a point (lesson's counting).

    `blocks` counts only the output head and that many blocks (with their
    share of the K/V); None counts the whole model.
    """
    p = self.model_point(batch, context)
    if blocks is not None:
      c = self.config
      head = p["N"] - p["L"] * p["N_block"]
      p["N"] = p["N_act"] = head + blocks * p["N_block"]
      p["k"] = float(formulas.kv_bytes_per_position(blocks, c.num_kv_heads, c.head_dim,
                                                    p["q"]))
    out = step_model("numpy")(B=p["B"], T=p["T"], N=p["N"], q=p["q"], k=p["k"], BW=1.0,
                              F=1.0, N_act=p["N_act"])
    return (float(formulas.linear_flops(p["N_act"], p["B"])),
            float(out["traffic_bytes"]))

  def _cache_shape(self, batch: int, context: int) -> tuple[int, ...]:
    """One block's K (or V) buffer: `context` filled slots and the new one."""
    return cache_lib.block_shape(self.config, batch, context + 1)

  def caches(self, batch: int, context: int, count: int
             ) -> list[cache_lib.FixedCache]:
    """`count` caches of `context` filled slots plus the one a step writes.

    Slices of one pool of `measure.filler` values, grown on demand (much
    faster than drawing each cache); the values do not change the time of a
    step. Each block's K and V start at different offsets of the pool.
    """
    shape = self._cache_shape(batch, context)
    size = math.prod(shape)
    blocks = self.config.num_blocks
    offsets = 2 * blocks * count
    if self._pool is None or self._pool.size < size + offsets:
      self._pool = None
      self._pool = measure.filler((size + offsets,), self.dtype, self.seed + 1)

    def buffer(offset: int) -> jax.Array:
      return self._pool[offset:offset + size].reshape(shape)

    return [cache_lib.FixedCache(
        k_blocks=tuple(buffer(2 * (i * blocks + j)) for j in range(blocks)),
        v_blocks=tuple(buffer(2 * (i * blocks + j) + 1) for j in range(blocks)),
        length=jnp.asarray(context, jnp.int32), batch=batch)
        for i in range(count)]

  def compile(self, batch: int, context: int):
    """The step compiled ahead of time for a point (kept for later rounds).

    Its `cost_analysis()` is XLA's count of the step's FLOPs and bytes.
    """
    if (batch, context) not in self._compiled:
      cache = jax.eval_shape(lambda: cache_lib.init_cache(
          self.config, batch, context + 1, self.dtype))
      token = jax.ShapeDtypeStruct((batch,), jnp.int32)
      self._compiled[batch, context] = self._step.lower(
          self.params[0], cache, token).compile()
    return self._compiled[batch, context]

  def measure(self, batch: int, context: int, *, warmup: int = 2,
              repeats: int = 5, cache_sets: int | None = None,
              clock=time.perf_counter) -> measure.Measurement:
    """Times the decode step at one point.

    Args:
      batch: sequences decoded together.
      context: positions already holding K/V in each sequence.
      warmup: untimed steps first.
      repeats: timed steps; the record keeps their median and spread.
      cache_sets: caches rotated between calls; None means two while a
        cache is under 256 MB (it could sit in a CPU cache), else one.
      clock: injectable for tests.
    """
    batch = errors.require_positive_int("batch", batch)
    context = errors.require_positive_int("context", context)
    cache_bytes = float(formulas.retained_kv_bytes(batch, context + 1, self.inputs.k))
    if cache_sets is None:
      cache_sets = 2 if cache_bytes < 256e6 else 1
    start = time.perf_counter()
    compiled = self.compile(batch, context)
    states = self.caches(batch, context, cache_sets)
    setup_s = time.perf_counter() - start
    token = jax.random.randint(jax.random.key(self.seed + 2), (batch,), 0,
                               self.config.vocab_size, jnp.int32)
    slots = math.lcm(len(self.params), cache_sets)

    def call(slot: int):
      params = self.params[slot % len(self.params)]
      logits, state = compiled(params, states[slot % cache_sets], token)
      states[slot % cache_sets] = state  # The old one was donated.
      return logits

    flops, traffic = self.analytic(batch, context)
    record = measure.measure(
        call, [(i,) for i in range(slots)], op="decode_step",
        shapes={"batch": batch, "context": context,
                "layers": self.config.num_blocks},
        dtype=jnp.dtype(self.dtype).name, backend="xla", warmup=warmup,
        repeats=repeats, flops=flops, bytes=traffic, clock=clock,
        extra={"model": self.name, "step_inputs": self.inputs.to_json(),
               "retained_tokens": context + 1, "cache_sets": cache_sets,
               "param_sets": len(self.params),
               "setup_s": setup_s, "donated_cache": True,
               "load_avg_1m": _load_average()})
    states.clear()  # Free this point's caches before the next point allocates.
    gc.collect()
    return record


@dataclasses.dataclass(frozen=True, order=True)
class StepPoint:
  """A decode-step point: which model, how many sequences, what context."""

  model: str
  batch: int
  context: int


def _load_average() -> float | None:
  try:
    return os.getloadavg()[0]
  except OSError:  # Not every platform has one.
    return None


class _CostGuess:
  """Guesses a point's step time from the points measured so far.

  Least squares of t = a + b*B + c*B*T per model: only used to skip points
  that would overrun the budget, never reported.
  """

  def __init__(self):
    self._rows: dict[str, list[tuple[float, float, float]]] = {}

  def add(self, point: StepPoint, seconds: float) -> None:
    self._rows.setdefault(point.model, []).append(
        (point.batch, point.batch * (point.context + 1), seconds))

  def step_s(self, point: StepPoint) -> float:
    rows = self._rows.get(point.model, [])
    if len(rows) < 3:
      return 0.0
    data = np.asarray(rows)
    design = np.column_stack([np.ones(len(data)), data[:, 0], data[:, 1]])
    coef, *_ = np.linalg.lstsq(design, data[:, 2], rcond=None)
    tokens = point.batch * (point.context + 1)
    return float(max(coef @ [1.0, point.batch, tokens], data[:, 2].min()))


STATISTIC = "lower-quartile round's median"


def lower_quartile(records: Sequence[measure.Measurement]
                   ) -> measure.Measurement:
  """The round at the lower quartile of the rounds' medians.

  Load from other processes only ever slows a round down, so the typical
  round overstates the step; the single fastest round can be a lucky one
  (the other core idle). The lower quartile (the second fastest of five) is
  robust to both.
  """
  ordered = sorted(records, key=lambda r: r.median_s)
  return ordered[int(0.25 * (len(ordered) - 1) + 0.5)]


def decode_step_sweep(
    benches: Mapping[str, DecodeStepBench],
    points: Sequence[StepPoint],
    *,
    rounds: int = 5,
    warmup: int = 1,
    repeats: int = 3,
    min_round_s: float = 0.1,
    deadline: float | None = None,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> list[measure.Measurement]:
  """Measures decode steps at `points` in rounds; keeps each lower quartile.

  Each round visits the points in a fresh random order, so a burst of load
  from other processes hits a few samples of many points rather than every
  sample of one. A point's record is its `lower_quartile` round (every
  round's median is kept in `extra`). Points whose guessed cost would pass
  `deadline` (a `time.monotonic()` value) are skipped; a point is reported
  once measured in at least one round.

  Args:
    benches: model name -> bench.
    points: where to measure.
    rounds: passes over the points (later ones only while time is left).
    warmup, repeats: per point and round.
    min_round_s: after its first round, a point gets enough repeats for its
      timed steps to last this long (short steps are the noisiest).
    deadline: stop measuring by then; None means no limit.
    seed: the visiting order.
    progress: called with one line per measured point.

  Returns:
    One record per measured point, in the order of `points`.
  """
  rng = np.random.default_rng(seed)
  measured: dict[StepPoint, list[measure.Measurement]] = {}
  guess = _CostGuess()
  total = len(points) * rounds
  done = 0
  for round_index in range(rounds):
    for i in rng.permutation(len(points)):
      point = points[i]
      done += 1
      count = repeats
      if point in measured:
        last = measured[point][-1]
        count = max(repeats, math.ceil(min_round_s / last.median_s))
        cost = last.extra["setup_s"] + (warmup + count) * last.median_s
      else:
        cost = 1.0 + (warmup + repeats + 1) * guess.step_s(point)
      if deadline is not None and time.monotonic() + cost > deadline:
        continue
      record = benches[point.model].measure(
          point.batch, point.context, warmup=warmup, repeats=count)
      guess.add(point, record.median_s)
      measured.setdefault(point, []).append(record)
      if progress:
        left = "" if deadline is None else (
            f", {max(0.0, deadline - time.monotonic()):.0f} s left")
        progress(f"[{done}/{total}] round {round_index + 1} {point.model} "
                 f"batch={point.batch} context={point.context}: "
                 f"{record.median_s * 1e3:.2f} ms (spread "
                 f"{record.spread:.2f}){left}")
  out = []
  for point in points:
    if point in measured:
      chosen = lower_quartile(measured[point])
      extra = {**chosen.extra,
               "round_medians_s": [r.median_s for r in measured[point]],
               "statistic": STATISTIC}
      out.append(dataclasses.replace(chosen, extra=extra))
  return out


# Per-op sweeps ----------------------------------------------------------------


def _platform() -> str:
  return jax.default_backend()


def _check_backend(backend: str) -> None:
  errors.require_choice("backend", backend, measure.BACKENDS)
  if backend == "pallas" and _platform() == "cpu":
    raise errors.InputError(
        "backend='pallas' is not allowed on the CPU: Pallas only interprets "
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


def _time_op(op: str, backend: str, arg_sets: Sequence[tuple], *,
             shapes: dict[str, int], dtype: str, flops: float, traffic: float,
             warmup: int, repeats: int) -> measure.Measurement:
  """Wall-clock timing with rotation on the CPU; a chain of calls elsewhere.

  On a GPU or TPU a single op lasts about as long as dispatching it, so the
  op is timed inside one jit as a chain of dependent calls
  (`kernels.device_timing`), which charges launches, never dispatch.
  """
  fn = _op_fn(op, backend)
  if _platform() == "cpu":
    return measure.measure(jax.jit(fn), arg_sets, op=op, shapes=shapes,
                           dtype=dtype, backend=backend, warmup=warmup,
                           repeats=repeats, flops=flops, bytes=traffic)
  from kernels import device_timing  # Deferred: accelerators only.

  timing = device_timing.time_chained(
      fn, arg_sets[0], feed=device_timing.perturb_first, warmup=warmup,
      repeats=repeats)
  return measure.labelled(timing, op=op, shapes=shapes, dtype=dtype,
                          backend=backend, flops=flops, bytes=traffic)


MEMORY_LIMIT_BYTES = 4e9  # Operands of one timed op on a 24 GB, 2 GB-budget machine.


def require_memory(nbytes: float, what: str, limit: float = MEMORY_LIMIT_BYTES) -> None:
  """Refuses, before allocating, operands over `limit` (their analytic bytes)."""
  if nbytes > limit:
    raise errors.InputError(f"{what} needs about {nbytes / 1e9:,.1f} GB of operands, over "
                            f"the {limit / 1e9:g} GB limit: use smaller sizes.")


def linear_args(rows: int, d_in: int, d_out: int, dtype: Any, sets: int,
                seed: int = 0) -> list[tuple[jax.Array, jax.Array]]:
  """`sets` independent (x, w) pairs: x (rows, d_in), w (d_in, d_out)."""
  return [(measure.filler((rows, d_in), dtype, seed + 2 * i),
           measure.filler((d_in, d_out), dtype, seed + 2 * i + 1)
           / math.sqrt(d_in)) for i in range(sets)]


def linear_analytic(rows: int, d_in: int, d_out: int,
                    itemsize: int) -> tuple[float, float]:
  """(FLOPs, bytes) of x @ w: `formulas.linear_flops` and `formulas.linear_bytes`
  (the weights once, x read, the output written)."""
  return (float(formulas.linear_flops(d_in * d_out, rows)),
          float(formulas.linear_bytes(rows, d_in, d_out, itemsize)))


def linear_sweep(
    rows: Sequence[int], *, d_in: int, d_out: int, dtype: Any = jnp.float32,
    backend: str = "xla", phase: str = "decode", warmup: int = 2,
    repeats: int = 10, progress: Callable[[str], None] | None = None,
) -> list[measure.Measurement]:
  """Times x (rows, d_in) @ w (d_in, d_out) for each row count."""
  _check_backend(backend)
  dtype = jnp.dtype(dtype)
  records = []
  for m in errors.require_positive_ints("rows", rows):
    flops, traffic = linear_analytic(m, d_in, d_out, dtype.itemsize)
    require_memory(2 * traffic, f"linear rows={m} d_in={d_in} d_out={d_out}")
    args = linear_args(m, d_in, d_out, dtype, sets=2)
    record = _time_op("linear", backend, args,
                      shapes={"rows": m, "d_in": d_in, "d_out": d_out},
                      dtype=dtype.name, flops=flops, traffic=traffic,
                      warmup=warmup, repeats=repeats)
    records.append(dataclasses.replace(record, extra={"phase": phase}))
    if progress:
      progress(f"linear {phase} rows={m}: {record.median_s * 1e3:.3f} ms")
  return records


def attention_args(batch: int, context: int, heads: int, kv_heads: int,
                   head_dim: int, dtype: Any, sets: int, seed: int = 0):
  """`sets` independent (q, k, v, lengths) of decode attention, all full."""
  shape = (batch, context, kv_heads, head_dim)
  return [(measure.filler((batch, heads, head_dim), dtype, seed + 3 * i),
           measure.filler(shape, dtype, seed + 3 * i + 1),
           measure.filler(shape, dtype, seed + 3 * i + 2),
           jnp.full((batch,), context, jnp.int32)) for i in range(sets)]


def attention_analytic(batch: int, context: int, heads: int, kv_heads: int,
                       head_dim: int, itemsize: int) -> tuple[float, float]:
  """(FLOPs, bytes) of one layer's decode attention: `formulas.attention_flops`
  and `formulas.attention_bytes` (the retained K/V, the queries and outputs)."""
  return (float(formulas.attention_flops(batch, context, heads, head_dim)),
          float(formulas.attention_bytes(batch, context, heads, kv_heads, head_dim,
                                         itemsize)))


def attention_sweep(
    points: Sequence[tuple[int, int]], *, heads: int, kv_heads: int,
    head_dim: int, dtype: Any = jnp.float32, backend: str = "xla",
    warmup: int = 2, repeats: int = 10,
    progress: Callable[[str], None] | None = None,
) -> list[measure.Measurement]:
  """Times one layer's decode attention at each (batch, context) point."""
  _check_backend(backend)
  dtype = jnp.dtype(dtype)
  records = []
  for batch, context in points:
    nbytes = formulas.retained_kv_bytes(
        batch, context, formulas.kv_bytes_per_position(1, kv_heads, head_dim, dtype.itemsize))
    sets = 2 if nbytes < 256e6 else 1
    flops, traffic = attention_analytic(batch, context, heads, kv_heads,
                                        head_dim, dtype.itemsize)
    require_memory(sets * traffic, f"decode_attention batch={batch} context={context} "
                   f"heads={heads} kv_heads={kv_heads} head_dim={head_dim}")
    args = attention_args(batch, context, heads, kv_heads, head_dim, dtype,
                          sets)
    record = _time_op(
        "decode_attention", backend, args,
        shapes={"batch": batch, "context": context, "heads": heads,
                "kv_heads": kv_heads, "head_dim": head_dim},
        dtype=dtype.name, flops=flops, traffic=traffic, warmup=warmup,
        repeats=repeats)
    records.append(record)
    if progress:
      progress(f"decode_attention batch={batch} context={context}: "
               f"{record.median_s * 1e3:.3f} ms")
    del args
  return records

