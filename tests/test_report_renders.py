"""The report renders results and runs no job.

Every module under `jaxroof/report/` may import the leaf utilities, the
symbolic and specs layers (values and formulas) and other report modules, and
nothing that computes an answer or runs a job: no simulator, planner search,
layout sweep, serving decision, calibration job, measurement or toy run. The
answers are computed below the report (`jaxroof.serving.report_results`) and
the sections render what they are given.
"""

from __future__ import annotations

import ast
import json
import pathlib

import pytest

from experiments import _report_commands
from jaxroof.report import chips_section
from jaxroof.report import plan_table
from jaxroof.report import real_engine
from jaxroof.report import user_calibration

ROOT = pathlib.Path(__file__).resolve().parent.parent
REPORT = ROOT / "jaxroof" / "report"

ALLOWED_PREFIXES = ("jaxroof.errors", "jaxroof.files", "jaxroof.timing", "jaxroof.progress",
                    "jaxroof.symbolic", "jaxroof.specs", "jaxroof.report")
# Modules below the report a renderer may name, each for words or a type, never to compute.
ALLOWED_MODULES = {
    "jaxroof.serving.elasticity": "moved_by (an elasticity in words) and INPUT_NAMES",
    "jaxroof.serving.requests": "ServingInputs, a type the serving lines take",
    "jaxroof.calibrate.toy_fit": "CalibrationRun (the type rendered) and its targets",
    "jaxroof.calibrate.user_fit": "SLOWER_LIMIT, the doubt threshold shown in words",
    "jaxroof.measure.profiles": "Profile, the type rendered, and save_profile",
    "jaxroof.measure.ceilings": "Ceilings, the type rendered",
}


