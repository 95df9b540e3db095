"""A serving-benchmark run replayed by the continuous-batching simulator.

A vLLM `bench serve` result (or SGLang `bench_serving` line) gives request
metrics (TTFT, TPOT, ITL) of a workload: request rate (or "inf"), lengths,
number of prompts. `simulate_run` replays one run on a replica of the model
(`jaxroof.serving.replica.from_model`, with the run's tensor-parallel layout) under
given cost terms, keyed by their registry names (`jaxroof.symbolic.terms`): the
six factors of the calibrated step, the optional costs (`OPTIONAL`) and every term
a `ServingSetup` holds as measured (an engine's, e.g. `jaxroof.engines.vllm_cpu`'s
cache, wake and kernel builds).

The replayed workload: per-request `input_lens`/`output_lens` where the file
has them (the legacy script always writes them), else every request at the
mean lengths; arrivals all at 0 for rate "inf", else a seeded Poisson (or
gamma, vLLM's burstiness setting) process at the rate. vLLM's own arrival draws
are not in the file, so a finite-rate run is reproduced in distribution, not
request by request; a run with per-request detail replays its own
`start_times`. With `max_concurrency` set, TTFT (which vLLM measures from the
client's send, after its semaphore) is left out of the fit.

A run whose client received more than `CLIENT_BOUND_SHARE` of its tokens
together was paced by its client and API server (`client_bound`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxroof import errors
from jaxroof.engines import vllm_cpu
from jaxroof.measure import vllm_results
from jaxroof.parallel.layout import Layout
from jaxroof.serving import arrivals
from jaxroof.serving import metrics as metrics_lib
from jaxroof.serving import replica as replica_lib
from jaxroof.serving import simulator
from jaxroof.specs import accelerators
from jaxroof.specs import models
from jaxroof.specs import what_if
from jaxroof.symbolic import calibrated
from jaxroof.symbolic import terms
from jaxroof.symbolic.step_model import StepModel

# Searched always (unless held): weight and K/V bandwidth (eta_kv tied to eta_w), FLOP
# efficiency (prefill in TTFT, large batches) and the fixed cost per iteration.
SEARCHED = ("eta_w", "eta_f", "t0_step")
# Searched where asked (`ServingSetup.search`), else 0 (or held): a fixed cost per request
# before the engine sees it, per sequence per iteration, per layer per iteration (it needs
# fit runs of two depths, else it and t0_step are one sum), and the wake of an idle engine.
OPTIONAL = ("t0_request", "t0_seq", "t0_layer", "t_wake")
# Held unless searched or held otherwise: t0_layer at 1 ns, r_ovl at 1 (p = 2).
FIXED = {"t0_layer": 1e-9, "r_ovl": 1.0}
COALESCED_S = 1e-4  # A measured token gap below this is a coalesced delivery, not a step.
# A run with more than this share of its measured token gaps coalesced was paced by its
# client and API server, not by the engine: on a 2-core CPU they share a core with the
# engine's scheduler, and at about 1 ms steps a second stream starves (whole requests
# delivered in one chunk, TTFT = their duration). Quiet runs of the tiny, small and medium
# presets had at most 11% of their gaps coalesced, the nano preset's 23-49% (five runs).
CLIENT_BOUND_SHARE = 0.2
# The analytic bound in the simulator: datasheet speed, no fixed cost, r_ovl and t0_layer at
# `FIXED`.
BOUND = {"eta_w": 1.0, "eta_kv": 1.0, "eta_f": 1.0, "t0_step": 1e-9, **FIXED}


@dataclasses.dataclass(frozen=True)
class ServingSetup:
  """What the result files do not say: the model, device, layout and server limits, and
  which terms are searched or held.

  Attributes:
    search: the `OPTIONAL` costs searched too, by name (else 0, or held).
    held: cost terms held as measured, by registry name (SI): any core term (e.g. eta_w,
      eta_kv, eta_attn, r_ovl, t0_request) or an engine's (e.g. c_llc, t_act, t_wake). A
      held `SEARCHED` factor is not searched; eta_kv not held is tied to eta_w.
  """

  model: str
  accelerator: str
  tp: int = 1
  weight_dtype: str = "bf16"
  kv_dtype: str = "bf16"
  scheduler: str = "chunked"
  max_running: int = 256  # vLLM --max-num-seqs.
  token_budget: int = 2048  # vLLM --max-num-batched-tokens (chunked prefill).
  seed: int = 0
  accelerator_file: str | None = None  # A user's device file (replaces `accelerator`).
  search: tuple[str, ...] = ()
  held: Mapping[str, float] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    object.__setattr__(self, "search", tuple(self.search))
    for name in self.search:
      errors.require_choice("search", name, OPTIONAL)
    held = terms.checked(self.held, "hold")
    both = sorted(set(held) & set(self.search))
    if both:
      raise errors.InputError(
          f"{both[0]} is both held and searched: a term is either held as measured or "
          "searched; give one.", field="hold")
    object.__setattr__(self, "held", held)

  @property
  def searched(self) -> tuple[str, ...]:
    return tuple(n for n in SEARCHED if n not in self.held) + tuple(
        n for n in OPTIONAL if n in self.search)

  def held_terms(self) -> dict[str, float]:
    """The terms held: r_ovl (`FIXED`'s unless held) and every one the setup holds."""
    return {"r_ovl": FIXED["r_ovl"], **self.held}

  def bound(self, floor: bool = False) -> dict[str, float]:
    """The analytic bound's terms: datasheet speed, no fixed cost, every held term
    absent; as a `floor` of what a measurement can reach, a held cache the engine
    measured faster than the datasheet kept (`vllm_cpu.BOUND_KEEPS`)."""
    kept = {n: v for n, v in self.held.items() if floor and n in vllm_cpu.BOUND_KEEPS}
    absent = terms.defaults(n for n in self.held_terms() if n not in kept)
    return {**absent, **{n: 0.0 for n in OPTIONAL}, **BOUND, **kept}

  @property
  def device_name(self) -> str:
    return self.accelerator_file or self.accelerator


def workload_of(run: vllm_results.BenchRun, seed: int) -> arrivals.Workload:
  """The run's requests: its lengths, arrivals at its rate (see the module docstring)."""
  n = len(run.prompt_tokens)
  if run.arrival_s is not None:
    return arrivals.Workload(run.arrival_s.copy(), run.prompt_tokens, run.output_tokens, {
        "from": run.label, "num_requests": n, "arrivals": "replayed from the result's start_times"
    })
  if math.isinf(run.request_rate):
    times = np.zeros(n)
  else:
    rng = np.random.default_rng(seed)
    kind = "poisson" if run.burstiness == 1.0 else "gamma"
    times = arrivals.arrival_times(kind, n, run.request_rate, rng, run.burstiness)
    times -= times[0]
  return arrivals.Workload(times, run.prompt_tokens, run.output_tokens,
                           {"from": run.label, "num_requests": n})


def coalesced_share(run: vllm_results.BenchRun) -> float | None:
  """The share of the run's measured token gaps under `COALESCED_S` (None without detail)."""
  if run.detail is None or not len(run.detail["itl_s"]):
    return None
  return float(np.mean(run.detail["itl_s"] < COALESCED_S))


def client_bound(run: vllm_results.BenchRun) -> bool:
  """Whether the run's latencies are its client's and front end's (`CLIENT_BOUND_SHARE`)."""
  share = coalesced_share(run)
  return share is not None and share > CLIENT_BOUND_SHARE


def step_factors(values: Mapping[str, float]) -> dict[str, float]:
  """The six factors of the calibrated step: eta_kv tied to eta_w unless given,
  t0_layer and r_ovl at `FIXED` unless given."""
  return {
      "eta_w": values["eta_w"], "eta_kv": values.get("eta_kv",
                                                     values["eta_w"]), "eta_f": values["eta_f"],
      "t0_step": values["t0_step"], "t0_layer": float(values.get("t0_layer", FIXED["t0_layer"])),
      "r_ovl": float(values.get("r_ovl", FIXED["r_ovl"]))
  }


def factors_of(values: Mapping[str, float]) -> dict[str, float]:
  """Every term a replay used, by name: the six factors, the other optional costs (0
  unless given) and every other registered term among `values`."""
  out = step_factors(values)
  out.update({n: float(values.get(n, 0.0)) for n in OPTIONAL if n not in out})
  known = terms.registered()
  return {**out, **{n: float(v) for n, v in values.items() if n in known and n not in out}}


def load_device(setup: ServingSetup) -> accelerators.Accelerator:
  if setup.accelerator_file:
    return what_if.load_accelerator_file(setup.accelerator_file)
  return accelerators.load_accelerator(setup.accelerator)


def replica_of(run: vllm_results.BenchRun, setup: ServingSetup,
               factors: Mapping[str, float]) -> replica_lib.Replica:
  """The replica a run is simulated on: the run's own server facts where it has them, the
  calibrated step of `factors` (the cost model's terms among them), and an engine's
  wake and kernel builds where held (`vllm_cpu.REPLICA_TERMS`)."""
  spec = models.load_model(run.model or setup.model)
  longest = int(np.max(run.prompt_tokens + run.output_tokens))
  server = run.server or {}
  config = server.get("config") or {}
  max_running = int(config.get("max_num_seqs") or setup.max_running)
  max_running = min(max_running, run.max_concurrency or max_running)
  block = int(config.get("block_size") or 16)
  step_model = StepModel.calibrated(step_factors(factors),
                                    terms=calibrated.iteration_terms(factors))
  replica = replica_lib.from_model(
      spec, load_device(setup), context=longest, step_model=step_model,
      weight_dtype=setup.weight_dtype, kv_dtype=setup.kv_dtype, max_running=max_running,
      token_budget=int(config.get("max_num_batched_tokens") or
                       setup.token_budget), layout=Layout(tp=setup.tp), block_size=block)
  if server.get("kv_blocks"):
    description = {
        **replica.description, "kv_pages": int(server["kv_blocks"]),
        "kv_pages_from": "the server's log (KV cache size / block size)",
        "chunked_prefill": bool(config.get("chunked_prefill", True))
    }
    replica = dataclasses.replace(replica, total_pages=int(server["kv_blocks"]),
                                  description=description)
  build = float(factors.get("t_build", 0.0))
  if build > 0:
    rows = vllm_cpu.KERNEL_CACHE_ROWS
    replica = dataclasses.replace(
        replica, kernel_cache=simulator.KernelCache(rows, spec.num_layers * build), description={
            **replica.description, "kernel_cache":
                f"a step at a token count not among the last {rows} builds its "
                f"GEMM kernels: {spec.num_layers} layers x {build * 1e6:.3g} us per token"
        })
  wake = float(factors.get("t_wake", 0.0))
  share = float(factors.get("s_cold", 0.0))
  cold = share * float(replica.cost.decode(
      1.0, 1.0, replica.step_model)["cold_cache_s"]) if share > 0 else 0.0
  if wake + cold > 0:
    replica = dataclasses.replace(
        replica, wake_s=wake + cold, description={
            **replica.description,
            "wake": f"an iteration on an idle engine pays {(wake + cold) * 1e3:.3g} ms more: its "
                    f"wake ({wake * 1e3:.3g} ms) and its weights' cached bytes read from memory "
                    f"({cold * 1e3:.3g} ms)"
        })
  return replica


def simulate_run(run: vllm_results.BenchRun, setup: ServingSetup, factors: Mapping[str, float],
                 detail: bool = False) -> dict[str, Any]:
  """Simulated TTFT, TPOT and ITL (seconds) of a run under the terms, the setup's held
  ones beneath `factors`.

  Keys: the medians (`median_<metric>_s`) and `p90_<metric>_s`; with `detail`, also the
  per-request arrays (`detail`). A request's `t0_request` delays when the engine sees
  it; its TTFT still runs from the client's send. With a held `t_build` the run is
  simulated twice: the second, reported, starts from the kernel cache the first left.
  """
  factors = {**setup.held_terms(), **factors}
  replica = replica_of(run, setup, factors)
  workload = workload_of(run, setup.seed)
  cost = float(factors.get("t0_request", 0.0))
  sent = workload.arrival_s
  if cost:
    workload = arrivals.Workload(sent + cost, workload.prompt_tokens, workload.output_tokens,
                                 workload.description)
  out = simulator.simulate(workload, replica, setup.scheduler)
  if replica.kernel_cache is not None:  # Served before: the cache as this load leaves it.
    warm = dataclasses.replace(replica.kernel_cache, warm=out.kernel_rows)
    out = simulator.simulate(workload, dataclasses.replace(replica, kernel_cache=warm),
                             setup.scheduler)
  block = metrics_lib.serving_metrics(sent, out.first_token_s, out.finish_s, out.output_tokens,
                                      out.itl_s)
  result: dict[str, Any] = {}
  for metric in ("ttft", "tpot", "itl"):
    result[f"median_{metric}_s"] = block[f"{metric}_s"]["median"]
    result[f"p90_{metric}_s"] = block[f"{metric}_s"]["p90"]
  result["request_throughput_per_s"] = block["request_throughput_per_s"]
  if detail:
    per = metrics_lib.per_request(sent, out.first_token_s, out.finish_s, out.output_tokens)
    result["detail"] = {"ttft_s": per["ttft_s"], "tpot_s": per["tpot_s"], "itl_s": out.itl_s}
  return result
