"""Every result the main report shows, computed before it is written.

The report (`jaxroof.report.document`) only words, tabulates and plots what
`compute` returns: the serving answer for the subject (`serving.answer`), the
serving decision studied on the best accelerator (`serving.decision_study`),
the fewest chips per model, a worked plan and a single stream
(`parallel.fewest_chips`, `parallel.planner`), the three schedulers simulated
at one load (`serving.scheduler_comparison`) and the toy's float64 decode
check. All but the toy are analytic bounds; each result carries its inputs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxroof.parallel import fewest_chips
from jaxroof.parallel import planner
from jaxroof.parallel.layout import Layout
from jaxroof.serving import answer
from jaxroof.serving import arrivals
from jaxroof.serving import decision_study
from jaxroof.serving import lesson_claims
from jaxroof.serving import scheduler_comparison
from jaxroof.specs.accelerators import load_accelerator, load_accelerators
from jaxroof.specs.models import load_model, shipped_models
from jaxroof.toy import check as toy_check
from jaxroof.toy.config import LESSON, LESSON_PROMPT

CHIPS_CONTEXT = 8192
PLAN_MODEL = "llama-3.1-70b"
PLAN_TARGETS = planner.Targets(token_gap_s=0.05, ttft_s=2.0, aggregate_tokens_per_s=10000.0)
PLAN_ACCELERATORS = "h100-sxm,h200,b200,mi300x,tpu-v5e,tpu-v6e"
PLAN_TOP = 5
SINGLE_STREAM_MODEL = "llama-3.1-70b"
SINGLE_STREAM_DEVICE = "h100-sxm"
# Deep dive when no listed accelerator serves the subject.
FALLBACK_MODEL, FALLBACK_DEVICE = "llama-3-8b", "h100-sxm"
FALLBACK_REQUEST = dict(prompt=2048, outputs=256, token_gap_s=0.02, ttft_s=0.5, arrival_rate=5.0)
# The scheduler comparison: Llama-3-8B (bf16) on one H100 under lognormal Poisson requests.
SIMULATION_MODEL, SIMULATION_DEVICE = "llama-3-8b", "h100-sxm"
SIMULATION_WORKLOAD = dict(arrival="poisson", num_requests=2000, arrival_rate=20.0, seed=0,
                           prompt_tokens=1000, output_tokens=200, prompt_distribution="lognormal",
                           output_distribution="lognormal", prompt_spread=0.5, output_spread=0.5)
SIMULATION_REPLICA = dict(context=1200, batch_window_s=0.05, token_budget=512)
SIMULATION_TARGETS = dict(ttft_target_s=0.5, tpot_target_s=0.05)
TOY_STEPS = 2


def _layout_fields(layout: Layout | None) -> dict[str, int] | None:
  if layout is None:
    return None
  return {"tp": layout.tp, "pp": layout.pp, "ep": layout.ep, "chips": layout.chips_per_replica}


def serving(subject: answer.Subject, summary: dict[str, Any]) -> dict[str, Any]:
  """The serving study of the subject on the summary's best accelerator, at the subject's
  load or else half the load limit found there; a shipped example when nothing serves."""
  lesson = decision_study.lesson_decisions()
  elasticities = decision_study.lesson_elasticities()
  best = summary["best"]
  if best is None:
    study = decision_study.study(FALLBACK_MODEL, FALLBACK_DEVICE, **FALLBACK_REQUEST)
  else:
    study = decision_study.study(
        subject.model, best, prompt=subject.prompt_tokens, outputs=subject.output_tokens,
        token_gap_s=subject.token_gap_s, ttft_s=subject.ttft_s, weight_dtype=subject.weight_dtype,
        kv_dtype=subject.kv_dtype, layout=answer.best_layout(summary),
        arrival_rate=subject.arrival_rate or 0.5 * answer.best_load_limit(summary))
  return {"study": study, "lesson": lesson, "elasticities": elasticities, "fallback": best is None}


def chips(subject_model: str, accelerators: tuple[str, ...]) -> dict[str, Any]:
  """Fewest chips per shipped model (the subject's first) on `accelerators`, the worked
  plan and the single stream on the fewest H100s."""
  devices = [load_accelerator(a) for a in accelerators]
  names = [subject_model] + [m for m in shipped_models() if m != subject_model]
  grid = fewest_chips.fewest_chips_grid({n: load_model(n) for n in names}, devices,
                                        context=CHIPS_CONTEXT)
  plan = planner.plan(load_model(PLAN_MODEL), load_accelerators(PLAN_ACCELERATORS),
                      context=CHIPS_CONTEXT, targets=PLAN_TARGETS, top=PLAN_TOP)
  stream_spec = load_model(SINGLE_STREAM_MODEL)
  return {
      "context": CHIPS_CONTEXT,
      "accelerators": list(accelerators),
      "subject_model": subject_model,
      "fewest": {m: {a: _layout_fields(lay) for a, lay in row.items()} for m, row in grid.items()},
      "plan_question": {
          "model": PLAN_MODEL, "accelerators": PLAN_ACCELERATORS,
          "targets": dataclasses.asdict(PLAN_TARGETS)
      },
      "plan": plan,
      "single_stream": {
          "model": SINGLE_STREAM_MODEL, "accelerator": SINGLE_STREAM_DEVICE,
          "rows": fewest_chips.single_stream(stream_spec, load_accelerator(SINGLE_STREAM_DEVICE),
                                             context=CHIPS_CONTEXT),
          "allreduces_per_token": fewest_chips.tp_allreduces_per_token(stream_spec)
      },
      "assumptions": list(planner.ASSUMPTIONS[:3]),
  }


def simulation() -> dict[str, Any]:
  """The three schedulers at one Poisson load, with the scenario's inputs."""
  workload = arrivals.synthetic(**SIMULATION_WORKLOAD)
  runs = scheduler_comparison.compare(load_model(SIMULATION_MODEL),
                                      load_accelerator(SIMULATION_DEVICE), workload,
                                      **SIMULATION_REPLICA, **SIMULATION_TARGETS)
  return {
      "model": SIMULATION_MODEL, "accelerator": SIMULATION_DEVICE, "workload": SIMULATION_WORKLOAD,
      "replica": SIMULATION_REPLICA, "targets": SIMULATION_TARGETS, "runs": runs
  }


def toy() -> dict[str, Any]:
  """The float64 decode check on the lesson's toy, as `decode_equivalence` writes it."""
  result = toy_check.lesson_check(LESSON, LESSON_PROMPT, TOY_STEPS)
  return toy_check.result_json(result, config=LESSON, prompt=LESSON_PROMPT, steps=TOY_STEPS,
                               break_name=None, layout="fixed", seed=0)


def compute(subject: answer.Subject, results_dir: str) -> dict[str, Any]:
  """Every result of the report: keys summary, serving, chips, simulation, toy, lesson."""
  summary = answer.summarise(subject, results_dir)
  return {
      "summary": summary, "serving": serving(subject,
                                             summary), "lesson": lesson_claims.all_claims(),
      "chips": chips(subject.model, subject.accelerators), "simulation": simulation(), "toy": toy()
  }
