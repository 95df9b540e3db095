"""What the simulator needs beyond a model on a device: the workload's flags (arrivals,
lengths, --num_requests, --seed), the scheduling's (--scheduler, --max_running,
--token_budget, --batch_window_ms, --router) and a replica given as raw numbers
(--params_b, --bandwidth_tbps, --layers, --heads, --head_dim, --kv_memory_gb,
--max_context, with `_model_flags`' --bytes_per_weight, --kv_bytes_per_token, --tflops).

Import this module in an experiment to define the flags, then call `workload(rate, n)`
for the `jaxroof.serving.arrivals.Workload` they describe at any rate or size,
`scheduling()` for a replica's scheduling options and `raw_replica(...)` for the replica
of the raw numbers.
"""

from __future__ import annotations

import types
from typing import Any

from absl import flags

from experiments import _cli
from experiments import _length_flags
from jaxroof.errors import InputError
from jaxroof.serving import arrivals
from jaxroof.serving import fleet
from jaxroof.serving import replica
from jaxroof.serving import simulation_result as sim_result
from jaxroof.serving import simulator

NUM_REQUESTS = flags.DEFINE_integer(
    "num_requests", 1000, "Requests to simulate. In [1, 1,000,000] (about 10,000 "
    "requests/s simulate on a 2-core CPU).", lower_bound=1, upper_bound=1_000_000)
ARRIVAL_RATE = flags.DEFINE_float("arrival_rate", 10.0, "Mean arrivals per second.")
ARRIVAL = flags.DEFINE_enum("arrival", "poisson", ["poisson", "gamma", "trace"], "Arrivals.")
_BURSTINESS = flags.DEFINE_float("burstiness", 1.0, "Gamma shape (1: Poisson, < 1: burstier).")
_TRACE = flags.DEFINE_string(
    "trace", None, "JSONL/CSV trace with arrival_s, prompt_tokens, "
    "output_tokens (--arrival=trace).")
_PROMPT_TOKENS = flags.DEFINE_float("prompt_tokens", 1000, "Mean prompt length (tokens).")
_OUTPUT_TOKENS = flags.DEFINE_float("output_tokens", 200, "Mean output length (tokens).")
SEED = flags.DEFINE_integer("seed", 0, "Seed of arrivals and lengths.")
# The scheduling.
SCHEDULER = flags.DEFINE_enum(
    "scheduler", "iteration", list(simulator.SCHEDULERS),
    "static, iteration (Orca), chunked (Sarathi) or vllm "
    "(vLLM V1's own scheduler).")
_MAX_RUNNING = flags.DEFINE_integer("max_running", 256, "Most running sequences.", lower_bound=1)
_TOKEN_BUDGET = flags.DEFINE_integer("token_budget", 512, "Chunked: tokens per iteration.",
                                     lower_bound=1)
_BATCH_WINDOW_MS = flags.DEFINE_float("batch_window_ms", 50.0, "Static: batching window, ms.",
                                      lower_bound=0.0)
ROUTER = flags.DEFINE_enum("router", "round_robin", list(fleet.ROUTERS),
                           "How a fleet (--dp > 1) sends requests to its replicas.")
# A replica of raw numbers.
_PARAMS_B = flags.DEFINE_float("params_b", None, "Raw: billions of weights read and "
                               "multiplied per iteration.")
_BANDWIDTH_TBPS = flags.DEFINE_float("bandwidth_tbps", None, "Raw: memory bandwidth, TB/s.")
_LAYERS = flags.DEFINE_integer("layers", None, "Raw: attention blocks.", lower_bound=1)
_HEADS = flags.DEFINE_integer("heads", None, "Raw: query heads per block.", lower_bound=1)
_HEAD_DIM = flags.DEFINE_integer("head_dim", None, "Raw: coordinates per head.", lower_bound=1)
_KV_MEMORY_GB = flags.DEFINE_float("kv_memory_gb", None, "Raw: memory for K/V pages, GB.")
_MAX_CONTEXT = flags.DEFINE_integer("max_context", None, "Raw: the model's longest sequence.",
                                    lower_bound=1)

# The targets.
TTFT_MS = flags.DEFINE_float("ttft_ms", None, "Goodput target: TTFT at most this (ms).")
TPOT_MS = flags.DEFINE_float("tpot_ms", None, "Goodput target: TPOT at most this (ms).")
ITL_MS = flags.DEFINE_float("itl_ms", None, "SLO for --find_max_rate: ITL at most this (ms).")
SLO_PERCENTILE = flags.DEFINE_float(
    "slo_percentile", 90.0, "Percentile at which "
    "--find_max_rate checks the SLOs, in (0, 100).", lower_bound=1e-6, upper_bound=99.999999)

for _holder, _unit in ((TTFT_MS, "ms"), (TPOT_MS, "ms"), (ITL_MS, "ms")):
  _cli.require_positive(_holder, _unit)
for _holder, _unit in ((ARRIVAL_RATE, "requests/s"), (_PROMPT_TOKENS, "tokens"),
                       (_OUTPUT_TOKENS, "tokens"), (_BURSTINESS, "1"), (NUM_REQUESTS, "requests"),
                       (_PARAMS_B, "billions"), (_BANDWIDTH_TBPS, "TB/s"), (_KV_MEMORY_GB, "GB")):
  _cli.require_positive(_holder, _unit)


