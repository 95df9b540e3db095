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
from jaxroof.measure import profiles
from jaxroof.report import serving_section
from jaxroof.report import accuracy
from jaxroof.report import table
from jaxroof.serving import decision as decision_lib
from jaxroof.serving import elasticity
from jaxroof.serving import multichip
from jaxroof.serving import peer
from jaxroof.serving import pools
from jaxroof.serving import queueing
from jaxroof.serving import percentiles
from jaxroof.serving import replica
from jaxroof.serving import requests
from jaxroof.specs import models
from jaxroof.specs import parameters
from jaxroof.specs import what_if
from jaxroof.symbolic.step_model import StepModel

# The model: a shipped model on an accelerator ...
_SHARED = _model_flags.define("model", "accelerator", "accelerator_file", "weight_dtype",
                              "kv_dtype", "block_size", "workspace_fraction", "group_size",
                              *_model_flags.COST)
_MODEL, _ACCELERATOR = _SHARED.model, _SHARED.accelerator
_WEIGHT_DTYPE, _KV_DTYPE = _SHARED.weight_dtype, _SHARED.kv_dtype
_MODEL_ONLY = (_SHARED.accelerator_file, _SHARED.weight_dtype, _SHARED.kv_dtype,
               _SHARED.block_size, _SHARED.workspace_fraction, _SHARED.group_size)
_CONTEXT = flags.DEFINE_integer(
    "context", None, "With --model: tokens each sequence may hold, reserved up front in the "
    "memory fit (default prompt + outputs). >= prompt_tokens + output_tokens - 1.")
# ... or batch_sweep's raw numbers.
_WEIGHTS_GB = flags.DEFINE_float("weights_gb", 16.0, "Weight bytes read per step, GB. > 0.")
_BYTES_PER_WEIGHT = flags.DEFINE_float("bytes_per_weight", 2.0, "Bytes per weight. > 0.")
_KV_GB_PER_SEQ = flags.DEFINE_float(
    "kv_gb_per_seq", None, "K/V each sequence reads per step, GB, fixed (the lesson's view; "
    "default 0.25 unless --kv_bytes_per_token). > 0.")
_KV_BYTES_PER_TOKEN = flags.DEFINE_float(
    "kv_bytes_per_token", None, "K/V bytes per retained token: the context then grows by "
    "one per decode step. > 0.")
_BANDWIDTH_TBPS = flags.DEFINE_float("bandwidth_tbps", 2.0, "Memory bandwidth, TB/s. > 0.")
_TFLOPS = flags.DEFINE_float("tflops", None, "FLOP rate, TFLOP/s. > 0. Omit for memory only.")
_MEMORY_GB = flags.DEFINE_float(
    "memory_gb", None, "Raw numbers: device memory, GB, for the memory fit (10% kept as "
    "workspace). > 0. Omit: memory does not bind.")
_LAYERS = flags.DEFINE_integer("layers", None, "Raw numbers: blocks, for a profile's "
                               "per-layer cost. >= 1.", lower_bound=1)
# ... or a calibrated profile (with either of the above).
_PROFILE = flags.DEFINE_string(
    "profile", None, "Profile JSON from `experiments.calibrate`: decode steps become "
    "calibrated predictions (prefill stays the bound at the profile's ceilings).")
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
_TOKEN_GAP_MS = flags.DEFINE_float("token_gap_ms", None,
                                   "Mean gap between a user's tokens (ITL) target, ms. > 0. Required.")
_AGGREGATE = flags.DEFINE_float("aggregate_tokens_per_s", None,
                                "Optional aggregate-rate target, tokens/s. > 0.")
# Outputs.
_COMPARE_PEER = flags.DEFINE_enum(
    "compare_peer", None, ["llm_viewer"], "Put the rows beside a peer's published analysis "
    "(llm_viewer: Llama-2-7B, A100, prompt 1024, 128 outputs).")
_WHAT_IF = flags.DEFINE_bool(
    "what_if", False, "Allow --profile fitted on another device kind than --accelerator "
    "(its factors applied as a what-if).")
_SIMULATE_REQUESTS = flags.DEFINE_integer(
    "simulate_requests", 0, "With --model and --arrival_rate: simulate this many requests "
    "at the decision's load (iteration-level batching, at most the decided batch running) "
    "for TTFT/TPOT/ITL percentiles beside the means. 0 skips it. In [0, 100,000].",
    lower_bound=0, upper_bound=100_000)
