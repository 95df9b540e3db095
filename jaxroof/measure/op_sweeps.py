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
a `jaxroof.measure.measurement.Measurement`.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import os
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxroof import errors
from jaxroof.symbolic import formulas
from jaxroof.measure import measurement
from jaxroof.symbolic.evaluate import step_model
from jaxroof.timing import time_call
from jaxroof.toy import cache as cache_lib
from jaxroof.toy import config as config_lib
from jaxroof.toy import model as model_lib
from jaxroof.toy import weights as params_lib

# The calibration model: 30.4M weights read per step (122 MB in float32, well
# beyond a CPU's last-level cache), 4 KiB of K/V per position in float32
# (2 KiB in bfloat16): 250,000 retained tokens take 1 GB.
CALIBRATION = dataclasses.replace(config_lib.SMALL_12L, vocab_size=4096, num_blocks=4, num_heads=16,
                                  num_kv_heads=2, head_dim=64, width=1024, mlp_dim=2048)
# Two variants tell the fixed costs from weight streaming: the same blocks at
# half the depth (per-layer costs), and an eight times larger vocabulary,
# whose output head adds weights without adding layers (per-step costs). The
# shallow variant also has another K/V layout (16 query over 8 K/V heads, GQA
# group 2 against 8): the same K/V bytes read 15-45% faster or slower in
# another layout on a CPU, so eta_kv is fitted over two (a model the fit never
# saw has a layout of its own).
SHALLOW = dataclasses.replace(CALIBRATION, num_blocks=2, num_kv_heads=8)
WIDE_VOCAB = dataclasses.replace(CALIBRATION, vocab_size=32_768)
MODELS: dict[str, config_lib.ToyConfig] = {
    "calibration": CALIBRATION, "shallow": SHALLOW, "wide_vocab": WIDE_VOCAB
}


def _kv_heads(heads: int, target: float, avoid: int) -> int:
  """The divisor of `heads` nearest `target`, other than `avoid` if possible."""
  divisors = [d for d in range(1, heads + 1) if heads % d == 0]
  others = [d for d in divisors if d != avoid] or divisors
  return min(others, key=lambda d: (abs(d - target), d))


