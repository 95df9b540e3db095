"""Simulate one serving replica under continuous batching (vLLM `bench serve` metrics).

Simulated predictions: each iteration's time is the iteration model of
`jaxroof.symbolic.iteration` (analytic bound, or calibrated with --profile)
for its mix of decodes and prefill chunks; K/V is paged from the model's
layer schedule. Give a shipped model on an accelerator
(`--model=llama-3-8b --accelerator=h100-sxm --context=2048`) or raw numbers
(`--params_b --bytes_per_weight --kv_bytes_per_token --bandwidth_tbps
--tflops --layers --heads --head_dim --kv_memory_gb`), and optionally
`--profile` (a calibration profile: its fitted factors and measured ceilings).

  python -m experiments.simulate --model=llama-3-8b --accelerator=h100-sxm \
      --context=2048 --num_requests=2000 --arrival_rate=20 --scheduler=chunked \
      --prompt_distribution=lognormal --prompt_spread=0.5 --ttft_ms=500 \
      --tpot_ms=50 --json_out=/tmp/sim.json --plot_out=/tmp/sim.png

--tp --pp --ep (with --model) simulate one replica of that layout: one
chip's traffic along a token's path, each iteration's communication added,
K/V pages on the busiest chip. --dp=N simulates a fleet of N alike replicas
behind a router (--router: round_robin, least_outstanding, power_of_two) at
the fleet's --arrival_rate: the fleet's metrics printed, each replica's in
the JSON (`replicas`).

--find_max_rate bisects the fleet's arrival rate with the seeded simulator
for the largest rate at which --ttft_ms, --tpot_ms and --itl_ms hold at
--slo_percentile (JSON: `max_rate_per_s`, `max_rate_per_chip`).

Sampled lengths whose prompt + output exceed the model's context are
resampled or clipped (--long_samples), and counted.

--plot_out writes the TTFT/ITL CDFs there, and beside it `<stem>_kv.png`
(K/V pages and queue over time) and `<stem>_goodput.png` (goodput against
arrival rate for the three schedulers, at up to --goodput_requests requests).
"""

from __future__ import annotations

import os

from absl import flags

from experiments import _cli
from experiments import _layout_flags
from experiments import _model_flags
from experiments import _model_notes
from jaxroof import files
from jaxroof import progress
from jaxroof.errors import InputError
from jaxroof.report import simulate_lines as sim_lines
from jaxroof.report import simulation as sim_report
from jaxroof.report import accuracy
from jaxroof.serving import arrivals, fleet, metrics, replica, simulator
from jaxroof.specs.models import load_model
from jaxroof.symbolic.step_model import StepModel

# The model: a shipped model on an accelerator ...
_SHARED = _model_flags.define("model", "accelerator", "accelerator_file", "weight_dtype",
                              "kv_dtype", "block_size", "workspace_fraction",
                              *_model_flags.COST, "profile", "what_if")
_MODEL, _ACCELERATOR = _SHARED.model, _SHARED.accelerator
_WEIGHT_DTYPE, _KV_DTYPE = _SHARED.weight_dtype, _SHARED.kv_dtype
_BLOCK_SIZE = _SHARED.block_size
_PROGRESS = _cli.define_progress()
_CONTEXT = flags.DEFINE_integer("context", None, "Context (tokens) at which K/V bytes per "
                                "token are taken (sliding windows, states).", lower_bound=1)
# ... or raw numbers.
_PARAMS_B = flags.DEFINE_float("params_b", None, "Raw: billions of weights read and "
                               "multiplied per iteration.")
_BYTES_PER_WEIGHT = flags.DEFINE_float("bytes_per_weight", 2.0, "Raw: bytes per weight.")
_KV_BYTES_PER_TOKEN = flags.DEFINE_float("kv_bytes_per_token", None, "Raw: K/V bytes per token.")
_BANDWIDTH_TBPS = flags.DEFINE_float("bandwidth_tbps", None, "Raw: memory bandwidth, TB/s.")
_TFLOPS = flags.DEFINE_float("tflops", None, "Raw: dense TFLOP/s.")
_LAYERS = flags.DEFINE_integer("layers", None, "Raw: attention blocks.", lower_bound=1)
_HEADS = flags.DEFINE_integer("heads", None, "Raw: query heads per block.", lower_bound=1)
_HEAD_DIM = flags.DEFINE_integer("head_dim", None, "Raw: coordinates per head.", lower_bound=1)
_KV_MEMORY_GB = flags.DEFINE_float("kv_memory_gb", None, "Raw: memory for K/V pages, GB.")
_MAX_CONTEXT = flags.DEFINE_integer("max_context", None, "Raw: the model's longest sequence.",
                                    lower_bound=1)
