"""The toy decode step's measuring plan: grids, memory limits and timed sweeps.

What a toy calibration times (`jaxroof.calibrate.toy_job` runs it and fits):
the fit models' steps (`default_points`, `SMALLEST`), the held-out models'
steps (`heldout_points`), the operations' grids (`LINEAR_ROWS`,
`ATTENTION_GRID`), each point within `MAX_KV_BYTES`, and the sweeps that time
the steps one model after another or interleaved in the same rounds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxroof.measure import calibration_models
from jaxroof.measure import measurement
from jaxroof.measure import op_sweeps
from jaxroof.measure import step_sweeps
from jaxroof.measure.step_sweeps import StepPoint
from jaxroof.symbolic import formulas
from jaxroof.toy.config import ToyConfig

Progress = Callable[[str], None]

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CONTEXTS = (128, 256, 512, 1024, 2048, 4096)
# Near the 250,000-token cap, which the powers of two stop short of.
EDGE_POINTS = ((64, 3900), (128, 1950), (256, 976))
QUICK_BUDGET_S = 150.0  # Below this, sparser grids.
# One cache of a timed point at most (the step's K/V, one copy): with the
# largest toy's two weight copies, a job stays within about 2 GB resident.
MAX_KV_BYTES = 400e6
# Weights below this get a second copy to rotate (so a CPU's 32 MB last-level
# cache cannot hold them between steps); larger ones stream from memory anyway
# (one copy also keeps the job within about 2 GB).
ROTATE_WEIGHTS_BELOW = 64e6
# Row counts of the linear layer (M = 1 ... 2048) and attention's points.
LINEAR_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
LINEAR_ROWS_QUICK = (1, 2, 4, 16, 64, 256, 2048)
ATTENTION_GRID = ((1, 128), (1, 1024), (1, 4096), (4, 512), (4, 2048), (16, 256), (16, 1024),
                  (16, 4096), (64, 512), (64, 1024), (256, 128), (256, 512))
ATTENTION_GRID_QUICK = ((1, 128), (1, 4096), (4, 1024), (16, 2048), (64, 512), (256, 128), (256,
                                                                                            512))
# The fixed costs' points: each fit model's smallest steps.
SMALLEST = ((1, 128), (2, 128), (1, 512))
# K/V-heavy steps of each fit model: `op_fit` refits eta_kv on them (the attention inside
# a step reads K/V faster than the attention timed alone).
KV_STEPS = ((16, 2048), (64, 512))
# Where the fit models share one K/V layout, one layer's attention is also timed at
# another at K/V-heavy shapes (`layout_probe`): the fit moves eta_kv to the rate midway
# over the layouts, and their spread is the floor of a K/V-heavy step of a model the fit
# never saw.
LAYOUT_PROBE_GRID = KV_STEPS + ((256, 128),)
LAYOUT_PROBE_KV_SCALE = 4  # The probe's K/V heads: the first fit model's times this.
# Held-out steps: batch 1-256, context 128-4096, spread over the grid.
HELDOUT_GRID = ((1, 128), (1, 1024), (1, 4096), (2, 512), (4, 1024), (8, 256), (16, 256),
                (16, 2048), (32, 1024), (64, 512), (128, 256), (256, 128))
HELDOUT_GRID_QUICK = ((1, 128), (1, 4096), (4, 1024), (16, 256), (16, 2048), (64, 512), (256, 128))
HELDOUT_GRID_SHORT = ((1, 128), (4, 1024), (16, 2048), (64, 512), (256, 128))


def fits_memory(config: ToyConfig, dtype: Any, batch: int, context: int) -> bool:
  """Whether a point's cache is within `MAX_KV_BYTES` and the token cap."""
  return (step_sweeps.kv_bytes(config, dtype, batch, context) <= MAX_KV_BYTES and
          batch * context <= calibration_models.MAX_RETAINED_TOKENS)


