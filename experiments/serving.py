"""The serving decision: concurrency from token gaps, TTFT under load and memory.

For requests of --prompt_tokens and --output_tokens arriving at --arrival_rate
(Poisson, requests/s), it prints one row per batch (prefill, TTFT, token gap,
end-to-end latency, both rates, and the input that moves the step most) and
the decision: the largest decode concurrency whose mean token gap meets
--token_gap_ms and that fits in memory (weights + paged K/V reserved for the
whole request + workspace), what binds it (token_gap, memory, ttft, compute),
its rates, the mean TTFT at the load (M/D/1) and the load limit. Every number
is an analytic bound unless --profile makes it a calibrated prediction.

Give a model and an accelerator,

  python -m experiments.serving --model=llama-3-8b --accelerator=h100-sxm \
      --prompt_tokens=2048 --output_tokens=256 --token_gap_ms=20 --ttft_ms=500 \
      --arrival_rate=5 --json_out=/tmp/serving.json --plot_out=/tmp/serving.png

On several chips (--tp --pp --ep, and --dp replicas; or a slice such as
--accelerator=8xh100-sxm) each replica's step is one chip's traffic along a
token's path plus the layout's communication, the memory fit is the busiest
chip's, --arrival_rate is the fleet's (split evenly over the replicas), and
the decision adds the fleet's rate and load limit:

  python -m experiments.serving --model=llama-3.1-70b --accelerator=h100-sxm \
      --tp=4 --dp=2 --token_gap_ms=30 --arrival_rate=4

or batch_sweep's raw numbers (defaults: the lesson's example, whose 12 ms gap
gives batch 32 and 9 ms gives 8):

  python -m experiments.serving --token_gap_ms=12

JSON keys: kind, inputs, units, assumptions, requests (rows: batch, prefill_s,
decode_s, ttft_s, mean_token_gap_s, e2e_s, aggregate_tokens_per_s,
per_sequence_tokens_per_s, status, elasticities, moved_by), decision (batch,
binds, step_s, aggregate_tokens_per_s, per_sequence_tokens_per_s, ttft_s,
max_arrival_rate_per_s, status, reason, ...), elasticities (at the decision),
prefill_decode (crossovers), pools (with --arrival_rate and --ttft_ms), and
peer (with --compare_peer).
"""

from __future__ import annotations

import dataclasses

from absl import flags
from absl import logging

from experiments import _cli
from experiments import _layout_flags
from experiments import _model_flags
from experiments import _model_notes
from jaxroof import errors
from jaxroof import files
from jaxroof.report import accuracy
from jaxroof.report import serving_lines
from jaxroof.report import serving_section
from jaxroof.serving import decision as decision_lib
from jaxroof.serving import elasticity
from jaxroof.serving import kv_link
from jaxroof.serving import multichip
from jaxroof.serving import peer
from jaxroof.serving import percentiles
from jaxroof.serving import pools
from jaxroof.serving import queueing
from jaxroof.serving import raw_inputs
from jaxroof.serving import replica
from jaxroof.serving import requests
from jaxroof.specs import models
from jaxroof.specs import parameters
from jaxroof.specs import what_if
from jaxroof.symbolic.step_model import StepModel

# A shipped model on an accelerator, or batch_sweep's raw numbers; either with a profile.
_SHARED = _model_flags.define(
    "model", "accelerator", "accelerator_file", "weight_dtype", "kv_dtype", "block_size",
    "workspace_fraction", "group_size", *_model_flags.COST, *_model_flags.RAW, "profile",
    "what_if")
_MODEL, _ACCELERATOR = _SHARED.model, _SHARED.accelerator
_MODEL_ONLY = (_SHARED.accelerator_file, _SHARED.weight_dtype, _SHARED.kv_dtype,
               _SHARED.block_size, _SHARED.workspace_fraction, _SHARED.group_size)
_CONTEXT = flags.DEFINE_integer(
    "context", None, "With --model: tokens each sequence may hold, reserved up front in the "
    "memory fit (default prompt + outputs). >= prompt_tokens + output_tokens - 1.")