# The workload.
_NUM_REQUESTS = flags.DEFINE_integer(
    "num_requests", 1000, "Requests to simulate. In [1, 1,000,000] (about 10,000 "
    "requests/s simulate on a 2-core CPU).", lower_bound=1, upper_bound=1_000_000)
_ARRIVAL_RATE = flags.DEFINE_float("arrival_rate", 10.0, "Mean arrivals per second.")
_ARRIVAL = flags.DEFINE_enum("arrival", "poisson", ["poisson", "gamma", "trace"], "Arrivals.")
_BURSTINESS = flags.DEFINE_float("burstiness", 1.0, "Gamma shape (1: Poisson, < 1: burstier).")
_TRACE = flags.DEFINE_string("trace", None, "JSONL/CSV trace with arrival_s, prompt_tokens, "
                             "output_tokens (--arrival=trace).")
_PROMPT_TOKENS = flags.DEFINE_float("prompt_tokens", 1000, "Mean prompt length (tokens).")
_OUTPUT_TOKENS = flags.DEFINE_float("output_tokens", 200, "Mean output length (tokens).")
_PROMPT_DIST = flags.DEFINE_enum("prompt_distribution", "fixed", list(arrivals.LENGTHS),
                                 "Prompt lengths: fixed (exact), uniform, lognormal.")
_OUTPUT_DIST = flags.DEFINE_enum("output_distribution", "fixed", list(arrivals.LENGTHS),
                                 "Output lengths: fixed (exact), uniform, lognormal.")
_PROMPT_SPREAD = flags.DEFINE_float("prompt_spread", 0.0, "Uniform: half-width / mean; "
                                    "lognormal: coefficient of variation.")
_OUTPUT_SPREAD = flags.DEFINE_float("output_spread", 0.0, "As --prompt_spread, for outputs.")
# The scheduling.
_SCHEDULER = flags.DEFINE_enum("scheduler", "iteration", list(simulator.SCHEDULERS),
                               "static, iteration (Orca), chunked (Sarathi) or vllm "
                               "(vLLM V1's own scheduler).")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of arrivals and lengths.")
_MAX_RUNNING = flags.DEFINE_integer("max_running", 256, "Most running sequences.", lower_bound=1)
_TOKEN_BUDGET = flags.DEFINE_integer("token_budget", 512, "Chunked: tokens per iteration.",
                                     lower_bound=1)
_BATCH_WINDOW_MS = flags.DEFINE_float("batch_window_ms", 50.0, "Static: batching window, ms.",
                                      lower_bound=0.0)
# The targets and outputs.
_TTFT_MS = flags.DEFINE_float("ttft_ms", None, "Goodput target: TTFT at most this (ms).")
_TPOT_MS = flags.DEFINE_float("tpot_ms", None, "Goodput target: TPOT at most this (ms).")
_ITL_MS = flags.DEFINE_float("itl_ms", None, "SLO for --find_max_rate: ITL at most this (ms).")
_SLO_PERCENTILE = flags.DEFINE_float("slo_percentile", 90.0, "Percentile at which "
                                     "--find_max_rate checks the SLOs, in (0, 100).",
                                     lower_bound=1e-6, upper_bound=99.999999)
_FIND_MAX_RATE = flags.DEFINE_bool("find_max_rate", False, "Bisect for the largest fleet "
                                   "arrival rate meeting --ttft_ms/--tpot_ms/--itl_ms at "
                                   "--slo_percentile (starting from --arrival_rate).")
_ROUTER = flags.DEFINE_enum("router", "round_robin", list(fleet.ROUTERS),
                            "How a fleet (--dp > 1) sends requests to its replicas.")
_LONG_SAMPLES = flags.DEFINE_enum("long_samples", "resample", list(arrivals.LONG_SAMPLES),
                                  "Sampled prompt + output beyond the model's context: "
                                  "drawn again, or clipped.")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Write the result JSON here.")
_PLOT_OUT = flags.DEFINE_string("plot_out", None, "Write the PNGs here (see the docstring).")
_GOODPUT_REQUESTS = flags.DEFINE_integer("goodput_requests", 1000, "Requests per point of the "
                                         "goodput-vs-rate plot. In [1, 100,000].",
                                         lower_bound=1, upper_bound=100_000)

