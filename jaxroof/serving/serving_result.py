"""The serving decision's whole answer, as `experiments.serving` writes it: a question
(the workload, the targets, what the user named) and a model's inputs in, the rows with
their elasticities, the decision, the crossovers and the prefill/decode pools out.

JSON keys: kind, inputs, units, assumptions, requests (rows: batch, prefill_s, decode_s,
ttft_s, mean_token_gap_s, e2e_s, aggregate_tokens_per_s, per_sequence_tokens_per_s,
status, elasticities, moved_by), decision (batch, binds, step_s, aggregate_tokens_per_s,
per_sequence_tokens_per_s, ttft_s, max_arrival_rate_per_s, status, reason, ...),
elasticities (at the decision), prefill_decode (crossovers) and pools (`pools`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxroof import errors
from jaxroof.parallel.layout import Layout
from jaxroof.serving import decision as decision_lib
from jaxroof.serving import decision_study
from jaxroof.serving import elasticity
from jaxroof.serving import multichip
from jaxroof.serving import percentiles as percentiles_lib
from jaxroof.serving import pools as pools_lib
from jaxroof.serving import queueing
from jaxroof.serving import replica
from jaxroof.serving import requests
from jaxroof.specs import accelerators
from jaxroof.specs.accelerators import Accelerator
from jaxroof.specs.model_spec import ModelSpec
from jaxroof.specs.parameters import WeightFormat
from jaxroof.symbolic import load_model
from jaxroof.symbolic.step_model import StepModel


@dataclasses.dataclass(frozen=True)
class Question:
  """What a user asks: the workload, the targets and what they named (echoed in the
  JSON). `arrival_rate_per_s` and `aggregate_tokens_per_s` are the fleet's."""
  prompt_tokens: int
  output_tokens: int
  batch_sizes: list[int]
  token_gap_s: float
  ttft_s: float | None = None
  aggregate_tokens_per_s: float | None = None
  arrival_rate_per_s: float = 0.0
  window_s: float = 0.0
  prefill_batch: int = 1
  scheduler: str | None = None
  token_budget: int | None = None
  model: str | None = None
  accelerator: str | None = None
  layout: Layout = dataclasses.field(default_factory=Layout)
  weight_format: WeightFormat | None = None
  kv_dtype: str | None = None

  def load(self, replicas: int) -> dict[str, Any]:
    """One replica's load: the workload and its share of the fleet's arrivals."""
    return dict(prompt_tokens=self.prompt_tokens, output_tokens=self.output_tokens,
                arrival_rate=self.arrival_rate_per_s / replicas, window_s=self.window_s,
                prefill_batch=self.prefill_batch)

  def targets(self, replicas: int) -> dict[str, float | None]:
    """One replica's targets: the fleet's aggregate rate split over the replicas."""
    aggregate = self.aggregate_tokens_per_s
    return dict(token_gap_s=self.token_gap_s, ttft_s=self.ttft_s,
                aggregate_tokens_per_s=None if aggregate is None else aggregate / replicas)


def model_inputs(spec: ModelSpec, device: Accelerator, *, prompt_tokens: int, output_tokens: int,
                 context: int | None, what_ifs: list[str],
                 **options: Any) -> requests.ServingInputs:
  """`multichip.model_inputs` with each sequence's K/V reserved for `context` tokens
  (default prompt + outputs), labelled a what-if when `what_ifs` replaced datasheet
  figures.

  Raises:
    InputError: a request beyond the model's context, or a `context` shorter than it.
  """
  needed, limit = prompt_tokens + output_tokens - 1, spec.max_position_embeddings
  if isinstance(limit, int) and needed > limit:
    raise errors.InputError(
        f"prompt_tokens={prompt_tokens} with output_tokens={output_tokens} needs {needed} "
        f"positions: beyond {spec.name}'s context (max_position_embeddings = {limit}).",
        field="prompt_tokens")
  if context is not None and context < needed:
    raise errors.InputError(
        f"context={context} is not allowed: it must be >= "
        f"prompt_tokens + output_tokens - 1 = {needed}.", field="context")
  inputs = multichip.model_inputs(
      spec, device, prompt_tokens=prompt_tokens,
      output_tokens=output_tokens if context is None else context - prompt_tokens, **options)
  return dataclasses.replace(inputs, label=inputs.label + (" (what-if)" if what_ifs else ""),
                             memory={**inputs.memory, "what_if": what_ifs})


def with_profile_ceilings(model: StepModel,
                          inputs: requests.ServingInputs) -> requests.ServingInputs:
  """The inputs' label naming the profile's measured ceilings its rows scale."""
  if model.ceilings is None:
    return inputs
  bw, flops = model.scaled_ceilings(inputs.BW, inputs.F)
  sizes = ", ".join(inputs.label.split(", ")[:2])
  return dataclasses.replace(
      inputs, label=f"{sizes}, the profile's ceilings {bw / 1e9:.3g} "
      f"GB/s, {flops / 1e12:.3g} TFLOP/s")


def kv_link(device: Accelerator | None) -> tuple[float | None, str]:
  """The per-chip network a prefill pool's K/V crosses (`accelerators.kv_transfer_link`);
  None (the transfer assumed free) for raw numbers."""
  if device is None:
    return None, "raw numbers: no network figure, K/V transfer assumed free"
  return accelerators.kv_transfer_link(device)