def heldout_variant(config: config_lib.ToyConfig, kind: str) -> config_lib.ToyConfig:
  """A toy model a fit on `config` never sees: other width, depth, K/V heads.

  "narrow": 3/4 of the query heads (so of the width), one block fewer,
  about twice the K/V heads; "wide": 5/4 of the heads, one block more,
  about 1.5 times the K/V heads. The MLP keeps its ratio to the width and the
  head size and vocabulary stay, so the variant is a different model of the
  same family, as a user's model is.
  """
  errors.require_choice("kind", kind, ("narrow", "wide"))
  scale, blocks, kv_scale = ((3, 4), -1, 2.0) if kind == "narrow" else ((5, 4), 1, 1.5)
  heads = max(1, config.num_heads * scale[0] // scale[1])
  width = heads * config.head_dim
  return dataclasses.replace(
      config, num_heads=heads, width=width,
      num_kv_heads=_kv_heads(heads, config.num_kv_heads * kv_scale,
                             config.num_kv_heads), num_blocks=max(1, config.num_blocks + blocks),
      mlp_dim=max(1, config.mlp_dim * width // config.width))


# The fit's models (the operations are timed at their shapes; their smallest
# steps give the fixed costs) and the two held out: every profile's error is
# measured on models the fit never saw (width 768 / 3 blocks / 4 K/V heads,
# and width 1280 / 5 blocks / 4 K/V heads, against 1024 / 4 blocks / 2 K/V heads
# and 1024 / 2 / 8).
FIT_MODELS: dict[str, config_lib.ToyConfig] = {"calibration": CALIBRATION, "shallow": SHALLOW}
HELDOUT_NARROW = heldout_variant(CALIBRATION, "narrow")
HELDOUT_WIDE = heldout_variant(CALIBRATION, "wide")
HELDOUT_MODELS: dict[str, config_lib.ToyConfig] = {
    "heldout_narrow": HELDOUT_NARROW, "heldout_wide": HELDOUT_WIDE
}
ALL_MODELS: dict[str, config_lib.ToyConfig] = {**MODELS, **HELDOUT_MODELS}

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
  shapes = jax.eval_shape(lambda key: params_lib.init_params(config, key, dtype), jax.random.key(0))
  total = sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(shapes))
  read = total - math.prod(shapes.embed.shape)
  blocks = sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(shapes.blocks))
  itemsize = jnp.dtype(dtype).itemsize
  kv = formulas.kv_bytes_per_position(config.num_blocks, config.num_kv_heads, config.head_dim,
                                      itemsize)
  return StepInputs(N=read, N_act=read, q=itemsize, k=int(kv), L=config.num_blocks,
                    N_block=blocks // config.num_blocks)


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

  def __init__(self, config: config_lib.ToyConfig = CALIBRATION, dtype: Any = jnp.float32, *,
               param_sets: int = 2, seed: int = 0, name: str = "calibration"):
    self.config = config
    self.dtype = dtype
    self.name = name
    self.seed = seed
    self.inputs = step_inputs(config, dtype)
    self.params = [filled_params(config, dtype, seed + 100 * i) for i in range(param_sets)]
    self._step = jax.jit(_step, donate_argnums=1)
    self._compiled: dict[tuple[int, int], Any] = {}

  def model_point(self, batch: int, context: int) -> dict[str, float]:
    """Step-model inputs of a point: T counts the slot the step writes."""
    return {"B": batch, "T": context + 1, **self.inputs.to_json()}

  def analytic(self, batch: int, context: int, blocks: int | None = None) -> tuple[float, float]:
    """The step model's (FLOPs, bytes) of a point (lesson's counting).

    `blocks` counts only the output head and that many blocks (with their
    share of the K/V); None counts the whole model.
    """
    p = self.model_point(batch, context)
    if blocks is not None:
      c = self.config
      head = p["N"] - p["L"] * p["N_block"]
      p["N"] = p["N_act"] = head + blocks * p["N_block"]
      p["k"] = float(formulas.kv_bytes_per_position(blocks, c.num_kv_heads, c.head_dim, p["q"]))
    out = step_model("numpy")(B=p["B"], T=p["T"], N=p["N"], q=p["q"], k=p["k"], BW=1.0, F=1.0,
                              N_act=p["N_act"])
    return (float(formulas.linear_flops(p["N_act"], p["B"])), float(out["traffic_bytes"]))

  def _cache_shape(self, batch: int, context: int) -> tuple[int, ...]:
    """One block's K (or V) buffer: `context` filled slots and the new one."""
    return cache_lib.block_shape(self.config, batch, context + 1)

  def caches(self, batch: int, context: int, count: int) -> list[cache_lib.FixedCache]:
    """`count` caches of `context` filled slots plus the one a step writes.

    Each block's K and V buffer is written once by a compiled fill
    (`_pattern`), with no pool or temporary beside it, so a point holds only
    its own caches; the values do not change the time of a step.
    """
    shape = self._cache_shape(batch, context)
    blocks = self.config.num_blocks

    def buffer(index: int) -> jax.Array:
      return _pattern(shape, self.dtype, self.seed + index)

    return [
        cache_lib.FixedCache(
            k_blocks=tuple(buffer(2 * (i * blocks + j)) for j in range(blocks)),
            v_blocks=tuple(buffer(2 * (i * blocks + j) + 1)
                           for j in range(blocks)), length=jnp.asarray(context,
                                                                       jnp.int32), batch=batch)
        for i in range(count)
    ]

  def compile(self, batch: int, context: int):
    """The step compiled ahead of time for a point (kept for later rounds).

    Its `cost_analysis()` is XLA's count of the step's FLOPs and bytes.
    """
    if (batch, context) not in self._compiled:
      cache = jax.eval_shape(lambda: cache_lib.init_cache(self.config, batch, context + 1, self.
                                                          dtype))
      token = jax.ShapeDtypeStruct((batch,), jnp.int32)
      self._compiled[batch, context] = self._step.lower(self.params[0], cache, token).compile()
    return self._compiled[batch, context]

  def measure(self, batch: int, context: int, *, warmup: int = 2, repeats: int = 5,
              cache_sets: int | None = None, clock=time.perf_counter) -> measurement.Measurement:
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
    token = jax.random.randint(jax.random.key(self.seed + 2), (batch,), 0, self.config.vocab_size,
                               jnp.int32)
    slots = math.lcm(len(self.params), cache_sets)

    def call(slot: int):
      params = self.params[slot % len(self.params)]
      logits, state = compiled(params, states[slot % cache_sets], token)
      states[slot % cache_sets] = state  # The old one was donated.
      return logits

    flops, traffic = self.analytic(batch, context)
    record = measurement.measure(
        call, [(i,) for i in range(slots)], op="decode_step",
        shapes={"batch": batch, "context": context,
                "layers": self.config.num_blocks}, dtype=jnp.dtype(self.dtype).name, backend="xla",
        warmup=warmup, repeats=repeats, flops=flops, bytes=traffic, clock=clock, extra={
            "model": self.name, "step_inputs": self.inputs.to_json(),
            "retained_tokens": context + 1, "cache_sets": cache_sets,
            "param_sets": len(self.params), "setup_s": setup_s, "donated_cache": True,
            "load_avg_1m": _load_average()
        })
    states.clear()  # Free this point's caches before the next point allocates.
    measurement.release_memory()
    return record


def _pattern(shape: tuple[int, ...], dtype: Any, seed: int) -> jax.Array:
  """Bounded, non-constant values of `shape`, computed in place (no copy)."""
  return _compiled_pattern(shape, jnp.dtype(dtype), jnp.float32(seed))


@functools.partial(jax.jit, static_argnums=(0, 1))
def _compiled_pattern(shape: tuple[int, ...], dtype: Any, offset: jax.Array) -> jax.Array:
  index = lax.iota(jnp.float32, math.prod(shape)).reshape(shape)
  return jnp.sin(index * 0.618 + offset).astype(dtype)


def filled_params(config: config_lib.ToyConfig, dtype: Any, seed: int) -> params_lib.Params:
  """Weights of the toy's shapes, each leaf one small constant per copy.

  Much faster than drawing them (`weights.init_params`, seconds per copy of
  a 200 MB model on a CPU) and with no compilation per shape: a step's time
  does not depend on the values, which keep activations finite. Not donated,
  so host memory may back them.
  """
  shapes = jax.eval_shape(lambda key: params_lib.init_params(config, key, dtype), jax.random.key(0))
  leaves, tree = jax.tree_util.tree_flatten(shapes)
  value = 0.01 * (1 + seed % 7)
  return jax.tree_util.tree_unflatten(
      tree, [jnp.asarray(np.full(leaf.shape, value, jnp.dtype(leaf.dtype))) for leaf in leaves])


def kv_bytes(config: config_lib.ToyConfig, dtype: Any, batch: int, context: int) -> float:
  """Bytes of one K/V cache of a point (context + the written slot)."""
  per_position = formulas.kv_bytes_per_position(config.num_blocks, config.num_kv_heads,
                                                config.head_dim,
                                                jnp.dtype(dtype).itemsize)
  return float(formulas.retained_kv_bytes(batch, context + 1, per_position))


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


def round_spread(medians: Sequence[float]) -> float:
  """How far a point's fastest rounds disagree: third fastest / fastest - 1.

  The lower quartile sits among the fastest rounds, so it is settled once
  they agree; one round alone is never settled (inf).
  """
  ordered = sorted(medians)
  if len(ordered) < 2:
    return math.inf
  return ordered[min(2, len(ordered) - 1)] / ordered[0] - 1.0


def lower_quartile(records: Sequence[measurement.Measurement]) -> measurement.Measurement:
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
    spread_limit: float = 0.08,
    max_extra_rounds: int = 3,
    always: Collection[StepPoint] = (),
    progress: Callable[[str], None] | None = None,
    after_round: Callable[[], None] | None = None,
) -> list[measurement.Measurement]:
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
    spread_limit: after the planned rounds, points whose `round_spread`
      exceeds this are measured again (up to `max_extra_rounds` passes,
      while the deadline allows): a shared machine's load comes in bursts.
    max_extra_rounds: see `spread_limit`.
    always: points measured once even past the deadline (what a fit cannot
      do without), first.
    progress: called with one line per measured point.
    after_round: called after each round that measured a point, to time
      something else in the same rounds (`calibrate.toy_job`: the linear
      layer at M = 1, spread over the whole run).

  Returns:
    One record per measured point, in the order of `points`; `extra` holds
    every round's median, their `round_spread` and the highest load seen.
  """
  rng = np.random.default_rng(seed)
  measured: dict[StepPoint, list[measurement.Measurement]] = {}
  guess = _CostGuess()
  total = len(points) * rounds
  done = 0

  def unsettled() -> list[int]:
    return [
        i for i, p in enumerate(points)
        if p in measured and round_spread([r.median_s for r in measured[p]]) > spread_limit
    ]

  passes = [rng.permutation(len(points)) for _ in range(rounds)]
  first = [i for i, p in enumerate(points) if p in always]
  passes[0] = np.asarray(first + [i for i in passes[0] if i not in first], dtype=int)
  extra = 0
  round_index = -1
  while True:
    round_index += 1
    if round_index < rounds:
      order = passes[round_index]
    else:  # Re-measure the points whose fastest rounds disagree.
      order = rng.permutation(unsettled())
      if extra >= max_extra_rounds or not len(order):
        break
      extra += 1
      total += len(order)
    timed_this_round = False
    for i in order:
      point = points[i]
      done += 1
      count = repeats
      if point in measured:
        last = measured[point][-1]
        count = max(repeats, math.ceil(min_round_s / last.median_s))
        cost = last.extra["setup_s"] + (warmup + count) * last.median_s
      else:
        cost = 1.0 + (warmup + repeats + 1) * guess.step_s(point)
      if (deadline is not None and time.monotonic() + cost > deadline and
          not (point in always and point not in measured)):
        continue
      record = benches[point.model].measure(point.batch, point.context, warmup=warmup,
                                            repeats=count)
      guess.add(point, record.median_s)
      measured.setdefault(point, []).append(record)
      timed_this_round = True
      if progress:
        left = "" if deadline is None else (f", {max(0.0, deadline - time.monotonic()):.0f} s left")
        progress(f"[{done}/{total}] round {round_index + 1} {point.model} "
                 f"batch={point.batch} context={point.context}: "
                 f"{record.median_s * 1e3:.2f} ms (spread "
                 f"{record.spread:.2f}){left}")
    if after_round and timed_this_round:
      after_round()
  out = []
  for point in points:
    if point in measured:
      chosen = lower_quartile(measured[point])
      medians = [r.median_s for r in measured[point]]
      loads = [r.extra.get("load_avg_1m") for r in measured[point]]
      loads = [x for x in loads if x is not None]
      extra = {
          **chosen.extra, "round_medians_s": medians, "round_spread": round_spread(medians),
          "load_avg_1m_max": max(loads) if loads else None, "statistic": STATISTIC
      }
      out.append(dataclasses.replace(chosen, extra=extra))
  return out


# Per-op sweeps ----------------------------------------------------------------


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
      record, extra={
          **record.extra, "arg_sets": sets, "elapsed_s": elapsed, "load_avg_1m": _load_average()
      })


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
           _pattern(rows, dtype, seed + 3 * i + 1), _pattern(rows, dtype, seed + 3 * i + 2), mask)
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
                  **chosen.extra, "round_medians_s": medians, "round_spread": round_spread(medians),
                  "statistic": STATISTIC
              }))
  return out
