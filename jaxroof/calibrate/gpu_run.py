"""The one GPU run, in stages that cannot take each other down.

A device is lent rarely and briefly, so `drive` runs every stage of
`experiments/gpu_bench` in its own subprocess with its own timeout (the
experiment says which command line runs a stage): a CUDA
fault, a Triton abort or a hang ends one stage, never the run. Stages, in
order: the device's ceilings (a failure leaves the cases without fractions),
one stage per kernel case (`jaxroof.measure.kernel_benchmark`), then the
operation sweeps and a calibration of the toy decode step at a GPU-sized
configuration, validated at fresh points (`jaxroof.measure.op_sweeps`,
`jaxroof.calibrate.toy_job`). Every stage writes its own JSON as soon
as it finishes and `summary.json` is rewritten after each, so whatever was
measured survives. A time budget decides which stages still start.

The dry run (`dry_run=True`) takes the same path on a CPU: interpreted
kernels on tiny shapes, tiny ceilings, a tiny toy calibration. Its times
mean nothing; it exists so the script cannot rot unseen.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax

from jaxroof import files
from jaxroof.calibrate import toy_job
from jaxroof.measure import calibration_models
from jaxroof.measure import ceilings as ceilings_lib
from jaxroof.measure import kernel_benchmark as benchmark
from jaxroof.measure import op_sweeps
from jaxroof.measure import profiles
from jaxroof.measure.step_sweeps import StepPoint
from jaxroof.toy.config import ToyConfig

Say = Callable[[str], None]
# Seconds a stage's own budget leaves before its subprocess is cut: jax's
# start-up and the writing of results.
_STAGE_MARGIN_S = 10.0

# The GPU-sized toy (bf16, width 4096, Llama-3-8B's block shapes, 4 blocks:
# about 1.1 B weights, 2.3 GB per step at batch 1) and its two variants, as
# `calibration_models.MODELS` varies the CPU calibration model.
GPU_CALIBRATION = ToyConfig(vocab_size=32_768, num_blocks=4, num_heads=32, num_kv_heads=8,
                            head_dim=128, width=4096, mlp_dim=14_336)
GPU_MODELS = {
    "calibration": GPU_CALIBRATION,
    "shallow": dataclasses.replace(GPU_CALIBRATION, num_blocks=2),
    "wide_vocab": dataclasses.replace(GPU_CALIBRATION, vocab_size=131_072),
}
# The dry run's toy: the same three roles at a size a CPU steps in ms.
DRY_CALIBRATION = ToyConfig(vocab_size=256, num_blocks=2, num_heads=4, num_kv_heads=2, head_dim=16,
                            width=64, mlp_dim=128)
DRY_MODELS = {
    "calibration": DRY_CALIBRATION,
    "shallow": dataclasses.replace(DRY_CALIBRATION, num_blocks=1),
    "wide_vocab": dataclasses.replace(DRY_CALIBRATION, vocab_size=2048),
}
DRY_POINTS = tuple([StepPoint("calibration", b, c) for b in (1, 4, 16) for c in (32, 128)] +
                   [StepPoint(m, b, 32) for m in ("shallow", "wide_vocab") for b in (1, 8)])
# Fresh (batch, context) points to validate the profile at: off the grid.
VALIDATION_POINTS = ((3, 384), (24, 1536), (96, 768))
DRY_VALIDATION_POINTS = ((2, 64),)
# The dry run's calibration on its smallest grids (each step point compiles
# a step: seconds on a loaded CPU): the fit's and the held-out models' steps,
# the linear layer's rows and attention's points.
DRY_FIT_POINTS = tuple(StepPoint(m, 1, 32) for m in DRY_MODELS)
DRY_HELDOUT_POINTS = tuple(
    StepPoint(f"heldout_{kind}", b, 32) for kind in ("narrow", "wide") for b in (1, 8))
DRY_OPERATIONS = {"linear_rows": (1, 16, 256), "attention_grid": ((1, 32), (8, 128))}


def header(dry_run: bool) -> dict[str, Any]:
  """What every JSON of the run starts with: when, where, with what."""
  device = jax.devices()[0]
  return {
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
      "device_kind": device.device_kind,
      "device_count": jax.device_count(),
      "platform": jax.default_backend(),
      "jax_version": jax.__version__,
      "dry_run": dry_run,
      "timing": "kernels.device_timing.time_chained: chained dependent calls "
                "in one jit, wall-clock with block_until_ready, median of "
                "chains, per call" + (" (interpreted on a CPU: meaningless)" if dry_run else ""),
  }


def ceilings_stage(out_dir: str, *, dry_run: bool, say: Say = print) -> None:
  """Measures the ceilings (or records why not) into ceilings.json."""
  ceilings = benchmark.measure_device_ceilings(quick=dry_run)
  files.write_json(os.path.join(out_dir, "ceilings.json"), {**header(dry_run), **ceilings})
  if "error" in ceilings:
    say(f"ceilings: FAILED ({ceilings['error']}); cases get no fractions")
  else:
    say(f"ceilings: copy {ceilings['copy']['bytes_per_s'] / 1e12:.3f} TB/s, "
        f"bf16 matmul {ceilings['matmul']['flop_per_s'] / 1e12:.2f} TFLOP/s")


def read_ceilings(out_dir: str) -> dict[str, Any] | None:
  """The ceilings stage's result, or None if it failed or never wrote."""
  path = os.path.join(out_dir, "ceilings.json")
  if not os.path.exists(path):
    return None
  data = _read(path)
  return None if "error" in data else data


