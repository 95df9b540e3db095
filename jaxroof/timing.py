"""The one timing loop: warm-up, synchronise, median and spread of repeats.

Everything that reports a speed (autotuner, calibration sweeps, benchmarks)
times through `time_call`, so every figure is taken the same way: warm-up calls
are excluded, each call is synchronised with `jax.block_until_ready`, inputs can
rotate between several argument sets so caches do not flatter weight streaming,
and the result keeps the median and the spread of the timed repeats.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Clock = Callable[[], float]


@dataclasses.dataclass(frozen=True)
class Timing:
  """Wall-clock statistics of repeated, synchronised calls (seconds)."""

  median_s: float
  min_s: float
  max_s: float
  p10_s: float
  p90_s: float
  repeats: int
  warmup: int
  method: str = "wall-clock, block_until_ready, median of repeats"

  @property
  def spread(self) -> float:
    """(p90 - p10) / median: relative width of the middle 80%."""
    return (self.p90_s - self.p10_s) / self.median_s if self.median_s else 0.0

  def to_json(self) -> dict[str, Any]:
    return {**dataclasses.asdict(self), "spread": self.spread}


def host() -> dict[str, Any]:
  """The machine a timing is taken on, so two runs can be compared: platform, versions,
  cores and the load average (the CPU may be shared)."""
  return {
      "platform": platform.platform(), "machine": platform.machine(),
      "processor": platform.processor() or platform.machine(), "python": platform.python_version(),
      "jax": importlib.metadata.version("jax"), "numpy": np.__version__,
      "cpu_count": os.cpu_count(), "load_average_1_5_15": list(os.getloadavg())
  }


def _quantile(sorted_samples: Sequence[float], fraction: float) -> float:
  """Linear-interpolated quantile of already sorted samples."""
  position = fraction * (len(sorted_samples) - 1)
  low = int(position)
  high = min(low + 1, len(sorted_samples) - 1)
  weight = position - low
  return sorted_samples[low] * (1 - weight) + sorted_samples[high] * weight


def summarize(samples: Sequence[float], warmup: int) -> Timing:
  """Median and spread of timed samples (warm-up already excluded)."""
  if not samples:
    raise ValueError("summarize needs at least one timed sample")
  ordered = sorted(samples)
  return Timing(
      median_s=statistics.median(ordered),
      min_s=ordered[0],
      max_s=ordered[-1],
      p10_s=_quantile(ordered, 0.1),
      p90_s=_quantile(ordered, 0.9),
      repeats=len(ordered),
      warmup=warmup,
  )


def time_call(
    fn: Callable[..., Any],
    arg_sets: Sequence[Sequence[Any]],
    *,
    warmup: int = 2,
    repeats: int = 10,
    clock: Clock = time.perf_counter,
) -> Timing:
  """Times `fn(*args)` for args rotating through `arg_sets`.

  Args:
    fn: the (usually jit-compiled) function to time.
    arg_sets: one or more argument tuples; call i uses `arg_sets[i % n]`, so
      consecutive calls touch different buffers.
    warmup: untimed calls first (compilation, caches, allocator).
    repeats: timed calls; the median and spread are taken over these.
    clock: seconds clock; injectable so tests can use a fake one.

  Returns:
    A `Timing` over the `repeats` timed calls.
  """
  import jax  # pylint: disable=import-outside-toplevel  (an analytic run never times)
  if not arg_sets:
    raise ValueError("arg_sets must hold at least one argument tuple")
  if warmup < 0 or repeats < 1:
    raise ValueError(f"need warmup >= 0 and repeats >= 1, got {warmup=}, {repeats=}")
  for i in range(warmup):
    jax.block_until_ready(fn(*arg_sets[i % len(arg_sets)]))
  samples = []
  for i in range(repeats):
    args = arg_sets[(warmup + i) % len(arg_sets)]
    start = clock()
    jax.block_until_ready(fn(*args))
    samples.append(clock() - start)
  return summarize(samples, warmup)
