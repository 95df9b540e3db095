"""The fewest chips or the cheapest fleet that serves a workload (or, with --chips, the
most load a fleet of that size carries), each top plan simulated and sized.

Analytic bounds (jaxroof.parallel.planner): searches accelerators x layout (tp, pp, ep,
microbatches) x the weight and K/V dtypes you allow; each replica's number of running
sequences (max_running) and scheduling (--scheduler, --token_budget, or the best) come
from the one load model, as `serving`'s do, with the largest rate meeting the mean token
gap, TTFT at p90 and the inter-token gap at p99; dp is the fewest replicas carrying the
load. Plans rank by cost per hour (with --price_per_hour) or by chips within each
accelerator. The top --top_k plans are then simulated, their replicas bisected to the
fewest that meet the targets at p90 (p99 for the inter-token gap); a plan no size meets
is dropped and the next simulated:

  python -m experiments.plan --model=llama-3.1-70b --context=8192 \
      --prompt_tokens=7000 --output_tokens=1000 --token_gap_ms=50 --ttft_ms=2000 \
      --aggregate_tokens_per_s=10000 --weight_dtype=bf16 --kv_dtype=bf16 \
      --accelerators=h100-sxm,h200,mi300x \
      --price_per_hour=h100-sxm=3.0,h200=3.8,mi300x=2.5 --json_out=/tmp/plan.json

--engine=NAME plans with that engine's predictions (its calibrated step, scheduler
defaults, running cap and memory reservation; labelled with its held-out error), the
bound's plan of the same layout beside (JSON: `bound_*` keys, `bound`). A TPOT target
stated as a mean alone is `--itl_percentile=0` (with --top_k=0).
"""

from __future__ import annotations

import os
import sys

from absl import flags
from absl import logging

from experiments import _cli
from experiments import _length_flags
from experiments import _model_flags
from experiments import _model_notes
from experiments import _scheduling_flags
from experiments import _work
from jaxroof import files
from jaxroof.errors import InputError
from jaxroof.parallel import engine_plan
from jaxroof.parallel import planner
from jaxroof.report import plan_table
from jaxroof.report import table
from jaxroof.serving import plan_check
from jaxroof.specs.accelerators import known_accelerators, load_accelerators
from jaxroof.specs.models import load_model

_cli.key_flags("model", "weight_dtype", "kv_dtype", "engine")  # --helpshort lists them.

_SHARED = _model_flags.define("model", "weight_dtype", "kv_dtype", *_model_flags.COST, "engine",
                              lists=("weight_dtype", "kv_dtype"))
_MODEL = _SHARED.model
_CONTEXT = flags.DEFINE_integer("context", None, "Tokens each sequence retains. >= 1.",
                                lower_bound=1)
_PROMPT_TOKENS = flags.DEFINE_integer(
    "prompt_tokens", None, "Prompt tokens per request (default: context - output_tokens). "
    ">= 1.", lower_bound=1)
_OUTPUT_TOKENS = flags.DEFINE_integer("output_tokens", planner.DEFAULT_OUTPUT_TOKENS,
                                      "Output tokens per request. >= 1.", lower_bound=1)
_TOKEN_GAP_MS = flags.DEFINE_float("token_gap_ms", None,
                                   "Longest gap between one user's tokens, ms. > 0.")
_TTFT_MS = flags.DEFINE_float("ttft_ms", None, "Longest time to first token, ms. > 0.")
_AGGREGATE = flags.DEFINE_float("aggregate_tokens_per_s", None,
                                "Output tokens per second the fleet must serve. > 0.")
_ARRIVAL_RATE = flags.DEFINE_float(
    "arrival_rate", None, "Requests per second the fleet must serve (instead of "
    "--aggregate_tokens_per_s). > 0.")
_ACCELERATORS = flags.DEFINE_string(
    "accelerators", "all",
    f"Comma-separated accelerators, or 'all' (with --price_per_hour: the priced ones): "
    f"{', '.join(known_accelerators())}.")
_MAX_CHIPS = flags.DEFINE_integer("max_chips", None, "Most chips a plan may use. >= 1.",
                                  lower_bound=1)
_PRICE = flags.DEFINE_string(
    "price_per_hour", None, "$ per chip-hour by accelerator, e.g. h100-sxm=3.0,h200=3.8: "
    "plans rank by cost per hour and report cost per million output tokens.")
_POOLS = flags.DEFINE_enum("pools", "both", list(planner.POOLS),
                           "Search shared pools, split prefill/decode pools, or both.")
_TOP = flags.DEFINE_integer("top", 20, "Plans to list. >= 1.", lower_bound=1)
_TOP_K = flags.DEFINE_integer("top_k", plan_check.DEFAULT_TOP_K,
                              "Plans simulated at the workload (0: none). >= 0.", lower_bound=0)
_SIM_REQUESTS = flags.DEFINE_integer("sim_requests", plan_check.DEFAULT_REQUESTS,
                                     "Requests per simulated plan. In [10, 100,000].",
                                     lower_bound=10, upper_bound=100_000)
_SCHEDULER, _TOKEN_BUDGET = _scheduling_flags.SCHEDULER, _scheduling_flags.TOKEN_BUDGET
_CHIPS = flags.DEFINE_integer(
    "chips", None, "A fixed fleet of exactly this many chips: the most load it carries "
    "within the targets (instead of a load). >= 1.", lower_bound=1)
