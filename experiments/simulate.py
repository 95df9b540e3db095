"""Simulate one serving replica under continuous batching (vLLM `bench serve` metrics).

Simulated predictions: each iteration's time is the one cost model (analytic bound, or
calibrated with --profile) for its mix of decodes and prefill chunks; K/V is paged from
the model's layer schedule. Give a shipped model on an accelerator (`--model=llama-3-8b
--accelerator=h100-sxm --context=2048`) or raw numbers (`--params_b --bytes_per_weight
--kv_bytes_per_token --bandwidth_tbps --tflops --layers --heads --head_dim
--kv_memory_gb`), and optionally `--profile` (fitted factors and measured ceilings).

  python -m experiments.simulate --model=llama-3-8b --accelerator=h100-sxm --context=2048 \
      --num_requests=2000 --arrival_rate=20 --scheduler=chunked --ttft_ms=500 --tpot_ms=50

--engine=NAME: that engine's calibrated iterations, scheduler defaults (where not given),
memory rule and cost per request (in every TTFT, fleets and --find_max_rate too), labelled
with its held-out error; the bound's run of the same replica beside (one replica).

--tp --pp --ep (with --model) simulate one replica of that layout (one chip's traffic along
a token's path, each iteration's communication, K/V pages on the busiest chip; --microbatches
as virtual engines waiting behind each other's prefills). --dp=N: N replicas behind a --router.

--find_max_rate bisects the fleet's arrival rate with the seeded simulator for the largest
rate at which --ttft_ms, --tpot_ms and --itl_ms hold at --slo_percentile, from the load
model's answer for the same replica with --model, else from --arrival_rate (JSON:
`max_rate_per_s`, `max_rate_per_chip`, `analytic_max_rate_per_s`). Lengths beyond the
context are resampled or clipped (--long_samples), and counted. --plot_out writes the
TTFT/ITL CDFs, `<stem>_kv.png` (K/V pages, queue) and `<stem>_goodput.png` (goodput against
arrival rate per scheduler, up to --goodput_requests requests).
"""
from __future__ import annotations

from absl import flags

from experiments import _cli
from experiments import _engine_flags
from experiments import _layout_flags
from experiments import _model_flags
from experiments import _model_notes
from experiments import _simulation_flags
from experiments import _work
from jaxroof import files
from jaxroof.errors import InputError
from jaxroof.report import simulate_lines as sim_lines
from jaxroof.report import accuracy
from jaxroof.serving import engine_serving, fleet, metrics, replica, simulator
from jaxroof.serving import simulation_result as sim_result
from jaxroof.specs.models import load_model

_cli.key_flags(*_cli.MODEL_KEYS, "prompt_tokens", "output_tokens", "arrival_rate", "num_requests",
               "scheduler", "max_running", "router", "tp", "dp", "engine")

# The model: a shipped model on an accelerator ...
_SHARED = _model_flags.define("model", "accelerator", "accelerator_file", "weight_dtype",
                              "kv_dtype", "block_size", "workspace_fraction", *_model_flags.COST,
                              "profile", "what_if", "engine", "bytes_per_weight",
                              "kv_bytes_per_token", "tflops")
_MODEL, _ACCELERATOR = _SHARED.model, _SHARED.accelerator
_PROGRESS = _cli.define_progress()
_F = _simulation_flags
_SCHEDULER, _ROUTER, _SEED = _F.SCHEDULER, _F.ROUTER, _F.SEED
_ARRIVAL, _ARRIVAL_RATE, _NUM_REQUESTS = _F.ARRIVAL, _F.ARRIVAL_RATE, _F.NUM_REQUESTS
_CONTEXT = flags.DEFINE_integer(
    "context", None, "Context (tokens) at which K/V bytes per token "
    "are taken (sliding windows, states).", lower_bound=1)
