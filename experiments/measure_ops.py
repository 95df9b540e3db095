"""Times the linear layer and decode attention; XLA's traffic against ours.

Per op, on this device (measurements: device, backend, dtype and timing
method are in the JSON):

* the linear layer x (rows, d_in) @ w (d_in, d_out) at decode row counts
  (one row per sequence) and prefill row counts (prompt tokens);
* one layer's decode attention over (batch, context) points with the toy
  calibration model's heads (batch x context <= --max_tokens).

The XLA backend (jit of each kernel module's jnp reference) runs everywhere;
`--backend=pallas` times the Pallas kernels on a GPU or TPU. Then XLA's
compiled cost analysis of the same computations (and of the toy decode step)
is set beside the step model's counts: the lesson's "actual kernel traffic".

  python -m experiments.measure_ops --json_out=results/measure_ops_cpu.json
"""

from __future__ import annotations

from absl import flags
from absl import logging

from experiments import _cli
from jaxroof.measure import calibration_models
from jaxroof.measure import cost_analysis
from jaxroof.measure import measurement
from jaxroof.measure import op_sweeps
from jaxroof.measure import step_sweeps
from jaxroof import files
from jaxroof.errors import InputError
from jaxroof.report import table

_CAL = calibration_models.CALIBRATION

_BACKEND = flags.DEFINE_enum("backend", "xla", ["xla", "pallas"],
                             "xla (every device) or pallas (GPU/TPU only).")
_DTYPE = flags.DEFINE_enum("dtype", "float32", list(measurement.DTYPES), "Operands.")
# Linear layer.
_D_IN = flags.DEFINE_integer("d_in", 4096, "Linear layer input features (>= 1).", lower_bound=1)
_D_OUT = flags.DEFINE_integer("d_out", 4096, "Linear layer output features (>= 1).", lower_bound=1)
_DECODE_ROWS = flags.DEFINE_list("decode_rows", "1,4,16,64,256",
                                 "Decode row counts (sequences), >= 1.")
_PREFILL_ROWS = flags.DEFINE_list("prefill_rows", "512,2048",
                                  "Prefill row counts (prompt tokens), >= 1.")
# Decode attention.
_BATCH_SIZES = flags.DEFINE_list("batch_sizes", "1,4,16,64,256", "Attention batch sizes, >= 1.")
_CONTEXTS = flags.DEFINE_list("contexts", "128,512,2048,4096", "Attention contexts (tokens), >= 1.")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", calibration_models.MAX_RETAINED_TOKENS,
                                   "Largest batch x context timed (>= 1).", lower_bound=1)
_HEADS = flags.DEFINE_integer("heads", _CAL.num_heads, "Query heads (>= 1).", lower_bound=1)
_KV_HEADS = flags.DEFINE_integer("kv_heads", _CAL.num_kv_heads,
                                 "K/V heads, dividing --heads (>= 1).", lower_bound=1)
_HEAD_DIM = flags.DEFINE_integer("head_dim", _CAL.head_dim, "Coordinates per head (>= 1).",
                                 lower_bound=1)
# Timing and output.
_REPEATS = flags.DEFINE_integer("repeats", 10, "Timed calls per point (>= 1).", lower_bound=1)
_JSON_OUT = flags.DEFINE_string("json_out", None,
                                "Write the measurements and cost table as JSON here.")

for _holder, _unit in ((_DECODE_ROWS, "rows"), (_PREFILL_ROWS, "rows"), (_BATCH_SIZES, "sequences"),
                       (_CONTEXTS, "tokens")):
  _cli.require_positive_int_list(_holder, _unit)


@flags.multi_flags_validator((_HEADS.name, _KV_HEADS.name),
                             message="--kv_heads must divide --heads")
def _heads_divide(values: dict) -> bool:
  return values[_HEADS.name] % values[_KV_HEADS.name] == 0


MEASURE_HEADERS = ("op", "shapes", "median ms", "spread", "GB/s (analytic)", "GFLOP/s")


