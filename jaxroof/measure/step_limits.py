"""How close the toy decode step comes to this device's memory bandwidth.

Three checks of `step_sweeps.DecodeStepBench` measurements against the read
bandwidth `ceilings` measures (a sum over arrays far beyond the caches):

* weight streaming: at batch 1 and the shortest context, the weights the step
  model says a step reads (`formulas.weight_traffic` of `calibration_models.step_inputs`)
  per median step time;
* K/V reading: at the largest batch, the extra K/V bytes of the longest
  context over the shortest (`formulas.retained_kv_bytes`) per extra second,
  i.e. the slope of step time in context, which leaves weights and fixed
  costs out;
* monotonicity: at every batch, a longer context is never faster beyond the
  measured spread of the rounds (`monotonic_in_context`).

Every figure here is a measurement on this device; the byte counts are the
step model's (analytic).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from jaxroof.measure import measurement
from jaxroof.symbolic import formulas

Grid = Mapping[tuple[int, int], measurement.Measurement]


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
    return {
        "bytes": self.bytes, "seconds": self.seconds, "rate_Bps": self.rate_Bps,
        "fraction_of_read_bandwidth": self.fraction, "read_bandwidth_Bps": self.read_bandwidth_Bps,
        "points": [list(p) for p in self.points]
    }


def weight_bytes(inputs: Any) -> float:
  """Weights read per step (`calibration_models.StepInputs`): N * q."""
  return float(formulas.weight_traffic(inputs.N, inputs.q))


def kv_bytes(inputs: Any, batch: int, context: int) -> float:
  """K/V read by a step at `context` filled positions plus the written slot."""
  return float(formulas.retained_kv_bytes(batch, context + 1, inputs.k))


def weight_stream(grid: Grid, inputs: Any, read_bandwidth_Bps: float, *,
                  best_round: bool = False) -> StreamFigure:
  """Weights per step at batch 1 (or the smallest batch), shortest context.

  The step time is the record's median (the sweep's statistic), or with
  `best_round` its fastest round's median: the statistic of the bandwidth
  ceiling it is compared with (`ceilings`: best round's median).
  """
  batch = min(b for b, _ in grid)
  context = min(c for b, c in grid if b == batch)
  record = grid[batch, context]
  seconds = _round_range(record)[0] if best_round else record.median_s
  return StreamFigure(bytes=weight_bytes(inputs), seconds=seconds,
                      read_bandwidth_Bps=read_bandwidth_Bps, points=((batch, context),))


def kv_stream(grid: Grid, inputs: Any, read_bandwidth_Bps: float) -> StreamFigure:
  """Extra K/V bytes per extra second, longest against shortest context, at
  the largest batch measured at two contexts or more."""
  batch = max(b for b, _ in grid if sum(1 for bb, _ in grid if bb == b) > 1)
  contexts = sorted(c for b, c in grid if b == batch)
  short, long_ = contexts[0], contexts[-1]
  return StreamFigure(bytes=kv_bytes(inputs, batch, long_) - kv_bytes(inputs, batch, short),
                      seconds=grid[batch, long_].median_s - grid[batch, short].median_s,
                      read_bandwidth_Bps=read_bandwidth_Bps,
                      points=((batch, short), (batch, long_)))


def _round_range(record: measurement.Measurement) -> tuple[float, float]:
  """Fastest and slowest round medians of a point (its own median if one round)."""
  medians = record.extra.get("round_medians_s") or [record.median_s]
  return min(medians), max(medians)


def monotonic_in_context(grid: Grid) -> dict[str, Any]:
  """Per batch: does a longer context never run faster beyond the spread?

  The measured spread is that of the rounds: a drop counts only when the
  longer context's slowest round median is below the shorter one's fastest
  (load from other processes moves whole rounds, and each point's rounds
  ran at different moments). The stricter within-round test (the longer
  context's p90 below the shorter one's p10, of the kept round) is reported
  beside it.
  """
  by_batch: dict[int, Any] = {}
  for batch in sorted({b for b, _ in grid}):
    contexts = sorted(c for b, c in grid if b == batch)
    drops, strict_drops = [], []
    for short, long_ in zip(contexts, contexts[1:]):
      a, b = grid[batch, short], grid[batch, long_]
      row = {
          "from_context": short, "to_context": long_, "from_median_s": a.median_s,
          "to_median_s": b.median_s
      }
      if _round_range(b)[1] < _round_range(a)[0]:
        drops.append(row)
      if b.timing.p90_s < a.timing.p10_s:
        strict_drops.append(row)
    by_batch[batch] = {
        "contexts": contexts, "monotonic": not drops, "drops": drops,
        "monotonic_within_round": not strict_drops, "drops_within_round": strict_drops
    }
  return {
      "all_monotonic": all(v["monotonic"] for v in by_batch.values()),
      "all_monotonic_within_round": all(v["monotonic_within_round"] for v in by_batch.values()),
      "rule": "a longer context's slowest round median is not below the shorter "
              "one's fastest round median",
      "rule_within_round": "a longer context's p90 is not below the shorter one's "
                           "p10 (the kept round's timed calls)",
      "by_batch": {str(b): v for b, v in by_batch.items()}
  }


def rows(grid: Grid, inputs: Any) -> list[dict[str, Any]]:
  """One row per point: median, spread, analytic bytes, achieved traffic."""
  out = []
  for (batch, context), record in sorted(grid.items()):
    w, kv = weight_bytes(inputs), kv_bytes(inputs, batch, context)
    t = record.timing
    out.append({
        "batch": batch, "context": context, "median_s": t.median_s, "p10_s": t.p10_s,
        "p90_s": t.p90_s, "min_s": t.min_s, "max_s": t.max_s, "spread": t.spread,
        "repeats": t.repeats, "weight_bytes": w, "kv_bytes": kv, "step_traffic_Bps":
            (w + kv) / t.median_s, "load_avg_1m": record.extra.get("load_avg_1m"),
        "round_medians_s": record.extra.get("round_medians_s")
    })
  return out


def summarize(grid: Grid, inputs: Any, read_bandwidth_Bps: float,
              targets: Mapping[str, float]) -> dict[str, Any]:
  """The three checks and whether each meets its target."""
  weights = weight_stream(grid, inputs, read_bandwidth_Bps)
  weights_best = weight_stream(grid, inputs, read_bandwidth_Bps, best_round=True)
  kv = kv_stream(grid, inputs, read_bandwidth_Bps)
  mono = monotonic_in_context(grid)
  return {
      "weight_stream_batch1": weights.to_json(),
      "weight_stream_batch1_best_round": weights_best.to_json(),
      "kv_read_large_batch": kv.to_json(),
      "monotonic": mono,
      "targets": dict(targets),
      "meets": {
          "weight_stream": weights.fraction >= targets["weight_stream_fraction"],
          "weight_stream_best_round": (weights_best.fraction >= targets["weight_stream_fraction"]),
          "kv_read": kv.fraction >= targets["kv_read_fraction"], "monotonic": mono["all_monotonic"]
      },
  }


def grid_of(
    records: Sequence[measurement.Measurement]) -> dict[tuple[int, int], measurement.Measurement]:
  """Decode-step records keyed by (batch, context)."""
  return {(r.shapes["batch"], r.shapes["context"]): r for r in records}