_MEMORY_GB = flags.DEFINE_float(
    "memory_gb", None, "Raw numbers: device memory, GB, for the memory fit (10% kept as "
    "workspace; omit: memory does not bind); with --model a what-if on the datasheet. > 0.")
# The workload.
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
# The targets.
_TTFT_MS = flags.DEFINE_float("ttft_ms", None, "Mean time-to-first-token target, ms. > 0.")
_TOKEN_GAP_MS = flags.DEFINE_float("token_gap_ms", None, "Mean gap between a user's tokens "
                                   "(ITL) target, ms. > 0. Required.")
_AGGREGATE = flags.DEFINE_float("aggregate_tokens_per_s", None,
                                "Optional aggregate-rate target, tokens/s. > 0.")
# Outputs.
_COMPARE_PEER = flags.DEFINE_enum(
    "compare_peer", None, ["llm_viewer"], "Put the rows beside a peer's published analysis "
    "(llm_viewer: Llama-2-7B, A100, prompt 1024, 128 outputs).")
_SIMULATE_REQUESTS = flags.DEFINE_integer(
    "simulate_requests", 0, "With --model and --arrival_rate: simulate this many requests "
    "at the decision's load (iteration-level batching, at most the decided batch running) "
    "for TTFT/TPOT/ITL percentiles beside the means. 0 skips it. In [0, 100,000].",
    lower_bound=0, upper_bound=100_000)
_JSON_OUT = flags.DEFINE_string("json_out", None, "Write the result as JSON here.")
_PLOT_OUT = flags.DEFINE_string("plot_out", None, "Write the frontier PNG here.")

for _holder, _unit in ((_MEMORY_GB, "GB"), (_TTFT_MS, "ms"), (_TOKEN_GAP_MS, "ms"),
                       (_AGGREGATE, "tokens/s")):
  _cli.require_positive(_holder, _unit)
_cli.require_positive_int_list(_BATCH_SIZES, "sequences")
for _holder, _unit in ((_ARRIVAL_RATE, "requests/s"), (_BATCHING_WINDOW_MS, "ms")):
  flags.register_validator(_holder.name, lambda v: v >= 0 and v != float("inf"),
                           message=f"must be a finite number >= 0 ({_unit})")

_RAW_FLAGS = (_SHARED.weights_gb, _SHARED.bytes_per_weight, _SHARED.kv_gb_per_seq,
              _SHARED.kv_bytes_per_token)


def _check_flags() -> None:
  """Flag combinations, as one-line errors."""
  present = lambda holders: any(flags.FLAGS[h.name].present for h in holders)  # noqa: E731
  device = _ACCELERATOR.value is not None or bool(_SHARED.accelerator_file.value)
  if (_MODEL.value is None) == device:
    raise errors.InputError("--model and --accelerator (or --accelerator_file) go together.")
  if _MODEL.value is None and present(_MODEL_ONLY):
    raise errors.InputError("--accelerator_file, --weight_dtype, --kv_dtype, --block_size, "
                            "--workspace_fraction and --group_size apply only with --model.")
  if _MODEL.value is not None and present(_RAW_FLAGS):
    raise errors.InputError("--model replaces the raw-number flags (--weights_gb, "
                            "--bytes_per_weight, --kv_*); with it --bandwidth_tbps, --tflops "
                            "and --memory_gb are what-ifs on the datasheet.")
  if _MODEL.value is None and _CONTEXT.value is not None:
    raise errors.InputError("--context applies only with --model.")
  if _MODEL.value is None and _layout_flags.layout().chips > 1:
    raise errors.InputError("--tp/--pp/--ep/--dp/--chips apply only with --model and "
                            "--accelerator.")
  if _SHARED.kv_gb_per_seq.value is not None and _SHARED.kv_bytes_per_token.value is not None:
    raise errors.InputError("give --kv_gb_per_seq or --kv_bytes_per_token, not both.")
  if _OUTPUT_TOKENS.value < 2 or _PROMPT_TOKENS.value < 1:
    raise errors.InputError(f"--prompt_tokens={_PROMPT_TOKENS.value} with --output_tokens="
                            f"{_OUTPUT_TOKENS.value} is not allowed: a prompt needs >= 1 token "
                            "and a request >= 2 outputs (one output has no token gap).")
  _cli.require_flags(_TOKEN_GAP_MS)


