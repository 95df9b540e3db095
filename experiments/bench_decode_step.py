"""How close the toy's decode step comes to this device's read bandwidth.

Measures the read (and copy) bandwidth the way `jaxroof.measure.ceilings`
does, then the jit-compiled toy decode step (`step_sweeps.DecodeStepBench`: a
donated fixed-size cache, rotating weights and caches) over a batch x context
grid in rounds (`step_sweeps.decode_step_sweep`: random order per round, the
lower-quartile round kept), then the bandwidth again. Reports, against the
larger of the two read-bandwidth measurements:

* the weights streamed per second at batch 1 (target >= 70%);
* the extra K/V read per extra second from the shortest to the longest
  context at the largest batch (target >= 50%);
* whether the step is monotonic in context at every batch within the
  measured spread (of the rounds' medians; one round's p10/p90 beside it).

Weight and K/V bytes are the step model's (`formulas.weight_traffic`,
`formulas.retained_kv_bytes` of `calibration_models.step_inputs`). All times are
measurements on this device; the JSON records device, backend, dtype, the
timing method and the load average.

  python -m experiments.bench_decode_step --json_out=results/decode_step_cpu_after.json
"""

from __future__ import annotations

import dataclasses
import os
import time

from absl import flags
from absl import logging

from experiments import _cli
from jaxroof import errors
from jaxroof import files
from jaxroof.measure import calibration_models
from jaxroof.measure import ceilings
from jaxroof.measure import measurement
from jaxroof.measure import op_sweeps
from jaxroof.measure import step_limits
from jaxroof.measure import step_sweeps
from jaxroof.report import table
from jaxroof.toy import config as config_lib

MODELS = {"calibration": calibration_models.CALIBRATION, **config_lib.PRESETS}
TARGETS = {"weight_stream_fraction": 0.7, "kv_read_fraction": 0.5}

_MODEL = flags.DEFINE_enum("model", "calibration", list(MODELS),
                           "Toy model sizes: the calibration model or a toy preset.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", list(measurement.DTYPES), "Weights and K/V.")
_BATCHES = flags.DEFINE_list("batches", "1,8,16", "Batch sizes, >= 1.")
_CONTEXTS = flags.DEFINE_list("contexts", "128,512,1024,2048,4096",
                              "Contexts (filled positions), >= 1; at least two.")
_ROUNDS = flags.DEFINE_integer("rounds", 5, "Passes over the grid. In [1, 1,000].", lower_bound=1,
                               upper_bound=1_000)
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed steps per point and round. In [1, 10,000].",
                                lower_bound=1, upper_bound=10_000)
_BANDWIDTH_MB = flags.DEFINE_integer(
    "bandwidth_mb", 128,
    "Array size of the bandwidth measurement, MiB (>= 1; 128 MiB is 4x the development "
    "CPU's 32 MB last-level cache).", lower_bound=1, upper_bound=1024)
_JSON_OUT = flags.DEFINE_string("json_out", None, "Write the results as JSON here.")

_cli.require_positive_int_list(_BATCHES, "sequences")
_cli.require_positive_int_list(_CONTEXTS, "tokens")

HEADERS = ("batch", "context", "median ms", "p10-p90 ms", "weights MB", "K/V MB", "step GB/s")


def _bandwidth(nbytes: int) -> ceilings.Ceilings:
  return ceilings.measure_ceilings((), bandwidth_bytes=nbytes, rounds=3)


