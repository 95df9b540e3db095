"""Serving engines' scheduler defaults and memory-reservation rules, as their sources state.

`settings(engine, device, tp=, pp=, source=)` gives the held values the predictor takes
beside an engine's fitted terms (`calibrate.published_points.SETTINGS`): its cap on
running sequences `n_max`, its token budget `n_bud`, whether it chunks prefills,
whether it reserves K/V for a whole request up front (`reserve_full`), and its memory
rule in the registered memory terms (`u_mem`, `m_act`, `m_graph`, `x_free`;
`symbolic/reservation.py`). Every figure is read from `engine_defaults.json`
(`data/published/`), which names its source; a published run's own settings, where
its source states them, override the defaults (`SOURCE_SETTINGS`), and so does its
protocol: `first_wave` where a source's closed-loop means are those of its clients'
first requests, sent together (0 by default: a benchmark's steady state).

Held estimates (stated, not fitted): the activation workspace of a profile run,
`m_act = 16` bytes per token of the budget per element of the model's width (a bf16
hidden state and the MLP's gate, up and activated outputs of about 3.5 widths:
2 * (1 + 3 * 3.5) ~ 16 here rounded to 16, summed per chip).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from jaxroof import errors
from jaxroof.engines import published
from jaxroof.specs.accelerators import Accelerator

GIB = 2**30
MIB = 2**20
M_ACT = 16.0  # See the module docstring.
UNCAPPED = 1e6  # An engine whose running sequences only its K/V memory caps.

# Engines whose rules are known; NIM runs TensorRT-LLM (its docs: TensorRT-LLM profiles are
# preferred over vLLM), so it takes TensorRT-LLM's rules and profile.
RULES: tuple[str, ...] = ("vllm", "sglang", "trtllm", "nim", "gpt-fast")
ALIASES: dict[str, str] = {"nim": "trtllm"}

# A published run's own settings, from its source (`engine_defaults.json`,
# `benchmark_settings_seen`, and the row's derivation). "requests": the prompts submitted.
SOURCE_SETTINGS: dict[str, dict[str, object]] = {
    "rocm-vllm-0.7.3": {"n_max": "requests", "n_bud": 131072},
    "rocm-vllm-0.9.1": {"n_max": "requests", "n_bud": 131072},
    "sglang-vs-vllm-0.6.0": {
        "vllm": {"n_max": 256, "n_bud": 4096, "chunked": 0.0}, "sglang": {"u_mem": 0.88}
    },
    "trtllm-perf-v0.17": {"u_mem": 0.95},
    "trtllm-perf-v1.0": {"u_mem": 0.95},
    "trtllm-perf-latest": {"u_mem": 0.95},
    # Its 405B server ran with --mem-frac 0.87 (the run's derivation and sources.csv); the
    # 70B one states none (SGLang's default).
    "datacrunch-sglang-h200": {"models": {"llama-3.1-405b": {"u_mem": 0.87}}},
    # genai-perf's measurement windows (perf_analyzer, a few seconds each) hold about one
    # request per client at these lengths (request latencies of 10-200 s), so its means
    # are a first wave's: its own points show it (TTFT at 25 clients 5-9x TTFT at one, a
    # lockstep queue of 12 prefills; a steady state queues none of them).
    "nim-dli-genai-perf": {"first_wave": 1.0},
}


def _gib(device: Accelerator) -> float:
  return device.memory_capacity_bytes / GIB


def _vllm(device: Accelerator, tp: int, pp: int) -> dict[str, float]:
  d = published.engine_defaults()["vllm"]["v1_engine"]
  large = _gib(device) >= 70 and "a100" not in device.name.lower()
  key = "gpu_memory_at_least_70GiB_and_not_A100" if large else "other_gpus"
  seqs = d["max_num_seqs"][key]["openai_api_server"]
  budget = d["max_num_batched_tokens"][key]["openai_api_server"]
  return {
      "n_max": float(min(seqs, budget)), "n_bud": float(budget), "chunked": 1.0,
      "reserve_full": 0.0, "u_mem": float(d["gpu_memory_utilization"]), "m_act": M_ACT,
      "m_graph": 0.0, "x_free": 0.0, "first_wave": 0.0
  }


def _by_memory(table: Mapping[str, object], gib: float) -> object:
  """The entry of a table keyed `lt_60GiB (...)`, ..., `ge_160GiB (...)` for `gib`."""
  by = {key.split()[0]: value for key, value in table.items()}
  for key, limit in (("lt_60GiB", 60), ("lt_90GiB", 90), ("lt_160GiB", 160)):
    if gib < limit:
      return by[key]
  return by["ge_160GiB"]


def _graph_bs(rule: object, tp: int) -> float:
  if isinstance(rule, (int, float)):
    return float(rule)
  # "A if tp < N else B" (engine_defaults.json's wording of SGLang's rule).
  small, limit, large = (int(n) for n in re.findall(r"\d+", str(rule))[:3])
  return float(small if tp < limit else large)


def _sglang(device: Accelerator, tp: int, pp: int) -> dict[str, float]:
  d = published.engine_defaults()["sglang"]["recent"]
  gib = _gib(device)
  chunk = float(_by_memory(d["chunked_prefill_size_by_gpu_memory"], gib))
  graphs = _graph_bs(_by_memory(d["cuda_graph_max_bs_by_gpu_memory"], gib), tp)
  reserved = 512 + 1.5 * max(chunk, 2048) + 2 * graphs + 1024 * tp * pp / 8
  if gib > 60:
    reserved = max(reserved, 10240)
  total = device.memory_capacity_bytes / MIB
  return {
      "n_max": UNCAPPED, "n_bud": chunk, "chunked": 1.0, "reserve_full": 0.0, "u_mem": round(
          (total - reserved) / total, 3), "m_act": 0.0, "m_graph": 0.0, "x_free": 0.0,
      "first_wave": 0.0
  }


def _trtllm(device: Accelerator, tp: int, pp: int) -> dict[str, float]:
  d = published.engine_defaults()["trtllm"]
  example = d["trtllm_bench_runtime_example"]
  budget = float(example["max_runtime_tokens"])
  return {
      "n_max": float(min(example["max_runtime_batch_size"],
                         budget)), "n_bud": budget, "chunked": 0.0, "reserve_full": 1.0,
      "u_mem": float(d["kv_cache_free_gpu_memory_fraction"]["default"]), "m_act": M_ACT,
      "m_graph": 0.0, "x_free": 1.0, "first_wave": 0.0
  }


def _gpt_fast(device: Accelerator, tp: int, pp: int) -> dict[str, float]:
  # One request at a time (its published runs are batch 1): no scheduler to speak of.
  return {
      "n_max": 1.0, "n_bud": UNCAPPED, "chunked": 0.0, "reserve_full": 1.0, "u_mem": 1.0,
      "m_act": 0.0, "m_graph": 0.0, "x_free": 0.0, "first_wave": 0.0
  }


_BUILDERS = {"vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm, "gpt-fast": _gpt_fast}

NOTES: dict[str, str] = {
    "vllm": "vLLM V1 OpenAI-server defaults (max_num_seqs, max_num_batched_tokens by device "
            "memory); gpu_memory_utilization of the whole device less weights and the "
            "workspace of a budget-sized batch; chunked prefill; K/V for the tokens held",
    "sglang": "SGLang: chunked_prefill_size and CUDA-graph batch by device memory; "
              "mem_fraction_static from its reserved-memory rule; running sequences capped "
              "by the K/V pool",
    "trtllm": "TensorRT-LLM: kv_cache_free_gpu_memory_fraction of the memory the weights and "
              "workspace leave; trtllm-bench's example max batch 4096, max tokens 8192; no "
              "chunked context; 'Guaranteed No Evict' (K/V for the whole request)",
    "gpt-fast": "gpt-fast: one request at a time",
}


def canonical(engine: str) -> str:
  """The engine whose profile and rules `engine` uses (NIM: TensorRT-LLM)."""
  return ALIASES.get(engine, engine)


def settings(engine: str, device: Accelerator, *, tp: int = 1, pp: int = 1, source: str = "",
             requests: float | None = None, model: str = "") -> dict[str, float]:
  """The held scheduler and memory settings of `engine` on `device` (see the module
  docstring); a published run's own, where its source states them (for every model it
  ran, or for `model`'s runs: `SOURCE_SETTINGS[source]["models"]`), override them."""
  name = canonical(engine)
  if name not in _BUILDERS:
    errors.require_choice("engine", engine, RULES)
  out = _BUILDERS[name](device, tp, pp)
  given = dict(SOURCE_SETTINGS.get(source, {}))
  given = dict(given.get(name, given)) if isinstance(
      given.get(name), dict) else {k: v for k, v in given.items() if not isinstance(v, dict)}
  given.update(SOURCE_SETTINGS.get(source, {}).get("models", {}).get(model, {}))
  for key, value in given.items():
    if value == "requests":
      value = requests if requests is not None and math.isfinite(requests) else out[key]
    out[key] = float(value)
  if name in ("vllm", "trtllm"):  # A decode row takes one token of the budget.
    out["n_max"] = min(out["n_max"], out["n_bud"])
  return out
