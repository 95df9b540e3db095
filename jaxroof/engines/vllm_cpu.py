"""vLLM on a CPU as an engine: its own cost terms, their formulas and measured values.

What vLLM's CPU path does that the core cost model does not say, each a term
registered here (owner "vllm_cpu") and measured on the engine rather than fitted
(values and their provenance: `data/vllm_cpu.json`, `docs/cpu-engine.md`):

  c_llc, bw_llc  a step finds the first c_llc bytes of its weights in the CPU's
                 last-level cache and reads them at bw_llc; the rest at eta_w*BW;
  s_lru          how the cache loses its hits as the weights outgrow it: every
                 step reads the weights in one order, and an LRU scanned
                 cyclically by more than it holds keeps max(0, 2*c_llc - W) of W
                 bytes (s_lru = 1); s_lru = 0 keeps c_llc of any larger set;
  m_pass         its oneDNN GEMM multiplies m_pass rows per pass over the
                 weights and reads them again per m_pass rows more (0: no limit);
  t_act          its elementwise kernels (norms, rotary, SiLU-and-multiply,
                 residual adds) at t_act per token and activation element (A_w:
                 each block's hidden and active MLP widths; dense shapes only: for
                 MoE the router and the experts' weighted sum are left out);
  t_wake         what an iteration pays when the engine idled before it (a core
                 waking from its wait), paid by the requests that find it idle;
  s_cold         the share of the cached bytes an idle gap evicts: an iteration on
                 an idle engine reads that share from memory again (`cold_cache_s`);
  t_build        seconds per layer and token a step at a token count the engine
                 has not run lately spends building its GEMM kernels (it keeps
                 `KERNEL_CACHE_ROWS` of them).

The first four shape the calibrated iteration through `EXTENSION` (the weights'
read, `weight_passes_s`, `elementwise_s`, and `cold_cache_s` beside the step); the
last three shape a simulated replica (its wake and kernel cache), which the engine
fit builds (`jaxroof.calibrate.engine_replay`).
"""

from __future__ import annotations

import functools
import json
import pathlib
from collections.abc import Mapping
from typing import Any

import sympy as sp

from jaxroof import errors
from jaxroof.symbolic import terms

NAME = "vllm_cpu"
DATA = pathlib.Path(__file__).parent / "data" / "vllm_cpu.json"
KERNEL_CACHE_ROWS = 32  # vLLM 0.32: ops.create_onednn_mm(weight, 32) per linear weight.

c_llc = terms.register(
    "c_llc", "B", "weight bytes of a step an engine finds in the last-level "
    "cache (0: none)", applies_to="weights", default=0.0, bounds=(0.0, 1e13), obtained="measured",
    owner=NAME, label="cached weight bytes")
bw_llc = terms.register("bw_llc", "B/s", "rate an engine reads its cached weight bytes (c_llc) "
                        "at", applies_to="weights", default=0.0, bounds=(0.0, 1e15),
                        obtained="measured", owner=NAME, label="cached weights' read rate")
s_lru = terms.register(
    "s_lru", "1", "share of its c_llc an engine's cache loses per byte the weights exceed it "
    "(1: LRU under a cyclic scan, no hits past 2 c_llc; 0: keeps c_llc)", applies_to="weights",
    default=0.0, bounds=(0.0, 1.0), obtained="held", owner=NAME, label="cache hits lost (LRU: 1)")
m_pass = terms.register(
    "m_pass", "tokens", "rows an engine's GEMM multiplies in one pass over the weights (a "
    "matmul of more rows reads them again per m_pass rows; 0: no such limit)", applies_to="linear",
    default=0.0, bounds=(0.0, 1e6), obtained="measured", owner=NAME,
    label="GEMM rows per pass over the weights")
t_act = terms.register(
    "t_act", "s/element", "an engine's elementwise time per token per activation element "
    "(A_w: each block's hidden and active MLP widths; 0: none)", applies_to="linear", default=0.0,
    bounds=(0.0, 1e-3), obtained="measured", owner=NAME,
    label="elementwise kernels per token and element")
t_wake = terms.register("t_wake", "s",
                        "what an iteration pays when the engine was idle before it (0: none)",
                        applies_to="idle", default=0.0, bounds=(0.0, 100.0), obtained="measured",
                        owner=NAME, label="wake of an idle engine")
s_cold = terms.register("s_cold", "1",
                        "share of the cached weight bytes (c_llc) an idle gap evicts (0: none)",
                        applies_to="idle", default=0.0, bounds=(0.0, 1.0), obtained="measured",
                        owner=NAME, label="cached bytes evicted by an idle gap")
t_build = terms.register(
    "t_build", "s", "per layer and token, building the GEMM kernels of a step at a token count "
    f"not among the last {KERNEL_CACHE_ROWS} the engine ran (0: none)", applies_to="iteration",
    default=0.0, bounds=(0.0, 1.0), obtained="measured", owner=NAME,
    label="GEMM kernel build per layer and token")