for _holder, _unit in ((_ARRIVAL_RATE, "requests/s"), (_PROMPT_TOKENS, "tokens"),
                       (_OUTPUT_TOKENS, "tokens"), (_BURSTINESS, "1"), (_TTFT_MS, "ms"),
                       (_TPOT_MS, "ms"), (_ITL_MS, "ms"), (_PARAMS_B, "billions"), (_BYTES_PER_WEIGHT, "B"),
                       (_KV_BYTES_PER_TOKEN, "B"), (_BANDWIDTH_TBPS, "TB/s"), (_TFLOPS, "TFLOP/s"),
                       (_KV_MEMORY_GB, "GB"), (_NUM_REQUESTS, "requests")):
  _cli.require_positive(_holder, _unit)


def _step_model(bound: bool = False) -> StepModel:
  return _model_flags.step_model(_SHARED, accelerator=_ACCELERATOR.value, bound=bound)


def _replica(bound: bool = False, **kw) -> replica.Replica:
  model = _step_model(bound)
  common = dict(step_model=model, max_running=_MAX_RUNNING.value,
                token_budget=_TOKEN_BUDGET.value, batch_window_s=_BATCH_WINDOW_MS.value / 1e3, **kw)
  if _MODEL.value is not None:
    if (_ACCELERATOR.value is None and not _SHARED.accelerator_file.value) \
        or _CONTEXT.value is None:
      raise InputError("model needs --accelerator (or --accelerator_file) and --context (or "
                       "give raw numbers).")
    return replica.from_model(load_model(_MODEL.value), _model_flags.device(_SHARED),
                              context=_CONTEXT.value, weight_dtype=_WEIGHT_DTYPE.value,
                              kv_dtype=_KV_DTYPE.value, block_size=_BLOCK_SIZE.value,
                              workspace_fraction=_SHARED.workspace_fraction.value,
                              layout=_layout_flags.layout(_ACCELERATOR.value),
                              mla_prefill=_SHARED.mla_prefill.value,
                              comm_overlap=_SHARED.comm_overlap.value, **common)
  if _layout_flags.layout().chips_per_replica > 1:
    raise InputError("--tp/--pp/--ep/--chips apply only with --model and --accelerator "
                     "(raw numbers take --dp for a fleet).")
  raw = {"params_b": _PARAMS_B, "kv_bytes_per_token": _KV_BYTES_PER_TOKEN,
         "bandwidth_tbps": _BANDWIDTH_TBPS, "layers": _LAYERS, "heads": _HEADS,
         "head_dim": _HEAD_DIM, "kv_memory_gb": _KV_MEMORY_GB}
  missing = [f"--{n}" for n, h in raw.items() if h.value is None]
  if missing:
    raise InputError(f"the model is not given: pass --model/--accelerator/--context or the raw "
                     f"numbers (missing {', '.join(missing)}).")
  k = _KV_BYTES_PER_TOKEN.value
  return replica.from_numbers(
      N=_PARAMS_B.value * 1e9, q=_BYTES_PER_WEIGHT.value, k=k,
      BW=_BANDWIDTH_TBPS.value * 1e12, F=None if _TFLOPS.value is None else _TFLOPS.value * 1e12,
      L=_LAYERS.value, H=_HEADS.value, d=_HEAD_DIM.value,
      kv_memory_bytes=_KV_MEMORY_GB.value * 1e9, page_bytes=_BLOCK_SIZE.value * k,
      page_tokens=_BLOCK_SIZE.value, max_context=_MAX_CONTEXT.value,
      description={"model": "raw numbers"}, **common)


def _workload(rate: float, n: int, max_total: int | None = None) -> arrivals.Workload:
  if _TRACE.value is not None and _ARRIVAL.value != "trace":
    raise InputError(f"--trace applies only with --arrival=trace (given --arrival="
                     f"{_ARRIVAL.value}): add --arrival=trace, or leave --trace out.")
  if _ARRIVAL.value == "trace":
    if not _TRACE.value:
      raise InputError("arrival='trace' needs --trace=PATH (a JSONL or CSV file).")
    return arrivals.load_trace(_TRACE.value)
  return arrivals.synthetic(
      arrival=_ARRIVAL.value, num_requests=n, arrival_rate=rate, seed=_SEED.value,
      prompt_tokens=_PROMPT_TOKENS.value, output_tokens=_OUTPUT_TOKENS.value,
      prompt_distribution=_PROMPT_DIST.value, output_distribution=_OUTPUT_DIST.value,
      prompt_spread=_PROMPT_SPREAD.value, output_spread=_OUTPUT_SPREAD.value,
      burstiness=_BURSTINESS.value, max_total=max_total, long_samples=_LONG_SAMPLES.value)


def _targets() -> dict:
  return {"ttft_target_s": None if _TTFT_MS.value is None else _TTFT_MS.value / 1e3,
          "tpot_target_s": None if _TPOT_MS.value is None else _TPOT_MS.value / 1e3}


