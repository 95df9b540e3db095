"""The serving question's flags: the workload (--prompt_tokens, --output_tokens,
--arrival_rate, --batching_window_ms, --prefill_batch), the batches to tabulate and the
targets (--token_gap_ms, --ttft_ms, --aggregate_tokens_per_s); the scheduling
(--scheduler, --token_budget) is `_scheduling_flags`', shared with `plan`.

Import this module in an experiment to define the flags, then call `question(...)` for
the `jaxroof.serving.serving_result.Question` they ask (in SI units).
"""

from __future__ import annotations

from typing import Any

from absl import flags

from experiments import _cli
from experiments import _scheduling_flags
from jaxroof import errors
from jaxroof.serving import serving_result

_PROMPT_TOKENS = flags.DEFINE_integer("prompt_tokens", 1024, "Prompt length P, tokens. "
                                      "1 .. 10,000,000.", upper_bound=10_000_000)
_OUTPUT_TOKENS = flags.DEFINE_integer("output_tokens", 128, "Outputs G per request. "
                                      "2 .. 1,000,000.", upper_bound=1_000_000)
_BATCH_SIZES = flags.DEFINE_list("batch_sizes", "1,2,4,8,16,32,64,128,256,512",
                                 "Batches (sequences) for the rows and the frontier.")
_ARRIVAL_RATE = flags.DEFINE_float("arrival_rate", 0.0, "Requests/s (Poisson). >= 0.")
_BATCHING_WINDOW_MS = flags.DEFINE_float("batching_window_ms", 0.0,
                                         "Wait before a prefill starts, ms. >= 0.")
_PREFILL_BATCH = flags.DEFINE_integer(
    "prefill_batch", 1, "Prompts prefilled together (the window collects them); batches "
    "queue as M/D/1 at arrival_rate / prefill_batch.", lower_bound=1, upper_bound=4096)
_SCHEDULER, _TOKEN_BUDGET = _scheduling_flags.SCHEDULER, _scheduling_flags.TOKEN_BUDGET
# The targets.
_TTFT_MS = flags.DEFINE_float("ttft_ms", None, "Time-to-first-token target at p90, ms. > 0.")
_TOKEN_GAP_MS = flags.DEFINE_float(
    "token_gap_ms", None, "Gap between a user's tokens: the mean (TPOT) and the p99 "
    "inter-token gap within it, ms. > 0. Required.")
_AGGREGATE = flags.DEFINE_float("aggregate_tokens_per_s", None,
                                "Optional aggregate-rate target, tokens/s. > 0.")

for _holder, _unit in ((_TTFT_MS, "ms"), (_TOKEN_GAP_MS, "ms"), (_AGGREGATE, "tokens/s")):
  _cli.require_positive(_holder, _unit)
_cli.require_positive_int_list(_BATCH_SIZES, "sequences")
for _holder, _unit in ((_ARRIVAL_RATE, "requests/s"), (_BATCHING_WINDOW_MS, "ms")):
  flags.register_validator(_holder.name, lambda v: v >= 0 and v != float("inf"),
                           message=f"must be a finite number >= 0 ({_unit})")


def check() -> None:
  """A request of at least one prompt token and two outputs, and a token-gap target."""
  if _OUTPUT_TOKENS.value < 2 or _PROMPT_TOKENS.value < 1:
    raise errors.InputError(f"--prompt_tokens={_PROMPT_TOKENS.value} with --output_tokens="
                            f"{_OUTPUT_TOKENS.value} is not allowed: a prompt needs >= 1 token "
                            "and a request >= 2 outputs (one output has no token gap).")
  _cli.require_flags(_TOKEN_GAP_MS)


def question(**named: Any) -> serving_result.Question:
  """The question the flags ask, in SI units; `named`: what else the user named (the
  model, the accelerator, the layout, the weight format, the K/V dtype)."""
  return serving_result.Question(
      prompt_tokens=_PROMPT_TOKENS.value, output_tokens=_OUTPUT_TOKENS.value,
      batch_sizes=_cli.int_list(_BATCH_SIZES), token_gap_s=_TOKEN_GAP_MS.value / 1e3,
      ttft_s=None if _TTFT_MS.value is None else _TTFT_MS.value / 1e3,
      aggregate_tokens_per_s=_AGGREGATE.value, arrival_rate_per_s=_ARRIVAL_RATE.value,
      window_s=_BATCHING_WINDOW_MS.value / 1e3, prefill_batch=_PREFILL_BATCH.value,
      scheduler=_SCHEDULER.value, token_budget=_TOKEN_BUDGET.value, **named)