def _device():
  """The --accelerator with --bandwidth_tbps, --tflops and --memory_gb as what-ifs."""
  given = _model_flags.given
  return what_if.with_overrides(
      _model_flags.device(_SHARED, bandwidth_tbps=given(_SHARED.bandwidth_tbps),
                          tflops=given(_SHARED.tflops)), memory_gb=given(_MEMORY_GB))


def _inputs() -> requests.ServingInputs:
  prompt, outputs = _PROMPT_TOKENS.value, _OUTPUT_TOKENS.value
  if _MODEL.value is None:
    tflops = _SHARED.tflops.value
    return raw_inputs.serving_inputs(
        weight_bytes=_SHARED.weights_gb.value * 1e9,
        bytes_per_weight=_SHARED.bytes_per_weight.value,
        bandwidth_bytes_per_s=_SHARED.bandwidth_tbps.value * 1e12,
        flops_per_s=None if tflops is None else tflops * 1e12, prompt_tokens=prompt,
        output_tokens=outputs, kv_bytes_per_token=_SHARED.kv_bytes_per_token.value,
        kv_per_sequence_bytes=(None if _SHARED.kv_gb_per_seq.value is None
                               else _SHARED.kv_gb_per_seq.value * 1e9),
        memory_capacity_bytes=None if _MEMORY_GB.value is None else _MEMORY_GB.value * 1e9,
        layers=_SHARED.layers.value)
  spec, device = models.load_model(_MODEL.value), _device()
  limit = spec.max_position_embeddings
  if isinstance(limit, int) and prompt + outputs - 1 > limit:
    raise errors.InputError(
        f"--prompt_tokens={prompt} with --output_tokens={outputs} needs {prompt + outputs - 1} "
        f"positions: beyond {spec.name}'s context (max_position_embeddings = {limit}).")
  if _CONTEXT.value is not None and _CONTEXT.value < prompt + outputs - 1:
    raise errors.InputError(f"--context={_CONTEXT.value} is not allowed: it must be >= "
                            f"prompt_tokens + output_tokens - 1 = {prompt + outputs - 1}.")
  inputs = multichip.model_inputs(
      spec, device, layout=_layout_flags.layout(_ACCELERATOR.value), prompt_tokens=prompt,
      output_tokens=outputs if _CONTEXT.value is None else _CONTEXT.value - prompt,
      weight_dtype=_SHARED.weight_dtype.value, kv_dtype=_SHARED.kv_dtype.value,
      block_size=_SHARED.block_size.value, workspace_fraction=_SHARED.workspace_fraction.value,
      group_size=_SHARED.group_size.value, mla_prefill=_SHARED.mla_prefill.value,
      comm_overlap=_SHARED.comm_overlap.value)
  what_ifs = _model_flags.what_ifs(device)
  return dataclasses.replace(inputs, label=inputs.label + (" (what-if)" if what_ifs else ""),
                             memory={**inputs.memory, "what_if": what_ifs})


def _step_model() -> StepModel:
  scale_given = _MODEL.value is not None or any(
      flags.FLAGS[h.name].present for h in (_SHARED.bandwidth_tbps, _SHARED.tflops))
  return _model_flags.step_model(_SHARED, accelerator=_ACCELERATOR.value,
                                 use_profile_ceilings=not scale_given)


def _percentiles(model: StepModel, decision: dict, load: dict, ttft_s: float | None,
                 gap_s: float) -> dict:
  """The simulator at the decision: percentiles the analytic means cannot give."""
  if _MODEL.value is None or load["arrival_rate"] <= 0 or not decision.get("batch"):
    raise errors.InputError("--simulate_requests needs --model, --arrival_rate > 0 and a "
                            "feasible decision (a batch that meets the targets).")
  prompt, outputs = load["prompt_tokens"], load["output_tokens"]
  replica_ = replica.from_model(
      models.load_model(_MODEL.value), _device(), context=prompt + outputs, step_model=model,
      weight_dtype=_SHARED.weight_dtype.value, kv_dtype=_SHARED.kv_dtype.value,
      block_size=_SHARED.block_size.value, workspace_fraction=_SHARED.workspace_fraction.value,
      max_running=int(decision["batch"]), layout=_layout_flags.layout(_ACCELERATOR.value),
      mla_prefill=_SHARED.mla_prefill.value, comm_overlap=_SHARED.comm_overlap.value)
  return percentiles.simulated_percentiles(
      replica_, arrival_rate=load["arrival_rate"], prompt_tokens=prompt, output_tokens=outputs,
      ttft_s=ttft_s, token_gap_s=gap_s, num_requests=_SIMULATE_REQUESTS.value)