def _seconds(holder: flags.FlagHolder) -> float | None:
  return None if holder.value is None else holder.value / 1e3


def targets() -> dict[str, float | None]:
  """The goodput targets in seconds (`metrics.run_metrics`' keywords)."""
  return {"ttft_target_s": _seconds(TTFT_MS), "tpot_target_s": _seconds(TPOT_MS)}


def slo_targets() -> dict[str, float | None]:
  """The SLOs --find_max_rate holds, in seconds."""
  return {"ttft_s": _seconds(TTFT_MS), "tpot_s": _seconds(TPOT_MS), "itl_s": _seconds(ITL_MS)}


def workload(rate: float, n: int, max_total: int | None = None) -> arrivals.Workload:
  """`n` requests at `rate` per second as the flags draw them (or the --trace), lengths
  beyond `max_total` tokens resampled or clipped."""
  if _TRACE.value is not None and ARRIVAL.value != "trace":
    raise InputError(f"--trace applies only with --arrival=trace (given --arrival="
                     f"{ARRIVAL.value}): add --arrival=trace, or leave --trace out.")
  if ARRIVAL.value == "trace":
    if not _TRACE.value:
      raise InputError("arrival='trace' needs --trace=PATH (a JSONL or CSV file).")
    return arrivals.load_trace(_TRACE.value)
  return arrivals.synthetic(arrival=ARRIVAL.value, num_requests=n, arrival_rate=rate,
                            seed=SEED.value, prompt_tokens=_PROMPT_TOKENS.value,
                            output_tokens=_OUTPUT_TOKENS.value, burstiness=_BURSTINESS.value,
                            max_total=max_total, **_length_flags.lengths())


def analytic(spec: Any, device: Any, layout: Any, options: dict[str, Any],
             targets: dict[str, float | None], percentile: float) -> dict[str, Any] | None:
  """The load model's max rate for the simulated replica as the flags schedule it
  (`simulation_result.analytic_max_rate`)."""
  return sim_result.analytic_max_rate(spec, device, layout, options=options,
                                      prompt_tokens=_PROMPT_TOKENS.value,
                                      output_tokens=_OUTPUT_TOKENS.value,
                                      max_running=_MAX_RUNNING.value, scheduler=SCHEDULER.value,
                                      token_budget=_TOKEN_BUDGET.value, targets=targets,
                                      percentile=percentile)


def engine_defaults(d: Any) -> dict[str, Any]:
  """An engine's scheduler defaults (`engine_drive.Drive`) in place of the flags the user
  did not give (vLLM: the simulator's vLLM scheduler); returns those applied."""
  if d is None:
    return {}
  own = ((SCHEDULER, "vllm" if d.entry.profile == "vllm" else d.scheduler),
         (_MAX_RUNNING, d.max_running), (_TOKEN_BUDGET, int(d.settings["n_bud"])))
  applied = {}
  for holder, value in own:
    if not flags.FLAGS[holder.name].present:
      flags.FLAGS[holder.name].value = applied[holder.name] = value
  return applied


def scheduling() -> dict[str, Any]:
  """A replica's scheduling options (`replica.from_model`, `replica.from_numbers`)."""
  return dict(max_running=_MAX_RUNNING.value, token_budget=_TOKEN_BUDGET.value,
              batch_window_s=_BATCH_WINDOW_MS.value / 1e3)


def raw_replica(holders: types.SimpleNamespace, **kw: Any) -> replica.Replica:
  """The replica of the raw numbers (`holders`: `_model_flags`' --bytes_per_weight,
  --kv_bytes_per_token, --tflops and --block_size); `kw`: its step model and scheduling.

  Raises:
    InputError: a raw number missing.
  """
  raw = {
      "params_b": _PARAMS_B, "kv_bytes_per_token": holders.kv_bytes_per_token,
      "bandwidth_tbps": _BANDWIDTH_TBPS, "layers": _LAYERS, "heads": _HEADS, "head_dim": _HEAD_DIM,
      "kv_memory_gb": _KV_MEMORY_GB
  }
  missing = [f"--{n}" for n, h in raw.items() if h.value is None]
  if missing:
    raise InputError(f"the model is not given: pass --model/--accelerator/--context or the raw "
                     f"numbers (missing {', '.join(missing)}).")
  k, tflops, block = holders.kv_bytes_per_token.value, holders.tflops.value, holders.block_size
  return replica.from_numbers(N=_PARAMS_B.value * 1e9, q=holders.bytes_per_weight.value, k=k,
                              BW=_BANDWIDTH_TBPS.value * 1e12,
                              F=None if tflops is None else tflops * 1e12, L=_LAYERS.value,
                              H=_HEADS.value, d=_HEAD_DIM.value,
                              kv_memory_bytes=_KV_MEMORY_GB.value * 1e9, page_bytes=block.value * k,
                              page_tokens=block.value, max_context=_MAX_CONTEXT.value,
                              description={"model": "raw numbers"}, **kw)