def default_points(budget_s: float, models: Mapping[str, ToyConfig] | None = None,
                   dtype: Any = "float32") -> list[StepPoint]:
  """The end-to-end fit's grid (`fit="steps"`): batch 1-256 x context 128-4096.

  The main model over the whole grid (and three points near the 250k-token
  cap); its variants (`calibration_models.MODELS`) at short contexts, where their
  weights and layers rather than their K/V set the step time; with a budget
  under `QUICK_BUDGET_S`, sparser grids still. Points whose cache would pass
  `MAX_KV_BYTES` are left out.
  """
  configs = calibration_models.MODELS if models is None else models
  quick = budget_s < QUICK_BUDGET_S
  grids = {
      "calibration": (BATCHES[::2], CONTEXTS[::2]) if quick else (BATCHES, CONTEXTS),
      "shallow": ((1, 16, 256), (128,)) if quick else ((1, 4, 16, 64, 256), (128, 256)),
      "wide_vocab": ((1, 16), (128,)) if quick else ((1, 4, 16, 64), (128, 512)),
  }
  points = [
      StepPoint(model, b, c) for model, (batches, contexts) in grids.items() if model in configs
      for b, c in calibration_models.decode_grid(batches, contexts)
  ]
  if not quick:
    points += [StepPoint("calibration", b, c) for b, c in EDGE_POINTS]
  return [
      p for p in points
      if p.model in configs and fits_memory(configs[p.model], dtype, p.batch, p.context)
  ]


def heldout_points(budget_s: float, models: Mapping[str, ToyConfig],
                   dtype: Any = "float32") -> list[StepPoint]:
  """The held-out models' points: batch 1-256 x context 128-4096, sparser on
  smaller budgets, each within `MAX_KV_BYTES`."""
  grid = (HELDOUT_GRID if budget_s >= QUICK_BUDGET_S else
          HELDOUT_GRID_QUICK if budget_s >= 90 else HELDOUT_GRID_SHORT)
  return [
      StepPoint(name, b, c) for name, config in models.items() for b, c in grid
      if fits_memory(config, dtype, b, c)
  ]


def sweep_models(configs: Mapping[str, ToyConfig], points: Sequence[StepPoint], dtype: Any, *,
                 deadline: float, rounds: int, warmup: int, repeats: int, seed: int, say: Progress,
                 after_round: Callable[[], None] | None = None) -> list[measurement.Measurement]:
  """Times each model's points with one bench alive at a time (memory);
  `after_round` as `step_sweeps.decode_step_sweep` takes it."""
  records = []
  names = [n for n in configs if any(p.model == n for p in points)]
  for index, name in enumerate(names):
    mine = [p for p in points if p.model == name]
    # Each model gets its share of the time left, so the last is not starved.
    share = (deadline - time.monotonic()) / (len(names) - index)
    weight_bytes = calibration_models.step_inputs(configs[name], dtype).N * np.dtype(dtype).itemsize
    bench = step_sweeps.DecodeStepBench(configs[name], dtype, name=name, seed=seed,
                                        param_sets=2 if weight_bytes < ROTATE_WEIGHTS_BELOW else 1)
    records += step_sweeps.decode_step_sweep({name: bench}, mine, rounds=rounds, warmup=warmup,
                                             repeats=repeats, deadline=time.monotonic() + share,
                                             seed=seed, always=mine[:1], progress=say,
                                             after_round=after_round)
    del bench
    measurement.release_memory()
  return records


def sweep_interleaved(
    configs: Mapping[str, ToyConfig], points: Sequence[StepPoint], dtype: Any, *, deadline: float,
    rounds: int, warmup: int, repeats: int, seed: int, say: Progress,
    after_round: Callable[[], None] | None = None) -> list[measurement.Measurement]:
  """Times every model's points in the same rounds (fit and held-out together).

  Each round visits all points in a fresh random order, so load from other
  processes hits the fit's steps and the held-out steps alike; the benches are
  alive together (one weight copy each above `ROTATE_WEIGHTS_BELOW`).
  `after_round` as `step_sweeps.decode_step_sweep` takes it.
  """
  names = [n for n in configs if any(p.model == n for p in points)]
  benches = {}
  for name in names:
    weight_bytes = calibration_models.step_inputs(configs[name], dtype).N * np.dtype(dtype).itemsize
    benches[name] = step_sweeps.DecodeStepBench(
        configs[name], dtype, name=name, seed=seed,
        param_sets=2 if weight_bytes < ROTATE_WEIGHTS_BELOW else 1)
  always = [next(p for p in points if p.model == n) for n in names]
  records = step_sweeps.decode_step_sweep(benches, list(points), rounds=rounds, warmup=warmup,
                                          repeats=repeats, deadline=deadline, seed=seed,
                                          always=always, progress=say, after_round=after_round)
  del benches
  measurement.release_memory()
  return records