def main(argv: list[str]) -> None:
  del argv  # Unused.
  contexts = sorted(set(_cli.int_list(_CONTEXTS)))
  batches = sorted(set(_cli.int_list(_BATCHES)))
  if len(contexts) < 2:
    raise errors.InputError(f"--contexts={','.join(_CONTEXTS.value)} is not allowed: "
                            "give at least two different contexts.")
  dtype = measurement.require_dtype(_DTYPE.value)
  config = MODELS[_MODEL.value]
  inputs = calibration_models.step_inputs(config, dtype)
  largest = max(step_limits.kv_bytes(inputs, b, max(contexts)) for b in batches)
  op_sweeps.require_memory(3 * largest + 2 * step_limits.weight_bytes(inputs),
                           "the largest point's caches and two weight copies")
  allocator = measurement.keep_allocations()
  say = lambda line: logging.info("%s", line)  # noqa: E731
  load = {"start": os.getloadavg()[0]}
  nbytes = _BANDWIDTH_MB.value * 2**20
  before = _bandwidth(nbytes)
  say(f"read bandwidth {before.read_bandwidth_Bps / 1e9:.1f} GB/s")
  bench = step_sweeps.DecodeStepBench(config, dtype, name=_MODEL.value)
  points = [step_sweeps.StepPoint(_MODEL.value, b, c) for b in batches for c in contexts]
  start = time.monotonic()
  records = step_sweeps.decode_step_sweep({_MODEL.value: bench}, points, rounds=_ROUNDS.value,
                                          repeats=_REPEATS.value, progress=say)
  sweep_s = time.monotonic() - start
  del bench
  load["after_sweep"] = os.getloadavg()[0]
  after = _bandwidth(nbytes)
  load["end"] = os.getloadavg()[0]
  read_Bps = max(before.read_bandwidth_Bps, after.read_bandwidth_Bps)
  grid = step_limits.grid_of(records)
  summary = step_limits.summarize(grid, inputs, read_Bps, TARGETS)
  rows = step_limits.rows(grid, inputs)

  device = measurement.current_device()
  print(f"Toy decode step ({_MODEL.value}, {_DTYPE.value}) on {device.device_kind} "
        f"({device.platform}); read bandwidth {read_Bps / 1e9:.1f} GB/s (measured); "
        f"load {load['start']:.2f}-{load['end']:.2f}.")
  print(
      table.format_table(HEADERS, [[
          str(r["batch"]),
          str(r["context"]), f"{r['median_s'] * 1e3:.2f}",
          f"{r['p10_s'] * 1e3:.2f}-{r['p90_s'] * 1e3:.2f}", f"{r['weight_bytes'] / 1e6:.1f}",
          f"{r['kv_bytes'] / 1e6:.1f}", f"{r['step_traffic_Bps'] / 1e9:.1f}"
      ] for r in rows]))
  w, kv = summary["weight_stream_batch1"], summary["kv_read_large_batch"]
  best = summary["weight_stream_batch1_best_round"]
  print(f"weights at batch 1: {w['rate_Bps'] / 1e9:.1f} GB/s = "
        f"{w['fraction_of_read_bandwidth']:.0%} of read bandwidth (target >= 70%); "
        f"best round (the ceiling's statistic) {best['rate_Bps'] / 1e9:.1f} GB/s = "
        f"{best['fraction_of_read_bandwidth']:.0%}")
  print(f"K/V at batch {kv['points'][0][0]}: {kv['rate_Bps'] / 1e9:.1f} GB/s = "
        f"{kv['fraction_of_read_bandwidth']:.0%} of read bandwidth (target >= 50%)")
  print(f"monotonic in context at every batch (within the rounds' spread): "
        f"{summary['monotonic']['all_monotonic']}; within one round's p10-p90: "
        f"{summary['monotonic']['all_monotonic_within_round']}")
  if _JSON_OUT.value:
    files.write_json(
        _JSON_OUT.value, {
            "experiment": "bench_decode_step",
            "kind": "measurement",
            **device.to_json(),
            "backend": "xla",
            "dtype": _DTYPE.value,
            "cpu_count": os.cpu_count(),
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "host_allocator": allocator,
            "timing": (f"jaxroof.timing.time_call via step_sweeps.decode_step_sweep: "
                       f"{records[0].method}; {step_sweeps.STATISTIC} of {_ROUNDS.value} "
                       "rounds; donated cache, rotating weights and caches"),
            "load_average_1m": load,
            "inputs": {
                "model": _MODEL.value, "config": dataclasses.asdict(config), "batches": batches,
                "contexts": contexts, "rounds": _ROUNDS.value, "repeats": _REPEATS.value,
                "bandwidth_bytes": nbytes, "step_inputs": inputs.to_json()
            },
            "bandwidth": {
                "read_Bps": read_Bps, "read_Bps_before_after": [
                    before.read_bandwidth_Bps, after.read_bandwidth_Bps
                ], "copy_Bps_before_after": [before.copy_bandwidth_Bps, after.copy_bandwidth_Bps],
                "method": "jaxroof.measure.ceilings.measure_ceilings: best of 3 rounds"
            },
            "rows": rows,
            "summary": summary,
            "sweep_s": sweep_s,
            "units": {
                "*_s": "s", "*_bytes": "B", "*_Bps": "B/s", "fraction*": "1",
                "spread": "(p90 - p10) / median"
            },
        })


if __name__ == "__main__":
  _cli.run(main)