def _with_profile_ceilings(model: StepModel, inputs: requests.ServingInputs
                           ) -> requests.ServingInputs:
  """The inputs' label naming the profile's measured ceilings its rows scale."""
  if model.ceilings is None:
    return inputs
  bw, flops = model.scaled_ceilings(inputs.BW, inputs.F)
  sizes = ", ".join(inputs.label.split(", ")[:2])
  return dataclasses.replace(inputs, label=f"{sizes}, the profile's ceilings {bw / 1e9:.3g} "
                             f"GB/s, {flops / 1e12:.3g} TFLOP/s")


def _result(model: StepModel, inputs: requests.ServingInputs, load: dict, targets: dict,
            batches: list[int]) -> dict:
  """The rows with their elasticities, the decision and the crossovers, as the JSON."""
  prompt, outputs = load["prompt_tokens"], load["output_tokens"]
  rows = requests.rows(model, inputs, batches, **load)
  context = decision_lib._mean_context(inputs, prompt, outputs)
  kv = inputs.k if inputs.grows else inputs.kv_per_sequence_bytes
  for row, values in zip(rows, elasticity.row_elasticities(
      model, batches, N=inputs.N, q=inputs.q, T=context, k=kv, BW=inputs.BW, F=inputs.F,
      N_act=None if inputs.N_act == inputs.N else inputs.N_act, L=inputs.layers)):
    row["elasticities"], row["moved_by"] = values, elasticity.moved_by(values)
  decision = decision_lib.decide(model, inputs, **targets, **load)
  layout = _layout_flags.layout(_ACCELERATOR.value)
  weight_format = (parameters.weight_format(models.load_model(_MODEL.value),
                                            _SHARED.weight_dtype.value, _SHARED.group_size.value)
                   if _MODEL.value else None)
  return {
      "kind": model.kind,
      "inputs": {
          "label": inputs.label, "model": _MODEL.value, "accelerator": _ACCELERATOR.value,
          "prompt_tokens": prompt, "output_tokens": outputs, "batch_sizes": batches,
          "arrival_rate_per_s": _ARRIVAL_RATE.value, "batching_window_s": load["window_s"],
          "arrival_rate_per_replica_s": load["arrival_rate"], "layout": layout.as_dict(),
          "prefill_batch": _PREFILL_BATCH.value, "ttft_target_s": targets["ttft_s"],
          "token_gap_target_s": targets["token_gap_s"],
          "aggregate_target_tokens_per_s": _AGGREGATE.value,
          "aggregate_target_per_replica_tokens_per_s": targets["aggregate_tokens_per_s"],
          "si": {"N": inputs.N, "N_act": inputs.N_act, "q": inputs.q, "k": inputs.k,
                 "kv_per_sequence_bytes": inputs.kv_per_sequence_bytes, "BW": inputs.BW,
                 "F": inputs.F, "layers": inputs.layers},
          "memory": inputs.memory, "max_batch_in_memory": inputs.max_batch_in_memory,
          "weight_dtype": weight_format.dtype if weight_format else None,
          "weight_format": weight_format.describe() if weight_format else None,
          "kv_dtype": _SHARED.kv_dtype.value if _MODEL.value else None},
      "units": {**requests.UNITS, **requests.LAYOUT_UNITS,
                "elasticities": "d ln(step_s) / d ln(input)",
                "max_arrival_rate_per_s": "requests/s"},
      "assumptions": list(model.assumptions) + [
          "prefill: analytic bound with causal attention (lower triangle, softmax omitted), "
          "weights read once, K/V written",
          "rows: a static batch of B requests (all B prompts prefilled together, then "
          "G - 1 decode steps at contexts P+1 .. P+G-1)",
          "TTFT: " + queueing.MODEL + "; a one-prompt prefill on arrival",
          "token gap under load: decode steps stretched by 1/(1 - lam*D)"]
      + multichip.assumptions(inputs),
      "requests": rows, "decision": decision, "elasticities": decision.get("elasticities"),
      "prefill_decode": pools.crossovers(model, inputs, prompt_tokens=prompt,
                                         output_tokens=outputs)}