TERM_NAMES: tuple[str, ...] = tuple(t.name for t in terms.owned_by(NAME))
# Terms that shape a simulated replica, not the iteration's expression.
REPLICA_TERMS: tuple[str, ...] = ("t_wake", "s_cold", "t_build")
# Terms the analytic bound keeps: a cache measured faster than the datasheet's bandwidth.
BOUND_KEEPS: tuple[str, ...] = ("c_llc", "bw_llc")

ASSUMPTIONS: tuple[str, ...] = (
    "the engine's GEMM reads the linear weights again per m_pass tokens past the first "
    "m_pass (held as measured; 0: no limit)",
    "the weights all at eta_w*BW unless a cache is held (c_llc bytes of them at bw_llc; with "
    "s_lru held, s_lru of them lost per byte the weights exceed c_llc)",
    "the engine's elementwise kernels at t_act per token and activation element (held as "
    "measured; 0: none)",
)


def cached_weight_bytes(weight_bytes: sp.Expr) -> sp.Expr:
  """The bytes of a step's weights found in the cache: min(W, c_llc) less s_lru per
  byte W exceeds c_llc, never below 0 (the smooth form of an LRU's cliff at s_lru = 1)."""
  return sp.Max(0, sp.Min(weight_bytes, c_llc - s_lru * (weight_bytes - c_llc)))


def weight_read_time(weight_bytes: sp.Expr, rate: sp.Expr) -> sp.Expr:
  """A step's weight reads (seconds): the cached bytes at `bw_llc`, the rest at `rate`
  (eta_w*BW); with c_llc = 0 the plain `weight_bytes / rate`."""
  cached = cached_weight_bytes(weight_bytes)
  return cached / sp.Max(bw_llc, 1) + (weight_bytes - cached) / rate


def cold_cache_time(weight_bytes: sp.Expr, rate: sp.Expr) -> sp.Expr:
  """What a step whose cache went cold pays over `weight_read_time` (seconds): its cached
  bytes from memory at `rate` instead of from the cache at `bw_llc` (0 where c_llc = 0,
  and where the cache is no faster than memory)."""
  cached = cached_weight_bytes(weight_bytes)
  return sp.Max(0, cached / rate - cached / sp.Max(bw_llc, 1))


def weight_passes(rows: sp.Expr, weight_bytes: sp.Expr, rate: sp.Expr) -> sp.Expr:
  """The weights read again by a matmul of more than `m_pass` rows (seconds):
  (ceiling(rows / m_pass) - 1) reads (`weight_read_time`); m_pass = 0 switches it off."""
  passes = sp.Max(0, sp.ceiling(rows / sp.Max(m_pass, 1)) - 1)
  return sp.Min(1, m_pass) * passes * weight_read_time(weight_bytes, rate)


def _seconds(parts: terms.IterationParts) -> dict[str, sp.Expr]:
  return {
      "weight_passes_s": weight_passes(parts.tokens, parts.linear_bytes, parts.weight_rate),
      "elementwise_s": t_act * parts.tokens * parts.A_w
  }


def _beside(parts: terms.IterationParts) -> dict[str, sp.Expr]:
  # Not in the step: what the same step pays more after the engine idled and its cache went
  # cold (a simulated replica's wake adds s_cold of it).
  return {"cold_cache_s": cold_cache_time(parts.weight_bytes, parts.weight_rate)}


def _check(values: Mapping[str, float], field: str) -> None:
  """A cache is its bytes and its rate together; s_lru and s_cold shape a cache."""
  if values.get("c_llc", 0.0) > 0 and not values.get("bw_llc", 0.0) > 0:
    raise errors.InputError(
        f"c_llc={values['c_llc']:g} without bw_llc: a cache needs the rate it is read at; "
        "give bw_llc above 0 too.", field=field)
  for name in ("s_lru", "s_cold"):
    if values.get(name, 0.0) > 0 and not values.get("c_llc", 0.0) > 0:
      raise errors.InputError(
          f"{name}={values[name]:g} without a cache: it shapes the cached bytes, so "
          "give c_llc and bw_llc too.", field=field)


EXTENSION = terms.extend(
    terms.Extension(NAME, weight_read=weight_read_time, seconds=_seconds,
                    memory=("weight_passes_s",), beside=_beside, check=_check,
                    assumptions=ASSUMPTIONS))


@functools.cache
def _data() -> dict[str, Any]:
  return json.loads(DATA.read_text())


def hosts() -> tuple[str, ...]:
  """The hosts whose measured terms ship (`data/vllm_cpu.json`)."""
  return tuple(_data()["hosts"])


def measured_terms(host: str) -> dict[str, float]:
  """One host's measured engine terms, by registry name, checked against their bounds.

  Raises:
    InputError: an unknown host (with the known ones).
  """
  errors.require_choice("host", host, hosts())
  return terms.checked(_data()["hosts"][host]["terms"], "host")
