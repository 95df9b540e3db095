"""The measurement harness, ceilings and sweeps (fake clocks; tiny shapes)."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxroof.measure import calibration_models
from jaxroof.measure import ceilings
from jaxroof.measure import measurement
from jaxroof.measure import op_sweeps
from jaxroof.measure import step_sweeps
from jaxroof import errors
from jaxroof import files
from jaxroof.symbolic import formulas
from jaxroof.timing import Timing

# Four blocks, grouped KV heads: small enough to compile in well under 1 s.
TINY = dataclasses.replace(calibration_models.CALIBRATION, vocab_size=64, num_blocks=2, num_heads=4,
                           num_kv_heads=2, head_dim=8, width=32, mlp_dim=64)


def test_record_excludes_warmup_takes_median_and_labels_everything(fake_clock):
  clock = fake_clock([50.0, 40.0, 3.0, 1.0, 2.0, 9.0, 4.0])
  record = measurement.measure(clock.fn, [("a",), ("b",), ("c",)], op="linear", shapes={"rows": 4},
                               dtype="float32", backend="xla", warmup=2, repeats=5, flops=6.0,
                               bytes=12.0, clock=clock)
  assert record.median_s == 3.0
  assert (record.timing.min_s, record.timing.max_s) == (1.0, 9.0)
  assert clock.calls[:4] == [("a",), ("b",), ("c",), ("a",)]  # Rotation.
  row = record.to_json()
  device = jax.devices()[0]
  assert row["device_kind"] == device.device_kind
  assert row["platform"] == jax.default_backend()
  assert row["jax_version"] == jax.__version__
  assert (row["op"], row["backend"], row["dtype"]) == ("linear", "xla", "float32")
  assert "median" in row["method"] and "block_until_ready" in row["method"]
  assert row["achieved_bytes_per_s"] == 4.0 and row["spread"] > 0
  assert measurement.Measurement.from_json(json.loads(json.dumps(row))) == record


def test_kept_allocations_are_recorded():
  how = measurement.keep_allocations()
  assert how == measurement.allocator() and how
  record = measurement.measure(lambda: jnp.zeros(()), [()], op="x", shapes={}, dtype="float32",
                               repeats=1)
  assert record.extra["host_allocator"] == how


def test_backend_and_dtype_are_checked():
  with pytest.raises(ValueError, match="backend"):
    measurement.measure(lambda: 0, [()], op="x", shapes={}, dtype="float32", backend="cuda")
  with pytest.raises(errors.InputError, match="Known: float32"):
    measurement.require_dtype("fp8")


def test_step_inputs_count_weights_read_and_kv_from_the_config():
  inputs = calibration_models.step_inputs(TINY, jnp.float32)
  c = TINY
  head = c.width * c.vocab_size + c.width  # Output head and final norm.
  assert inputs.N == inputs.L * inputs.N_block + head
  assert inputs.N == inputs.N_act and inputs.q == 4
  assert inputs.k == formulas.kv_bytes_per_position(c.num_blocks, c.num_kv_heads, c.head_dim, 4)


def test_decode_grid_caps_retained_tokens():
  grid = calibration_models.decode_grid([1, 64, 256], [128, 3900], max_tokens=250_000)
  assert (256, 3900) not in grid and (64, 3900) in grid and len(grid) == 5


def test_decode_step_bench_keeps_context_and_labels_the_point():
  bench = step_sweeps.DecodeStepBench(TINY, jnp.float32, name="tiny")
  record = bench.measure(3, 5, warmup=1, repeats=2)
  assert record.op == "decode_step" and record.dtype == "float32"
  assert record.shapes == {"batch": 3, "context": 5, "layers": 2}
  assert record.extra["retained_tokens"] == 6
  assert record.extra["donated_cache"] and record.extra["model"] == "tiny"
  flops, traffic = bench.analytic(3, 5)
  assert record.flops == flops == 2 * bench.inputs.N * 3
  assert traffic == bench.inputs.N * 4 + 3 * 6 * bench.inputs.k
  # The timed step writes slot `context` and leaves the length alone.
  [cache] = bench.caches(3, 5, 1)
  _, after = bench.compile(3, 5)(bench.params[0], cache, jnp.zeros((3,), jnp.int32))
  assert int(after.length) == 5


class FakeBench:
  """Returns the next scripted median of a batch size per `measure` call."""

  def __init__(self, medians):
    self.medians = {b: list(m) for b, m in medians.items()}

  def measure(self, batch, context, *, warmup, repeats):
    del warmup, repeats  # Unused.
    median = self.medians[batch].pop(0)
    timing = Timing(median_s=median, min_s=median, max_s=median, p10_s=median, p90_s=median,
                    repeats=3, warmup=1)
    return measurement.labelled(timing, op="decode_step",
                                shapes={"batch": batch, "context": context}, dtype="float32",
                                extra={"setup_s": 0.0, "model": "m"})


def test_sweep_keeps_each_points_lower_quartile_round():
  points = [step_sweeps.StepPoint("m", 1, 8), step_sweeps.StepPoint("m", 2, 8)]
  bench = FakeBench({1: [5.0, 4.0, 6.0, 1.0, 7.0], 2: [17.0, 19.0, 18.0, 20.0, 11.0]})
  records = step_sweeps.decode_step_sweep({"m": bench}, points, rounds=5, max_extra_rounds=0)
  assert [r.shapes["batch"] for r in records] == [1, 2]
  assert records[0].extra["round_medians_s"] == [5.0, 4.0, 6.0, 1.0, 7.0]
  # The second fastest of five: neither the lucky round nor a slow one.
  assert [r.median_s for r in records] == [4.0, 17.0]
  assert step_sweeps.lower_quartile(records[:1]) is records[0]


def test_sweep_measures_again_points_whose_fastest_rounds_disagree():
  points = [step_sweeps.StepPoint("m", 1, 8), step_sweeps.StepPoint("m", 2, 8)]
  # Batch 1 settles (its fastest rounds within 8%); batch 2's fastest rounds
  # are 2.0 and 3.0 apart until two more rounds come in at 2.05 and 2.1.
  bench = FakeBench({1: [1.0, 1.02, 1.05], 2: [2.0, 3.0, 3.1, 2.05, 2.1]})
  records = step_sweeps.decode_step_sweep({"m": bench}, points, rounds=3, spread_limit=0.08,
                                          max_extra_rounds=3)
  assert len(records[0].extra["round_medians_s"]) == 3
  assert records[1].extra["round_medians_s"] == [2.0, 3.0, 3.1, 2.05, 2.1]
  assert records[1].extra["round_spread"] == pytest.approx(0.05)
  assert bench.medians == {1: [], 2: []}


def test_a_point_timed_in_one_round_records_no_spread_and_writes_as_json(tmp_path):
  # A deadline on a busy machine can leave a point one round: it has no spread (null),
  # where the re-measuring rule still counts it unsettled (inf); the record writes.
  one = FakeBench({1: [1.0]})
  [record] = step_sweeps.decode_step_sweep({"m": one}, [step_sweeps.StepPoint("m", 1, 8)], rounds=1,
                                           max_extra_rounds=0)
  assert record.extra["round_spread"] is None
  assert step_sweeps.round_spread([1.0]) == float("inf")
  ops = op_sweeps.summarized([op_sweeps.OpPoint("linear", (1, 8, 4))],
                             {op_sweeps.OpPoint("linear", (1, 8, 4)): [record]})
  assert ops[0].extra["round_spread"] is None
  files.write_json(str(tmp_path / "r.json"), {"records": [record.to_json(), ops[0].to_json()]})


def test_sweep_skips_points_past_the_deadline():
  points = [step_sweeps.StepPoint("m", b, 8) for b in (1, 2, 3)]
  bench = FakeBench({b: [1.0] * 3 for b in (1, 2, 3)})
  records = step_sweeps.decode_step_sweep({"m": bench}, points, rounds=3, deadline=0.0)
  assert records == []


def test_ceilings_measure_and_round_trip():
  result = ceilings.measure_ceilings(("float32",), bandwidth_bytes=2**20, matmul_size=64, repeats=2,
                                     rounds=2)
  assert result.bandwidth_Bps == max(result.read_bandwidth_Bps, result.copy_bandwidth_Bps) > 0
  assert result.flop_rate("float32") > 0
  assert [r.op for r in result.records] == ["read", "copy", "matmul"]
  assert all(len(r.extra["round_medians_s"]) == 2 for r in result.records)
  again = ceilings.Ceilings.from_json(json.loads(json.dumps(result.to_json())))
  assert again.bandwidth_Bps == result.bandwidth_Bps
  with pytest.raises(errors.InputError, match="bfloat16"):
    result.flop_rate("bfloat16")


def test_op_sweeps_label_backend_and_refuse_interpreted_pallas():
  linear = op_sweeps.linear_sweep([1, 4], d_in=32, d_out=16, repeats=2)
  assert [r.shapes["rows"] for r in linear] == [1, 4]
  # Weights once, x read, output written (4 B each): (32*16 + 4*32 + 4*16) * 4.
  assert linear[1].flops == 2 * 32 * 16 * 4
  assert linear[1].bytes == (32 * 16 + 4 * 32 + 4 * 16) * 4
  attention = op_sweeps.attention_sweep([(2, 16)], heads=4, kv_heads=2, head_dim=8, repeats=2)
  assert attention[0].backend == "xla"
  assert attention[0].bytes == (2 * 16 * 2 * 2 * 8 + 2 * 2 * 4 * 8) * 4
  if jax.default_backend() == "cpu":
    with pytest.raises(errors.InputError, match="pallas"):
      op_sweeps.linear_sweep([1], d_in=8, d_out=8, backend="pallas")


def test_op_sweep_rounds_alternate_between_operations():
  points = ([op_sweeps.OpPoint("linear", (m, 8, 8)) for m in (1, 2, 4, 8)] +
            [op_sweeps.OpPoint("decode_attention", (1, 8, 2, 1, 4))])
  order = op_sweeps._interleaved(points, np.random.default_rng(0))
  assert sorted(order) == list(range(5))
  assert points[order[0]].op != points[order[1]].op


def test_op_sweep_opens_every_round_with_the_points_a_factor_rests_on(monkeypatch):
  points = [op_sweeps.OpPoint("linear", (m, 8, 8)) for m in (1, 2, 4)]
  single, largest = points[0], points[2]
  calls = []
  clock = [0.0]

  def fake_measure_op(point, *args, **kwargs):
    calls.append(point)
    clock[0] += 1.0
    timing = Timing(median_s=1e-3, min_s=1e-3, max_s=1e-3, p10_s=1e-3, p90_s=1e-3, repeats=3,
                    warmup=1)
    return dataclasses.replace(
        measurement.labelled(timing, op="linear", shapes={"rows": point.sizes[0]}, dtype="float32"),
        extra={"elapsed_s": 1.0})

  monkeypatch.setattr(op_sweeps, "measure_op", fake_measure_op)
  monkeypatch.setattr(op_sweeps.time, "monotonic", lambda: clock[0])
  # Time for four measurements: the first round (3), then the second round's opening.
  records = op_sweeps.op_sweep(points, rounds=3, deadline=4.5, always=[largest],
                               every_round=[single], max_extra_rounds=0)
  assert calls[:2] == [largest, single]
  assert calls[3:] == [single]
  assert [len(r.extra["round_medians_s"]) for r in records] == [2, 1, 1]


def test_step_sweep_calls_after_round_once_per_round_that_timed():
  points = [step_sweeps.StepPoint("m", 1, 8), step_sweeps.StepPoint("m", 2, 8)]
  bench = FakeBench({1: [1.0] * 3, 2: [2.0] * 3})
  calls = []
  step_sweeps.decode_step_sweep(
      {"m": bench}, points, rounds=3, max_extra_rounds=0,
      after_round=lambda: calls.append(sum(map(len, bench.medians.values()))))
  # After each round: 2, 1 then 0 medians left per point.
  assert calls == [4, 2, 0]


def test_a_later_op_sweep_adds_rounds_to_the_same_points(monkeypatch):
  points = [op_sweeps.OpPoint("linear", (m, 8, 8)) for m in (1, 2)]
  times = iter([4.0, 2.0, 1.0, 3.0, 9.0])

  def fake_measure_op(point, *args, **kwargs):
    t = next(times)
    timing = Timing(median_s=t, min_s=t, max_s=t, p10_s=t, p90_s=t, repeats=3, warmup=1)
    return dataclasses.replace(
        measurement.labelled(timing, op="linear", shapes={"rows": point.sizes[0]}, dtype="float32"),
        extra={"elapsed_s": 0.0})

  monkeypatch.setattr(op_sweeps, "measure_op", fake_measure_op)
  timed = {}
  op_sweeps.op_sweep(points, rounds=1, max_extra_rounds=0, every_round=points[:1], timed=timed)
  for _ in range(3):
    op_sweeps.op_sweep(points[:1], rounds=1, max_extra_rounds=0, timed=timed)
  records = op_sweeps.summarized(points, timed)
  assert records[0].extra["round_medians_s"] == [4.0, 1.0, 3.0, 9.0]
  assert records[0].median_s == 3.0  # The lower quartile of four rounds: the second fastest.
  assert records[1].extra["round_medians_s"] == [2.0]