def _read(path: str) -> dict[str, Any]:
  return files.read_json("result", path)


def case_stage(out_dir: str, name: str, *, dry_run: bool, quick: bool, repeats: int,
               max_candidates: int, tune_budget_s: float, say: Say = print) -> None:
  """Tunes and times one case into `<case>.json`, printing every trial."""
  case = benchmark.cases_by_name(dry_run, quick)[name]

  def on_trial(trial) -> None:
    median = (f"{trial.timing.median_s * 1e6:.1f} us" if trial.timing else trial.reason)
    say(f"  {name} trial {trial.status}: {trial.config} {median}")

  record = benchmark.run_case(case, read_ceilings(out_dir), out_dir, repeats, max_candidates,
                              tune_budget_s, max_inner=2 if dry_run else 1000, on_trial=on_trial)
  files.write_json(os.path.join(out_dir, f"{name}.json"), {**header(dry_run), **record})
  say(benchmark.summary_line(record))


def calibration_stage(out_dir: str, results_dir: str, *, dry_run: bool, budget_s: float,
                      say: Say = print) -> None:
  """Op sweeps, a toy calibration and its validation, within `budget_s`.

  Writes OUT/op_sweeps.json, OUT/calibration.json and the profile to
  `results_dir` (the GPU run's results folder), each as soon as it exists.
  """
  start = time.monotonic()
  models = DRY_MODELS if dry_run else GPU_MODELS
  dtype = "float32" if dry_run else "bfloat16"
  main = models["calibration"]
  rows = (1, 16) if dry_run else (1, 16, 64, 256, 1024, 2048)
  points = ((4, 128),) if dry_run else ((1, 1024), (16, 1024), (64, 2048), (32, 8192))
  backend = "xla" if dry_run else "pallas"
  sweeps = {"backend": backend, "dtype": dtype, "linear": [], "attention": []}
  sweeps["linear"] = [
      r.to_json()
      for r in op_sweeps.linear_sweep(rows, d_in=main.width, d_out=main.mlp_dim, dtype=dtype,
                                      backend=backend, repeats=3 if dry_run else 5, progress=say)
  ]
  files.write_json(os.path.join(out_dir, "op_sweeps.json"), {**header(dry_run), **sweeps})
  sweeps["attention"] = [
      r.to_json() for r in op_sweeps.attention_sweep(
          points, heads=main.num_heads, kv_heads=main.num_kv_heads, head_dim=main.head_dim,
          dtype=dtype, backend=backend, repeats=3 if dry_run else 5, progress=say)
  ]
  files.write_json(os.path.join(out_dir, "op_sweeps.json"), {**header(dry_run), **sweeps})
  left = budget_s - (time.monotonic() - start)
  say(f"calibration: {left:.0f} s left of {budget_s:.0f} s")
  measured = read_ceilings(out_dir)
  ceilings = (ceilings_lib.Ceilings.from_json(measured["measured"]) if measured else None)
  validation_s = 0.15 * left
  job = toy_job.run(max(left - validation_s, 1.0), dtype=dtype, models=models,
                    points=list(DRY_FIT_POINTS) if dry_run else None,
                    heldout=list(DRY_HELDOUT_POINTS) if dry_run else None,
                    **(DRY_OPERATIONS if dry_run else {}), ceilings=ceilings,
                    rounds=2 if dry_run else 5, progress=say)
  slug = "".join(ch if ch.isalnum() else "_" for ch in job.profile.device_kind.lower())
  profile_path = os.path.join(results_dir, f"profile_gpu_{slug}.json")
  files.write_json(os.path.join(out_dir, "calibration.json"), job.to_json())
  profiles.save_profile(job.profile, profile_path)
  say(f"profile written to {profile_path}")
  rows_out = toy_job.validate(job.profile, DRY_VALIDATION_POINTS if dry_run else VALIDATION_POINTS,
                              rounds=2 if dry_run else 3, progress=say)
  files.write_json(
      os.path.join(out_dir, "validation.json"), {
          **header(dry_run), "profile": profile_path, "what":
              "the toy decode step timed afresh at points off the "
              "calibration grid (measured) against the profile (calibrated)", "validation": rows_out
      })
  for row in rows_out:
    say(f"validate batch={row['batch']} context={row['context']}: predicted "
        f"{row['predicted_s'] * 1e3:.3f} ms, measured "
        f"{row['measured_s'] * 1e3:.3f} ms")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Stage:
  """One subprocess of the run: what it does, and its time limit."""

  name: str
  kind: str  # One of STAGE_KINDS.
  timeout_s: float
  case: str | None = None  # The kernel case of a "case" stage.
  # Whether the stage gets the seconds left to the run (less a margin), capped at
  # its planned value, so it plans its work to end before it is cut.
  budgeted: bool = False
  # Whether earlier stages must leave this stage its whole timeout.
  reserved: bool = False


