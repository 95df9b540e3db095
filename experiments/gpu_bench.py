"""GPU benchmark: measured ceilings, autotuned Pallas kernels against XLA.

  PYTHONPATH=. bash experiments/gpu_bench.sh OUT   # GPU tests, then this
  python -m experiments.gpu_bench --out_dir=OUT    # this alone

Needs a GPU: without one it says so and exits 1. It measures the device's
copy bandwidth and bf16 matmul rate, then for each case (decode attention,
paged decode attention, the linear layer at decode and prefill row counts)
autotunes the Pallas kernel, times it and XLA's own, and writes, as each case
finishes: OUT/ceilings.json, OUT/<case>.json (time, achieved bytes/s and
FLOP/s, fractions of the ceilings, XLA's times, the issue's targets),
OUT/summary.json and the tuning cache OUT/autotune_cache/. Cases run in
priority order; none starts after --budget_s. The logic lives in
`jaxroof.measure.kernel_benchmark`; this file is kept short on purpose.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
import traceback
import warnings

import jax
from absl import flags

from experiments._cli import run
from jaxroof.errors import InputError
from jaxroof.files import write_json
from kernels import _backend
from jaxroof.measure import kernel_benchmark as benchmark

_OUT_DIR = flags.DEFINE_string(
    "out_dir", None, "Folder for the JSON results (required; created)."
)
_MAX_CANDIDATES = flags.DEFINE_integer(
    "max_candidates", 12, "Configs tried per case at most.", lower_bound=1
)
_REPEATS = flags.DEFINE_integer(
    "repeats", 10, "Timed chains per measurement (median taken).",
    lower_bound=3,
)
_BUDGET_S = flags.DEFINE_float(
    "budget_s", 330.0, "Seconds after which no further case starts.",
    lower_bound=0.0,
)
_TUNE_BUDGET_S = flags.DEFINE_float(
    "tune_budget_s", 40.0, "Seconds of tuning per case; candidates left then "
    "are skipped.", lower_bound=0.0,
)
_QUICK = flags.DEFINE_bool(
    "quick", False, "Small shapes and ceilings (a smoke run, minutes less)."
)


def main(argv: list[str]) -> int:
  del argv  # Unused.
  if not _OUT_DIR.value:
    raise InputError("--out_dir is required: the folder for the results.")
  warnings.filterwarnings("ignore", message="(?i).*triton.*",
                          category=DeprecationWarning)
  start = time.perf_counter()
  if jax.default_backend() != "gpu":
    print(f"gpu_bench: NO GPU: jax's default backend is "
          f"{jax.default_backend()!r} ({jax.devices()}); this benchmark only "
          "runs on a GPU. Nothing was measured.", file=sys.stderr)
    return 1
  out_dir = _OUT_DIR.value
  header = {
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
      "device_kind": _backend.device_kind(),
      "device_count": jax.device_count(),
      "jax_version": jax.__version__,
      "timing": "kernels.device_timing.time_chained: chained dependent calls "
                "in one jit, wall-clock with block_until_ready, median of "
                f"{_REPEATS.value} chains, per call",
  }
  ceilings = benchmark.measure_ceilings(_REPEATS.value, _QUICK.value)
  write_json(os.path.join(out_dir, "ceilings.json"), {**header, **ceilings})
  print(f"ceilings on {header['device_kind']}: copy "
        f"{ceilings['copy']['bytes_per_s'] / 1e12:.2f} TB/s, bf16 matmul "
        f"{ceilings['matmul']['flop_per_s'] / 1e12:.1f} TFLOP/s", flush=True)
  summary = {**header, "ceilings": ceilings, "cases": {}, "skipped": [],
             "errors": {}}
  cases = benchmark.QUICK_CASES if _QUICK.value else benchmark.CASES
  for case in cases:
    if time.perf_counter() - start > _BUDGET_S.value:
      summary["skipped"].append(case.name)
      continue
    try:
      record = benchmark.run_case(
          case, ceilings, out_dir, _REPEATS.value, _MAX_CANDIDATES.value,
          _TUNE_BUDGET_S.value,
      )
    except Exception:  # noqa: BLE001 - one case must not stop the others.
      summary["errors"][case.name] = traceback.format_exc(limit=4)
      print(f"{case.name}: ERROR\n{summary['errors'][case.name]}",
            file=sys.stderr, flush=True)
    else:
      record = {**header, **record}
      write_json(os.path.join(out_dir, f"{case.name}.json"), record)
      summary["cases"][case.name] = {
          k: record[k] for k in ("config", "pallas", "xla_best_median_s",
                                 "pallas_over_xla_best", "targets")
      }
      print(benchmark.summary_line(record), flush=True)
    summary["elapsed_s"] = time.perf_counter() - start
    write_json(os.path.join(out_dir, "summary.json"), summary)
  if summary["skipped"]:
    print(f"skipped (time budget): {', '.join(summary['skipped'])}")
  return 3 if summary["errors"] else 0


if __name__ == "__main__":
  run(main)