_JSON_OUT = flags.DEFINE_string("json_out", None, "Write the result as JSON here.")
_PLOT_OUT = flags.DEFINE_string("plot_out", None, "Write the frontier PNG here.")

for _holder, _unit in ((_WEIGHTS_GB, "GB"), (_BYTES_PER_WEIGHT, "bytes/weight"),
                       (_KV_GB_PER_SEQ, "GB"), (_KV_BYTES_PER_TOKEN, "bytes/token"),
                       (_BANDWIDTH_TBPS, "TB/s"), (_TFLOPS, "TFLOP/s"), (_MEMORY_GB, "GB"),
                       (_TTFT_MS, "ms"), (_TOKEN_GAP_MS, "ms"), (_AGGREGATE, "tokens/s")):
  _cli.require_positive(_holder, _unit)
_cli.require_positive_int_list(_BATCH_SIZES, "sequences")
flags.register_validator(_ARRIVAL_RATE.name, lambda v: v >= 0 and v != float("inf"),
                         message="must be a finite number >= 0 (requests/s)")
flags.register_validator(_BATCHING_WINDOW_MS.name, lambda v: v >= 0 and v != float("inf"),
                         message="must be a finite number >= 0 (ms)")

_RAW_FLAGS = (_WEIGHTS_GB, _BYTES_PER_WEIGHT, _KV_GB_PER_SEQ, _KV_BYTES_PER_TOKEN)
_WHAT_IF_FLAGS = (_BANDWIDTH_TBPS, _TFLOPS, _MEMORY_GB)  # With --model: datasheet replaced.


def _given(holder: flags.FlagHolder) -> float | None:
  return holder.value if flags.FLAGS[holder.name].present else None


def _weight_format() -> parameters.WeightFormat:
  """How --weight_dtype stores the --model's weights ("published": its own format)."""
  return parameters.weight_format(models.load_model(_MODEL.value), _WEIGHT_DTYPE.value,
                                  _SHARED.group_size.value)


def _check_flags() -> None:
  """Flag combinations, as one-line errors."""
  device = _ACCELERATOR.value is not None or bool(_SHARED.accelerator_file.value)
  if (_MODEL.value is None) == device:
    raise errors.InputError("--model and --accelerator (or --accelerator_file) go together.")
  if _MODEL.value is None and any(flags.FLAGS[h.name].present for h in _MODEL_ONLY):
    raise errors.InputError("--accelerator_file, --weight_dtype, --kv_dtype, --block_size, "
                            "--workspace_fraction and --group_size apply only with --model.")
  if _MODEL.value is not None and any(flags.FLAGS[h.name].present for h in _RAW_FLAGS):
    raise errors.InputError("--model replaces the raw-number flags (--weights_gb, "
                            "--bytes_per_weight, --kv_*); with it --bandwidth_tbps, --tflops "
                            "and --memory_gb are what-ifs on the datasheet.")
  if _MODEL.value is None and _CONTEXT.value is not None:
    raise errors.InputError("--context applies only with --model.")
  if _MODEL.value is None and _layout_flags.layout().chips > 1:
    raise errors.InputError("--tp/--pp/--ep/--dp/--chips apply only with --model and "
                            "--accelerator.")
  if _KV_GB_PER_SEQ.value is not None and _KV_BYTES_PER_TOKEN.value is not None:
    raise errors.InputError("give --kv_gb_per_seq or --kv_bytes_per_token, not both.")
  for holder in (_PROMPT_TOKENS, _OUTPUT_TOKENS):
    if holder.value < 1:
      raise errors.InputError(f"--{holder.name}={holder.value} is not allowed: it must be >= 1.")
  if _OUTPUT_TOKENS.value < 2:
    raise errors.InputError(f"--output_tokens={_OUTPUT_TOKENS.value} is not allowed: it must "
                            "be >= 2 (one output has no token gap).")
  _cli.require_flags(_TOKEN_GAP_MS)


