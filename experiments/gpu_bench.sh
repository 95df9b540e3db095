#!/usr/bin/env bash
# The GPU run of jaxroof, in one command that cannot lose its results:
#
#   PYTHONPATH=. bash experiments/gpu_bench.sh OUT_DIR            # on a GPU
#   PYTHONPATH=. bash experiments/gpu_bench.sh --dry_run OUT_DIR  # on a CPU
#
# Needs jax; no network, no pip. First the benchmark (experiments.gpu_bench:
# the device's ceilings, each kernel case autotuned and timed against XLA in
# its own subprocess, then op sweeps, a calibration of a GPU-sized bf16 toy
# and its validation, profile written to results/), then the GPU test file
# alone, capped at about 60 s. Everything lands in OUT_DIR: devices.txt,
# gpu_bench.log, ceilings.json, one JSON per case, op_sweeps.json,
# calibration.json, validation.json, summary.json (rewritten after every
# stage), autotune_cache/, pytest_gpu.log. Exits 1 without a GPU (unless
# --dry_run), 3 if a stage failed or was skipped. Within 8 minutes on an H200.
#
# --dry_run takes the same path on a CPU: interpreted kernels, tiny shapes,
# a tiny toy, its profile under OUT_DIR/results; under 90 s. The test suite
# runs it (tests/test_gpu_bench_dry_run.py) so the script cannot rot unseen.
# A stage fails when it cannot measure, fit or write; the calibration's
# held-out error and status are recorded in summary.json ("calibration"),
# not a gate (a dry run's CPU timings are noise; on a GPU, read them first).
set -uo pipefail

DRY=0
if [[ "${1:-}" == "--dry_run" ]]; then
  DRY=1
  shift
fi
if [[ $# -ne 1 ]]; then
  echo "usage: PYTHONPATH=. bash experiments/gpu_bench.sh [--dry_run] OUT_DIR" >&2
  exit 2
fi
mkdir -p "$1" || exit 2
OUT="$(cd "$1" && pwd)"
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
export PYTHONPATH="${PYTHONPATH:-.}"
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if command -v python >/dev/null 2>&1; then PY=python; else PY=python3; fi
fi
START=$SECONDS

# The jax probes get a timeout: a wedged driver must not eat the lease.
BACKEND="$(timeout 60 "$PY" -c 'import jax; print(jax.default_backend())' 2>/dev/null | tail -1)"
if [[ $DRY -eq 0 && "$BACKEND" != "gpu" ]]; then
  echo "gpu_bench: NO GPU. jax sees: $(timeout 60 "$PY" -c 'import jax; print(jax.devices())' 2>&1 | tail -1)" >&2
  echo "gpu_bench: refusing to run; nothing was measured." >&2
  exit 1
fi
timeout 60 "$PY" -c 'import jax; print("gpu_bench:", jax.__version__, jax.devices())' \
  > "$OUT/devices.txt" 2>&1
cat "$OUT/devices.txt"

if [[ $DRY -eq 1 ]]; then
  # 89 s; a test on a loaded shared machine may allow more.
  LIMIT_S="${GPU_BENCH_DRY_RUN_LIMIT_S:-89}"
  FLAGS=(--dry_run "--budget_s=$((LIMIT_S - 3))" --case_timeout_s=25
         --calibrate_budget_s=45
         --repeats=3 --max_candidates=2 "--results_dir=$OUT/results")
else
  LIMIT_S=400  # The benchmark's share of the 8 minutes; the tests follow.
  FLAGS=(--budget_s=380 --case_timeout_s=75 --calibrate_budget_s=150
         --results_dir=results)
fi
export PYTHONUNBUFFERED=1
timeout "$LIMIT_S" "$PY" -u -m experiments.gpu_bench --out_dir="$OUT" "${FLAGS[@]}" \
  2>&1 | tee "$OUT/gpu_bench.log"
BENCH=${PIPESTATUS[0]}

TESTS=0
if [[ $DRY -eq 0 ]]; then
  timeout 60 "$PY" -m pytest -q -p no:cacheprovider tests/test_kernels_gpu.py \
    2>&1 | tee "$OUT/pytest_gpu.log"
  TESTS=${PIPESTATUS[0]}
fi

echo "gpu_bench: benchmark exit $BENCH, GPU tests exit $TESTS, $((SECONDS - START)) s; results in $OUT"
if [[ $BENCH -ne 0 || $TESTS -ne 0 ]]; then
  exit 1
fi