# The targets (`_simulation_flags`) and outputs.
_SLO_PERCENTILE, _targets = _F.SLO_PERCENTILE, _F.targets
_FIND_MAX_RATE = flags.DEFINE_bool(
    "find_max_rate", False, "Bisect for the largest fleet arrival rate meeting --ttft_ms/"
    "--tpot_ms/--itl_ms at --slo_percentile (from the load model's answer with --model, else "
    "from --arrival_rate).")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Write the result JSON here.")
_PLOT_OUT = flags.DEFINE_string("plot_out", None, "Write the PNGs here (see the docstring).")
_cli.output_siblings("plot_out", *sim_lines.PLOT_SIBLINGS)  # Checked first with it.
_GOODPUT_REQUESTS = flags.DEFINE_integer(
    "goodput_requests", 1000, "Requests per point of the "
    "goodput-vs-rate plot. In [1, 100,000].", lower_bound=1, upper_bound=100_000)


def _replica(bound: bool = False, d=None) -> replica.Replica:
  """The replica of --model on the device, or of the raw numbers, as scheduled (an
  engine's memory reservation with `d`)."""
  model = _model_flags.step_model(_SHARED, accelerator=_ACCELERATOR.value, bound=bound)
  common = dict(step_model=model, **_simulation_flags.scheduling())
  if d is not None:
    common["reservation"] = d.settings
  if _MODEL.value is not None:
    if (_ACCELERATOR.value is None and not _SHARED.accelerator_file.value) \
        or _CONTEXT.value is None:
      raise InputError("model needs --accelerator (or --accelerator_file) and --context (or "
                       "give raw numbers).")
    return _model_flags.model_replica(_SHARED, _model_flags.device(_SHARED), context=_CONTEXT.value,
                                      layout=_layout_flags.layout(_ACCELERATOR.value), **common)
  if _layout_flags.layout().chips_per_replica > 1:
    raise InputError("--tp/--pp/--ep/--chips apply only with --model and --accelerator "
                     "(raw numbers take --dp for a fleet).")
  return _simulation_flags.raw_replica(_SHARED, **common)


def _max_rate(r: replica.Replica, replicas: int, layout, d, t0: float) -> None:
  """Bisects for the largest fleet rate meeting the SLOs (each TTFT `t0` longer); prints it."""
  targets = _simulation_flags.slo_targets()
  if all(v is None for v in targets.values()):
    raise InputError("--find_max_rate needs at least one of --ttft_ms, --tpot_ms, --itl_ms.")
  analytic = _MODEL.value and _simulation_flags.analytic(  # The bisection's start.
      load_model(_MODEL.value), _model_flags.device(_SHARED), layout,
      _model_flags.model_options(_SHARED), targets, _SLO_PERCENTILE.value)
  found = sim_result.max_rate(lambda rate, n: _simulation_flags.workload(rate, n, r.max_context), r,
                              replicas=replicas, chips=layout.chips, pipeline=layout.microbatches,
                              scheduler=_SCHEDULER.value, router=_ROUTER.value, seed=_SEED.value,
                              num_requests=_NUM_REQUESTS.value, start_rate=_ARRIVAL_RATE.value,
                              percentile=_SLO_PERCENTILE.value, targets=targets, t0_request_s=t0,
                              analytic=analytic or None)
  print(sim_lines.max_rate_line(found, _SCHEDULER.value, d and d.entry.label))
  if _JSON_OUT.value:
    files.write_json(
        _JSON_OUT.value, {
            **sim_result.max_rate_json(found, r, _SCHEDULER.value, _ROUTER.value),
            **(d.label_fields() if d else {})
        })


