"""The command lines the report shows its reader, built from its results.

The library names no flag: `jaxroof.report.document.Commands` holds whatever command
lines the rendering experiment passes, and this table is where they are written, so a
renamed flag is changed here and in the experiment that defines it. Flag-free, so
tests import it without defining the report's flags.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from jaxroof.report import document

RESULTS_DIR = os.path.join(document.REPOSITORY, "results")  # What the report reads from disk.


def _ms(seconds: float) -> str:
  return f"{seconds * 1e3:g}"


def serving(subject: Mapping[str, Any]) -> str:
  """One accelerator of the summary in full (SLUG stands for it)."""
  return (f"python -m experiments.serving --model={subject['model']} --accelerator=SLUG "
          f"--prompt_tokens={subject['prompt_tokens']} --output_tokens={subject['output_tokens']} "
          f"--token_gap_ms={_ms(subject['token_gap_s'])} --ttft_ms={_ms(subject['ttft_s'])}" +
          ("" if subject.get("engine", "bound") == "bound" else f" --engine={subject['engine']}"))


def plan(subject: Mapping[str, Any]) -> str:
  """The layout search for the summary's subject."""
  return f"python -m experiments.plan --model={subject['model']} --context={subject['context']}"


def worked_plan(chips: Mapping[str, Any]) -> str:
  """The multi-chip section's worked plan, searched again."""
  question, targets = chips["plan_question"], chips["plan_question"]["targets"]
  return (f"python -m experiments.plan --model={question['model']} --context={chips['context']} "
          f"--token_gap_ms={_ms(targets['token_gap_s'])} --ttft_ms={_ms(targets['ttft_s'])} "
          f"--aggregate_tokens_per_s={targets['aggregate_tokens_per_s']:g} "
          f"--accelerators={question['accelerators']}")


# Hints that do not depend on the run.
COMPARE_ACCELERATORS = "python -m experiments.compare_accelerators --model=NAME --context=T"
KV_SIZING = "python -m experiments.kv_sizing --model=NAME --context=T"
LONGER_CALIBRATION = "python -m experiments.calibrate --budget_s=240"
USER_CALIBRATION = ("python -m experiments.calibrate --from_csv=PATH --accelerator=SLUG "
                    "--json_out=PATH")
MEASURE_REAL_ENGINE = (
    "bash experiments/vllm_setup.sh ENV",
    "python -m experiments.vllm_bench --engine_env=ENV --model=tiny-llama --rates=2,4,8 "
    "--prompt_tokens=128 --output_tokens=32 --num_prompts=60 --out_dir=OUT",
    "python -m experiments.calibrate --source=vllm --from_vllm=... --heldout_vllm=...",
)


def commands(results: Mapping[str, Any], results_dir: str = RESULTS_DIR) -> document.Commands:
  """Every command line the report shows, for results from `report_results.compute`."""
  subject = results["summary"]["subject"]
  bench = document.in_repository(os.path.join(results_dir, document.BENCH_DECODE))
  return document.Commands(serving=serving(subject), plan=plan(subject),
                           worked_plan=worked_plan(results["chips"]),
                           compare_accelerators=COMPARE_ACCELERATORS, kv_sizing=KV_SIZING,
                           longer_calibration=LONGER_CALIBRATION, user_calibration=USER_CALIBRATION,
                           bench_decode=f"python -m experiments.bench_decode --json_out={bench}",
                           measure_real_engine=MEASURE_REAL_ENGINE)