def load_summary(records: Sequence[measurement.Measurement]) -> dict[str, Any]:
  """The 1-minute load average over the timings (min, median, max, cores)."""
  loads = [
      x for r in records for x in (r.extra.get("load_avg_1m"), r.extra.get("load_avg_1m_max"))
      if x is not None
  ]
  return {
      "load_avg_1m_min": min(loads) if loads else None,
      "load_avg_1m_median": float(np.median(loads)) if loads else None,
      "load_avg_1m_max": max(loads) if loads else None, "cpu_count": os.cpu_count(),
      "what": "the 1-minute load average at each timing (this process "
              "included)"
  }


def minimum_operations(linear: Sequence[op_sweeps.OpPoint],
                       attention: Sequence[op_sweeps.OpPoint]) -> list[op_sweeps.OpPoint]:
  """What each operation fit cannot do without, however short the budget:
  the largest linear layer at its fewest, middle and most rows, and the
  smallest and largest attention (give the fit models' own layouts: a layout
  probe's points do not count towards the fit's two)."""
  largest = max({p.sizes[1:] for p in linear}, key=lambda s: s[0] * s[1])
  rows = sorted(p for p in linear if p.sizes[1:] == largest)
  by_tokens = sorted(attention, key=lambda p: p.sizes[0] * p.sizes[1])
  return [rows[0], rows[len(rows) // 2], rows[-1], by_tokens[0], by_tokens[-1]]


def single_row_operations(linear: Sequence[op_sweeps.OpPoint]) -> list[op_sweeps.OpPoint]:
  """The linear layers at M = 1: `eta_w` rests on them alone (`op_fit.fit_linear`),
  so the sweep opens every round with them (`op_sweep(every_round=...)`)."""
  return [p for p in linear if p.sizes[0] == 1]


def layout_probe(configs: Mapping[str, ToyConfig],
                 heldout: Mapping[str, ToyConfig]) -> list[op_sweeps.OpPoint]:
  """One layer's attention at `LAYOUT_PROBE_GRID` with a K/V layout of no model here.

  The first fit model's query heads over `LAYOUT_PROBE_KV_SCALE` times its K/V heads
  (fewer where that does not divide the heads); none when the fit models already have
  two or more layouts, or when every such layout is one that a fit or held-out model
  has (a probe must not time a held-out layout).
  """
  first = next(iter(configs.values()))
  if len({(c.num_heads, c.num_kv_heads) for c in configs.values()}) > 1:
    return []
  taken = {(c.num_heads, c.num_kv_heads) for c in (*configs.values(), *heldout.values())}
  for scale in range(LAYOUT_PROBE_KV_SCALE, 1, -1):
    kv_heads = first.num_kv_heads * scale
    if first.num_heads % kv_heads == 0 and (first.num_heads, kv_heads) not in taken:
      return [
          op_sweeps.OpPoint("decode_attention", (b, t, first.num_heads, kv_heads, first.head_dim))
          for b, t in LAYOUT_PROBE_GRID
      ]
  return []


def attention_kv_bytes(point: op_sweeps.OpPoint, dtype: Any) -> float:
  """One layer's K/V of a decode-attention point (batch, context, heads,
  kv_heads, head_dim), from the symbolic K/V formulas."""
  batch, context, _, kv_heads, head_dim = point.sizes
  per_position = formulas.kv_bytes_per_position(1, kv_heads, head_dim, np.dtype(dtype).itemsize)
  return float(formulas.retained_kv_bytes(batch, context, per_position))
