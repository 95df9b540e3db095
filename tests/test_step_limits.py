"""The decode-step checks against the read bandwidth, on made-up timings.

Byte counts come from the step model (`formulas`), independently of the
checks; timings are hand-made `Timing`s, so each check can be made to fail.
"""

from __future__ import annotations

import pytest

from jaxroof import timing
from jaxroof.measure import calibration_models
from jaxroof.measure import measurement
from jaxroof.measure import step_limits

INPUTS = calibration_models.StepInputs(N=1_000_000, N_act=1_000_000, q=4, k=1000, L=2,
                                       N_block=400_000)


def _record(batch: int, context: int, median: float, half_width: float = 0.0,
            rounds: tuple[float, ...] = ()) -> measurement.Measurement:
  samples = [median - half_width, median, median + half_width]
  return measurement.labelled(timing.summarize(samples, warmup=1), op="decode_step",
                              shapes={"batch": batch, "context": context}, dtype="float32",
                              extra={"round_medians_s": list(rounds or (median,))})


def test_weight_stream_is_weight_bytes_per_batch1_step():
  grid = step_limits.grid_of(
      [_record(1, 100, 2e-3), _record(1, 200, 2.1e-3),
       _record(4, 100, 3e-3)])
  figure = step_limits.weight_stream(grid, INPUTS, read_bandwidth_Bps=4e9)
  assert figure.points == ((1, 100),)
  assert figure.rate_Bps == pytest.approx(4e6 / 2e-3)  # N * q bytes per step.
  assert figure.fraction == pytest.approx(0.5)


def test_kv_stream_is_the_slope_in_context_at_the_largest_batch():
  # 8 sequences, 1000 more positions: 8 * 1000 * k = 8e6 more bytes in 4 ms.
  grid = step_limits.grid_of([
      _record(1, 100, 1e-3),
      _record(1, 1100, 1.5e-3),
      _record(8, 100, 2e-3),
      _record(8, 1100, 6e-3)
  ])
  figure = step_limits.kv_stream(grid, INPUTS, read_bandwidth_Bps=4e9)
  assert figure.points == ((8, 100), (8, 1100))
  assert figure.bytes == pytest.approx(8e6)
  assert figure.rate_Bps == pytest.approx(2e9)
  assert figure.fraction == pytest.approx(0.5)


def test_a_drop_within_the_spread_is_not_a_break_of_monotonicity():
  within = step_limits.grid_of([
      _record(1, 100, 10e-3, rounds=(10e-3, 11e-3)),
      _record(1, 200, 9.5e-3, rounds=(9.5e-3, 10.5e-3))
  ])
  beyond = step_limits.grid_of([
      _record(1, 100, 12e-3, rounds=(12e-3, 12.5e-3)),
      _record(1, 200, 10e-3, rounds=(10e-3, 11e-3))
  ])
  assert step_limits.monotonic_in_context(within)["all_monotonic"]
  report = step_limits.monotonic_in_context(beyond)
  assert not report["all_monotonic"]
  assert report["by_batch"]["1"]["drops"][0]["to_context"] == 200


def test_rounds_that_overlap_are_within_the_spread():
  # The kept rounds drop beyond their own p10/p90, but the other rounds of
  # the two points overlap: load moved whole rounds, not the step.
  grid = step_limits.grid_of([
      _record(1, 100, 12e-3, 0.5e-3, rounds=(12e-3, 9e-3, 14e-3)),
      _record(1, 200, 10e-3, 0.5e-3, rounds=(10e-3, 13e-3))
  ])
  report = step_limits.monotonic_in_context(grid)
  assert report["all_monotonic"] and not report["all_monotonic_within_round"]


def test_best_round_weight_stream_uses_the_fastest_round():
  grid = step_limits.grid_of(
      [_record(1, 100, 4e-3, rounds=(4e-3, 2e-3, 5e-3)),
       _record(1, 200, 5e-3)])
  figure = step_limits.weight_stream(grid, INPUTS, 4e9, best_round=True)
  assert figure.seconds == 2e-3 and figure.fraction == pytest.approx(0.5)


def test_summary_says_which_targets_are_met():
  grid = step_limits.grid_of([
      _record(1, 100, 2e-3),
      _record(1, 1100, 2.5e-3),
      _record(8, 100, 3e-3),
      _record(8, 1100, 5e-3)
  ])
  summary = step_limits.summarize(grid, INPUTS, 4e9,
                                  {"weight_stream_fraction": 0.4, "kv_read_fraction": 0.5})
  assert summary["meets"] == {
      "weight_stream": True, "weight_stream_best_round": True, "kv_read": True, "monotonic": True
  }
  rows = step_limits.rows(grid, INPUTS)
  assert [r["kv_bytes"] for r in rows] == [101_000, 1_101_000, 808_000, 8_808_000]


@pytest.mark.slow
def test_bench_decode_step_writes_the_three_checks(tmp_path):
  import json
  import subprocess
  import sys
  out = tmp_path / "d.json"
  proc = subprocess.run([
      sys.executable, "-m", "experiments.bench_decode_step", "--model=lesson", "--batches=1,2",
      "--contexts=8,16", "--rounds=1", "--repeats=2", "--bandwidth_mb=8", f"--json_out={out}"
  ], capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  data = json.loads(out.read_text())
  assert data["kind"] == "measurement" and len(data["rows"]) == 4
  meets = data["summary"]["meets"]
  assert {"weight_stream", "kv_read", "monotonic"} <= set(meets)
  assert all(isinstance(value, bool) for value in meets.values())
  assert data["bandwidth"]["read_Bps"] > 0 and "load_average_1m" in data
