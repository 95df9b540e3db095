"""How close the toy decode step comes to this device's memory bandwidth.

Three checks of `op_sweeps.DecodeStepBench` measurements against the read
bandwidth `ceilings` measures (a sum over arrays far beyond the caches):

* weight streaming: at batch 1 and the shortest context, the weights the step
  model says a step reads (`formulas.weight_traffic` of `op_sweeps.step_inputs`)
  per median step time;
* K/V reading: at the largest batch, the extra K/V bytes of the longest
  context over the shortest (`formulas.retained_kv_bytes`) per extra second,
  i.e. the slope of step time in context, which leaves weights and fixed
  costs out;
* monotonicity: at every batch, a longer context is never faster beyond the
  measured spread (its p90 is at least the shorter context's p10).

Every figure here is a measurement on this device; the byte counts are the
step model's (analytic).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from jaxroof.measure import records as measure
from jaxroof.symbolic import formulas

Grid = Mapping[tuple[int, int], measure.Measurement]


@dataclasses.dataclass(frozen=True)
class StreamFigure:
  """Bytes moved per second by part of a step, against the read ceiling."""

  bytes: float  # Analytic (step model).
  seconds: float  # Measured (median, or a difference of medians).
  read_bandwidth_Bps: float  # Measured ceiling.
  points: tuple[tuple[int, int], ...]  # The (batch, context) points used.

  @property
  def rate_Bps(self) -> float:
    return self.bytes / self.seconds if self.seconds > 0 else 0.0

  @property
  def fraction(self) -> float:
    """Of the measured read bandwidth."""
    return self.rate_Bps / self.read_bandwidth_Bps

  def to_json(self) -> dict[str, Any]:
    return {"bytes": self.bytes, "seconds": self.seconds,
            "rate_Bps": self.rate_Bps, "fraction_of_read_bandwidth": self.fraction,
            "read_bandwidth_Bps": self.read_bandwidth_Bps,
            "points": [list(p) for p in self.points]}


def weight_bytes(inputs: Any) -> float:
  """Weights read per step (`op_sweeps.StepInputs`): N * q."""
  return float(formulas.weight_traffic(inputs.N, inputs.q))


def kv_bytes(inputs: Any, batch: int, context: int) -> float:
  """K/V read by a step at `context` filled positions plus the written slot."""
  return float(formulas.retained_kv_bytes(batch, context + 1, inputs.k))


def weight_stream(grid: Grid, inputs: Any, read_bandwidth_Bps: float
                  ) -> StreamFigure:
  """Weights per median step at batch 1 (or the smallest batch), shortest context."""
  batch = min(b for b, _ in grid)
  context = min(c for b, c in grid if b == batch)
  return StreamFigure(bytes=weight_bytes(inputs),
                      seconds=grid[batch, context].median_s,
                      read_bandwidth_Bps=read_bandwidth_Bps,
                      points=((batch, context),))


def kv_stream(grid: Grid, inputs: Any, read_bandwidth_Bps: float
              ) -> StreamFigure:
  """Extra K/V bytes per extra second, longest against shortest context, at
  the largest batch measured at two contexts or more."""
  batch = max(b for b, _ in grid if sum(1 for bb, _ in grid if bb == b) > 1)
  contexts = sorted(c for b, c in grid if b == batch)
  short, long_ = contexts[0], contexts[-1]
  return StreamFigure(
      bytes=kv_bytes(inputs, batch, long_) - kv_bytes(inputs, batch, short),
      seconds=grid[batch, long_].median_s - grid[batch, short].median_s,
      read_bandwidth_Bps=read_bandwidth_Bps,
      points=((batch, short), (batch, long_)))


def monotonic_in_context(grid: Grid) -> dict[str, Any]:
  """Per batch: does a longer context never run faster beyond the spread?

  A drop counts only when the longer context's p90 is below the shorter
  one's p10 (their middle 80% do not overlap).
  """
  by_batch: dict[int, Any] = {}
  for batch in sorted({b for b, _ in grid}):
    contexts = sorted(c for b, c in grid if b == batch)
    drops = []
    for short, long_ in zip(contexts, contexts[1:]):
      a, b = grid[batch, short].timing, grid[batch, long_].timing
      if b.p90_s < a.p10_s:
        drops.append({"from_context": short, "to_context": long_,
                      "from_median_s": a.median_s, "to_median_s": b.median_s})
    by_batch[batch] = {"contexts": contexts, "monotonic": not drops, "drops": drops}
  return {"all_monotonic": all(v["monotonic"] for v in by_batch.values()),
          "rule": "a longer context's p90 is not below the shorter one's p10",
          "by_batch": {str(b): v for b, v in by_batch.items()}}


def rows(grid: Grid, inputs: Any) -> list[dict[str, Any]]:
  """One row per point: median, spread, analytic bytes, achieved traffic."""
  out = []
  for (batch, context), record in sorted(grid.items()):
    w, kv = weight_bytes(inputs), kv_bytes(inputs, batch, context)
    t = record.timing
    out.append({
        "batch": batch, "context": context, "median_s": t.median_s,
        "p10_s": t.p10_s, "p90_s": t.p90_s, "min_s": t.min_s, "max_s": t.max_s,
        "spread": t.spread, "repeats": t.repeats,
        "weight_bytes": w, "kv_bytes": kv,
        "step_traffic_Bps": (w + kv) / t.median_s,
        "load_avg_1m": record.extra.get("load_avg_1m"),
        "round_medians_s": record.extra.get("round_medians_s")})
  return out


def summarize(grid: Grid, inputs: Any, read_bandwidth_Bps: float,
              targets: Mapping[str, float]) -> dict[str, Any]:
  """The three checks and whether each meets its target."""
  weights = weight_stream(grid, inputs, read_bandwidth_Bps)
  kv = kv_stream(grid, inputs, read_bandwidth_Bps)
  mono = monotonic_in_context(grid)
  return {
      "weight_stream_batch1": weights.to_json(),
      "kv_read_large_batch": kv.to_json(),
      "monotonic": mono,
      "targets": dict(targets),
      "meets": {
          "weight_stream": weights.fraction >= targets["weight_stream_fraction"],
          "kv_read": kv.fraction >= targets["kv_read_fraction"],
          "monotonic": mono["all_monotonic"]},
  }


def grid_of(records: Sequence[measure.Measurement]) -> dict[tuple[int, int], measure.Measurement]:
  """Decode-step records keyed by (batch, context)."""
  return {(r.shapes["batch"], r.shapes["context"]): r for r in records}
