"""The main report: every section of Markdown, and the document they make.

Each section is a function `(Context) -> Markdown` that renders results
computed before the report (`ctx.results`, from
`jaxroof.serving.report_results.compute`), may write PNGs into `ctx.out_dir`
and reads earlier measurements from `ctx.results_dir` (never a path relative
to the working directory). `build` runs them in order and writes
`<out_dir>/README.md` atomically. Every number is labelled: analytic bound,
calibrated prediction or measurement.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
from absl import logging

from jaxroof import files
from jaxroof.calibrate import toy_fit
from jaxroof.report import kernels as kernels_report
from jaxroof.report import calibration as calibration_report
from jaxroof.report import chips_section
from jaxroof.report import paths
from jaxroof.report import plots
from jaxroof.report import real_engine as real_engine_report
from jaxroof.report import simulation as simulation_report
from jaxroof.report import summary_section
from jaxroof.report import serving_section
from jaxroof.report import specs_section
from jaxroof.report import table
from jaxroof.report import toy_section
from jaxroof.report import user_calibration as user_calibration_report
from jaxroof.symbolic import catalogue
from jaxroof.symbolic.sweep import decode_sweep

REPOSITORY = paths.REPOSITORY
BENCH_DECODE = "bench_decode_cpu.json"  # The cache benchmark on file, under results_dir.
in_repository = paths.in_repository


@dataclasses.dataclass(frozen=True)
class Commands:
  """Command lines that tell a reader how to repeat or extend a run.

  Command lines belong to the experiments: the one that renders the report builds
  these and the sections show what they are given. A section given None (or, for
  `measure_real_engine`, nothing) describes the step in words instead.
  """

  serving: str | None = None  # One accelerator of the summary in full (SLUG for it).
  plan: str | None = None  # The layout search for the summary's subject.
  worked_plan: str | None = None  # The multi-chip section's worked plan, searched again.
  compare_accelerators: str | None = None  # Any model on the accelerators.
  kv_sizing: str | None = None  # Any model's K/V sizing.
  longer_calibration: str | None = None  # The calibration with a longer budget.
  user_calibration: str | None = None  # A fit to a CSV of measured step times.
  bench_decode: str | None = None  # The cache benchmark, rewriting its file.
  measure_real_engine: tuple[str, ...] = ()  # vLLM set up, measured, then fitted.


@dataclasses.dataclass(frozen=True)
class Context:
  """What every section may use: the results to render, where to write, where earlier
  measurements are.

  `results` holds `report_results.compute`'s keys: summary (its `subject` is the
  report's), serving, chips, simulation, toy.
  """

  out_dir: str
  results: Mapping[str, Any]
  results_dir: str  # Where earlier measurements are (the experiment names it).
  calibration_budget_s: float = 60.0
  calibration: toy_fit.CalibrationRun | None = None  # The short calibration, if it fitted.
  calibration_failure: str | None = None  # Why it did not (a busy machine measures too few).
  commands: Commands = Commands()

  @property
  def subject(self) -> Mapping[str, Any]:
    return self.results["summary"]["subject"]


def lesson_section(ctx: Context) -> str:
  """Every worked number and quiz answer of the lesson, recomputed."""
  claims = ctx.results["lesson"]
  rows = [[
      c.section, c.claim,
      table.fmt(c.expected),
      table.fmt(c.computed), c.unit, "yes" if c.agrees else "**NO**"
  ] for c in claims]
  agree = sum(c.agrees for c in claims)
  return "\n".join([
      "## The lesson, recomputed (analytic bounds)",
      "",
      f"{agree} of {len(claims)} claims of the weight-reuse lesson (its worked numbers and "
      "quiz answers, recorded in `jaxroof/serving/lesson_claims.py`) agree with the symbolic model "
      "(`python -m experiments.lesson`).",
      "",
      table.markdown_table(("section", "claim", "lesson", "ours", "unit", "agrees"), rows),
  ])


def crossovers_section(ctx: Context) -> str:
  """Closed forms of the derived quantities, with the lesson's numbers."""
  del ctx  # Unused.
  values = dict(N=8e9, q=2, T=1, k=2.5e8, BW=2e12, F=6e14, R=300, B=32, P=1000, t_gap=0.012,
                t_window=0.01, t_queue=0.02)
  rows = []
  for item in catalogue.evaluate(values):
    if item["derived_by"] == "formula" and item["name"] not in ("step_floor", "ridge_point",
                                                                "prefill_time",
                                                                "time_to_first_token"):
      continue
    value = item["note"] or table.fmt(item["value"])
    rows.append([item["name"], f"${item['latex']}$", item["derived_by"], value, item["unit"]])
  return "\n".join([
      "## Derived quantities (closed forms)",
      "",
      "At the lesson's example: N = 8e9 weights, q = 2 B, T·k = 0.25 GB per sequence, "
      "BW = 2 TB/s, F = 600 TFLOP/s (a 300 FLOP/B ridge), B = 32 for the step floor, "
      "a 12 ms token-gap target, a 1,000-token prompt, 10 ms batching window and "
      "20 ms queueing wait.",
      "",
      table.markdown_table(("quantity", "closed form", "derived by", "value", "unit"), rows),
  ])


