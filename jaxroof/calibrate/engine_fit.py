"""Fitting the calibrated factors to serving-benchmark results through the simulator.

A vLLM `bench serve` result (or SGLang `bench_serving` line) gives request
metrics (TTFT, TPOT, ITL) of a workload: request rate (or "inf"), lengths,
number of prompts. Each run is replayed by the continuous-batching simulator
(`jaxroof.serving.simulator`, scheduler "chunked" by default, as vLLM's V1
engine) on a replica of the model (`jaxroof.serving.replica.from_model`, with
the run's tensor-parallel layout), and the factors are chosen whose simulated
medians reproduce the measured ones: the mean squared log error over every
run's `METRICS`.

Three factors are searched, the ones request medians can tell apart: eta_w
(weight and K/V bandwidth; eta_kv tied to it), eta_f (FLOP efficiency:
prefill in TTFT, large batches) and t0_step (fixed cost per iteration); eta_w
is held instead where measured (`weight_efficiency`: the engine's GEMMs' rate beyond the cache);
t0_layer and r_ovl stay at `FIXED` (stated in the result). Optional: a fixed
cost per request before the engine sees it (`t0_request`, `request_cost`) and
one per sequence per iteration (`t0_seq`, `sequence_cost`: the engine's Python
and sampling work grows with the running sequences; the cost model's
`t0_seq * n_seq`), one per layer per iteration (`t0_layer`, `layer_cost`: the
engine's per-layer kernels and their launches; it needs fit runs of two depths, else it
and t0_step are one sum), and one on an iteration that begins on an idle engine (`t_wake`,
`wake_cost`: the engine waking from its wait; paid by the requests that find it idle, where
`t0_request` is paid by every request; hold `t0_request` at its measured value,
`request_seconds`, and the load tells the two apart). With the cache and `cold_share` held,
an iteration on an idle engine also reads that share of its cached weight bytes from memory
(the cost model's `cold_cache_s`, on top of t_wake). Held as measured, not searched: r_ovl (`overlap`, how the
engine's GEMMs overlap weight reads and FLOPs), m_pass (`m_pass`, the rows its GEMM
multiplies in one pass over the weights: on vLLM's CPU path a mixed step of a 256-token
prompt and k decode rows reads them about twice) and, where given, eta_kv (`kv_efficiency`,
the rate of the engine's own attention kernel over the K/V; else tied to eta_w) and eta_attn
(`attention_efficiency`, the FLOP rate of that kernel; else its FLOPs go with the linear
layers' at eta_f). The simulator is
discrete (admission and page events), so the loss has small jumps and no
jax gradient: `search` is a damped Gauss-Newton (Levenberg-Marquardt) on the
log residuals within `BOUNDS`, its Jacobian from finite differences `FD_STEP`
apart (wider than the jumps), some 30-60 simulations of every run.

The replayed workload: per-request `input_lens`/`output_lens` where the file
has them (the legacy script always writes them), else every request at the
mean lengths; arrivals all at 0 for rate "inf", else a seeded Poisson (or
gamma, vLLM's burstiness setting) process at the rate. vLLM's own arrival draws
are not in the file, so a finite-rate run is reproduced in distribution, not
request by request. With `max_concurrency` set, TTFT (which vLLM measures
from the client's send, after its semaphore) is left out of the loss.

Held-out error is leave-one-run-out: each run's metrics predicted by factors
fitted on the other runs. A held-out run whose client received more than
`CLIENT_BOUND_SHARE` of its tokens together was paced by its client and API
server (`client_bound`): its rows show their error outside the medians.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxroof import errors
from jaxroof import files
from jaxroof.calibrate import fitting
from jaxroof.measure import profiles
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
from jaxroof.symbolic.step_model import StepModel

SEARCHED = ("eta_w", "eta_f", "t0_step")
# With `ServingSetup.request_cost`: a fixed cost per request (HTTP, API server,
# tokenisation) before the engine sees it, fitted too (0 at the bound).
REQUEST_COST = "t0_request"
# With `ServingSetup.sequence_cost`: a fixed cost per sequence per iteration (0 at the bound).
SEQUENCE_COST = "t0_seq"
# With `ServingSetup.wake_cost`: what an iteration pays when the engine was idle before it
# (`simulator.Replica.wake_s`), fitted (0 at the bound). Unlike `REQUEST_COST` only a request
# that finds the engine idle pays it: served prefills of 16 tokens took 2-4 ms longer after
# an idle gap than beside a running decode (results/vllm_cpu/engine_idle_probe.py). Its part
# that grows with the weights held in the cache is the cost model's `cold_cache_s`, charged
# with it where `ServingSetup.cold_share` is held; t_wake is the rest (about 2 ms for every
# shape whose weights fit the cache).
WAKE_COST = "t_wake"
# With `ServingSetup.layer_cost`: the fixed cost per layer per iteration, searched (else `FIXED`).
LAYER_COST = "t0_layer"
# `ServingSetup.m_pass`: the rows the engine's GEMM multiplies in one pass over the weights,
# held as measured (0 at the bound: the weights read once a step).
WEIGHT_PASS = "m_pass"
# `ServingSetup.kv_efficiency`: eta_kv held at the engine's attention rate over the K/V as a
# share of BW (measured; None: tied to eta_w, as the cost model's one memory efficiency).
KV_EFFICIENCY = "eta_kv"
# `ServingSetup.attention_efficiency`: eta_attn held at the engine's attention kernel's FLOP
# rate as a share of F (measured; None: 0, attention FLOPs with the linear layers').
ATTENTION_EFFICIENCY = "eta_attn"
# `ServingSetup.cache_bytes`, `cache_rate`: the weight bytes of a step the engine finds in the
# CPU's last-level cache and the rate it reads them at (measured from its GEMMs over weight
# sets of several sizes; 0: none, every weight byte at eta_w*BW).
CACHE_BYTES, CACHE_RATE = "c_llc", "bw_llc"
# `ServingSetup.cache_lru`: how the cache loses its hits as a step's weights outgrow c_llc
# (the cost model's s_lru: 1 an LRU under the steps' cyclic scan, none past 2 c_llc; 0: keeps
# c_llc of any larger set, the default), held with the cache.
CACHE_LRU = "s_lru"
# `ServingSetup.kernel_build`: seconds per decoder layer and per token a step spends building
# the engine's GEMM kernels at a token count it has not kept (measured: vLLM CPU's oneDNN
# handler builds one primitive per row count and keeps `KERNEL_CACHE_ROWS`;
# engine_cold_rows.py; 0: none).
KERNEL_BUILD = "t_build"
# `ServingSetup.elementwise_seconds`: the engine's elementwise kernels (norms, rotary,
# SiLU-and-multiply, residual adds) per token and activation element (measured: vLLM CPU's
# inductor code, results/vllm_cpu/engine_forward_ops.py; 0: none).
ELEMENTWISE = "t_act"
# `ServingSetup.cold_share`: the share of the cached weight bytes (c_llc) an idle gap evicts,
# held (1: all of them; 0: none, the default): an iteration on an idle engine pays that share
# of the cost model's `cold_cache_s` on top of t_wake (measured: the idle probe's wake less
# t_wake grows with the cached bytes as the whole share would; wake_split.py).
COLD_SHARE = "s_cold"
KERNEL_CACHE_ROWS = 32  # vLLM 0.32: ops.create_onednn_mm(weight, 32) per linear weight.
BOUNDS = {
    "eta_w": (0.05, 1.0), "eta_f": (0.01, 1.0), "t0_step": (1e-5, 0.05), REQUEST_COST: (1e-5, 0.5),
    SEQUENCE_COST: (1e-6, 0.02), LAYER_COST: (1e-7, 0.01), WAKE_COST: (1e-5, 0.05)
}
START = {
    "eta_w": 0.6, "eta_f": 0.4, "t0_step": 1e-3, REQUEST_COST: 5e-3, SEQUENCE_COST: 1e-4,
    LAYER_COST: 5e-5, WAKE_COST: 2e-3
}
# Held-out percentiles (vLLM's np.percentile) of each metric.
PERCENTILES = (50, 90)
COALESCED_S = 1e-4  # A measured token gap below this is a coalesced delivery, not a step.
# A run with more than this share of its measured token gaps coalesced was paced by its
# client and API server, not by the engine: on this 2-core CPU they share core 0 with
# vLLM's scheduler, and at about 1 ms steps (nano-llama) a second stream starves (whole
# requests delivered in one chunk, TTFT = their duration). Quiet runs of tiny-, small- and
# medium-llama had at most 11% of their gaps coalesced, nano-llama's 23-49% (five runs)
# (results/vllm_cpu/README.md, "Client-bound runs").
CLIENT_BOUND_SHARE = 0.2
FIXED = {"t0_layer": 1e-9, "r_ovl": 1.0}
# `search(starts=2)`'s second start: every searched fixed cost at its lower bound.
LOW_COST_START = {
    n: BOUNDS[n][0] for n in ("t0_step", REQUEST_COST, SEQUENCE_COST, LAYER_COST, WAKE_COST)
}
MIN_RUNS = 1
FD_STEP = 0.05  # Log-space step of the finite-difference Jacobian (5%).
MAX_DAMPING = 1e6  # Beyond this no damped step lowers the loss: a minimum.
DAMPING = 1e-3  # Levenberg-Marquardt's first damping (relative to the curvature).
TOLERANCE = 0.01  # Stop when a step moves every log factor by < 1%.
MISSING_RESIDUAL = 5.0  # The log residual of a metric the simulation cannot produce.
MAX_EVALUATIONS = 200
BOUND_FACTORS = {
    "eta_w": 1.0, KV_EFFICIENCY: 1.0, "eta_f": 1.0, "t0_step": 1e-9, "r_ovl": FIXED["r_ovl"],
    REQUEST_COST: 0.0, SEQUENCE_COST: 0.0, WAKE_COST: 0.0, WEIGHT_PASS: 0,
    ATTENTION_EFFICIENCY: 0.0, CACHE_BYTES: 0.0, CACHE_RATE: 0.0, KERNEL_BUILD: 0.0,
    ELEMENTWISE: 0.0, COLD_SHARE: 0.0, CACHE_LRU: 0.0
}
# A measured median under this share of the bound's simulated one cannot be
# reproduced by factors in range: it is left out of the fit and flagged.
BELOW_BOUND = 0.9
ASSUMPTIONS = (
    "each run replayed by the continuous-batching simulator: with per-request detail "
    "(--save-detailed) its own arrivals (start_times) and lengths; else per-request lengths "
    "from the file where present, else mean lengths, and arrivals all at 0 for rate inf, "
    "else a seeded Poisson/gamma draw at the rate",
    "a run with a jaxroof_engine_run block (experiments.vllm_bench) is simulated with its "
    "server's max_num_seqs, token budget, chunked prefill, block size and K/V blocks (read "
    "from the server's log)",
    "the engine's GEMM reads the linear weights again per m_pass tokens past the first m_pass "
    "(held as measured; 0: no limit); a step at a token count not among the last "
    f"{KERNEL_CACHE_ROWS} the engine ran builds its GEMM kernels, t_build per layer and token "
    "(held as measured; 0: none), the cache at a run's start as the same run leaves it (a "
    "server that has served this load before: vLLM's cache lasts across the runs one "
    "server serves)",
    "eta_kv tied to eta_w unless held (the engine's attention kernel timed over the K/V); "
    "attention FLOPs with the linear layers' at eta_f unless eta_attn is held (that "
    "kernel's FLOP rate, timed on prompts); the weights all at eta_w*BW unless a cache is "
    "held (c_llc bytes of them at bw_llc, from the engine's GEMMs over weight sets of several "
    "sizes; with s_lru held, s_lru of them lost per byte the weights exceed c_llc); "
    "r_ovl held (1, or the engine's measured GEMM overlap) and t0_layer "
    "at 1 ns unless searched (layer_cost); the bound at r_ovl = 1; on a "
    "layout, communication as the simulator's (analytic, serial, no eta_comm)",
    "loss: mean squared log error of the simulated vs measured median TTFT, TPOT and ITL "
    "(TTFT left out for runs with max_concurrency)",
)


@dataclasses.dataclass(frozen=True)
class ServingSetup:
  """What the result files do not say: the model, device, layout and server limits."""

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
  request_cost: bool = False  # Fit `REQUEST_COST` (else 0, or `request_seconds`).
  # `REQUEST_COST` held as measured (seconds; None: 0 unless `request_cost` fits it): the
  # client's time to a one-token response less the engine's own prefill time, isolated
  # requests (results/vllm_cpu/engine_prefill_lengths.py).
  request_seconds: float | None = None
  sequence_cost: bool = False  # Fit `SEQUENCE_COST` (else 0).
  wake_cost: bool = False  # Fit `WAKE_COST` (else 0, or `wake_seconds`).
  # `WAKE_COST` held as measured (seconds; None: 0 unless `wake_cost` fits it): a short
  # prompt's served prefill after an idle gap less the same beside a running decode
  # (results/vllm_cpu/engine_idle_probe.py).
  wake_seconds: float | None = None
  layer_cost: bool = False  # Fit `LAYER_COST` (else `FIXED`'s).
  # r_ovl, held (not searched): how the engine's GEMMs overlap weight reads and FLOPs
  # (p = 1 + r_ovl); `FIXED`'s 1 unless the caller measured it (the engine's own GEMMs
  # timed at several token counts).
  overlap: float = 1.0
  # Rows the engine's GEMM multiplies in one pass over the weights, held (measured; 0: no
  # limit): a step of more tokens reads the linear weights once more.
  m_pass: int = 0
  # eta_kv, held (not searched): the engine's attention kernel's K/V rate as a share of the
  # device's BW (measured: vLLM's CPU kernel read K/V at about 9 GB/s net of its FLOPs here,
  # 8-11 by model, where its GEMMs read weights at 24-39 GB/s;
  # results/vllm_cpu/engine_attention_rates*.json). None: tied to eta_w.
  kv_efficiency: float | None = None
  # eta_w, held (not searched): the engine's GEMMs' weight rate beyond the cache as a share of
  # the device's BW (measured: engine_cache.json's bw_rest over the read ceiling, 0.39-0.45 on
  # the EPYC of issue 25). None: searched. Held, the served runs' slower small-model steps
  # go to the fixed costs instead of lowering the rate every model's weights are read at.
  weight_efficiency: float | None = None
  # eta_attn, held: the engine's attention kernel's FLOP rate as a share of F (measured:
  # vLLM's CPU kernel 114-121 GFLOP/s on prompts of 128-512 tokens, its GEMMs 450). None:
  # attention FLOPs with the linear layers' at eta_f.
  attention_efficiency: float | None = None
  # c_llc and bw_llc, held: the weight bytes of a step the engine finds in the CPU's cache and
  # the rate it reads them at (measured: vLLM's GEMMs on the AMX Xeon read 50-110 MB at about
  # 22 GB/s, the rest at 10-12; results/vllm_cpu/passIN/engine_cache.json). 0: no cache.
  cache_bytes: float = 0.0
  cache_rate: float = 0.0
  # s_lru, held with the cache: the share of c_llc lost per byte a step's weights exceed it
  # (1: an LRU under the steps' cyclic scan, c_llc from engine_cache_fit.py's `lru`; on the
  # EPYC of issue 25 each pass's fit loss fell 12-34%, held-out rows were mixed). 0: c_llc of
  # any larger set.
  cache_lru: float = 0.0
  # t_build, held: seconds per decoder layer and per token a step at a new token count spends
  # building the engine's GEMM kernels (measured: vLLM's oneDNN primitives, results/vllm_cpu/
  # engine_cold_rows.py). 0: none.
  kernel_build: float = 0.0
  # t_act, held: seconds per token and activation element (`symbols.A_w`) the engine's
  # elementwise kernels take (measured: vLLM's inductor code on the AMX Xeon, 1.2-1.9 ns;
  # results/vllm_cpu/engine_forward_ops.json). 0: none.
  elementwise_seconds: float = 0.0
  # s_cold, held: the share of the cached weight bytes an idle gap evicts (`COLD_SHARE`; 1 on
  # the AMX Xeon of issue 25, results/vllm_cpu/wake_split.py). 0: none.
  cold_share: float = 0.0

  def __post_init__(self):
    for held, fitted in (("request_seconds", "request_cost"), ("wake_seconds", "wake_cost")):
      value = getattr(self, held)
      if value is None:
        continue
      if getattr(self, fitted):
        raise errors.InputError(
            f"{held}={value!r} with {fitted}: a fixed cost is either held as measured or "
            "fitted; give one.", field=held)
      errors.require_non_negative(held, value)
    errors.require_non_negative("elementwise_seconds", self.elementwise_seconds)
    if self.weight_efficiency is not None and not 0.0 < self.weight_efficiency <= 1.0:
      raise errors.InputError(
          f"weight_efficiency={self.weight_efficiency!r} is not allowed: give eta_w, the "
          "engine's weight read rate as a share of the device's BW, in (0, 1].",
          field="weight_efficiency")
    if not 0.0 <= self.cache_lru <= 1.0:
      raise errors.InputError(
          f"cache_lru={self.cache_lru!r} is not allowed: give the share of the cache lost per "
          "byte the weights exceed it, in [0, 1] (1: LRU).", field="cache_lru")
    if self.cache_lru > 0 and not self.cache_bytes > 0:
      raise errors.InputError(
          f"cache_lru={self.cache_lru!r} without a cache: it shapes the cached bytes, so give "
          "cache_bytes and cache_rate too.", field="cache_lru")
    if not 0.0 <= self.cold_share <= 1.0:
      raise errors.InputError(
          f"cold_share={self.cold_share!r} is not allowed: give the share of the cached "
          "weight bytes an idle gap evicts, in [0, 1].", field="cold_share")

  @property
  def searched(self) -> tuple[str, ...]:
    optional = ((REQUEST_COST, self.request_cost), (SEQUENCE_COST, self.sequence_cost),
                (LAYER_COST, self.layer_cost), (WAKE_COST, self.wake_cost))
    base = SEARCHED if self.weight_efficiency is None else SEARCHED[1:]
    return base + tuple(name for name, searched in optional if searched)

  def held(self) -> dict[str, float]:
    """The factors held as measured: r_ovl always; eta_w, eta_kv, eta_attn, the cache,
    t_build, t_act, t0_request and t_wake where given."""
    weights = ({} if self.weight_efficiency is None else {"eta_w": float(self.weight_efficiency)})
    kv = {} if self.kv_efficiency is None else {KV_EFFICIENCY: float(self.kv_efficiency)}
    attention = ({} if self.attention_efficiency is None else
                 {ATTENTION_EFFICIENCY: float(self.attention_efficiency)})
    cache = ({
        CACHE_BYTES: float(self.cache_bytes), CACHE_RATE: float(self.cache_rate),
        **({CACHE_LRU: float(self.cache_lru)} if self.cache_lru > 0 else {})
    } if self.cache_bytes > 0 else {})
    build = {KERNEL_BUILD: float(self.kernel_build)} if self.kernel_build > 0 else {}
    elementwise = ({ELEMENTWISE: float(self.elementwise_seconds)}
                   if self.elementwise_seconds > 0 else {})
    request = {} if self.request_seconds is None else {REQUEST_COST: float(self.request_seconds)}
    wake = {} if self.wake_seconds is None else {WAKE_COST: float(self.wake_seconds)}
    cold = {COLD_SHARE: float(self.cold_share)} if self.cold_share > 0 else {}
    return {
        "r_ovl": float(self.overlap), **weights, **kv, **attention, **cache, **build, **elementwise,
        **request, **wake, **cold
    }

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


def _step_factors(values: Mapping[str, float]) -> dict[str, float]:
  return {
      "eta_w": values["eta_w"], "eta_kv": values.get(KV_EFFICIENCY, values["eta_w"]),
      "eta_f": values["eta_f"], "t0_step": values["t0_step"], **FIXED,
      LAYER_COST: float(values.get(LAYER_COST, FIXED[LAYER_COST])),
      "r_ovl": float(values.get("r_ovl", FIXED["r_ovl"]))
  }


def _factors(values: Mapping[str, float]) -> dict[str, float]:
  held = {
      n: float(values[n]) for n in (ATTENTION_EFFICIENCY, CACHE_BYTES, CACHE_RATE, CACHE_LRU,
                                   KERNEL_BUILD, ELEMENTWISE, COLD_SHARE) if n in values
  }
  costs = {n: float(values.get(n, 0.0)) for n in (REQUEST_COST, SEQUENCE_COST, WAKE_COST)}
  return {**_step_factors(values), **costs, **held}


def load_device(setup: ServingSetup) -> accelerators.Accelerator:
  if setup.accelerator_file:
    return what_if.load_accelerator_file(setup.accelerator_file)
  return accelerators.load_accelerator(setup.accelerator)


def replica_of(run: vllm_results.BenchRun, setup: ServingSetup,
               factors: Mapping[str, float]) -> replica_lib.Replica:
  """The replica a run is simulated on: the run's own server facts where it has them."""
  spec = models.load_model(run.model or setup.model)
  longest = int(np.max(run.prompt_tokens + run.output_tokens))
  server = run.server or {}
  config = server.get("config") or {}
  max_running = int(config.get("max_num_seqs") or setup.max_running)
  max_running = min(max_running, run.max_concurrency or max_running)
  block = int(config.get("block_size") or 16)
  replica = replica_lib.from_model(
      spec, load_device(setup), context=longest, step_model=StepModel.calibrated(
          _step_factors(factors), engine={
              SEQUENCE_COST: float(factors.get(SEQUENCE_COST, 0.0)),
              WEIGHT_PASS: float(factors.get(WEIGHT_PASS, setup.m_pass)),
              ATTENTION_EFFICIENCY: float(factors.get(ATTENTION_EFFICIENCY, 0.0)),
              CACHE_BYTES: float(factors.get(CACHE_BYTES,
                                             0.0)), CACHE_RATE: float(factors.get(CACHE_RATE, 0.0)),
              CACHE_LRU: float(factors.get(CACHE_LRU,
                                           0.0)), ELEMENTWISE: float(factors.get(ELEMENTWISE, 0.0))
          }), weight_dtype=setup.weight_dtype, kv_dtype=setup.kv_dtype, max_running=max_running,
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
  build = float(factors.get(KERNEL_BUILD, 0.0))
  if build > 0:
    replica = dataclasses.replace(
        replica, kernel_cache=simulator.KernelCache(KERNEL_CACHE_ROWS, spec.num_layers * build),
        description={
            **replica.description, "kernel_cache":
                f"a step at a token count not among the last {KERNEL_CACHE_ROWS} builds its "
                f"GEMM kernels: {spec.num_layers} layers x {build * 1e6:.3g} us per token"
        })
  wake = float(factors.get(WAKE_COST, 0.0))
  share = float(factors.get(COLD_SHARE, 0.0))
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
  """Simulated TTFT, TPOT and ITL (seconds) of a run under the factors.

  Keys: `METRICS` (medians) and `p90_<metric>_s`; with `detail`, also the
  per-request arrays (`detail`). A request's `REQUEST_COST` delays when the
  engine sees it; its TTFT still runs from the client's send. With a held
  `KERNEL_BUILD` the run is simulated twice: the second, reported, starts from
  the kernel cache the first left.
  """
  factors = {**setup.held(), **factors}
  replica = replica_of(run, setup, factors)
  workload = workload_of(run, setup.seed)
  cost = float(factors.get(REQUEST_COST, 0.0))
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


def _residuals(runs: Sequence[vllm_results.BenchRun], setup: ServingSetup,
               values: Mapping[str, float], cache: dict) -> np.ndarray:
  """Log ratios of simulated to measured medians, every run's metrics in order."""
  key = tuple(round(values[n], 12) for n in setup.searched)
  if key not in cache:
    out = []
    for run in runs:
      simulated = simulate_run(run, setup, values)
      for name, measured in run.measured.items():
        value = simulated[name]
        # A metric the simulation cannot produce: a large, finite residual.
        out.append(
            math.log(value / measured) if value is not None and value > 0 else MISSING_RESIDUAL)
    cache[key] = np.asarray(out)
  return cache[key]


def _clip(name: str, value: float) -> float:
  """A factor held within its `BOUNDS`."""
  low, high = BOUNDS[name]
  return float(min(max(value, low), high))


def search(runs: Sequence[vllm_results.BenchRun], setup: ServingSetup, *,
           start: Mapping[str, float] | None = None, max_simulations: int = MAX_EVALUATIONS,
           tolerance: float = TOLERANCE, starts: int = 1) -> tuple[dict[str, float], float, int]:
  """Damped Gauss-Newton (Levenberg-Marquardt) on the log factors within `BOUNDS`.

  The loss is the mean squared log ratio of simulated to measured medians.
  The simulator is discrete, so there is no jax gradient: each step takes the
  residuals' Jacobian from one simulation per factor `FD_STEP` apart in log
  space (wider than the loss's small jumps) and solves the damped normal
  equations. A step that lowers the loss is taken and the damping eased; one
  that does not raises the damping. It starts at `start` (default `START`) and
  stops when a taken step moves every log factor by less than `tolerance` (~1%)
  or after `max_simulations` loss evaluations (each simulates every run once;
  repeated points are cached). Deterministic.

  The loss can hold more than one minimum: the additive costs trade against each other and
  against eta_f (pass I7's fit landed at t0_seq 0.4 ms or at none as a held term moved by
  1%). `starts=2` descends again from `LOW_COST_START` (every searched fixed cost at its
  lower bound) and keeps the lower loss; each descent has `max_simulations`.

  Returns:
    (factors, loss, distinct loss evaluations).
  """
  if starts not in (1, 2):
    raise errors.InputError(f"starts={starts} is not allowed: give 1 (from START) or 2 (from "
                            "START and from every fixed cost at its lower bound).")
  names = setup.searched
  low = np.log([BOUNDS[n][0] for n in names])
  high = np.log([BOUNDS[n][1] for n in names])
  cache: dict = {}

  def residuals(x: np.ndarray) -> np.ndarray:
    return _residuals(runs, setup, dict(zip(names, np.exp(np.clip(x, low, high)))), cache)

  def descend(origin: Mapping[str, float]) -> tuple[np.ndarray, np.ndarray]:
    x = np.log([_clip(n, origin[n]) for n in names])
    here = residuals(x)
    damping, budget = DAMPING, len(cache) + max_simulations
    # A point clipped at a bound or seen before adds nothing to the cache, so the steps are
    # bounded too, and a damping no step can satisfy ends the search at a minimum within
    # the bounds (the log factors pinned there).
    for _ in range(max_simulations):
      if len(cache) >= budget or damping > MAX_DAMPING:
        break
      steps = [FD_STEP if x[i] + FD_STEP <= high[i] else -FD_STEP for i in range(len(names))]
      jacobian = np.stack(
          [(residuals(x + h * e) - here) / h for h, e in zip(steps, np.eye(len(names)))], axis=1)
      normal = jacobian.T @ jacobian
      move = np.linalg.solve(normal + damping * np.diag(np.diag(normal) + 1e-12),
                             -jacobian.T @ here)
      trial = np.clip(x + move, low, high)
      there = residuals(trial)
      if np.mean(there**2) < np.mean(here**2):
        settled = np.max(np.abs(trial - x)) < tolerance
        x, here, damping = trial, there, damping / 3
        if settled:
          break
      else:
        damping *= 4
    return x, here

  origins = [start or START, {**(start or START), **LOW_COST_START}][:starts]
  x, here = min((descend(o) for o in origins), key=lambda found: float(np.mean(found[1]**2)))
  return ({n: float(v) for n, v in zip(names, np.exp(x))}, float(np.mean(here**2)), len(cache))


def _errors(run: vllm_results.BenchRun, simulated: Mapping[str, float | None]) -> dict[str, Any]:
  out = {}
  for name, measured in run.measured.items():
    value = simulated[name]
    out[name] = {
        "measured_s": measured, "simulated_s": value,
        "rel_error": None if value is None else abs(value - measured) / measured
    }
  return out


def _held_cache(setup: ServingSetup) -> dict[str, float]:
  """The setup's held cache terms (none when it holds no cache)."""
  return {n: v for n, v in setup.held().items() if n in (CACHE_BYTES, CACHE_RATE)}


def screen(runs: Sequence[vllm_results.BenchRun],
           setup: ServingSetup) -> tuple[list[vllm_results.BenchRun], list[str]]:
  """The runs with only the metrics the bound does not undercut; a flag per dropped one.

  A median measured below `BELOW_BOUND` of the one simulated at the bound
  (datasheet speed, no fixed cost) is faster than any factor in range allows:
  the setup or the benchmark's timing differs from the model, so it would
  only drag the factors to their limits. A held cache (`cache_bytes`) is a
  measured rate above the datasheet's, so the bound keeps it. A client-bound
  run (`client_bound`) is kept and flagged: its medians may still be the
  engine's, its tails are not.
  """
  cache = _held_cache(setup)
  floor_factors = {**BOUND_FACTORS, **cache}
  held = ", the held cache" if cache else ""
  kept_runs, flags = [], []
  for run in runs:
    if client_bound(run):
      flags.append(
          f"{run.label}: {coalesced_share(run):.0%} of its token gaps are coalesced (over "
          f"{CLIENT_BOUND_SHARE:.0%}): the client and API server paced it, not the engine, "
          "so its latencies hold a term the simulator lacks; fitted as given")
    bound = simulate_run(run, setup, floor_factors)
    kept = {}
    for name, measured in run.measured.items():
      floor = bound[name]
      if floor is not None and measured < BELOW_BOUND * floor:
        flags.append(
            f"{run.label} {name.removesuffix('_s')} = {measured * 1e3:.1f} ms is below the "
            f"bound's {floor * 1e3:.1f} ms (simulated at datasheet speed{held}, no fixed "
            "cost): no factor in range reproduces it, so it is left out of the fit; check the setup "
            "(model, device, tp, dtypes, scheduler) or how the benchmark timed it")
      else:
        kept[name] = measured
    if kept:
      kept_runs.append(dataclasses.replace(run, measured=kept))
  return kept_runs, flags


def fit_runs(runs: Sequence[vllm_results.BenchRun], setup: ServingSetup,
             **search_kw) -> dict[str, Any]:
  """Factors from every run, leave-one-run-out held-out errors, the bound beside them.

  Metrics below the bound are left out first (`screen`, flagged).

  Raises:
    InputError: no runs, or no metric the bound does not undercut.
  """
  if len(runs) < MIN_RUNS:
    raise errors.InputError(f"runs={len(runs)} is too few: give at least {MIN_RUNS} "
                            "benchmark run.")
  all_runs = list(runs)
  runs, flags = screen(all_runs, setup)
  if not runs:
    raise errors.InputError(
        f"from_vllm: every measured median is below the bound for model={setup.model!r} on "
        f"{setup.tp} x {setup.accelerator!r}: {flags[0]}.")
  values, loss, sims = search(runs, setup, **search_kw)
  # Each fold searches afresh from `START` (not from the full fit, which saw the
  # held-out run), with the same settings.
  fold_kw = {k: v for k, v in search_kw.items() if k != "start"}
  folds, held = [], []
  if len(runs) >= 2:
    for i, run in enumerate(runs):
      train = [r for j, r in enumerate(runs) if j != i]
      fold_values, _, _ = search(train, setup, **fold_kw)
      errs = _errors(run, simulate_run(run, setup, fold_values))
      held += [e["rel_error"] for e in errs.values() if e["rel_error"] is not None]
      folds.append({
          "heldout_run": run.label, "trained_on": [r.label for r in train],
          "factors": _factors({**fold_values, **setup.held()}), "metrics": errs
      })
  per_run, bound_errs, train_errs = [], [], []
  fitted = {r.label: set(r.measured) for r in runs}
  for run in all_runs:
    cal = _errors(run, simulate_run(run, setup, values))
    bound = _errors(run, simulate_run(run, setup, BOUND_FACTORS))
    for name in cal:
      cal[name]["in_fit"] = name in fitted.get(run.label, set())
    train_errs += [
        e["rel_error"] for e in cal.values() if e["rel_error"] is not None and e["in_fit"]
    ]
    bound_errs += [
        bound[n]["rel_error"] for n, e in cal.items()
        if bound[n]["rel_error"] is not None and e["in_fit"]
    ]
    per_run.append({
        "run": run.label, "engine": run.engine,
        "request_rate": None if math.isinf(run.request_rate) else run.request_rate,
        "max_concurrency": run.max_concurrency, "requests": len(run.prompt_tokens),
        "mean_prompt_tokens": float(run.prompt_tokens.mean()),
        "mean_output_tokens": float(run.output_tokens.mean()), "calibrated": cal, "bound": bound
    })
  held_summary = fitting.error_summary(held)
  return {
      "factors": _factors({**values, **setup.held()}),
      "searched": list(setup.searched),
      "fixed": {
          n: v for n, v in {**FIXED, **setup.held(), WEIGHT_PASS: setup.m_pass}.items()
          if n not in setup.searched
      },
      "tied": {} if setup.kv_efficiency is not None else {KV_EFFICIENCY: "eta_w"},
      "loss": loss,
      "statistic": "mean squared log error",
      "simulations": sims,
      "starts": search_kw.get("starts", 1),
      "setup": dataclasses.asdict(setup),
      "heldout_median_rel_error": held_summary["median_rel_error"],
      "heldout_max_rel_error": held_summary["max_rel_error"],
      "heldout_points": held_summary["points"],
      "heldout_method": ("leave-one-run-out: each run's medians simulated with factors "
                         "searched on the other runs" if folds else
                         "none: one run (give two or more runs for a held-out error)"),
      "train": fitting.error_summary(train_errs),
      "bound": {
          **fitting.error_summary(bound_errs),
          "what": "simulated with eta = 1 and no fixed cost (the analytic bound "
                  "iteration), on the metrics in the fit"
      },
      "folds": folds,
      "runs": per_run,
      "rows_used": len(runs),
      "metrics_used": sum(len(r.measured) for r in runs),
      "flags": flags,
      "assumptions": list(ASSUMPTIONS),
  }


def _thin(values: np.ndarray, keep: int = 101) -> list[float]:
  """Sorted values, or `keep` evenly spaced quantiles of them (for CDF plots)."""
  values = np.sort(np.asarray(values, float))
  if len(values) <= keep:
    return values.tolist()
  return np.quantile(values, np.linspace(0, 1, keep)).tolist()


def predict_heldout(runs: Sequence[vllm_results.BenchRun], setup: ServingSetup,
                    factors: Mapping[str, float]) -> dict[str, Any]:
  """Held-out runs predicted with fitted factors: `heldout[]` rows and CDF samples.

  Each row: `run`, `metric` (ttft, tpot, itl), `percentile`, `measured_s`,
  `predicted_s` (calibrated), `bound_s` (eta = 1, no fixed costs) and
  `rel_error` (|predicted - measured| / measured). A coalesced measurement has
  no relative error; a client-bound run's rows (`client_bound`) keep theirs but
  stay out of the medians and the maximum, counted apart.
  """
  rows, throughput, cdfs, terms = [], [], [], []
  for run in runs:
    predicted = simulate_run(run, setup, factors, detail=True)
    bound = simulate_run(run, setup, BOUND_FACTORS)
    share, paced = coalesced_share(run), client_bound(run)
    for metric in ("ttft", "tpot", "itl"):
      for q in PERCENTILES:
        measured = vllm_results.measured_percentile(run, metric, q)
        key = f"median_{metric}_s" if q == 50 else f"p{q}_{metric}_s"
        value = predicted.get(key)
        if measured is None or value is None:
          continue
        coalesced = measured < COALESCED_S  # Tokens that arrived together: no step to match.
        note = {}
        if coalesced:
          note = {
              "note": f"measured {measured * 1e3:.3g} ms: under {COALESCED_S * 1e3:g} ms the "
                      "client received these tokens together (coalesced_itl_share), so no "
                      "relative error is defined; left out of the medians"
          }
        elif paced:
          note = {
              "client_bound": True,
              "note": f"{share:.0%} of this run's token gaps are coalesced (over "
                      f"{CLIENT_BOUND_SHARE:.0%}): its client and API server paced it, not the "
                      "engine; the error is shown and left out of the medians and the maximum"
          }
        rows.append({
            "run": run.label, "model": run.model or setup.model, "metric": metric, "percentile": q,
            "measured_s": measured, "predicted_s": value, "bound_s": bound.get(key),
            "rel_error": None if coalesced else abs(value - measured) / measured, **note
        })
    measured_rate = run.measured_throughput
    if measured_rate and predicted.get("request_throughput_per_s"):
      throughput.append({
          "run": run.label, "metric": "request_throughput", "measured_per_s": measured_rate,
          "predicted_per_s": predicted["request_throughput_per_s"],
          "rel_error": abs(predicted["request_throughput_per_s"] - measured_rate) / measured_rate
      })
    if share is not None:
      terms.append({
          "run": run.label, "term": "coalesced_itl_share", "value": share, "client_bound": paced,
          "what": f"share of measured token gaps under {COALESCED_S * 1e3:g} ms: "
                  "tokens the client received together (the client, API server "
                  "and engine share the CPU), not engine steps; the simulator has "
                  "no such term"
      })
    if run.detail is not None:
      cdfs.append({
          "run": run.label, "measured": {m: _thin(run.detail[f"{m}_s"]) for m in ("ttft", "itl")},
          "predicted": {m: _thin(predicted["detail"][f"{m}_s"]) for m in ("ttft", "itl")}
      })
  scored = [r for r in rows if r["rel_error"] is not None and not r.get("client_bound")]
  errors_ = [r["rel_error"] for r in scored]
  paced_points = sum(bool(r.get("client_bound")) for r in rows)
  return {
      "heldout": rows, "heldout_throughput": throughput, "cdfs": cdfs, "heldout_terms": terms,
      "heldout_median_rel_error": float(np.median(errors_)) if errors_ else None,
      "heldout_median_rel_error_by_metric": {
          f"p{q} {m}": float(
              np.median(
                  [r["rel_error"] for r in scored if r["metric"] == m and r["percentile"] == q]))
          for m in ("ttft", "tpot", "itl") for q in PERCENTILES
          if any(r["metric"] == m and r["percentile"] == q for r in scored)
      }, "heldout_max_rel_error": float(np.max(errors_)) if errors_ else None,
      "heldout_points": len(errors_),
      "heldout_points_coalesced": sum(r["rel_error"] is None for r in rows),
      "heldout_points_client_bound": paced_points, "client_bound_share": CLIENT_BOUND_SHARE
  }


def _per_file(chosen: str | Sequence[str] | None, paths: Sequence[str],
              field: str) -> list[str | None]:
  """One model (or None: the setup's) per file: one for all, or one per file."""
  per_file = [chosen] if isinstance(chosen, str) or chosen is None else list(chosen)
  if len(per_file) == 1:
    per_file = per_file * len(paths)
  if paths and len(per_file) != len(paths):
    raise errors.InputError(
        f"{field} names {len(per_file)} models for {len(paths)} files: give one, or one "
        "per file.", field=field)
  for name in set(per_file) - {None, ""}:
    try:
      models.load_model(name)
    except errors.InputError as error:  # Named as the per-file list, not the setup's model.
      raise errors.InputError(str(error), field=field) from None
  return per_file


def _heldout_runs(paths: Sequence[str],
                  per_file: Sequence[str | None]) -> list[vllm_results.BenchRun]:
  """The held-out files' runs, each on its model; every one must carry per-request detail."""
  held = []
  for path, model in zip(paths, per_file):
    held += [
        dataclasses.replace(r, model=model or None)
        for r in vllm_results.read_runs([path], field="heldout_vllm")
    ]
  for run in held:
    if run.detail is None:
      raise errors.InputError(
          f"heldout_vllm={run.path!r} has no per-request detail "
          "(start_times, input_lens, output_lens, ttfts, itls): rerun vllm "
          "bench serve with --save-result --save-detailed.", field="heldout_vllm")
  return held


def _engine_run_block(runs: Sequence[vllm_results.BenchRun]) -> dict[str, Any]:
  """`engine_run`: the version, device, dates and load of runs made by experiments.vllm_bench."""
  blocks = [r.engine_run for r in runs if r.engine_run]
  if not blocks:
    return {}
  loads = [b["load"]["before"][0] for b in blocks if isinstance(b.get("load"), dict)]
  return {
      "engine_run": {
          "vllm_version": blocks[0].get("vllm_version"), "device": blocks[0].get("device"),
          "date": f"{min(b.get('date', '') for b in blocks)} to "
                  f"{max(b.get('date', '') for b in blocks)}",
          "load": f"{min(loads):.2f}-{max(loads):.2f}" if loads else None,
          "what": "measurement: vLLM bench serve on loopback (jaxroof_engine_run blocks)"
      }
  }


def calibrate_engine(paths: Sequence[str], setup: ServingSetup, *,
                     heldout_paths: Sequence[str] = (),
                     heldout_model: str | Sequence[str] | None = None,
                     fit_model: str | Sequence[str] | None = None, **search_kw) -> dict[str, Any]:
  """Reads result files and fits them (`fit_runs`); predicts held-out files; the JSON.

  Held-out files must carry per-request detail (`--save-detailed`); each is
  replayed with its own arrivals and lengths, on `heldout_model` if given:
  one model for every held-out file, or one per file (in order). `fit_model`
  does the same for the fitted files (default the setup's model): runs of two
  model sizes let the fit tell the weights' rate from the fixed costs, which
  one size cannot.

  Raises:
    InputError: a bad file or key, an unknown model or device, a layout the
      model or device refuses, a held-out file without per-request detail.
  """
  models.load_model(setup.model)
  load_device(setup)
  per_file = _per_file(heldout_model, heldout_paths, "heldout_model")
  fit_per_file = _per_file(fit_model, paths, "fit_model")
  runs = []
  for path, model in zip(paths, fit_per_file):
    runs += [dataclasses.replace(r, model=model or None) for r in vllm_results.read_runs([path])]
  held = _heldout_runs(heldout_paths, per_file)
  result = fit_runs(runs, setup, **search_kw)
  if held:
    result["loo"] = {
        k: result[k] for k in ("heldout_median_rel_error", "heldout_max_rel_error", "heldout_points",
                              "heldout_method")
    }
    result.update(predict_heldout(held, setup, result["factors"]))
    result["heldout_method"] = (
        "held-out files: each run replayed with its own arrivals and lengths and predicted "
        "with the factors fitted on the from_vllm runs; rows: p50 and p90 of TTFT, TPOT, ITL")
  result.update(_engine_run_block([*runs, *held]))
  return {
      "kind": "engine_calibration",
      "what": "calibrated factors chosen so that the continuous-batching simulator "
              "reproduces measured serving-benchmark medians (TTFT, TPOT, ITL)", "labels": {
                  "measured": "measurement (the result files)",
                  "predicted": "calibrated prediction (simulator + fitted factors)",
                  "bound": "analytic bound (simulator, eta = 1, no fixed costs)"
              }, "source": {
                  "files": [os.fspath(p) for p in paths
                           ], "heldout_files": [os.fspath(p) for p in heldout_paths],
                  "heldout_models": per_file if heldout_paths else [],
                  "fit_models": [m or setup.model for m in fit_per_file],
                  "engines": sorted({r.engine for r in runs}), "model": setup.model,
                  "accelerator": setup.device_name, "tp": setup.tp
              }, **result, "units": {
                  "measured_s": "s", "simulated_s": "s", "predicted_s": "s", "bound_s": "s",
                  "rel_error": "1", REQUEST_COST: "s", "t0_step": "s"
              }
  }


def read_factors(path: str | os.PathLike[str]) -> dict[str, float]:
  """An earlier engine calibration's factors (the result JSON of `calibrate_engine`), with
  the m_pass it held: what `predict_runs` predicts with, on another device or day.

  Raises:
    InputError: not such a result, or a factor missing, not a number or negative.
  """
  data = files.read_json("engine_factors", path)
  if (not isinstance(data, dict) or data.get("kind") != "engine_calibration" or
      not isinstance(data.get("factors"), dict)):
    raise errors.InputError(
        f"engine_factors={os.fspath(path)!r} is not an engine calibration: give the result "
        "JSON of a vLLM-run fit (kind engine_calibration).", field="engine_factors")
  factors = dict(data["factors"])
  fixed = data.get("fixed")
  if isinstance(fixed, dict) and WEIGHT_PASS in fixed:
    factors[WEIGHT_PASS] = fixed[WEIGHT_PASS]
  missing = [n for n in SEARCHED if n not in factors]
  if missing:
    raise errors.InputError(
        f"engine_factors={os.fspath(path)!r} lacks {', '.join(missing)}: give the result "
        "JSON of a vLLM-run fit (kind engine_calibration).", field="engine_factors")
  out = {}
  for name, value in factors.items():
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or
        not math.isfinite(value) or value < 0):
      raise errors.InputError(
          f"engine_factors={os.fspath(path)!r}: {name}={value!r} is not a finite number >= 0.",
          field="engine_factors")
    out[name] = float(value)
  return out


