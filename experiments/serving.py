"""The serving decision: how many sequences to run, and how much load one replica takes.

For requests of --prompt_tokens and --output_tokens, it prints one row per batch (a
static batch: prefill, TTFT, token gap, end-to-end latency, both rates, and the input
that moves the step most) and the decision from the one load model: the number of
running sequences (max_running, for the engine) and the scheduling with the largest max
rate meeting --token_gap_ms (mean, and the p99 inter-token gap) and --ttft_ms (p90)
within memory (weights + paged K/V reserved for the whole request + workspace), that
max rate (it does not depend on --arrival_rate), what binds it, the rate its slots fill
at, and at --arrival_rate (Poisson, requests/s) the operating point: an analytic bound, or
with --profile or --engine=NAME (its profile, scheduler defaults, memory rule) a prediction.

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

JSON keys: those of `jaxroof.serving.serving_result` (kind, inputs, units,
assumptions, requests, decision, elasticities, prefill_decode, pools), and percentiles
(with --simulate_requests) and peer (with --compare_peer).
"""

from __future__ import annotations

from absl import flags
from absl import logging

from experiments import _cli
from experiments import _engine_flags
from experiments import _layout_flags
from experiments import _model_flags
from experiments import _model_notes
from experiments import _serving_flags
from jaxroof import errors
from jaxroof import files
from jaxroof.report import accuracy
from jaxroof.report import serving_lines
from jaxroof.serving import engine_serving
from jaxroof.serving import peer
from jaxroof.serving import raw_inputs
from jaxroof.serving import requests
from jaxroof.serving import serving_result
from jaxroof.specs import models
from jaxroof.specs import parameters
from jaxroof.symbolic.step_model import StepModel

_cli.key_flags(*_cli.MODEL_KEYS, "prompt_tokens", "output_tokens", "token_gap_ms", "ttft_ms",
               "arrival_rate", "aggregate_tokens_per_s", "tp", "pp", "ep", "dp", "engine")

# A shipped model on an accelerator, or batch_sweep's raw numbers; either with a profile.
_SHARED = _model_flags.define("model", "accelerator", "accelerator_file", "weight_dtype",
                              "kv_dtype", "block_size", "workspace_fraction", "group_size",
                              *_model_flags.COST, *_model_flags.RAW, "profile", "what_if", "engine")
_MODEL, _ACCELERATOR = _SHARED.model, _SHARED.accelerator
_MODEL_ONLY = (_SHARED.accelerator_file, _SHARED.weight_dtype, _SHARED.kv_dtype, _SHARED.block_size,
               _SHARED.workspace_fraction, _SHARED.group_size)
_CONTEXT = flags.DEFINE_integer(
    "context", None, "With --model: tokens each sequence may hold, reserved up front in the "
    "memory fit (default prompt + outputs). >= prompt_tokens + output_tokens - 1.")
_MEMORY_GB = flags.DEFINE_float(
    "memory_gb", None, "Raw numbers: device memory, GB, for the memory fit (10% kept as "
    "workspace; omit: memory does not bind); with --model a what-if on the datasheet. > 0.")
# Outputs.
_COMPARE_PEER = flags.DEFINE_enum(
    "compare_peer", None, ["llm_viewer"], "Put the rows beside a peer's published analysis "
    "(llm_viewer: Llama-2-7B, A100, prompt 1024, 128 outputs).")
_SIMULATE_REQUESTS = flags.DEFINE_integer(
    "simulate_requests", 0, "With --model and --arrival_rate: simulate this many requests "
    "at the decision's load (iteration-level batching, at most the decided batch running) "
    "for TTFT/TPOT/ITL percentiles beside the means. 0 skips it. In [0, 100,000].", lower_bound=0,
    upper_bound=100_000)
_JSON_OUT = flags.DEFINE_string("json_out", None, "Write the result as JSON here.")
_PLOT_OUT = flags.DEFINE_string("plot_out", None, "Write the frontier PNG here.")

_cli.require_positive(_MEMORY_GB, "GB")

_RAW_FLAGS = (_SHARED.weights_gb, _SHARED.bytes_per_weight, _SHARED.kv_gb_per_seq,
              _SHARED.kv_bytes_per_token)


def _check_flags() -> None:
  """Flag combinations, as one-line errors."""
  _model_flags.check_model_or_raw(_SHARED, model_only=_MODEL_ONLY, raw=_RAW_FLAGS)
  if _MODEL.value is None and _CONTEXT.value is not None:
    raise errors.InputError("--context applies only with --model.")
  if _MODEL.value is None and _layout_flags.layout().chips > 1:
    raise errors.InputError("--tp/--pp/--ep/--dp/--chips apply only with --model and "
                            "--accelerator.")
  if _layout_flags.layout().microbatches > 1:
    raise errors.InputError(
        f"--microbatches={_layout_flags.layout().microbatches} is not allowed here: serving's load "
        "model mixes each prompt into one microbatch's iterations; simulate --microbatches runs "
        "a plan's microbatches as virtual engines, and plan searches them.")
  _serving_flags.check()