def _progress(total: int):
  """A bar over the simulated requests (runs of 2,000 or more), and its callback."""
  if total < 2000 or not progress.enabled(_PROGRESS.value):
    return None, None
  bar = progress.bar(total=total, unit="req", desc="simulating", requested=_PROGRESS.value)
  return bar, (lambda finished: bar.update(finished - bar.n))


def _goodput_sweep(r: replica.Replica, rate: float) -> dict:
  rates = [rate * f for f in (0.25, 0.5, 0.75, 1.0, 1.5, 2.0)]
  n = min(_NUM_REQUESTS.value, _GOODPUT_REQUESTS.value)
  out = {name: [] for name in simulator.SCHEDULERS}
  for x in progress.bar(rates, desc="goodput sweep", unit="rate", requested=_PROGRESS.value):
    w = _workload(x, n)
    for name in simulator.SCHEDULERS:
      run = simulator.simulate(w, r, name)
      m = metrics.serving_metrics(run.arrival_s, run.first_token_s, run.finish_s,
                                  run.output_tokens, run.itl_s, **_targets())
      out[name].append(m["goodput_per_s"] if m["goodput_per_s"] is not None
                       else m["request_throughput_per_s"])
  return {"arrival_rate_per_s": rates, "goodput_per_s": out, "num_requests": n}


def _fleet(w: arrivals.Workload, r: replica.Replica, replicas: int) -> dict:
  """The fleet behind the router: its metrics, each replica's, the routing."""
  run = fleet.simulate_fleet(w, r, replicas, scheduler=_SCHEDULER.value, router=_ROUTER.value,
                             seed=_SEED.value)
  m = metrics.serving_metrics(run.fleet.arrival_s, run.fleet.first_token_s,
                              run.fleet.finish_s, run.fleet.output_tokens, run.fleet.itl_s,
                              **_targets())
  return {"run": run, "metrics": m,
          "replicas": fleet.replica_metrics(run, **_targets())}


def _max_rate(r: replica.Replica, replicas: int, chips: int) -> dict:
  targets = {"ttft_s": None if _TTFT_MS.value is None else _TTFT_MS.value / 1e3,
             "tpot_s": None if _TPOT_MS.value is None else _TPOT_MS.value / 1e3,
             "itl_s": None if _ITL_MS.value is None else _ITL_MS.value / 1e3}
  if all(v is None for v in targets.values()):
    raise InputError("--find_max_rate needs at least one of --ttft_ms, --tpot_ms, --itl_ms.")

  def run_at(rate: float) -> simulator.Run:
    w = _workload(rate, _NUM_REQUESTS.value, r.max_context)
    if replicas == 1:
      return simulator.simulate(w, r, _SCHEDULER.value)
    return fleet.simulate_fleet(w, r, replicas, scheduler=_SCHEDULER.value,
                                router=_ROUTER.value, seed=_SEED.value).fleet

  found = fleet.find_max_rate(run_at, start_rate=_ARRIVAL_RATE.value,
                              percentile=_SLO_PERCENTILE.value, targets=targets)
  rate = found["max_rate_per_s"]
  return {**found, "max_rate_per_chip": None if rate is None else rate / chips,
          "replicas": replicas, "chips": chips, "slo_percentile": _SLO_PERCENTILE.value,
          "targets": targets, "num_requests": _NUM_REQUESTS.value, "seed": _SEED.value,
          "label": "simulated (seeded bisection over the arrival rate)"}