def sweep_section(ctx: Context) -> str:
  """The lesson's batch sweep on a 300 FLOP/B device, with its plot."""
  sweep = decode_sweep([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096], N=8e9, q=2, T=1,
                       k=2.5e8, BW=2e12, F=6e14)
  plots.plot_sweep(sweep, os.path.join(ctx.out_dir, "batch_sweep.png"),
                   "8B BF16, 0.25 GB K/V per sequence, 2 TB/s, 600 TFLOP/s")
  s = sweep["summary"]
  linear_from = table.linear_compute_from(sweep)
  return "\n".join([
      "## Batch sweep (analytic bound)",
      "",
      "Aggregate throughput rises towards the memory-only limit of "
      f"{s['memory_limit_tokens_per_s']:,.0f} tokens/s while each user's rate falls; "
      f"K/V traffic passes the weights at B = {s['weight_kv_crossover_batch']:,.0f}. " +
      binds_words(sweep["rows"], linear_from),
      "",
      table.markdown_table(table.SWEEP_HEADERS, table.sweep_rows(sweep["rows"], linear_from)),
      "",
      "![batch sweep](batch_sweep.png)",
  ])


def binds_words(rows: Sequence[Mapping[str, Any]], linear_from: float | None) -> str:
  """What binds the sweep, in the words its table's binds column uses: each operation is
  its own roofline under the per-operation bound, so the linear layers may be
  compute-bound while memory time stays the larger part of the step."""
  compute = [r["batch"] for r in rows if r["bound"] == "compute"]
  if compute:
    whole = f"Compute binds the whole step from B = {compute[0]:,}."
  elif linear_from is None:
    whole = "Memory binds at every batch: the plateau is not a compute limit."
  else:
    whole = ("Memory time stays the larger part of every step; past that batch the linear "
             "layers' FLOPs grow with the batch as the K/V does and hold the plateau below "
             "the memory-only limit.")
  if linear_from is None:
    return whole
  return (f"Each operation is its own roofline (the per-operation bound): the linear layers "
          f"are compute-bound from B = {linear_from:,.0f}, where their FLOPs per weight byte "
          "pass the ridge, while attention's K/V reads stay memory-bound. " + whole)


def toy_check_section(ctx: Context) -> str:
  """The float64 decode check on the lesson's toy, and the cache benchmark on file."""
  parts = [toy_section.decode_equivalence_section(ctx.results["toy"])]
  bench = os.path.join(ctx.results_dir, BENCH_DECODE)
  if os.path.exists(bench):
    parts.append(toy_section.bench_decode_section(files.read_json("results", bench)))
    rerun = ctx.commands.bench_decode
    parts.append(f"(From `{in_repository(bench)}`, measured earlier" +
                 (f"; rerun with `{rerun}`.)" if rerun else ".)"))
  return "\n".join(parts)


def calibration_section(ctx: Context) -> str:
  """A short calibration on this device (measurements and calibrated factors)."""
  budget = ctx.calibration_budget_s
  if budget == 0:
    return ("## Calibration on this device\n\nSkipped (a calibration budget of 0 s); "
            "`python -m experiments.calibrate` measures and fits a profile.")
  return calibration_report.report_section(ctx.out_dir, ctx.calibration, budget_s=budget,
                                           failure=ctx.calibration_failure,
                                           longer_command=ctx.commands.longer_calibration)


