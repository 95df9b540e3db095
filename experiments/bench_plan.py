"""Times the planner's vectorised search (configurations per second) on this CPU.

Three timings through `jaxroof.timing` (warm-up excluded, median of repeats):
the whole `planner.plan` call over every accelerator, layout, batch and
dtype (grid building, evaluation, the prefill load's dp, ranking), the
evaluation alone (`planner.evaluate_grid`, the lambdified decode step,
prefill and per-chip memory over the flat grid), and issue 24's question as
`experiments.plan` answers it (bf16, three priced accelerators, the top 5
plans simulated). A measurement of the search's speed, not of any accelerator.

  python -m experiments.bench_plan --json_out=results/bench_plan_cpu.json
"""

from __future__ import annotations

import platform

import numpy as np
from absl import flags

from experiments import _cli
from jaxroof import files
from jaxroof.parallel import planner
from jaxroof.serving import plan_check
from jaxroof.specs.accelerators import load_accelerators
from jaxroof.specs.models import load_model
from jaxroof.timing import time_call

_MODEL = flags.DEFINE_string("model", "llama-3.1-70b", "Model to plan for.")
_CONTEXT = flags.DEFINE_integer("context", 8192, "Context, tokens. >= 1.", lower_bound=1)
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed repeats. In [1, 10,000].", lower_bound=1,
                                upper_bound=10_000)
_JSON_OUT = flags.DEFINE_string("json_out", None, "Write the timings as JSON here.")

_TARGETS = planner.Targets(token_gap_s=0.05, ttft_s=2.0, aggregate_tokens_per_s=10000.0)
_PRICES = {"h100-sxm": 3.0, "h200": 3.8, "mi300x": 2.5}


def main(argv: list[str]) -> None:
  del argv  # Unused.
  spec, devices = load_model(_MODEL.value), load_accelerators("all")
  run = lambda: planner.plan(spec, devices, context=_CONTEXT.value, targets=_TARGETS,  # noqa: E731
                             weight_dtypes=planner.WEIGHT_DTYPES, kv_dtypes=planner.KV_DTYPES)
  searched = run()["searched"]
  whole = time_call(run, [()], warmup=1, repeats=_REPEATS.value)
  asked = load_accelerators("h100-sxm,h200,mi300x")

  def question() -> dict:
    result = planner.plan(spec, asked, context=_CONTEXT.value, prompt_tokens=7000,
                          output_tokens=1000, targets=_TARGETS, weight_dtypes=("bf16",),
                          kv_dtypes=("bf16",), prices=_PRICES)
    return plan_check.check_top(result, spec, asked, k=plan_check.DEFAULT_TOP_K)

  answer = question()
  with_sims = time_call(question, [()], warmup=0, repeats=max(1, min(_REPEATS.value, 3)))
  grid = planner.build_grid(spec, devices, _CONTEXT.value, planner.WEIGHT_DTYPES,
                       planner.KV_DTYPES, np.asarray(planner.BATCHES, dtype=float),
                       0.1)
  evaluation = time_call(lambda: planner.evaluate_grid(grid, _CONTEXT.value), [()],
                         warmup=1, repeats=_REPEATS.value)
  report = {
      "kind": "measurement",
      "what": "speed of the planner's search (analytic model evaluation), not a device speed",
      "model": spec.name, "context": _CONTEXT.value, "accelerators": len(devices),
      "targets": {"token_gap_s": _TARGETS.token_gap_s, "ttft_s": _TARGETS.ttft_s,
                  "aggregate_tokens_per_s": _TARGETS.aggregate_tokens_per_s},
      "searched": searched,
      "plan_configs_per_s": searched / whole.median_s,
      "evaluate_configs_per_s": searched / evaluation.median_s,
      "plan_timing": whole.to_json(), "evaluate_timing": evaluation.to_json(),
      "question": {
          "what": "issue 24's question: llama-3.1-70b, 7000 in / 1000 out, 50 ms gap, 2 s "
                  "TTFT, 10,000 tokens/s, bf16, h100-sxm/h200/mi300x priced; top 5 simulated",
          "searched": answer["searched"], "timing": with_sims.to_json(),
          "simulation_wall_s": answer["simulation"]["wall_s"],
          "top": {k: answer["plans"][0][k] for k in ("accelerator", "chips", "tp", "pp", "dp",
                                                     "batch", "cost_per_hour", "simulated")}},
      "backend": "numpy (lambdified sympy), float64",
      "host": {"machine": platform.machine(), "processor": platform.processor(),
               "python": platform.python_version(),
               "note": "shared 2-core machine; other jobs were running"},
  }
  print(f"issue 24's question with top-5 simulations: {with_sims.median_s:.2f} s median")
  print(f"{searched:,} configurations: plan {whole.median_s:.2f} s median "
        f"({report['plan_configs_per_s']:,.0f} configs/s), evaluation alone "
        f"{evaluation.median_s:.2f} s ({report['evaluate_configs_per_s']:,.0f} configs/s)")
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, report)


if __name__ == "__main__":
  _cli.run(main)
