"""The fewest chips, split how, at what batch: a vectorised search meeting targets.

Analytic bounds (jaxroof.parallel.planner): searches accelerators x layout
(tp, pp, ep, microbatches; dp solved for the rate) x batch x weight and K/V
dtypes, keeps what fits per-chip memory and meets the token gap and TTFT,
and ranks by chips, then headroom:

  python -m experiments.plan --model=llama-3.1-70b --context=8192 \
      --token_gap_ms=50 --ttft_ms=2000 --aggregate_tokens_per_s=10000 \
      --accelerators=h100-sxm,tpu-v5e,mi300x --json_out=/tmp/plan.json
"""

from __future__ import annotations

from absl import flags
from absl import logging

from experiments import _cli
from experiments import _model_flags
from experiments import _model_notes
from jaxroof import files
from jaxroof.parallel import planner
from jaxroof.report import table
from jaxroof.specs.accelerators import known_accelerators, load_accelerators
from jaxroof.specs.models import load_model

_SHARED = _model_flags.define("model", *_model_flags.COST)
_MODEL = _SHARED.model
_CONTEXT = flags.DEFINE_integer("context", None, "Tokens each sequence retains. >= 1.",
                                lower_bound=1)
_TOKEN_GAP_MS = flags.DEFINE_float("token_gap_ms", None,
                                   "Longest gap between one user's tokens, ms. > 0.")
_TTFT_MS = flags.DEFINE_float("ttft_ms", None, "Longest time to first token, ms. > 0.")
_AGGREGATE = flags.DEFINE_float("aggregate_tokens_per_s", None,
                                "Tokens per second the fleet must serve. > 0.")
_ACCELERATORS = flags.DEFINE_string(
    "accelerators", "all",
    f"Comma-separated accelerators, or 'all': {', '.join(known_accelerators())}.")
_TOP = flags.DEFINE_integer("top", 20, "Plans to list. >= 1.", lower_bound=1)
_JSON_OUT = flags.DEFINE_string("json_out", None, "Write the ranked plans as JSON here.")

for _holder, _unit in ((_TOKEN_GAP_MS, "ms"), (_TTFT_MS, "ms"), (_AGGREGATE, "tokens/s")):
  _cli.require_positive(_holder, _unit)

HEADERS = ("rank", "accelerator", "chips", "tp", "pp", "ep", "dp", "mb", "batch", "weights",
           "K/V", "step ms", "TTFT ms", "fleet tok/s", "binds", "headroom")


def main(argv: list[str]) -> None:
  del argv  # Unused.
  _cli.require_flags(_MODEL, _CONTEXT, _TOKEN_GAP_MS, _TTFT_MS, _AGGREGATE)
  spec = load_model(_MODEL.value)
  result = planner.plan(
      spec, load_accelerators(_ACCELERATORS.value),
      context=_CONTEXT.value, top=_TOP.value,
      targets=planner.Targets(token_gap_s=_TOKEN_GAP_MS.value / 1e3,
                              ttft_s=_TTFT_MS.value / 1e3,
                              aggregate_tokens_per_s=_AGGREGATE.value),
      bound=_SHARED.bound.value, comm_overlap=_SHARED.comm_overlap.value)
  print(f"{result['model']} at {result['context']} tokens: {result['meeting']:,} of "
        f"{result['searched']:,} configurations meet a {_TOKEN_GAP_MS.value:g} ms token gap, "
        f"{_TTFT_MS.value:g} ms TTFT and {_AGGREGATE.value:,.0f} tokens/s "
        f"(analytic bound; searched in {result['wall_s']:.2f} s on this CPU)")
  rows = [[p["rank"], p["accelerator"], p["chips"], p["tp"], p["pp"], p["ep"], p["dp"],
           p["microbatches"], p["batch"], p["weight_dtype"], p["kv_dtype"],
           f"{p['step_s'] * 1e3:,.2f}", f"{p['ttft_s'] * 1e3:,.1f}",
           f"{p['aggregate_tokens_per_s']:,.0f}", p["binds"], f"{p['headroom']:.2f}"]
          for p in result["plans"]]
  if rows:
    print(table.format_table(HEADERS, rows))
  else:
    print("no configuration meets the targets: relax the token gap, TTFT or rate.")
  for line in result["assumptions"]:
    print(f"assumes: {line}")
  _model_notes.say(spec, [_CONTEXT.value])
  result.update(_model_notes.json_fields(spec, [_CONTEXT.value]))
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, result)
    logging.info("wrote %s", _JSON_OUT.value)


if __name__ == "__main__":
  _cli.run(main)