def job_imports(source: str) -> list[str]:
  """What `source` imports from jaxroof or kernels, at any depth, that a renderer may not
  (dotted, `from a import b` as `a.b`): anything outside the allowed layers and the
  named serving modules."""
  names = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      names += [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      names += [f"{node.module}.{alias.name}" for alias in node.names]
  allowed = ALLOWED_PREFIXES + tuple(ALLOWED_MODULES)
  return sorted({
      n for n in names
      if n.split(".")[0] in ("jaxroof", "kernels") and not any(n == p or n.startswith(p + ".")
                                                               for p in allowed)
  })


def test_the_check_catches_a_job_at_any_depth():
  source = ("from jaxroof.report import table\n"
            "from jaxroof import files, toy\n"
            "def f():\n"
            "  from jaxroof.serving import simulator\n"
            "  import jaxroof.parallel.planner\n"
            "  from jaxroof.measure.calibration_job import run\n")
  assert job_imports(source) == [
      "jaxroof.measure.calibration_job.run", "jaxroof.parallel.planner",
      "jaxroof.serving.simulator", "jaxroof.toy"
  ]
  assert job_imports("from jaxroof.serving import elasticity\nimport jaxroof.specs.models\n"
                     "from jaxroof.symbolic.sweep import decode_sweep\n") == []


def test_the_report_imports_nothing_that_runs_a_job():
  wrong = {path.name: job_imports(path.read_text()) for path in sorted(REPORT.glob("*.py"))}
  assert not {name: found for name, found in wrong.items() if found}


def _made_up_chips():
  plan = {
      "searched": 7, "meeting": 3, "plans": [{
          "rank": 1, "rank_within_accelerator": 1, "accelerator": "h200", "chips": 12,
          "pools": {"kind": "shared"}, "tp": 4, "pp": 3, "ep": 1, "dp": 1, "max_running": 77,
          "scheduler": "chunked", "token_budget": 2048, "weight_dtype": "fp8", "kv_dtype": "bf16",
          "merged": [], "max_rate_per_replica_s": 3.21, "loaded_token_gap_s": 0.0123,
          "ttft_s": 0.456, "ttft_p90_s": 0.789
      }]
  }
  chips = {
      "context": 1234,
      "accelerators": ["h200", "b200"],
      "subject_model": "m1",
      "fewest": {
          "m1": {"h200": {"tp": 4, "pp": 2, "ep": 1, "chips": 8}, "b200": None}, "m2": {
              "h200": {"tp": 1, "pp": 1, "ep": 1, "chips": 1},
              "b200": {"tp": 2, "pp": 1, "ep": 4, "chips": 8}
          }
      },
      "plan_question": {
          "model": "m1", "accelerators": "h200",
          "targets": {"token_gap_s": 0.04, "ttft_s": 1.5, "aggregate_tokens_per_s": 900.0}
      },
      "plan": plan,
      "single_stream": {
          "model": "m1", "accelerator": "h200", "allreduces_per_token": 99, "rows": [{
              "tp": 1, "fits_in_memory": False, "memory_s": 0.03, "comm_s": 0.0, "step_s": 0.03,
              "per_sequence_tokens_per_s": 33.3, "bound": "memory"
          }, {
              "tp": 2, "fits_in_memory": True, "memory_s": 0.015, "comm_s": 0.002, "step_s": 0.017,
              "per_sequence_tokens_per_s": 58.8, "bound": "memory"
          }]
      },
      "assumptions": ["first", "second"],
  }
  return chips, plan


def test_the_chips_section_shows_what_it_is_given():
  """Made-up results: the section must show them, not figures of its own."""
  chips, plan = _made_up_chips()
  text = chips_section.report_section(chips, plan_command="search it again")
  assert "| **m1** | 8 (tp4 pp2) | - |" in text
  assert "| m2 | 1 (tp1) | 8 (tp2 ep4) |" in text
  assert "7 configurations searched, 3 meet the targets (`search it again`):" in text
  assert "are 2: 58.8 tokens/s" in text and "the 99 all-reduces per token" in text
  assert "Assumptions: first; second." in text
  headers, rows = plan_table.plan_rows(plan)
  assert rows == [[
      "1 (1)", "h200", 12, "shared", 4, 3, 1, 1, 77, "chunked 2048", "fp8", "bf16", "3.21/s",
      "12.3", "789"
  ]]
  assert "$/h" not in headers and "meets" not in headers  # No prices, nothing simulated.


def test_the_plan_table_adds_cost_and_simulation_columns_when_there_are_some():
  plan = {
      "prices_per_hour": {"h200": 3.0}, "simulation": {}, "plans": [{
          "rank": 2, "rank_within_accelerator": 1, "accelerator": "h200", "chips": 6, "pools": {
              "kind": "split", "prefill_chips": 2, "decode_chips": 4,
              "prefill": {"tp": 1, "replicas": 2}
          }, "tp": 2, "pp": 1, "ep": 1, "dp": 2, "max_running": 5, "scheduler": "iteration",
          "token_budget": None, "weight_dtype": "bf16", "kv_dtype": "fp8",
          "merged": [{"weight_dtype": "bf16", "kv_dtype": "int8"}], "max_rate_per_replica_s": 1.5,
          "loaded_token_gap_s": 0.02, "ttft_s": 0.3, "ttft_p90_s": 0.35, "cost_per_hour": 18.0,
          "cost_per_million_tokens": 1.25, "simulated": {
              "replicas_needed": None, "ttft_p90_s": 0.41, "tpot_p90_s": 0.0215, "itl_p99_s": 0.031,
              "meets": False
          }
      }]
  }
  headers, rows = plan_table.plan_rows(plan)
  row = dict(zip(headers, rows[0]))
  assert row["rank"] == 2 and row["pools"] == "split 2+4 (prefill tp1x2)"
  assert row["K/V"] == "fp8 (= bf16/int8)"
  assert (row["$/h"], row["$/Mtok"]) == ("18.00", "1.250")
  assert (row["sim p90 TTFT/TPOT ms"], row["meets"]) == ("410 / 21.5", "MISSES")
  assert (row["sim replicas"], row["sim p99 ITL ms"]) == ("none meets", "31.0")
  assert (row["max_running"], row["scheduler"]) == (5, "iteration")


def test_the_worked_plan_command_repeats_the_question_it_is_given():
  chips, _ = _made_up_chips()
  command = _report_commands.worked_plan(chips)
  assert command.startswith("python -m experiments.plan ")
  assert ("--model=m1 --context=1234 --token_gap_ms=40 --ttft_ms=1500 "
          "--aggregate_tokens_per_s=900 --accelerators=h200") in command
  assert "meet the targets:" in chips_section.report_section(chips)  # No command: none shown.


def test_the_summary_commands_repeat_the_subject():
  subject = {
      "model": "m9", "context": 5000, "prompt_tokens": 4000, "output_tokens": 1000,
      "token_gap_s": 0.025, "ttft_s": 0.75
  }
  assert _report_commands.serving(subject).endswith(
      "--model=m9 --accelerator=SLUG --prompt_tokens=4000 --output_tokens=1000 "
      "--token_gap_ms=25 --ttft_ms=750")
  assert _report_commands.plan(subject).endswith("experiments.plan --model=m9 --context=5000")


@pytest.mark.parametrize("render, given, shown, unnamed", [
    (user_calibration.report_section, dict(fit_command="fit it"), "No results yet: `fit it`.",
     "No results yet: the calibrate experiment fits"),
    (lambda d, **given: real_engine.report_section(d, d, **given),
     dict(measure_commands=("set up", "measure")), "To measure: `set up`; then `measure` (README).",
     "then `experiments.vllm_bench`"),
])
def test_with_no_results_a_section_shows_the_commands_given_or_names_the_experiments(
    tmp_path, render, given, shown, unnamed):
  assert shown in render(str(tmp_path), **given)
  words = render(str(tmp_path))
  assert unnamed in words and "--" not in words


def test_the_real_engine_section_counts_the_targets_met_without_client_bound_rows(tmp_path):
  rows = [
      dict(metric="ttft", percentile=50, rel_error=0.05),
      dict(metric="tpot", percentile=50, rel_error=0.15),
      dict(metric="ttft", percentile=90, rel_error=0.19),
      dict(metric="tpot", percentile=90, rel_error=0.50, client_bound=True),
      dict(metric="itl", percentile=50, rel_error=0.01),
      dict(metric="tpot", percentile=50, rel_error=None, note="coalesced"),
  ]
  assert real_engine.targets_met({"heldout": rows}) == {"p50": (1, 2), "p90": (1, 1)}