def main(argv: list[str]) -> None:
  del argv  # Unused.
  _check_flags()
  prompt, outputs = _PROMPT_TOKENS.value, _OUTPUT_TOKENS.value
  if _COMPARE_PEER.value:
    peer.check_case(_MODEL.value, _ACCELERATOR.value, prompt, outputs)
  model = _step_model()
  inputs = _with_profile_ceilings(model, _inputs())
  batches = _cli.int_list(_BATCH_SIZES)
  window_s, gap_s = _BATCHING_WINDOW_MS.value / 1e3, _TOKEN_GAP_MS.value / 1e3
  ttft_s = None if _TTFT_MS.value is None else _TTFT_MS.value / 1e3
  load = dict(prompt_tokens=prompt, output_tokens=outputs,
              arrival_rate=_ARRIVAL_RATE.value / inputs.replicas, window_s=window_s,
              prefill_batch=_PREFILL_BATCH.value)
  targets = dict(token_gap_s=gap_s, ttft_s=ttft_s, aggregate_tokens_per_s=(
      None if _AGGREGATE.value is None else _AGGREGATE.value / inputs.replicas))
  result = _result(model, inputs, load, targets, batches)
  decision = result["decision"]
  if _ARRIVAL_RATE.value > 0 and ttft_s is not None:
    link, link_note = kv_link.kv_link(_model_flags.device(_SHARED) if _MODEL.value else None)
    result["pools"] = pools.compare(model, inputs, prompt_tokens=prompt, output_tokens=outputs,
                                    arrival_rate=_ARRIVAL_RATE.value, ttft_s=ttft_s,
                                    token_gap_s=gap_s, window_s=window_s,
                                    kv_link_bytes_per_s=link, kv_link_note=link_note)
  if _SIMULATE_REQUESTS.value:
    result["percentiles"] = _percentiles(model, decision, load, ttft_s, gap_s)
  if _COMPARE_PEER.value:
    result["peer"] = peer.compare(requests.rows(model, inputs, batches, prompt_tokens=prompt,
                                                output_tokens=outputs))
  if model.kind == "calibrated":  # The error travels with every calibrated number.
    result["profile"] = dict(model.provenance)
    result["accuracy"] = accuracy.fields(model.provenance)
    for row in result["requests"] + [decision]:
      row[accuracy.ROW_FIELD] = model.provenance.get("heldout_median_rel_error")
    if accuracy.bound_first(model.provenance):
      result["bound_decision"] = decision_lib.decide(StepModel.bound(), inputs, **targets,
                                                     **load)
      print("\n".join(serving_lines.bound_first_lines(result["bound_decision"])))
  print("\n".join(serving_lines.lines(result)))
  if _MODEL.value is not None:
    spec = models.load_model(_MODEL.value)
    _model_notes.say(spec)  # A context beyond the model's is refused above.
    result.update(_model_notes.json_fields(spec))
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, result)
    logging.info("wrote %s", _JSON_OUT.value)
  if _PLOT_OUT.value:
    frontier = decision_lib.frontier(
        model, inputs, serving_section.frontier_batches(batches, decision, inputs),
        prompt_tokens=prompt, output_tokens=outputs)
    serving_section.plot_frontier(
        frontier, decision, _PLOT_OUT.value, f"{inputs.label}\nprompt {prompt} + {outputs} "
        "outputs", kind=model.kind, token_gap_s=gap_s, memory_limit=inputs.max_batch_in_memory)
    logging.info("wrote %s", _PLOT_OUT.value)


if __name__ == "__main__":
  _cli.run(main)
