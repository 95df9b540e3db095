"""The toy decode step timed end to end, at (batch, context) points.

`DecodeStepBench` times the toy Transformer's jit-compiled decode step at a (batch,
context) point: a fixed-size cache of `context` filled positions plus the slot the step
writes, donated to the step so the update is in place, as a server does. Every call
decodes at the same context (the step's length is reset), parameter copies and caches
rotate between calls so the CPU's last-level cache does not flatter weight streaming.
`decode_step_sweep` visits the points in rounds and keeps each one's lower-quartile
round; every figure is a `jaxroof.measure.measurement.Measurement`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxroof import errors
from jaxroof.measure import measurement
from jaxroof.measure.calibration_models import CALIBRATION, step_inputs
from jaxroof.symbolic import formulas
from jaxroof.symbolic.evaluate import step_model
from jaxroof.toy import cache as cache_lib
from jaxroof.toy import config as config_lib
from jaxroof.toy import model as model_lib
from jaxroof.toy import weights as params_lib


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
    (`pattern`), with no pool or temporary beside it, so a point holds only
    its own caches; the values do not change the time of a step.
    """
    shape = self._cache_shape(batch, context)
    blocks = self.config.num_blocks

    def buffer(index: int) -> jax.Array:
      return pattern(shape, self.dtype, self.seed + index)

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
            "load_avg_1m": load_average()
        })
    states.clear()  # Free this point's caches before the next point allocates.
    measurement.release_memory()
    return record


def pattern(shape: tuple[int, ...], dtype: Any, seed: int) -> jax.Array:
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


def load_average() -> float | None:
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


def recorded_spread(medians: Sequence[float]) -> float | None:
  """`round_spread` as a record keeps it: None (JSON null) for a point timed in one round
  (a deadline on a busy machine), where no spread exists."""
  spread = round_spread(medians)
  return spread if math.isfinite(spread) else None


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
          **chosen.extra, "round_medians_s": medians, "round_spread": recorded_spread(medians),
          "load_avg_1m_max": max(loads) if loads else None, "statistic": STATISTIC
      }
      out.append(dataclasses.replace(chosen, extra=extra))
  return out


# Per-op sweeps ----------------------------------------------------------------