def pools(model: StepModel, inputs: requests.ServingInputs, question: Question,
          device: Accelerator | None) -> dict[str, Any]:
  """Split prefill/decode pools against one shared pool at the fleet's rate, the K/V
  crossing `device`'s network (`kv_link`)."""
  link, note = kv_link(device)
  return pools_lib.compare(model, inputs, prompt_tokens=question.prompt_tokens,
                           output_tokens=question.output_tokens,
                           arrival_rate=question.arrival_rate_per_s, ttft_s=question.ttft_s,
                           token_gap_s=question.token_gap_s, window_s=question.window_s,
                           kv_link_bytes_per_s=link, kv_link_note=note)


def _rows(model: StepModel, inputs: requests.ServingInputs,
          question: Question) -> list[dict[str, Any]]:
  """One row per batch, with its elasticities and the input that moves its step most."""
  batches, load = question.batch_sizes, question.load(inputs.replicas)
  rows = requests.rows(model, inputs, batches, **load)
  context = decision_lib.mean_context(inputs, question.prompt_tokens, question.output_tokens)
  kv = inputs.k if inputs.grows else inputs.kv_per_sequence_bytes
  for row, values in zip(
      rows,
      elasticity.row_elasticities(model, batches, N=inputs.N, q=inputs.q, T=context, k=kv,
                                  BW=inputs.BW, F=inputs.F,
                                  N_act=None if inputs.N_act == inputs.N else inputs.N_act,
                                  L=inputs.layers)):
    row["elasticities"], row["moved_by"] = values, elasticity.moved_by(values)
  return rows


def decide(model: StepModel, inputs: requests.ServingInputs, question: Question) -> dict[str, Any]:
  """The decision (`decision.decide`) at one replica's load and targets."""
  return decision_lib.decide(model, inputs, **question.targets(inputs.replicas),
                             **question.load(inputs.replicas), scheduler=question.scheduler,
                             token_budget=question.token_budget)


def percentiles(replica_: replica.Replica, question: Question, num_requests: int,
                scheduler: str = "iteration") -> dict[str, Any]:
  """TTFT/TPOT/ITL percentiles of `num_requests` simulated on a replica at its share of
  the fleet's load (`replica_` running at most the decided number, with the decided
  scheduler and budget)."""
  return percentiles_lib.simulated_percentiles(
      replica_, arrival_rate=question.arrival_rate_per_s / question.layout.dp,
      prompt_tokens=question.prompt_tokens, output_tokens=question.output_tokens,
      ttft_s=question.ttft_s, token_gap_s=question.token_gap_s, num_requests=num_requests,
      scheduler=scheduler)


def result(model: StepModel, inputs: requests.ServingInputs, question: Question) -> dict[str, Any]:
  """The rows with their elasticities, the decision and the crossovers, as the JSON."""
  load, targets = question.load(inputs.replicas), question.targets(inputs.replicas)
  decision = decide(model, inputs, question)
  fmt = question.weight_format
  return {
      "kind": model.kind, "inputs": {
          "label": inputs.label, "model": question.model, "accelerator": question.accelerator,
          "prompt_tokens": question.prompt_tokens, "output_tokens": question.output_tokens,
          "batch_sizes": question.batch_sizes, "arrival_rate_per_s": question.arrival_rate_per_s,
          "batching_window_s": question.window_s,
          "arrival_rate_per_replica_s": load["arrival_rate"], "layout": question.layout.as_dict(),
          "prefill_batch": question.prefill_batch, "ttft_target_s": targets["ttft_s"],
          "scheduler": question.scheduler, "token_budget": question.token_budget,
          "token_gap_target_s": targets["token_gap_s"],
          "aggregate_target_tokens_per_s": question.aggregate_tokens_per_s,
          "aggregate_target_per_replica_tokens_per_s": targets["aggregate_tokens_per_s"], "si": {
              "N": inputs.N, "N_act": inputs.N_act, "q": inputs.q, "k": inputs.k,
              "kv_per_sequence_bytes": inputs.kv_per_sequence_bytes, "BW": inputs.BW, "F": inputs.F,
              "layers": inputs.layers
          }, "memory": inputs.memory, "max_batch_in_memory": inputs.max_batch_in_memory,
          "weight_dtype": fmt.dtype if fmt else None,
          "weight_format": fmt.describe() if fmt else None, "kv_dtype": question.kv_dtype
      }, "units": {
          **requests.UNITS, **requests.LAYOUT_UNITS, "elasticities": "d ln(step_s) / d ln(input)",
          "max_arrival_rate_per_s": "requests/s"
      }, "assumptions": list(model.assumptions) + [
          "prefill: analytic bound with causal attention (lower triangle, softmax omitted), "
          "weights read once, K/V written",
          "rows: a static batch of B requests (all B prompts prefilled together, then "
          "G - 1 decode steps at contexts P+1 .. P+G-1)",
          "rows' TTFT: " + queueing.MODEL + "; a one-prompt prefill on arrival; their token "
          "gap: decode steps stretched by 1/(1 - lam*D)",
          "decision: the load model (" + load_model.MODEL + "); prompts join the running "
          "iterations as they arrive (prefill_batch applies to the rows only)"
      ] + multichip.assumptions(inputs), "requests": _rows(model, inputs, question),
      "decision": decision, "elasticities": decision.get("elasticities"),
      "prefill_decode": pools_lib.crossovers(model, inputs, prompt_tokens=question.prompt_tokens,
                                             output_tokens=question.output_tokens)
  }


def frontier(model: StepModel, inputs: requests.ServingInputs, question: Question,
             decision: dict[str, Any]) -> dict[str, Any]:
  """The rate frontier around the decision: the swept batches plus the decision's and the
  memory limit (`decision_study.frontier_batches`)."""
  return decision_lib.frontier(
      model, inputs, decision_study.frontier_batches(question.batch_sizes, decision, inputs),
      prompt_tokens=question.prompt_tokens, output_tokens=question.output_tokens)