def predict_runs(heldout_paths: Sequence[str], setup: ServingSetup, factors: Mapping[str, float], *,
                 heldout_model: str | Sequence[str] | None = None,
                 factors_from: str | None = None) -> dict[str, Any]:
  """Runs predicted with given factors and no fit: the JSON (`kind` engine_prediction).

  The factors of one calibration (`read_factors`) on the setup's device: the
  efficiency factors and fixed costs fitted on one device or day, the ceilings
  of another. Rows as `predict_heldout`'s; each run replayed with its own
  arrivals and lengths.

  Raises:
    InputError: as `calibrate_engine`'s for the held-out files, model and device.
  """
  models.load_model(setup.model)
  load_device(setup)
  if not heldout_paths:
    raise errors.InputError("heldout_vllm is empty: give the runs to predict.",
                            field="heldout_vllm")
  per_file = _per_file(heldout_model, heldout_paths, "heldout_model")
  held = _heldout_runs(heldout_paths, per_file)
  values = {**setup.held(), **factors}
  result = predict_heldout(held, setup, values)
  return {
      "kind": "engine_prediction",
      "what": "serving-benchmark runs predicted by the continuous-batching simulator with "
              "factors fitted elsewhere (no fit on these runs)", "labels": {
                  "measured": "measurement (the result files)",
                  "predicted": "calibrated prediction (simulator + the given factors, on this "
                               "device's ceilings)",
                  "bound": "analytic bound (simulator, eta = 1, no fixed costs)"
              },
      "factors": {**_factors(values), WEIGHT_PASS: float(values.get(WEIGHT_PASS, setup.m_pass))},
      "factors_from": None if factors_from is None else os.fspath(factors_from), "source": {
          "heldout_files": [os.fspath(p) for p in heldout_paths], "heldout_models": per_file,
          "model": setup.model, "accelerator": setup.device_name, "tp": setup.tp
      }, "setup": dataclasses.asdict(setup), **result,
      "heldout_method": "each run replayed with its own arrivals and lengths and predicted "
                        "with the given factors, none fitted on it; rows: p50 and p90 of "
                        "TTFT, TPOT, ITL", **_engine_run_block(held), "units": {
          "measured_s": "s", "predicted_s": "s", "bound_s": "s", "rel_error": "1",
          REQUEST_COST: "s", "t0_step": "s"
      }
  }


