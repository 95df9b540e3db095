"""The serving decision studied from both rates: what the report's serving section shows.

`lesson_decisions` is the lesson's decision at two token-gap targets; `study`
takes one model on one replica from its frontier (aggregate against
per-sequence rate over batch) through static-batch request rows, the
prefill/decode crossovers and split against shared pools; `lesson_elasticities`
says what moves the step in the lesson's 0.5 GB case. Analytic bounds; TTFT
figures are M/D/1 means.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jaxroof.parallel.layout import Layout
from jaxroof.serving import decision as decision_lib
from jaxroof.serving import elasticity
from jaxroof.serving import lesson_claims
from jaxroof.serving import multichip
from jaxroof.serving import pools
from jaxroof.serving import requests
from jaxroof.specs.accelerators import load_accelerator
from jaxroof.specs.models import load_model
from jaxroof.symbolic.step_model import StepModel

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
WINDOW_S = 0.005  # The batching window of the study's load, s.
POOL_ARRIVAL_RATE = 40.0  # Requests/s at which split and shared pools are compared.
LESSON_GAPS_S = (0.012, 0.009)
LESSON_PROMPT, LESSON_OUTPUTS = 1000, 128
ELASTICITY_BATCHES = (1, 8, 32, 64, 256)
# The lesson's 0.5 GB case: 16 GB BF16 weights, 0.5 GB K/V per sequence, 2 TB/s, 600 TFLOP/s.
ELASTICITY_CASE = dict(N=lesson_claims.WEIGHTS, q=lesson_claims.BF16, T=1,
                       k=lesson_claims.KV_PER_SEQ_DOUBLED, BW=lesson_claims.BANDWIDTH,
                       F=lesson_claims.RIDGE * lesson_claims.BANDWIDTH)


def lesson_inputs() -> requests.ServingInputs:
  """The lesson's example: 8e9 BF16 weights, 2 TB/s, 300 FLOP/B, fixed K/V per sequence."""
  return requests.ServingInputs(
      N=lesson_claims.WEIGHTS, N_act=lesson_claims.WEIGHTS, q=lesson_claims.BF16, k=0.0,
      BW=lesson_claims.BANDWIDTH, F=lesson_claims.RIDGE * lesson_claims.BANDWIDTH,
      kv_per_sequence_bytes=lesson_claims.KV_PER_SEQ,
      label="lesson: 16 GB BF16 weights, 0.25 GB K/V per sequence, 2 TB/s, 600 TFLOP/s")


def lesson_decisions() -> list[dict[str, Any]]:
  """The lesson's decision at each of `LESSON_GAPS_S`, with its `token_gap_s`."""
  return [{
      "token_gap_s": gap,
      **decision_lib.decide(StepModel.bound(), lesson_inputs(), prompt_tokens=LESSON_PROMPT,
                            output_tokens=LESSON_OUTPUTS, token_gap_s=gap)
  } for gap in LESSON_GAPS_S]


def lesson_elasticities() -> list[dict[str, Any]]:
  """d ln(step)/d ln(x) of the lesson's 0.5 GB case at each of `ELASTICITY_BATCHES`."""
  out = []
  for batch in ELASTICITY_BATCHES:
    values = elasticity.row_elasticities(StepModel.bound(), [batch], **ELASTICITY_CASE)[0]
    out.append({"batch": batch, "elasticities": values, "moved_by": elasticity.moved_by(values)})
  return out


def frontier_batches(batches: Sequence[int], decision: dict[str, Any],
                     inputs: requests.ServingInputs) -> list[int]:
  """The swept batches plus the decision and the memory limit, for the frontier plot."""
  extra = [decision.get("batch"), inputs.max_batch_in_memory]
  return sorted(set(batches) | {b for b in extra if b is not None and b >= 1})


def study(model_name: str, accelerator: str, *, prompt: int, outputs: int, token_gap_s: float,
          ttft_s: float, arrival_rate: float, weight_dtype: str = "bf16", kv_dtype: str = "bf16",
          layout: Layout | None = None) -> dict[str, Any]:
  """One model on one replica of `layout` (default one chip) at `arrival_rate`.

  Returns the inputs, the `decision`, the `frontier` (arrays over batch), the
  static-batch request `rows`, the prefill/decode `crossovers`, the `pools`
  comparison at `POOL_ARRIVAL_RATE` with when each kind wins, and
  `max_batch_in_memory`.
  """
  model = StepModel.bound()
  inputs = multichip.model_inputs(load_model(model_name), load_accelerator(accelerator),
                                  layout=layout, prompt_tokens=prompt, output_tokens=outputs,
                                  weight_dtype=weight_dtype, kv_dtype=kv_dtype)
  work = dict(prompt_tokens=prompt, output_tokens=outputs)
  decision = decision_lib.decide(model, inputs, token_gap_s=token_gap_s, ttft_s=ttft_s,
                                 arrival_rate=arrival_rate, window_s=WINDOW_S, **work)
  layout = layout or Layout()
  return {
      "model": model_name,
      "accelerator": accelerator,
      "prompt_tokens": prompt,
      "output_tokens": outputs,
      "token_gap_s": token_gap_s,
      "ttft_s": ttft_s,
      "arrival_rate_per_s": arrival_rate,
      "window_s": WINDOW_S,
      "weight_dtype": weight_dtype,
      "kv_dtype": kv_dtype,
      "layout": {"tp": layout.tp, "pp": layout.pp, "ep": layout.ep},
      "chips": layout.chips_per_replica,
      "max_batch_in_memory": inputs.max_batch_in_memory,
      "decision": decision,
      "frontier": decision_lib.frontier(model, inputs, frontier_batches(BATCHES, decision, inputs),
                                        **work),
      "rows": requests.rows(model, inputs, list(BATCHES), arrival_rate=arrival_rate,
                            window_s=WINDOW_S, **work),
      "crossovers": pools.crossovers(model, inputs, **work),
      "pools": pools.compare(model, inputs, arrival_rate=POOL_ARRIVAL_RATE, ttft_s=ttft_s,
                             token_gap_s=token_gap_s, window_s=WINDOW_S, **work),
      "shared_wins": list(pools.SHARED_WINS[:3]),
      "split_wins": list(pools.SPLIT_WINS[:3]),
  }