def main(argv: list[str]) -> None:
  del argv  # Unused.
  layout = _layout_flags.layout(_ACCELERATOR.value)
  replicas = layout.dp
  if replicas > 1 and _SCHEDULER.value not in fleet.CONTINUOUS:
    raise InputError(f"--scheduler={_SCHEDULER.value} with --dp={replicas}: a fleet behind a "
                     f"router simulates continuous batching ({', '.join(fleet.CONTINUOUS)}).")
  if _ARRIVAL.value == "trace" and _FIND_MAX_RATE.value:
    raise InputError("--find_max_rate needs synthetic arrivals (a trace fixes its rate).")
  trace = _workload(_ARRIVAL_RATE.value, 1) if _ARRIVAL.value == "trace" else None
  r = _replica()
  if _FIND_MAX_RATE.value:
    found = _max_rate(r, replicas, layout.chips)
    print(sim_lines.max_rate_line(found, _SCHEDULER.value))
    if _JSON_OUT.value:
      files.write_json(_JSON_OUT.value, {"label": found["label"], "replica": r.description,
                                         "scheduler": _SCHEDULER.value,
                                         "router": _ROUTER.value if replicas > 1 else None,
                                         **found})
    return
  w = trace or _workload(_ARRIVAL_RATE.value, _NUM_REQUESTS.value, r.max_context)
  beyond = w.description.get("beyond_context")
  if beyond and beyond["requests_beyond"]:
    print(sim_lines.beyond_context_line(beyond))
  if replicas > 1:
    _main_fleet(w, r, replicas)
    return
  bar, on_progress = _progress(len(w))
  run = simulator.simulate(w, r, _SCHEDULER.value, on_progress)
  if bar is not None:
    bar.close()
  m = metrics.serving_metrics(run.arrival_s, run.first_token_s, run.finish_s, run.output_tokens,
                              run.itl_s, **_targets())
  m.update(metrics.iteration_means(run))
  label = sim_lines.label(r.description["step_model"])
  model = _step_model()
  provenance = model.provenance if model.kind == "calibrated" else None
  bound_metrics = None
  if provenance is not None and accuracy.bound_first(provenance):
    bound_run = simulator.simulate(w, _replica(bound=True), _SCHEDULER.value)
    bound_metrics = metrics.serving_metrics(
        bound_run.arrival_s, bound_run.first_token_s, bound_run.finish_s,
        bound_run.output_tokens, bound_run.itl_s, **_targets())
    print(f"{sim_lines.label('bound')}, shown first (the profile's held-out error is larger "
          f"than the bound's on the same data): {_SCHEDULER.value} scheduler, {len(w)} requests")
    print(sim_lines.metrics_table(_SCHEDULER.value, bound_metrics) + "\n")
  print(f"{label}: {_SCHEDULER.value} scheduler, {len(w)} requests")
  print(sim_lines.metrics_table(_SCHEDULER.value, m, provenance))
  if provenance is not None:
    print("\n".join(accuracy.footnote_lines(provenance)))
  print(sim_lines.run_line(run, r.total_pages))
  result = {"label": label, "scheduler": _SCHEDULER.value, "replica": r.description,
            "workload": w.description, "metrics": m,
            "simulation": metrics.simulation_block(run, r.total_pages)}
  if provenance is not None:
    result["profile"] = dict(provenance)
    result["accuracy"] = accuracy.fields(provenance)
    result["metrics"] = {**m, accuracy.ROW_FIELD: provenance.get("heldout_median_rel_error")}
  if bound_metrics is not None:
    result["bound_metrics"] = bound_metrics
  if _MODEL.value is not None:
    spec = load_model(_MODEL.value)
    _model_notes.say(spec, [_CONTEXT.value])
    result.update(_model_notes.json_fields(spec, [_CONTEXT.value]))
  if _PLOT_OUT.value:
    stem, _ = os.path.splitext(_PLOT_OUT.value)
    sim_report.plot_cdfs({_SCHEDULER.value: {"ttft_s": run.first_token_s - run.arrival_s,
                                             "itl_s": run.itl_s}}, _PLOT_OUT.value, label)
    sim_report.plot_kv_over_time(run, r.total_pages, f"{stem}_kv.png", label)
    if _ARRIVAL.value != "trace":
      sweep = _goodput_sweep(r, _ARRIVAL_RATE.value)
      result["goodput_vs_rate"] = sweep
      sim_report.plot_goodput(sweep["arrival_rate_per_s"], sweep["goodput_per_s"],
                              f"{stem}_goodput.png", label)
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, result)


def _main_fleet(w: arrivals.Workload, r: replica.Replica, replicas: int) -> None:
  out = _fleet(w, r, replicas)
  label = sim_lines.label(r.description["step_model"])
  print(f"{label}: fleet of {replicas} replicas behind {_ROUTER.value}, {_SCHEDULER.value} "
        f"scheduler, {len(w)} requests at {_ARRIVAL_RATE.value:g}/s")
  print(sim_lines.metrics_table(f"fleet ({replicas})", out["metrics"]))
  print(sim_lines.fleet_line(out["run"], replicas))
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, {
        "label": label, "scheduler": _SCHEDULER.value, "router": _ROUTER.value,
        "replica": r.description, "workload": w.description, "metrics": out["metrics"],
        "fleet": {"replicas": replicas, "router": _ROUTER.value,
                  "request_throughput_per_s": out["metrics"]["request_throughput_per_s"],
                  "output_throughput_tokens_per_s":
                      out["metrics"]["output_throughput_tokens_per_s"]},
        "replicas": out["replicas"]})


if __name__ == "__main__":
  _cli.run(main)