STAGE_KINDS = ("ceilings", "case", "calibrate")
# The command line of a stage, given the budget it may plan for (None: no budget).
CommandOf = Callable[[Stage, float | None], Sequence[str]]


def plan(*, dry_run: bool, quick: bool, case_timeout_s: float,
         calibrate_budget_s: float) -> list[Stage]:
  """The stages of a run, in order."""
  stages = [Stage(name="ceilings", kind="ceilings", timeout_s=60 if dry_run else 120)]
  stages += [
      Stage(name=name, kind="case", case=name, timeout_s=case_timeout_s)
      for name in benchmark.cases_by_name(dry_run, quick)
  ]
  if calibrate_budget_s > 0:
    stages.append(
        Stage(name="calibrate", kind="calibrate", timeout_s=calibrate_budget_s + _STAGE_MARGIN_S,
              budgeted=True, reserved=True))
  return stages


def drive(command_of: CommandOf, out_dir: str, stages: Sequence[Stage], *, budget_s: float,
          dry_run: bool, say: Say = print) -> int:
  """Runs each stage as `command_of(stage, budget)` in its own subprocess.

  A stage that could not get a third of its timeout (at most 30 s) of
  `budget_s` (counted from now), less the time reserved for later stages
  marked `reserved`, is skipped; one that fails or times out is recorded and the
  next one starts. Output streams through as it comes.

  Returns:
    0 if every stage that ran succeeded and none was skipped, else 3.
  """
  start = time.monotonic()
  summary = {
      **header(dry_run), "stages": {}, "skipped": [], "errors": {}, "ceilings": {}, "cases": {}
  }
  summary_path = os.path.join(out_dir, "summary.json")
  for index, stage in enumerate(stages):
    elapsed = time.monotonic() - start
    reserved = sum(s.timeout_s for s in stages[index + 1:] if s.reserved)
    available = budget_s - elapsed - reserved
    if min(stage.timeout_s / 3, 30) > available:
      summary["skipped"].append(stage.name)
      say(f"{stage.name}: skipped ({elapsed:.0f} s of {budget_s:.0f} s spent, "
          f"{reserved:.0f} s kept for later stages)")
      continue
    limit = min(stage.timeout_s, available)
    stage_budget = None
    if stage.budgeted:
      planned = stage.timeout_s - _STAGE_MARGIN_S
      stage_budget = float(round(max(1.0, min(planned, limit - _STAGE_MARGIN_S))))
    began = time.monotonic()
    try:
      proc = subprocess.run(list(command_of(stage, stage_budget)), timeout=limit, stdout=sys.stdout,
                            stderr=sys.stderr)
      code = proc.returncode
    except subprocess.TimeoutExpired:
      code = "timeout"
    took = time.monotonic() - began
    summary["stages"][stage.name] = {"exit": code, "seconds": took}
    if code != 0:
      summary["errors"][stage.name] = (f"timed out after {limit:.0f} s"
                                       if code == "timeout" else f"exit {code}")
      say(f"{stage.name}: FAILED ({summary['errors'][stage.name]})")
    _collect(out_dir, stage.name, summary)
    summary["elapsed_s"] = time.monotonic() - start
    files.write_json(summary_path, summary)
    sys.stdout.flush()
  return 3 if summary["errors"] or summary["skipped"] else 0


def _collect(out_dir: str, name: str, summary: dict[str, Any]) -> None:
  """Adds a finished stage's JSON (ceilings or a case) to the summary."""
  if name == "calibrate":
    summary["calibration"] = calibration_accuracy(out_dir)
    return
  path = os.path.join(out_dir, "ceilings.json" if name == "ceilings" else f"{name}.json")
  if not os.path.exists(path):
    return
  data = _read(path)
  if name == "ceilings":
    summary["ceilings"] = {k: data[k] for k in ("copy", "matmul", "error") if k in data}
  else:
    summary["cases"][name] = {
        k: data[k]
        for k in ("config", "pallas", "xla_best_median_s", "pallas_over_xla_best", "targets")
    }


def calibration_accuracy(out_dir: str) -> dict[str, Any] | None:
  """The calibration's held-out error and status, as recorded (None if it wrote none).

  Recorded, not a gate: the stage fails (and the run with it) only when it cannot
  measure, fit or write; whether the fit met its targets is its `status`. On a dry run
  the timings are a CPU's interpreted noise, so an "inaccurate" status there says
  nothing of the GPU path; on a GPU it is the figure to read first.
  """
  path = os.path.join(out_dir, "calibration.json")
  if not os.path.exists(path):
    return None
  data = _read(path)
  keys = ("status", "heldout_median_rel_error", "heldout_max_rel_error", "targets", "warnings")
  return {**{k: data.get(k) for k in keys}, "gated": False}