def engine_profile(result: dict[str, Any]) -> profiles.Profile:
  """The fitted factors as a profile of the device (a `Profile` the experiments read)."""
  setup, source = result["setup"], result["source"]
  device = (what_if.load_accelerator_file(setup["accelerator_file"]) if
            setup.get("accelerator_file") else accelerators.load_accelerator(setup["accelerator"]))
  created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
  fit_block = {
      key: result[key]
      for key in ("heldout_median_rel_error", "heldout_max_rel_error", "heldout_points",
                  "heldout_method", "loss", "statistic", "searched", "fixed", "tied")
  }
  return profiles.Profile(
      device_kind=device.full_name, platform="", backend=", ".join(source["engines"]),
      dtype=setup["weight_dtype"], jax_version=importlib.metadata.version("jax"), created=created,
      ceilings={}, factors={n: float(result["factors"][n]) for n in calibrated.FACTOR_NAMES
                           }, fit=fit_block, model={"setup": setup},
      method="serving-benchmark medians (TTFT, TPOT, ITL) reproduced by the "
      "continuous-batching simulator (jaxroof.calibrate.engine_fit)", accelerator=device.name,
      source={
          **source, "date": created, "rows_used": result["rows_used"],
          "what": "request-level metrics of the user's serving benchmark"
      })