def _inputs() -> requests.ServingInputs:
  prompt, outputs = _PROMPT_TOKENS.value, _OUTPUT_TOKENS.value
  if _MODEL.value is not None:
    spec = models.load_model(_MODEL.value)
    device = what_if.with_overrides(
        _model_flags.device(_SHARED, bandwidth_tbps=_given(_BANDWIDTH_TBPS),
                            tflops=_given(_TFLOPS)), memory_gb=_given(_MEMORY_GB))
    limit = spec.max_position_embeddings
    if isinstance(limit, int) and prompt + outputs - 1 > limit:
      raise errors.InputError(
          f"--prompt_tokens={prompt} with --output_tokens={outputs} needs "
          f"{prompt + outputs - 1} positions: beyond {spec.name}'s context "
          f"(max_position_embeddings = {limit}).")
    reserve = outputs
    if _CONTEXT.value is not None:
      if _CONTEXT.value < prompt + outputs - 1:
        raise errors.InputError(
            f"--context={_CONTEXT.value} is not allowed: it must be >= prompt_tokens + "
            f"output_tokens - 1 = {prompt + outputs - 1}.")
      reserve = _CONTEXT.value - prompt
    inputs = multichip.model_inputs(
        spec, device, layout=_layout_flags.layout(_ACCELERATOR.value), prompt_tokens=prompt,
        output_tokens=reserve, weight_dtype=_WEIGHT_DTYPE.value, kv_dtype=_KV_DTYPE.value,
        block_size=_SHARED.block_size.value,
        workspace_fraction=_SHARED.workspace_fraction.value,
        group_size=_SHARED.group_size.value, mla_prefill=_SHARED.mla_prefill.value,
        comm_overlap=_SHARED.comm_overlap.value)
    what_ifs = [d for d in device.decisions if d.startswith("what-if")]
    return dataclasses.replace(inputs, label=inputs.label + (" (what-if)" if what_ifs else ""),
                               memory={**inputs.memory, "what_if": what_ifs})
  weight_bytes = _WEIGHTS_GB.value * 1e9
  n = weight_bytes / _BYTES_PER_WEIGHT.value
  fixed = None
  per_token = _KV_BYTES_PER_TOKEN.value
  if per_token is None:
    fixed = (0.25 if _KV_GB_PER_SEQ.value is None else _KV_GB_PER_SEQ.value) * 1e9
  max_batch = None
  memory = {}
  if _MEMORY_GB.value is not None:
    per_seq = fixed if fixed is not None else per_token * (prompt + outputs)
    usable = _MEMORY_GB.value * 1e9 * 0.9 - weight_bytes
    max_batch = max(int(usable // per_seq), 0)
    memory = {"memory_capacity_bytes": _MEMORY_GB.value * 1e9, "workspace_fraction": 0.1,
              "usable_memory_bytes": usable, "kv_allocated_bytes_per_sequence": per_seq}
  return requests.ServingInputs(
      N=n, N_act=n, q=_BYTES_PER_WEIGHT.value, k=per_token or 0.0,
      BW=_BANDWIDTH_TBPS.value * 1e12, F=None if _TFLOPS.value is None else _TFLOPS.value * 1e12,
      kv_per_sequence_bytes=fixed, layers=_LAYERS.value, max_batch_in_memory=max_batch,
      label=f"{_WEIGHTS_GB.value:g} GB weights ({_BYTES_PER_WEIGHT.value:g} B/weight), "
      + (f"{fixed / 1e9:g} GB K/V per sequence" if fixed is not None
         else f"{per_token:g} B K/V per token")
      + f", {_BANDWIDTH_TBPS.value:g} TB/s"
      + (f", {_TFLOPS.value:g} TFLOP/s" if _TFLOPS.value is not None else ", memory only"),
      memory=memory)


def _step_model() -> StepModel:
  if _PROFILE.value is None:
    return StepModel.bound(_SHARED.bound.value)
  scale_given = _MODEL.value is not None or any(
      flags.FLAGS[h.name].present for h in (_BANDWIDTH_TBPS, _TFLOPS))
  prof = profiles.load_profile(_PROFILE.value)
  notes = (profiles.check_applies(prof, _ACCELERATOR.value, what_if=_WHAT_IF.value)
           if _ACCELERATOR.value else [])
  return profiles.step_model(prof, use_profile_ceilings=not scale_given, notes=tuple(notes))


def _percentiles(model: StepModel, decision: dict, prompt: int, outputs: int,
                 arrival_rate: float, ttft_s: float | None, gap_s: float) -> dict:
  """The simulator at the decision: percentiles the analytic means cannot give."""
  if _MODEL.value is None or arrival_rate <= 0 or not decision.get("batch"):
    raise errors.InputError("--simulate_requests needs --model, --arrival_rate > 0 and a "
                            "feasible decision (a batch that meets the targets).")
  spec = models.load_model(_MODEL.value)
  device = what_if.with_overrides(
      _model_flags.device(_SHARED, bandwidth_tbps=_given(_BANDWIDTH_TBPS),
                          tflops=_given(_TFLOPS)), memory_gb=_given(_MEMORY_GB))
  replica_ = replica.from_model(
      spec, device, context=prompt + outputs, step_model=model,
      weight_dtype=_WEIGHT_DTYPE.value, kv_dtype=_KV_DTYPE.value,
      block_size=_SHARED.block_size.value, workspace_fraction=_SHARED.workspace_fraction.value,
      max_running=int(decision["batch"]), layout=_layout_flags.layout(_ACCELERATOR.value),
      mla_prefill=_SHARED.mla_prefill.value, comm_overlap=_SHARED.comm_overlap.value)
  out = percentiles.simulated_percentiles(
      replica_, arrival_rate=arrival_rate, prompt_tokens=prompt, output_tokens=outputs,
      ttft_s=ttft_s, token_gap_s=gap_s, num_requests=_SIMULATE_REQUESTS.value)
  m = out["metrics"]
  print(f"simulated ({out['num_requests']} requests at {arrival_rate:g}/s per replica, "
        f"at most {decision['batch']} running): TTFT median/p90/p99 "
        f"{m['ttft_s']['median'] * 1e3:.1f}/{m['ttft_s']['p90'] * 1e3:.1f}/"
        f"{m['ttft_s']['p99'] * 1e3:.1f} ms; ITL {m['itl_s']['median'] * 1e3:.2f}/"
        f"{m['itl_s']['p90'] * 1e3:.2f}/{m['itl_s']['p99'] * 1e3:.2f} ms")
  return out


def main(argv: list[str]) -> None:
  del argv  # Unused.
  _check_flags()
  if _COMPARE_PEER.value:
    peer.check_case(_MODEL.value, _ACCELERATOR.value, _PROMPT_TOKENS.value,
                    _OUTPUT_TOKENS.value)
  model = _step_model()
  inputs = _inputs()
  if model.ceilings is not None:
    bw, flops = model.scaled_ceilings(inputs.BW, inputs.F)
    inputs = dataclasses.replace(inputs, label=inputs.label.split(", ")[0] + ", "
                                 + inputs.label.split(", ")[1] + f", the profile's ceilings "
                                 f"{bw / 1e9:.3g} GB/s, {flops / 1e12:.3g} TFLOP/s")
  prompt, outputs = _PROMPT_TOKENS.value, _OUTPUT_TOKENS.value
  batches = _cli.int_list(_BATCH_SIZES)
  window_s = _BATCHING_WINDOW_MS.value / 1e3
  gap_s = _TOKEN_GAP_MS.value / 1e3
  ttft_s = None if _TTFT_MS.value is None else _TTFT_MS.value / 1e3
  load = dict(prompt_tokens=prompt, output_tokens=outputs,
              arrival_rate=_ARRIVAL_RATE.value / inputs.replicas,
              window_s=window_s, prefill_batch=_PREFILL_BATCH.value)
  rows = requests.rows(model, inputs, batches, **load)
  context = prompt + outputs / 2 if inputs.grows else 1.0
  kv = inputs.k if inputs.grows else inputs.kv_per_sequence_bytes
  for row, values in zip(rows, elasticity.row_elasticities(
      model, batches, N=inputs.N, q=inputs.q, T=context, k=kv, BW=inputs.BW, F=inputs.F,
      N_act=None if inputs.N_act == inputs.N else inputs.N_act, L=inputs.layers)):
    row["elasticities"] = values
    row["moved_by"] = elasticity.moved_by(values)
  decision = decision_lib.decide(model, inputs, token_gap_s=gap_s, ttft_s=ttft_s,
                                 aggregate_tokens_per_s=_replica_aggregate(inputs), **load)
  result = {
      "kind": model.kind,
      "inputs": {
          "label": inputs.label, "model": _MODEL.value, "accelerator": _ACCELERATOR.value,
          "prompt_tokens": prompt, "output_tokens": outputs, "batch_sizes": batches,
          "arrival_rate_per_s": _ARRIVAL_RATE.value, "batching_window_s": window_s,
          "arrival_rate_per_replica_s": _ARRIVAL_RATE.value / inputs.replicas,
          "layout": _layout_flags.layout(_ACCELERATOR.value).as_dict(),
          "prefill_batch": _PREFILL_BATCH.value,
          "ttft_target_s": ttft_s, "token_gap_target_s": gap_s,
          "aggregate_target_tokens_per_s": _AGGREGATE.value,
          "aggregate_target_per_replica_tokens_per_s": _replica_aggregate(inputs),
          "si": {"N": inputs.N, "N_act": inputs.N_act, "q": inputs.q, "k": inputs.k,
                 "kv_per_sequence_bytes": inputs.kv_per_sequence_bytes, "BW": inputs.BW,
                 "F": inputs.F, "layers": inputs.layers},
          "memory": inputs.memory, "max_batch_in_memory": inputs.max_batch_in_memory,
          "weight_dtype": _weight_format().dtype if _MODEL.value else None,
          "weight_format": _weight_format().describe() if _MODEL.value else None,
          "kv_dtype": _KV_DTYPE.value if _MODEL.value else None,
      },
      "units": {**requests.UNITS, **requests.LAYOUT_UNITS, "elasticities": "d ln(step_s) / d ln(input)",
                "max_arrival_rate_per_s": "requests/s"},
      "assumptions": list(model.assumptions) + [
          "prefill: analytic bound with causal attention (lower triangle, softmax omitted), "
          "weights read once, K/V written",
          "rows: a static batch of B requests (all B prompts prefilled together, then "
          "G - 1 decode steps at contexts P+1 .. P+G-1)",
          "TTFT: " + queueing.MODEL + "; a one-prompt prefill on arrival",
          "token gap under load: decode steps stretched by 1/(1 - lam*D)"]
      + multichip.assumptions(inputs),
      "requests": rows,
      "decision": decision,
      "elasticities": decision.get("elasticities"),
      "prefill_decode": pools.crossovers(model, inputs, prompt_tokens=prompt,
                                         output_tokens=outputs),
  }
  if _ARRIVAL_RATE.value > 0 and ttft_s is not None:
    link, link_note = _kv_link()
    result["pools"] = pools.compare(model, inputs, prompt_tokens=prompt, output_tokens=outputs,
                                    arrival_rate=_ARRIVAL_RATE.value, ttft_s=ttft_s,
                                    token_gap_s=gap_s, window_s=window_s,
                                    kv_link_bytes_per_s=link, kv_link_note=link_note)
  if _SIMULATE_REQUESTS.value:
    result["percentiles"] = _percentiles(model, decision, prompt, outputs,
                                         load["arrival_rate"], ttft_s, gap_s)
  if _COMPARE_PEER.value:
    result["peer"] = peer.compare(requests.rows(model, inputs, batches, prompt_tokens=prompt,
                                                output_tokens=outputs))
  calibrated = model.kind == "calibrated"
  if calibrated:  # The error travels with every calibrated number.
    result["profile"] = dict(model.provenance)
    result["accuracy"] = accuracy.fields(model.provenance)
    for row in rows:
      row[accuracy.ROW_FIELD] = model.provenance.get("heldout_median_rel_error")
    decision[accuracy.ROW_FIELD] = model.provenance.get("heldout_median_rel_error")
  if calibrated and accuracy.bound_first(model.provenance):
    bound_decision = decision_lib.decide(StepModel.bound(), inputs, token_gap_s=gap_s,
                                         ttft_s=ttft_s, aggregate_tokens_per_s=_replica_aggregate(inputs),
                                         **load)
    result["bound_decision"] = bound_decision
    print("Analytic bound, shown first (the profile's held-out error is larger than the "
          "bound's on the same data):")
    print("\n".join(serving_section.decision_lines(bound_decision)))
    print()
  label = {"bound": "analytic bound", "calibrated": "calibrated prediction"}[model.kind]
  print(f"Serving {inputs.label}: prompt {prompt}, {outputs} outputs, "
        f"{_ARRIVAL_RATE.value:g} requests/s ({label}; TTFT: M/D/1 mean)")
  headers, cells = serving_section.REQUEST_HEADERS, serving_section.request_cells(rows)
  if calibrated:
    headers = tuple(headers) + (accuracy.HEADER,)
    cells = [c + [accuracy.cell(model.provenance)] for c in cells]
  print(table.format_table(headers, cells))
  print("\n".join(serving_section.decision_lines(decision)))
  if calibrated:
    print("\n".join(accuracy.footnote_lines(model.provenance)))
  if decision.get("comm_s") is not None:
    print(f"  layout: {decision['chips']} chips ({decision['replicas']} replica(s)); "
          f"communication {decision['comm_s'] * 1e3:.3f} ms of each step at the decision "
          "(serial; the elasticities are the step's floor without it); fleet "
          f"{decision['fleet_aggregate_tokens_per_s']:,.0f} tokens/s, load limit "
          f"{decision['fleet_max_arrival_rate_per_s']:.4g} requests/s")
  if "pools" in result:
    print(_pools_line(result["pools"]))
  if "peer" in result:
    print(table.format_table(serving_section.PEER_HEADERS,
                             serving_section.peer_cells(result["peer"]["rows"])))
  if _MODEL.value is not None:
    spec = models.load_model(_MODEL.value)
    _model_notes.say(spec)  # A context beyond the model's is refused above.
    result.update(_model_notes.json_fields(spec))
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, result)
    logging.info("wrote %s", _JSON_OUT.value)
  if _PLOT_OUT.value:
    frontier = decision_lib.frontier(model, inputs,
                                     serving_section.frontier_batches(batches, decision, inputs),
                                     prompt_tokens=prompt,
                                     output_tokens=outputs)
    title = (f"{inputs.label}\nprompt {prompt} + {outputs} outputs")
    serving_section.plot_frontier(frontier, decision, _PLOT_OUT.value, title, kind=model.kind,
                                 token_gap_s=gap_s, memory_limit=inputs.max_batch_in_memory)
    logging.info("wrote %s", _PLOT_OUT.value)


def _replica_aggregate(inputs) -> float | None:
  """The fleet's --aggregate_tokens_per_s, split evenly over the dp replicas (the
  decision is one replica's)."""
  return None if _AGGREGATE.value is None else _AGGREGATE.value / inputs.replicas


def _kv_link() -> tuple[float | None, str]:
  """The per-chip network a split's K/V crosses between pools: the device's scale-out
  figure (its scale-up one when none), or free without a device."""
  if _MODEL.value is None:
    return None, "raw numbers: no network figure, K/V transfer assumed free"
  device = _model_flags.device(_SHARED)
  net = device.links
  if net is None:
    return None, f"{device.name} records no network: K/V transfer assumed free"
  if net.scale_out_bytes_per_s is not None:
    return net.scale_out_bytes_per_s, (f"{device.name} scale-out "
                                       f"{net.scale_out_bytes_per_s / 1e9:g} GB/s per chip")
  return net.collective_bytes_per_s, (f"{device.name} scale-up {net.technology} "
                                      f"{net.collective_bytes_per_s / 1e9:g} GB/s per chip "
                                      "(no scale-out figure)")


def _pools_line(p: dict) -> str:
  """The split-vs-shared answer in GPUs (a replica is tp*pp*ep of them)."""
  per = p["chips_per_replica"]
  unit = "" if per == 1 else f" ({per} per replica)"
  split, shared = p["split"], p["shared"]
  a = (f"split {split['prefill_gpus']} prefill + {split['decode_gpus']} decode = "
       f"{split['gpus']} GPUs (K/V transfer {split['kv_transfer_s'] * 1e3:.3g} ms)"
       if split["feasible"] else f"split infeasible ({split['reason']})")
  b = (f"shared {shared['gpus']} GPUs" if shared["feasible"]
       else f"shared infeasible ({shared['reason']})")
  return (f"  pools at {p['arrival_rate_per_s']:g} requests/s{unit}: {a}; {b}; fewer: "
          f"{p['fewer_chips'] or 'neither'} ({p['kv_transfer']['note']})")


if __name__ == "__main__":
  _cli.run(main)