def summary(ctx: Context) -> str:
  return summary_section.report_section(ctx.results["summary"], ctx.out_dir,
                                        serving_command=ctx.commands.serving,
                                        plan_command=ctx.commands.plan)


def _accelerators_section(ctx: Context) -> str:
  s = ctx.subject
  return specs_section.accelerator_section(ctx.out_dir, model_name=s["model"], context=s["context"],
                                           accelerators=tuple(s["accelerators"]),
                                           weight_dtype=s["weight_dtype"], kv_dtype=s["kv_dtype"],
                                           any_model_command=ctx.commands.compare_accelerators)


def _kv_sizing_section(ctx: Context) -> str:
  return specs_section.kv_sizing_section(ctx.out_dir, subject_model=ctx.subject["model"],
                                         context=ctx.subject["context"],
                                         any_model_command=ctx.commands.kv_sizing)


def _serving_section(ctx: Context) -> str:
  """The serving deep dive: the subject on the summary's best accelerator (or, when
  nothing serves it, the shipped example)."""
  serving = ctx.results["serving"]
  text = serving_section.report_section(ctx.out_dir, serving["study"], serving["lesson"],
                                        serving["elasticities"])
  if not serving["fallback"]:
    return text
  study = serving["study"]
  return (f"No listed accelerator serves {ctx.subject['model']} at these targets (see the "
          "summary and the multi-chip section); the deep dive shows "
          f"{study['model']} on {study['accelerator']} instead.\n\n" + text)


def _parallel_section(ctx: Context) -> str:
  return chips_section.report_section(ctx.results["chips"], plan_command=ctx.commands.worked_plan)


def _simulation_section(ctx: Context) -> str:
  return simulation_report.simulation_section(ctx.results["simulation"], ctx.out_dir)


def _kernels_section(ctx: Context) -> str:
  return kernels_report.report_section(ctx.out_dir, ctx.results_dir)


def _user_calibration_section(ctx: Context) -> str:
  return user_calibration_report.report_section(ctx.results_dir,
                                                fit_command=ctx.commands.user_calibration)


def _real_engine_section(ctx: Context) -> str:
  return real_engine_report.report_section(ctx.results_dir, ctx.out_dir,
                                           measure_commands=ctx.commands.measure_real_engine)


def check_heading(ctx: Context) -> str:
  """Where the checks start: the lesson and the toy, after the decision."""
  del ctx  # Unused.
  return ("---\n\n# Checks: the lesson reproduced, the toy Transformer, the kernels\n\n"
          "The sections above rest on the symbolic model; these check it against the "
          "lesson's worked numbers and against a real (toy) Transformer.")


# The decision first (summary, serving, multi-chip, accelerators, K/V sizing,
# calibration), then the checks.
SECTIONS: list[Callable[[Context], str]] = [
    summary,
    _serving_section,
    _simulation_section,
    _parallel_section,
    _accelerators_section,
    _kv_sizing_section,
    calibration_section,
    _user_calibration_section,
    check_heading,
    lesson_section,
    crossovers_section,
    sweep_section,
    toy_check_section,
    _real_engine_section,
    _kernels_section,
]


def build(ctx: Context, sections: Sequence[Callable[[Context], str]] = tuple(SECTIONS)) -> str:
  """Runs every section and writes `<out_dir>/README.md`; returns its path."""
  out_dir = ctx.out_dir
  os.makedirs(out_dir, exist_ok=True)
  parts = [
      "# jaxroof report",
      "",
      f"Generated {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC "
      f"with jax {jax.__version__} on {jax.devices()[0].device_kind} ({jax.default_backend()}).",
      "Labels: *analytic bound* (the symbolic model under the lesson's assumptions), "
      "*calibrated prediction* (bound scaled by fitted efficiency factors), "
      "*measurement* (timed on this device).",
  ]
  for section in sections:
    logging.info("report: %s", section.__name__)
    parts += ["", section(ctx)]
  path = os.path.join(out_dir, "README.md")
  files.write_text(path, "\n".join(parts) + "\n")
  return path