def _inputs(question: serving_result.Question) -> requests.ServingInputs:
  """The model's inputs on the device, or the raw numbers', for the question's workload."""
  prompt, outputs = question.prompt_tokens, question.output_tokens
  if _MODEL.value is None:
    memory_gb = _MEMORY_GB.value
    return raw_inputs.serving_inputs(
        **_model_flags.raw_numbers(_SHARED), prompt_tokens=prompt, output_tokens=outputs,
        memory_capacity_bytes=None if memory_gb is None else memory_gb * 1e9,
        layers=_SHARED.layers.value)
  device = _model_flags.what_if_device(_SHARED, _MEMORY_GB)
  return serving_result.model_inputs(models.load_model(_MODEL.value), device, prompt_tokens=prompt,
                                     output_tokens=outputs, context=_CONTEXT.value,
                                     what_ifs=_model_flags.what_ifs(device),
                                     layout=_layout_flags.layout(_ACCELERATOR.value),
                                     group_size=_SHARED.group_size.value,
                                     **_model_flags.model_options(_SHARED))


def _question() -> serving_result.Question:
  """The question the flags ask, with the names given."""
  spec = models.load_model(_MODEL.value) if _MODEL.value else None
  return _serving_flags.question(
      model=_MODEL.value, accelerator=_ACCELERATOR.value,
      layout=_layout_flags.layout(_ACCELERATOR.value), weight_format=spec and
      parameters.weight_format(spec, _SHARED.weight_dtype.value, _SHARED.group_size.value),
      kv_dtype=_SHARED.kv_dtype.value if spec else None)


def _percentiles(model: StepModel, decision: dict, question: serving_result.Question, d) -> dict:
  """The simulator at the decision: percentiles the analytic means cannot give."""
  if _MODEL.value is None or question.arrival_rate_per_s <= 0 or not decision.get("batch"):
    raise errors.InputError("--simulate_requests needs --model, --arrival_rate > 0 and a "
                            "feasible decision (a batch that meets the targets).")
  replica_ = _model_flags.model_replica(_SHARED, _model_flags.what_if_device(_SHARED, _MEMORY_GB),
                                        step_model=model,
                                        context=question.prompt_tokens + question.output_tokens,
                                        max_running=int(decision["batch"]), layout=question.layout,
                                        token_budget=decision.get("token_budget") or 512,
                                        reservation=d and d.settings)
  return serving_result.percentiles(replica_, question, _SIMULATE_REQUESTS.value,
                                    scheduler=decision.get("scheduler") or "iteration")


def main(argv: list[str]) -> None:
  del argv  # Unused.
  _check_flags()
  question = _question()
  prompt, outputs = question.prompt_tokens, question.output_tokens
  if _COMPARE_PEER.value:
    peer.check_case(_MODEL.value, _ACCELERATOR.value, prompt, outputs)
  model = _model_flags.step_model(_SHARED, accelerator=_ACCELERATOR.value,
                                  use_profile_ceilings=not _model_flags.figures_given(_SHARED))
  spec = models.load_model(_MODEL.value) if _MODEL.value else None
  d = _engine_flags.drive(_SHARED.engine, spec and _model_flags.device(_SHARED), question.layout)
  bound_inputs, asked = serving_result.with_profile_ceilings(model, _inputs(question)), question
  inputs, question = engine_serving.prepare(d, bound_inputs, asked, spec)  # As given: bound.
  result = serving_result.result(model, inputs, question)
  decision = result["decision"]
  if question.arrival_rate_per_s > 0 and question.ttft_s is not None:
    result["pools"] = serving_result.pools(model, inputs, question,
                                           _model_flags.device(_SHARED) if _MODEL.value else None)
  if _SIMULATE_REQUESTS.value:
    result["percentiles"] = _percentiles(model, decision, question, d)
  if _COMPARE_PEER.value:
    result["peer"] = peer.compare(
        requests.rows(model, inputs, question.batch_sizes, prompt_tokens=prompt,
                      output_tokens=outputs))
  if model.kind == "calibrated":  # The error travels with every calibrated number.
    serving_lines.annotate_calibrated(result, model.provenance)
    if d is not None:  # The same question asked of the bound, beside every figure.
      engine_serving.serving_beside(result, d, asked, bound_inputs)
    elif accuracy.bound_first(model.provenance):
      result["bound_decision"] = serving_result.decide(StepModel.bound(), inputs, question)
      print("\n".join(serving_lines.bound_first_lines(result["bound_decision"])))
  print("\n".join(serving_lines.lines(result)))
  if spec is not None:
    _model_notes.say(spec)  # A context beyond the model's is refused above.
    result.update(_model_notes.json_fields(spec))
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, result)
    logging.info("wrote %s", _JSON_OUT.value)
  if _PLOT_OUT.value:
    frontier = serving_result.frontier(model, inputs, question, decision)
    serving_lines.plot_frontier(frontier, model.kind, inputs, question, decision, _PLOT_OUT.value)
    logging.info("wrote %s", _PLOT_OUT.value)


if __name__ == "__main__":
  _cli.run(main)
