"""The planner's benchmark `experiments.bench --what=plan` runs.

It times the planner's search through `jaxroof.timing.time_call` (median and spread of
repeats) and returns its JSON document (the keys the former `bench_plan` app wrote). These
are measurements of this machine, never of an accelerator the model describes.
"""

from __future__ import annotations

import functools
import os

import numpy as np

from jaxroof import timing
from jaxroof.parallel import plan_grid
from jaxroof.parallel import plan_search
from jaxroof.parallel import planner
from jaxroof.parallel import replica_load
from jaxroof.serving import plan_check
from jaxroof.serving import report_results
from jaxroof.specs import step_inputs
from jaxroof.specs.accelerators import load_accelerators
from jaxroof.specs.models import load_model
from jaxroof.symbolic import load_model as lm
from jaxroof.symbolic.step_model import StepModel

# The 70B question (the README's plan example).
PLAN_TARGETS = report_results.PLAN_TARGETS
PLAN_PRICES = {"h100-sxm": 3.0, "h200": 3.8, "mi300x": 2.5}


def _cpu_s() -> float:
  """CPU seconds of this process and its finished children (the sizing's workers)."""
  t = os.times()
  return t.user + t.system + t.children_user + t.children_system


def _with_cpu(fn, spent: list[float]):
  """`fn`, each call's CPU seconds appended to `spent` (the machine may be shared: wall
  time alone mixes in the others' load)."""

  def call():
    start = _cpu_s()
    out = fn()
    spent.append(_cpu_s() - start)
    return out

  return call


def plan(*, model: str, context: int, repeats: int) -> dict:
  """Configurations per second of the planner's search over every accelerator, layout,
  batch and dtype (the load model's answer of each group that can make the list); its
  cheap pass alone (the cost model over the whole grid); and the question with its top 5
  simulated and sized."""
  spec, devices = load_model(model), load_accelerators("all")
  search = functools.partial(planner.plan, spec, devices, context=context, targets=PLAN_TARGETS,
                             weight_dtypes=planner.WEIGHT_DTYPES, kv_dtypes=planner.KV_DTYPES)
  first = search()  # Also the warm-up of the timed searches.
  searched = first["searched"] + first["split_searched"]
  search_cpu: list[float] = []
  whole = timing.time_call(_with_cpu(search, search_cpu), [()], warmup=0, repeats=repeats)
  asked = load_accelerators(",".join(PLAN_PRICES))

  def question() -> dict:
    result = planner.plan(spec, asked, context=context, prompt_tokens=7000, output_tokens=1000,
                          targets=PLAN_TARGETS, weight_dtypes=("bf16",), kv_dtypes=("bf16",),
                          prices=PLAN_PRICES)
    return plan_check.check_top(result, spec, asked, k=plan_check.DEFAULT_TOP_K,
                                workers=os.cpu_count() or 1)

  answer = question()
  question_cpu: list[float] = []
  with_sims = timing.time_call(_with_cpu(question, question_cpu), [()], warmup=0,
                               repeats=max(1, min(repeats, 3)))
  prompt = context - planner.DEFAULT_OUTPUT_TOKENS
  work = plan_search.Workload(
      prompt_tokens=prompt, output_tokens=planner.DEFAULT_OUTPUT_TOKENS,
      context=replica_load.mean_context(prompt, planner.DEFAULT_OUTPUT_TOKENS),
      targets=lm.Targets(token_gap_s=PLAN_TARGETS.token_gap_s, ttft_s=PLAN_TARGETS.ttft_s), cv2=0.0,
      schedulings=plan_search.schedulings(None, None))

  def cheap() -> None:
    grid = plan_grid.build(spec, devices, context=context, prompt_tokens=prompt,
                           weight_dtypes=planner.WEIGHT_DTYPES, kv_dtypes=planner.KV_DTYPES,
                           workspace_fraction=step_inputs.DEFAULT_WORKSPACE_FRACTION)
    plan_search.bound(grid, StepModel.bound(), work, np.asarray(planner.BATCHES, dtype=float))

  evaluation = timing.time_call(cheap, [()], warmup=1, repeats=repeats)
  top = answer["plans"][0]
  return {
      "experiment": "bench_plan", "kind": "measurement",
      "what": "speed of the planner's search (analytic model evaluation), not a device speed",
      "model": spec.name, "context": context, "accelerators": len(devices), "targets": {
          "token_gap_s": PLAN_TARGETS.token_gap_s, "ttft_s": PLAN_TARGETS.ttft_s,
          "aggregate_tokens_per_s": PLAN_TARGETS.aggregate_tokens_per_s
      }, "searched": searched, "evaluated_groups": first["evaluated_groups"],
      "plan_configs_per_s": searched / whole.median_s,
      "evaluate_configs_per_s": first["searched"] / evaluation.median_s,
      "plan_timing": whole.to_json(), "plan_cpu_s": search_cpu,
      "evaluate_timing": evaluation.to_json(), "load_avg_1m": os.getloadavg()[0], "question": {
          "what": "llama-3.1-70b, 7000 in / 1000 out, 50 ms gap, 2 s TTFT, 10,000 tokens/s, "
                  "bf16, h100-sxm/h200/mi300x priced; top 5 simulated and sized (plans side "
                  "by side over the CPUs)",
          "searched": answer["searched"] + answer["split_searched"], "timing": with_sims.to_json(),
          "cpu_s": question_cpu, "simulation_wall_s": answer["simulation"]["wall_s"], "top": {
              k: top[k] for k in ("accelerator", "chips", "tp", "pp", "dp", "max_running",
                                 "scheduler", "token_budget", "cost_per_hour", "simulated")
          }
      }, "backend": "numpy (lambdified sympy), float64", "host": timing.host()
  }