def _one_replica(w, r: replica.Replica, label: str, d=None) -> dict:
  """Simulates the workload on one replica; prints its metrics, plots them, returns the
  JSON (an engine's `d`: the bound's run of the same replica beside)."""
  run = engine_serving.user_run(
      sim_result.simulate(w, r, _SCHEDULER.value, show_progress=_PROGRESS.value), d)
  m = {**metrics.run_metrics(run, **_targets()), **metrics.iteration_means(run)}
  model = _model_flags.step_model(_SHARED, accelerator=_ACCELERATOR.value)
  provenance = model.provenance if model.kind == "calibrated" else None
  bound_metrics = None
  if d is not None or (provenance is not None and accuracy.bound_first(provenance)):
    bound_r = engine_serving.bound_replica(r, _SHARED.bound.value) if d else _replica(bound=True)
    bound_metrics = metrics.run_metrics(simulator.simulate(w, bound_r, _SCHEDULER.value),
                                        **_targets())
  print("\n".join(
      sim_lines.run_lines(label, _SCHEDULER.value, len(w), m, run, r.total_pages, provenance,
                          bound_metrics, engine=d is not None)))
  result = sim_result.run_json(run, m, label=label, scheduler=_SCHEDULER.value, replica_=r,
                               workload=w)
  if provenance is not None:
    sim_lines.annotate_calibrated(result, provenance)
  engine_serving.metrics_beside(result, bound_metrics, d)
  if _MODEL.value is not None:
    spec = load_model(_MODEL.value)
    _model_notes.say(spec, [_CONTEXT.value])
    result.update(_model_notes.json_fields(spec, [_CONTEXT.value]))
  if _PLOT_OUT.value:
    sim_lines.plot_run(run, r.total_pages, _SCHEDULER.value, _PLOT_OUT.value, label)
    if _ARRIVAL.value != "trace":
      result["goodput_vs_rate"] = sim_result.goodput_sweep(
          _simulation_flags.workload, r, _ARRIVAL_RATE.value,
          num_requests=min(_NUM_REQUESTS.value, _GOODPUT_REQUESTS.value), targets=_targets(),
          show_progress=_PROGRESS.value)
      sim_lines.plot_goodput(result["goodput_vs_rate"], _PLOT_OUT.value, label)
  return result


def main(argv: list[str]) -> None:
  del argv  # Unused.
  layout = _layout_flags.layout(_ACCELERATOR.value)
  d = _engine_flags.drive(_SHARED.engine, _MODEL.value and _model_flags.device(_SHARED), layout)
  applied = _simulation_flags.engine_defaults(d)  # Where the user set none.
  t0 = engine_serving.t0_request(d) if d else 0.0  # In every run's TTFT.
  replicas, rate = layout.dp * layout.microbatches, _ARRIVAL_RATE.value
  if replicas > 1 and _SCHEDULER.value not in fleet.CONTINUOUS:
    raise InputError(f"--scheduler={_SCHEDULER.value} with --dp={replicas}: a fleet behind a "
                     f"router simulates continuous batching ({', '.join(fleet.CONTINUOUS)}).")
  trace = _ARRIVAL.value == "trace"
  if trace and _FIND_MAX_RATE.value:
    raise InputError("--find_max_rate needs synthetic arrivals (a trace fixes its rate).")
  w = _simulation_flags.workload(rate, 1) if trace else None
  r = _work.checked(replica.per_microbatch(_replica(d=d), layout.microbatches), w, replicas)
  if _FIND_MAX_RATE.value:
    return _max_rate(r, replicas, layout, d, t0)
  w = w or _simulation_flags.workload(rate, _NUM_REQUESTS.value, r.max_context)
  beyond = w.description.get("beyond_context")
  if beyond and beyond["requests_beyond"]:
    print(sim_lines.beyond_context_line(beyond))
  label = sim_lines.label(r.description["step_model"], d and d.entry.label)
  if replicas == 1:
    result = _one_replica(w, r, label, d)
  else:
    out = sim_result.fleet_run(w, r, replicas, scheduler=_SCHEDULER.value, router=_ROUTER.value,
                               seed=_SEED.value, targets=_targets(), pipeline=layout.microbatches,
                               t0_request_s=t0)
    print("\n".join(sim_lines.fleet_lines(out, label, _ROUTER.value, _SCHEDULER.value, len(w),
                                          rate)))
    result = sim_result.fleet_json(out, label=label, scheduler=_SCHEDULER.value,
                                   router=_ROUTER.value, replica_=r, workload=w)
  if d is not None:
    result.update(d.label_fields(), engine_defaults_applied=applied)
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, result)


if __name__ == "__main__":
  _cli.run(main)
