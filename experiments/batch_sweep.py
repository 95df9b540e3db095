"""Decode batch sweep: step time and both token rates against batch size.

Analytic bounds from the symbolic step model (jaxroof.formulas):

  traffic = weights + B * KV per sequence;  step = max(traffic/BW, 2*N*B/F)
  aggregate rate = B / step;  per-sequence rate = 1 / step

Defaults are the lesson's example (16 GB of BF16 weights, 0.25 GB of K/V per
sequence, 2 TB/s):

  python -m experiments.batch_sweep --batch_sizes=1,8,32,64 \
      --json_out=/tmp/sweep.json --plot_out=/tmp/sweep.png
"""

from __future__ import annotations

from absl import flags
from absl import logging

from experiments import _cli
from jaxroof import io
from jaxroof import plots
from jaxroof import table
from jaxroof.sweep import decode_sweep

# Weights.
_WEIGHTS_GB = flags.DEFINE_float(
    "weights_gb", 16.0, "Weight bytes read per step, in GB (1e9 B). > 0.")
_BYTES_PER_WEIGHT = flags.DEFINE_float(
    "bytes_per_weight", 2.0, "Bytes per weight (2 = BF16); sets N = bytes / this. > 0.")
# K/V per sequence: either directly, or per token times the context.
_KV_GB_PER_SEQ = flags.DEFINE_float(
    "kv_gb_per_seq", None,
    "K/V bytes each sequence reads per step, in GB. > 0. Default 0.25 unless "
    "--kv_bytes_per_token and --context are given.")
_KV_BYTES_PER_TOKEN = flags.DEFINE_float(
    "kv_bytes_per_token", None, "K/V bytes per retained token (all layers). > 0.")
_CONTEXT = flags.DEFINE_integer(
    "context", None, "Retained tokens per sequence (with --kv_bytes_per_token). >= 1.")
# Device.
_BANDWIDTH_TBPS = flags.DEFINE_float(
    "bandwidth_tbps", 2.0, "Sustained memory bandwidth, TB/s (1e12 B/s). > 0.")
_TFLOPS = flags.DEFINE_float(
    "tflops", None, "Sustained FLOP rate, TFLOP/s (1e12). > 0. Omit for memory only.")
# Sweep and output.
_BATCH_SIZES = flags.DEFINE_list(
    "batch_sizes", "1,2,4,8,16,32,64,128,256,512,1024",
    "Comma-separated batch sizes (sequences), each a whole number >= 1.")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Write the sweep as JSON here.")
_PLOT_OUT = flags.DEFINE_string("plot_out", None, "Write a PNG of both rates here.")

for _holder, _unit in ((_WEIGHTS_GB, "GB"), (_BYTES_PER_WEIGHT, "bytes/weight"),
                       (_KV_GB_PER_SEQ, "GB per sequence"),
                       (_KV_BYTES_PER_TOKEN, "bytes/token"), (_CONTEXT, "tokens"),
                       (_BANDWIDTH_TBPS, "TB/s"), (_TFLOPS, "TFLOP/s")):
  _cli.require_positive(_holder, _unit)
_cli.require_positive_int_list(_BATCH_SIZES, "sequences")


@flags.multi_flags_validator(
    (_KV_GB_PER_SEQ.name, _KV_BYTES_PER_TOKEN.name, _CONTEXT.name),
    message="give either --kv_gb_per_seq, or both --kv_bytes_per_token and --context",
)
def _kv_flags_consistent(values: dict) -> bool:
  per_token = values[_KV_BYTES_PER_TOKEN.name] is not None
  context = values[_CONTEXT.name] is not None
  if per_token != context:
    return False
  return not (per_token and values[_KV_GB_PER_SEQ.name] is not None)


def raw_inputs() -> dict:
  """The sweep's inputs in SI units, from the raw-number flags."""
  if _KV_BYTES_PER_TOKEN.value is not None:
    T, k = float(_CONTEXT.value), _KV_BYTES_PER_TOKEN.value
  else:
    # Only the product T*k matters here: fold the context into k.
    T, k = 1.0, (0.25 if _KV_GB_PER_SEQ.value is None else _KV_GB_PER_SEQ.value) * 1e9
  weight_bytes = _WEIGHTS_GB.value * 1e9
  return {
      "N": weight_bytes / _BYTES_PER_WEIGHT.value,
      "q": _BYTES_PER_WEIGHT.value,
      "T": T,
      "k": k,
      "BW": _BANDWIDTH_TBPS.value * 1e12,
      "F": None if _TFLOPS.value is None else _TFLOPS.value * 1e12,
  }


def summary_lines(summary: dict) -> list[str]:
  """Human-readable summary of a sweep's solved quantities."""
  lines = [
      f"weight/KV crossover: B = {summary['weight_kv_crossover_batch']:,.1f} sequences",
      f"memory-limited rate (B -> oo): {summary['memory_limit_tokens_per_s']:,.1f} tokens/s",
  ]
  if summary["compute_crossover_batch"] is not None:
    lines.append(f"compute crossover: B = {summary['compute_crossover_batch']:,.1f} sequences")
  lines += [f"note: {n}" for n in summary["notes"]]
  return lines


def main(argv: list[str]) -> None:
  del argv  # Unused.
  inputs = raw_inputs()
  batch_sizes = _cli.int_list(_BATCH_SIZES)
  sweep = decode_sweep(batch_sizes, **inputs)
  sweep["inputs"] = {"flags": {h.name: h.value for h in (
      _WEIGHTS_GB, _BYTES_PER_WEIGHT, _KV_GB_PER_SEQ, _KV_BYTES_PER_TOKEN, _CONTEXT,
      _BANDWIDTH_TBPS, _TFLOPS)}, "si": inputs, "batch_sizes": batch_sizes}
  print("Decode batch sweep (analytic bound; GB = 1e9 B)")
  print(table.format_table(table.SWEEP_HEADERS, table.sweep_rows(sweep["rows"])))
  print("\n".join(summary_lines(sweep["summary"])))
  if _JSON_OUT.value:
    io.write_json(_JSON_OUT.value, sweep)
    logging.info("wrote %s", _JSON_OUT.value)
  if _PLOT_OUT.value:
    plots.plot_sweep(sweep, _PLOT_OUT.value, "Decode batch sweep")
    logging.info("wrote %s", _PLOT_OUT.value)


if __name__ == "__main__":
  _cli.run(main)
