"""GPU benchmark: ceilings, autotuned Pallas kernels against XLA, calibration.

  PYTHONPATH=. bash experiments/gpu_bench.sh OUT            # the GPU run
  PYTHONPATH=. bash experiments/gpu_bench.sh --dry_run OUT  # same, on a CPU
  python -m experiments.gpu_bench --out_dir=OUT             # this alone

Without --stage it drives the run: every stage (the ceilings, each kernel
case, the op sweeps with calibration and validation) runs as
`python -m experiments.gpu_bench --stage=...` in its own subprocess with its
own timeout, so a CUDA fault or Triton abort ends one stage only. Each stage
writes its JSON as it finishes, and OUT/summary.json is rewritten after each.
Needs a GPU unless --dry_run (interpreted kernels on tiny shapes; times mean
nothing). The logic lives in `jaxroof.calibrate.gpu_run` and
`jaxroof.measure.kernel_benchmark`; which flags run a stage is said here.
"""

from __future__ import annotations

import sys
import warnings

import jax
from absl import flags

from experiments._cli import run
from jaxroof import files
from jaxroof.errors import InputError
from jaxroof.calibrate import gpu_run

_OUT_DIR = flags.DEFINE_string("out_dir", None, "Folder for the JSON results (required; created).")
_STAGE = flags.DEFINE_enum(
    "stage",
    "all",
    ["all", *gpu_run.STAGE_KINDS],
    "all drives every stage in its own subprocess; the others run one.",
)
_CASE = flags.DEFINE_string("case", None, "With --stage=case: which case.")
_DRY_RUN = flags.DEFINE_bool(
    "dry_run",
    False,
    "Run the whole path on a CPU: interpreted kernels, "
    "tiny shapes and toy (plumbing only, times mean nothing).",
)
_QUICK = flags.DEFINE_bool("quick", False, "Small GPU shapes (a smoke run).")
_MAX_CANDIDATES = flags.DEFINE_integer("max_candidates", 12, "Configs tried per case at most.",
                                       lower_bound=1)
_REPEATS = flags.DEFINE_integer(
    "repeats",
    10,
    "Timed chains per measurement (median taken).",
    lower_bound=3,
)
_BUDGET_S = flags.DEFINE_float(
    "budget_s",
    420.0,
    "Seconds for the whole run; a stage starts only with "
    "a third of its timeout (at most 30 s) left after the time kept for the "
    "calibration.",
    lower_bound=1.0,
)
_CASE_TIMEOUT_S = flags.DEFINE_float(
    "case_timeout_s",
    75.0,
    "Seconds a case's subprocess may take.",
    lower_bound=1.0,
)
_TUNE_BUDGET_S = flags.DEFINE_float(
    "tune_budget_s",
    30.0,
    "Seconds of tuning per case; candidates left then "
    "are skipped.",
    lower_bound=0.0,
)
_CALIBRATE_BUDGET_S = flags.DEFINE_float(
    "calibrate_budget_s",
    150.0,
    "Seconds for op sweeps, calibration and "
    "validation of the toy; 0 skips them.",
    lower_bound=0.0,
)
_RESULTS_DIR = flags.DEFINE_string(
    "results_dir",
    "results",
    "Where the calibrated profile is written.",
)


def _say(line: str) -> None:
  print(line, flush=True)


def _stage_command(stage: gpu_run.Stage, budget_s: float | None) -> list[str]:
  """This experiment's command line for one stage, with the flags the driver's share."""
  names = ("out_dir", "dry_run", "quick", "max_candidates", "repeats", "tune_budget_s",
           "calibrate_budget_s", "results_dir")
  command = [
      sys.executable, "-m", "experiments.gpu_bench",
      *(flags.FLAGS[name].serialize() for name in names), f"--stage={stage.kind}"
  ]
  if stage.case:
    command.append(f"--case={stage.case}")
  if budget_s is not None:
    command.append(f"--calibrate_budget_s={budget_s:.0f}")
  return command


def main(argv: list[str]) -> int:
  del argv  # Unused.
  if not _OUT_DIR.value:
    raise InputError("--out_dir is required: the folder for the results.")
  warnings.filterwarnings("ignore", message="(?i).*triton.*", category=DeprecationWarning)
  dry_run = _DRY_RUN.value
  if not dry_run and jax.default_backend() != "gpu":
    print(
        f"gpu_bench: NO GPU: jax's default backend is "
        f"{jax.default_backend()!r} ({jax.devices()}); this benchmark only "
        "runs on a GPU (or with --dry_run). Nothing was measured.", file=sys.stderr)
    return 1
  with files.output_folder("--out_dir", _OUT_DIR.value) as out_dir:  # Removed if it fails.
    return _run(out_dir, dry_run)


def _run(out_dir: str, dry_run: bool) -> int:
  """Runs the chosen stage (or drives them all) into `out_dir`."""
  stage = _STAGE.value
  if stage == "ceilings":
    gpu_run.ceilings_stage(out_dir, dry_run=dry_run, say=_say)
  elif stage == "case":
    if not _CASE.value:
      raise InputError("--case is required with --stage=case.")
    gpu_run.case_stage(out_dir, _CASE.value, dry_run=dry_run, quick=_QUICK.value,
                       repeats=_REPEATS.value, max_candidates=_MAX_CANDIDATES.value,
                       tune_budget_s=_TUNE_BUDGET_S.value, say=_say)
  elif stage == "calibrate":
    gpu_run.calibration_stage(out_dir, _RESULTS_DIR.value, dry_run=dry_run,
                              budget_s=_CALIBRATE_BUDGET_S.value, say=_say)
  else:
    stages = gpu_run.plan(dry_run=dry_run, quick=_QUICK.value, case_timeout_s=_CASE_TIMEOUT_S.value,
                          calibrate_budget_s=_CALIBRATE_BUDGET_S.value)
    return gpu_run.drive(_stage_command, out_dir, stages, budget_s=_BUDGET_S.value, dry_run=dry_run,
                         say=_say)
  return 0


if __name__ == "__main__":
  run(main)