def _measure_rows(records: list[measurement.Measurement]) -> list[list[str]]:
  out = []
  for r in records:
    out.append([
        r.op if r.op != "linear" else f"linear ({r.extra['phase']})",
        " ".join(f"{k}={v}" for k, v in r.shapes.items()), f"{r.median_s * 1e3:,.3f}",
        f"{r.spread:.2f}", f"{r.rate(r.bytes) / 1e9:,.1f}", f"{r.rate(r.flops) / 1e9:,.1f}"
    ])
  return out


def main(argv: list[str]) -> None:
  del argv  # Unused.
  dtype = measurement.require_dtype(_DTYPE.value)
  backend = _BACKEND.value
  measurement.keep_allocations()
  say = lambda line: logging.info("%s", line)  # noqa: E731
  heads = dict(heads=_HEADS.value, kv_heads=_KV_HEADS.value, head_dim=_HEAD_DIM.value)
  dims = dict(d_in=_D_IN.value, d_out=_D_OUT.value)
  points = calibration_models.decode_grid(_cli.int_list(_BATCH_SIZES), _cli.int_list(_CONTEXTS),
                                          _MAX_TOKENS.value)
  if not points:  # Checked before any timing.
    smallest = min(_cli.int_list(_BATCH_SIZES)) * min(_cli.int_list(_CONTEXTS))
    raise InputError(f"--max_tokens={_MAX_TOKENS.value:,} leaves no attention point: the smallest "
                     f"--batch_sizes x --contexts is {smallest:,} tokens; raise --max_tokens to at "
                     "least that, or give smaller sizes.")
  records = op_sweeps.linear_sweep(_cli.int_list(_DECODE_ROWS), **dims, dtype=dtype,
                                   backend=backend, phase="decode", repeats=_REPEATS.value,
                                   progress=say)
  records += op_sweeps.linear_sweep(_cli.int_list(_PREFILL_ROWS), **dims, dtype=dtype,
                                    backend=backend, phase="prefill", repeats=_REPEATS.value,
                                    progress=say)
  records += op_sweeps.attention_sweep(points, **heads, dtype=dtype, backend=backend,
                                       repeats=_REPEATS.value, progress=say)

  costs = [
      cost_analysis.linear_cost(m, **dims, dtype=dtype)
      for m in (_cli.int_list(_DECODE_ROWS)[:1] + _cli.int_list(_DECODE_ROWS)[-1:] +
                _cli.int_list(_PREFILL_ROWS)[-1:])
  ]
  costs += [
      cost_analysis.attention_cost(b, c, **heads, dtype=dtype) for b, c in (points[0], points[-1])
  ]
  bench = step_sweeps.DecodeStepBench(calibration_models.CALIBRATION, dtype, param_sets=1)
  costs += [cost_analysis.decode_step_cost(bench, b, c) for b, c in ((1, 128), (64, 1024))]

  device = measurement.current_device()
  print(f"Per-op measurements on {device.device_kind} ({device.platform}), "
        f"backend {backend}, {_DTYPE.value}; "
        f"{records[0].method}. GB/s and GFLOP/s use the analytic counts.")
  print(table.format_table(MEASURE_HEADERS, _measure_rows(records)))
  print("\nActual traffic: XLA compiled cost analysis vs the step model "
        "(MB = 1e6 B).")
  print(table.format_table(cost_analysis.HEADERS, cost_analysis.table_rows(costs)))
  for note in dict.fromkeys(f"{r.op}: {r.counts}" for r in costs):
    print(f"counted: {note}")
  if _JSON_OUT.value:
    files.write_json(
        _JSON_OUT.value, {
            "kind": "measurement",
            "what": "per-op timings and XLA cost analysis vs analytic counts",
            **device.to_json(),
            "backend": backend,
            "inputs": {
                "d_in": _D_IN.value, "d_out": _D_OUT.value, "decode_rows":
                    _cli.int_list(_DECODE_ROWS), "prefill_rows": _cli.int_list(_PREFILL_ROWS),
                "attention_points": points, **heads, "repeats": _REPEATS.value
            },
            "rows": [r.to_json() for r in records],
            "cost_analysis": [c.to_json() for c in costs],
            "units": {
                "median_s": "s", "flops": "FLOP", "bytes": "B", "achieved_flops_per_s": "FLOP/s",
                "achieved_bytes_per_s": "B/s"
            },
        })


if __name__ == "__main__":
  _cli.run(main)