_SEED = flags.DEFINE_integer("seed", 0, "First seed of the simulated arrivals.")
_SIM_SEEDS = flags.DEFINE_integer(
    "sim_seeds", plan_check.DEFAULT_SEEDS,
    "Seeds per simulated plan (seed, seed + 1, ...): a plan meets "
    "only if every seed does. In [1, 20].", lower_bound=1, upper_bound=20)
_TTFT_PERCENTILE = flags.DEFINE_float(
    "ttft_percentile", 90.0, "Percentile at which TTFT must "
    "meet --ttft_ms, in (0, 100).", lower_bound=1e-6, upper_bound=99.999999)
_ITL_PERCENTILE = flags.DEFINE_float(
    "itl_percentile", 99.0, "Percentile at which the inter-token gap must meet --token_gap_ms, "
    "in (0, 100); 0: the mean gap (TPOT) alone, as TPOT targets are often stated.", lower_bound=0.0,
    upper_bound=99.999999)
_JSON_OUT = flags.DEFINE_string("json_out", None, "Write the ranked plans as JSON here.")

for _holder, _unit in ((_TOKEN_GAP_MS, "ms"), (_TTFT_MS, "ms"), (_AGGREGATE, "tokens/s"),
                       (_ARRIVAL_RATE, "requests/s")):
  _cli.require_positive(_holder, _unit)


def main(argv: list[str]) -> None:
  del argv  # Unused.
  _cli.require_flags(_MODEL, _CONTEXT, _TOKEN_GAP_MS, _TTFT_MS)
  _work.check_plan()  # The simulations asked for, before the search.
  if _AGGREGATE.value is not None and _ARRIVAL_RATE.value is not None:
    raise InputError("give the load once: --aggregate_tokens_per_s or --arrival_rate.")
  if _AGGREGATE.value is None and _ARRIVAL_RATE.value is None and _CHIPS.value is None:
    raise InputError("give the load (--aggregate_tokens_per_s or --arrival_rate) or a fleet "
                     "size (--chips).")
  known = known_accelerators()
  prices = planner.parse_prices(_PRICE.value, known)
  names = _ACCELERATORS.value
  if prices and names.strip() == "all":
    names = ",".join(prices)
  devices = load_accelerators(names)
  missing = [d.name for d in devices if prices and d.name not in prices]
  if missing:
    raise InputError(f"--price_per_hour has no price for {', '.join(missing)}: give one for "
                     "every accelerator in --accelerators, or leave it out.")
  quantiles = (_TTFT_PERCENTILE.value, _ITL_PERCENTILE.value)
  if quantiles != (90.0, 99.0) and _TOP_K.value:
    raise InputError(f"--ttft_percentile={quantiles[0]:g} --itl_percentile={quantiles[1]:g}: the "
                     "simulated check holds p90 TTFT and TPOT and the p99 gap; give --top_k=0.")
  spec = load_model(_MODEL.value)
  result = engine_plan.plan(
      spec, devices, context=_CONTEXT.value, top=_TOP.value, prompt_tokens=_PROMPT_TOKENS.value,
      output_tokens=_OUTPUT_TOKENS.value, targets=planner.Targets(
          token_gap_s=_TOKEN_GAP_MS.value / 1e3, ttft_s=_TTFT_MS.value / 1e3,
          aggregate_tokens_per_s=_AGGREGATE.value, arrival_rate_per_s=_ARRIVAL_RATE.value,
          ttft_quantile=quantiles[0] / 100, itl_quantile=quantiles[1] / 100 or
          None), weight_dtypes=tuple(dict.fromkeys(_SHARED.weight_dtype.value)),
      kv_dtypes=tuple(dict.fromkeys(_SHARED.kv_dtype.value)), prices=prices,
      max_chips=_MAX_CHIPS.value, pools=_POOLS.value, bound=_SHARED.bound.value,
      comm_overlap=_SHARED.comm_overlap.value, hold_cv2=_length_flags.output_cv2(),
      scheduler=_SCHEDULER.value, token_budget=_TOKEN_BUDGET.value, chips=_CHIPS.value,
      mla_prefill=_SHARED.mla_prefill.value, engine=_SHARED.engine.value)
  for note in result["notes"]:
    print(f"note: {note}", file=sys.stderr)
  if _TOP_K.value and result["plans"]:
    plan_check.check_top(result, spec, devices, k=_TOP_K.value, num_requests=_SIM_REQUESTS.value,
                         seed=_SEED.value, seeds=_SIM_SEEDS.value, bound=_SHARED.bound.value,
                         comm_overlap=_SHARED.comm_overlap.value, lengths=_length_flags.lengths(),
                         mla_prefill=_SHARED.mla_prefill.value, workers=os.cpu_count() or 1,
                         engine=_SHARED.engine.value)
  print("\n".join(plan_table.header_lines(result)))
  headers, rows = plan_table.plan_rows(result)
  if rows:
    print(table.format_table(headers, rows))
    print("\n".join(plan_table.footer_lines(result)))
  else:
    raise InputError(plan_table.no_plan_line(result))
  for line in result["assumptions"]:
    print(f"assumes: {line}")
  _model_notes.say(spec, [_CONTEXT.value])
  result.update(_model_notes.json_fields(spec, [_CONTEXT.value]))
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, result)
    logging.info("wrote %s", _JSON_OUT.value)


if __name__ == "__main__":
  _cli.run(main)
