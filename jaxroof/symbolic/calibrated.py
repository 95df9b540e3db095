"""The calibrated step model: the symbolic floor with fitted factors and costs.

The analytic floor of `jaxroof.symbolic.formulas` assumes every byte moves at the
device's bandwidth and every FLOP at its peak, with nothing else to pay. The
calibrated model keeps its terms and adds what a device and an
implementation actually achieve, as named sympy symbols:

  weight_s  = N*q / (eta_w*BW)        weights streamed at a fraction of BW
  kv_s      = B*T*k / (eta_kv*BW)     K/V read (and, by the implementation,
                                      copied) at another fraction of BW
  compute_s = 2*N_act*B / (eta_f*F)   linear FLOPs at a fraction of F
  linear_s  = (weight_s**p + compute_s**p)**(1/p),  p = 1 + r_ovl
  step_s    = t0_step + L*t0_layer + linear_s + kv_s

Ops run one after another. The linear layers take their weight reads and
their FLOPs combined by a p-norm: a kernel that overlaps them perfectly takes
the larger (the roofline's Max, r_ovl -> oo), one that does not takes the sum
(r_ovl -> 0); the fit says which the device does. Attention's K/V reads come
on top, as do a fixed cost per step (dispatch) and one per layer (launches).
The expression is lambdified once to JAX, and optax fits the logarithms of
the six factors to the logarithm of measured step times, so a 10% error
weighs the same at 1 ms and at 1 s.
"""

from __future__ import annotations

import functools
from typing import Literal

import sympy as sp

from jaxroof.symbolic import formulas
from jaxroof.symbolic.lambdify import lambdified
from jaxroof.symbolic.symbols import (A_w, B, BW, F, FACTOR_QUANTITIES, L, N, N_act, T, bw_llc,
                                      c_llc, eta_f, eta_kv, eta_attn, eta_w, k, m_pass, q, r_ovl,
                                      r_pack, s_lru, t0_layer, t0_seq, t0_step, t_act)

FACTORS: tuple[sp.Symbol, ...] = (eta_w, eta_kv, eta_f, t0_step, t0_layer, r_ovl)
FACTOR_NAMES: tuple[str, ...] = tuple(str(s) for s in FACTORS)
FACTOR_UNITS: dict[str, str] = {str(x.symbol): x.unit for x in FACTOR_QUANTITIES}
INPUTS: tuple[sp.Symbol, ...] = (B, T, N, q, k, BW, F, N_act, L)
INPUT_NAMES: tuple[str, ...] = tuple(str(s) for s in INPUTS)

ASSUMPTIONS: tuple[str, ...] = (
    "ops run one after another: linear layers combine weight reads and "
    "FLOPs by the fitted overlap, attention's K/V time comes on top",
    "efficiency factors and fixed costs fitted to measured decode steps "
    "(see the profile); attention FLOPs, activations and K/V copies are "
    "absorbed by the factor of the term they scale with",
)


def _overlap(a: sp.Expr, b: sp.Expr) -> sp.Expr:
  """The p-norm of a and b, p = 1 + r_ovl, written so no power underflows."""
  larger = sp.Max(a, b)
  p = 1 + r_ovl
  return larger * ((a / larger)**p + (b / larger)**p)**(1 / p)


def overlap(a: sp.Expr, b: sp.Expr) -> sp.Expr:
  """The fitted overlap of two times (public for the iteration model)."""
  return _overlap(a, b)


def cached_weight_bytes(weight_bytes: sp.Expr) -> sp.Expr:
  """The bytes of a step's weights found in an engine's cache: min(W, c_llc) less s_lru per
  byte W exceeds c_llc, never below 0.

  A step reads its weights in the same order every time; a least-recently-used cache that
  such a cyclic scan outgrows evicts each byte before it comes round again, so an LRU
  (s_lru = 1) keeps max(0, 2 c_llc - W) of a set larger than c_llc (none past 2 c_llc, the
  smooth form of the cliff), and a cache that keeps a fixed part (s_lru = 0) keeps c_llc.
  """
  return sp.Max(0, sp.Min(weight_bytes, c_llc - s_lru * (weight_bytes - c_llc)))


def weight_read_time(weight_bytes: sp.Expr, rate: sp.Expr) -> sp.Expr:
  """A step's weight reads (seconds): its cached bytes (`cached_weight_bytes`) from the
  last-level cache at `bw_llc`, the rest at `rate` (eta_w*BW).

  An engine on a CPU finds the weights a step read last time still in its cache when they
  fit: on the AMX Xeon of issue 25 vLLM's GEMMs read 26-50 MB of weights at about 22 GB/s,
  201-403 MB at 12-14, and a least-squares fit of min(W, c_llc)/bw_llc + the rest at one
  rate to nine weight sets leaves 6-7% (results/vllm_cpu/engine_cache_fit.py). c_llc = 0
  (every device but such a CPU) is the plain `weight_bytes / rate`.
  """
  cached = cached_weight_bytes(weight_bytes)
  return cached / sp.Max(bw_llc, 1) + formulas.memory_time(weight_bytes - cached, rate)


def cold_cache_time(weight_bytes: sp.Expr, rate: sp.Expr) -> sp.Expr:
  """What a step whose cache went cold pays over `weight_read_time` (seconds): its cached
  bytes (`cached_weight_bytes`) come from memory at `rate` instead of from the cache at
  `bw_llc`.

  An engine idle between steps loses what its busy steps kept in the cache (the other
  processes on the machine, an idle core): on the AMX Xeon of issue 25 a short prefill after
  0.2 s idle cost 1.9 ms more than beside a running decode for shapes of 1-2 MB of weights,
  2.6-3.7 ms for 15-76 MB (results/vllm_cpu/engine_idle_probe.json). 0 where c_llc = 0,
  and where the cache is held no faster than memory.
  """
  cached = cached_weight_bytes(weight_bytes)
  return sp.Max(0, formulas.memory_time(cached, rate) - cached / sp.Max(bw_llc, 1))


def _terms(weights_cached: bool = False) -> dict[str, sp.Expr]:
  """The calibrated step's named expressions, built from `formulas`; `weights_cached`: the
  weights read through `weight_read_time` (an engine's terms)."""
  weight_bytes = formulas.weight_traffic(N, q)
  weight_s = (weight_read_time(weight_bytes, eta_w * BW)
              if weights_cached else formulas.memory_time(weight_bytes, eta_w * BW))
  kv_s = formulas.memory_time(formulas.retained_kv_bytes(B, T, k), eta_kv * BW)
  compute_s = formulas.compute_time(B, N_act, eta_f * F)
  fixed_s = t0_step + L * t0_layer
  step_s = fixed_s + _overlap(weight_s, compute_s) + kv_s
  return {
      "weight_bytes": formulas.weight_traffic(N, q),
      "kv_bytes": formulas.retained_kv_bytes(B, T, k),
      "traffic_bytes": formulas.step_traffic(B, N, q, T, k),
      "weight_s": weight_s,
      "kv_s": kv_s,
      "fixed_s": fixed_s,
      "memory_s": weight_s + kv_s,
      "compute_s": compute_s,
      "linear_s": _overlap(weight_s, compute_s),
      "step_s": step_s,
      "aggregate_tokens_per_s": formulas.aggregate_rate(B, step_s),
      "per_sequence_tokens_per_s": formulas.per_sequence_rate(step_s),
  }


def calibrated_step() -> sp.Expr:
  """The calibrated step time as one sympy expression (seconds)."""
  return _terms()["step_s"]


def readable_step() -> str:
  """The calibrated step with the overlap written as a named p-norm."""
  t = _terms()
  pnorm = sp.Function("pnorm")(t["weight_s"], t["compute_s"])
  return f"{t['fixed_s'] + pnorm + t['kv_s']}, p = {1 + r_ovl}"


OUTPUT_NAMES: tuple[str, ...] = tuple(_terms())


@functools.cache
def calibrated_model(backend: Literal["numpy", "jax"] = "numpy"):
  """The calibrated terms as a vectorised function, lambdified once.

  Returns `f(**values) -> dict` where `values` holds `INPUT_NAMES` and
  `FACTOR_NAMES`, arrays that broadcast together (`evaluate.lambdified`'s
  convention). The JAX form is jit-compiled and differentiable in the factors.
  """
  return lambdified(_terms(), INPUTS + FACTORS, backend)


SUMMARY_NAMES: tuple[str, ...] = (
    "weight_kv_crossover_batch",
    "memory_limit_tokens_per_s",
    "compute_crossover_batch",
    "rate_limit_tokens_per_s",
)


@functools.cache
def _summary_exprs() -> tuple[sp.Expr, ...]:
  """Calibrated crossovers and limits, solved from the calibrated terms."""
  t = _terms()
  [kv_cross] = sp.solve(sp.Eq(t["weight_s"], t["kv_s"]), B)
  memory_limit = sp.limit(B / t["memory_s"], B, sp.oo)
  [compute_cross] = sp.solve(sp.Eq(t["memory_s"], t["compute_s"]), B)
  # Past every crossover the linear layers are compute-bound.
  rate_limit = sp.limit(B / (t["fixed_s"] + t["compute_s"] + t["kv_s"]), B, sp.oo)
  return tuple(sp.simplify(e) for e in (kv_cross, memory_limit, compute_cross, rate_limit))


@functools.cache
def calibrated_summary_model():
  """The solved summary as a numpy function of the inputs and factors."""
  return lambdified(dict(zip(SUMMARY_NAMES, _summary_exprs())), INPUTS + FACTORS)


# A regime of one implementation, fitted where it shows (XLA:CPU), zero elsewhere.
REGIME_FACTORS: tuple[sp.Symbol, ...] = (r_pack,)
REGIME_FACTOR_NAMES: tuple[str, ...] = tuple(str(s) for s in REGIME_FACTORS)
REGIME_ASSUMPTIONS: tuple[str, ...] = (
    "a matmul of two or more rows first re-packs the weights (XLA:CPU's GEMM): "
    "r_pack weight reads more from B = 2 on; crossovers and limits leave it out",)

# An engine's own terms: its per-sequence cost per iteration (`symbols.t0_seq`, 0 unless a
# real engine's runs fitted it), the rows its GEMM multiplies per pass over the weights
# (`symbols.m_pass`, 0: no limit; measured), its attention kernel's FLOP efficiency
# (`symbols.eta_attn`, 0: attention FLOPs with the linear layers'; measured) and the weight
# bytes it finds in the CPU's cache and their rate (`symbols.c_llc`, `symbols.bw_llc`, 0:
# none; measured; `symbols.s_lru` how it loses them as the weights outgrow it) and its
# elementwise time per token and activation element (`symbols.t_act`, 0: none; measured; the
# iteration cost model's, with A_w).
ENGINE_FACTORS: tuple[sp.Symbol, ...] = (t0_seq, m_pass, eta_attn, c_llc, bw_llc, t_act, s_lru)
ENGINE_FACTOR_NAMES: tuple[str, ...] = tuple(str(s) for s in ENGINE_FACTORS)


def repack_time(rows: sp.Expr = B, weight_bytes: sp.Expr | None = None) -> sp.Expr:
  """Re-packing the weights for a matmul of two or more rows (seconds).

  r_pack * N*q / (eta_w*BW), switched on from two rows by min(1, max(0, rows - 1))
  (0 at one row, 1 at every whole count >= 2). XLA:CPU's GEMM packs the weight
  panel before a multi-row product, about 1.5 weight reads; a device whose
  kernels stream the weights as they are has r_pack = 0. `rows` and
  `weight_bytes` default to the decode step's B and N*q; the iteration cost
  model passes its tokens and its linear layers' bytes.
  """
  if weight_bytes is None:
    weight_bytes = formulas.weight_traffic(N, q)
  switch = sp.Min(1, sp.Max(0, rows - 1))
  return r_pack * switch * formulas.memory_time(weight_bytes, eta_w * BW)


def weight_passes(rows: sp.Expr, weight_bytes: sp.Expr) -> sp.Expr:
  """The weights read again by a matmul of more than `m_pass` rows (seconds).

  (ceiling(rows / m_pass) - 1) * the weights' read (`weight_read_time`: the cached bytes at
  bw_llc, the rest at eta_w*BW): vLLM CPU's oneDNN GEMM multiplies m_pass rows per pass over
  the weights. Measured by the line through 128-256 rows (results/vllm_cpu/
  engine_gemm_blocks.py): 256 rows on the AMD EPYC of the night passes (0.4-0.9 more reads
  from 257 to 513 rows), 320 on the AMX Xeon (1.1-1.6 more from 384 to 513); and by the
  offline engine's steps of one to four 256-token prompts (engine_prompts_probe.py), which
  grow by one read per 320 rows. m_pass = 0 switches it off (min(1, m_pass)).
  """
  passes = sp.Max(0, sp.ceiling(rows / sp.Max(m_pass, 1)) - 1)
  return sp.Min(1, m_pass) * passes * weight_read_time(weight_bytes, eta_w * BW)


def attention_split(flops: sp.Expr) -> tuple[sp.Expr, sp.Expr]:
  """Attention FLOPs as (the share left with the linear layers, their own time in seconds).

  An engine whose attention kernel runs at eta_attn*F (vLLM CPU's: about a quarter of its
  GEMMs' rate) takes `flops / (eta_attn*F)` on top of the linear layers; eta_attn = 0 keeps
  them with the linear layers' FLOPs at eta_f*F (the switch ceiling(min(1, eta_attn)) is 1
  for any eta_attn in (0, 1], 0 at 0).
  """
  on = sp.ceiling(sp.Min(1, eta_attn))
  return (1 - on) * flops, on * flops / (sp.Max(eta_attn, 1e-30) * F)


def _with_added(terms: dict[str, sp.Expr], extra_s: sp.Expr, *also: str) -> dict[str, sp.Expr]:
  """`terms` with `extra_s` seconds added to the step (and to the terms named in
  `also`), the rates derived from the new step."""
  t = dict(terms)
  for name in ("step_s", *also):
    t[name] = t[name] + extra_s
  t["aggregate_tokens_per_s"] = formulas.aggregate_rate(B, t["step_s"])
  t["per_sequence_tokens_per_s"] = formulas.per_sequence_rate(t["step_s"])
  return t


def _regime_terms(weights_cached: bool = False) -> dict[str, sp.Expr]:
  """The calibrated terms with the re-pack added to the step and the memory time."""
  repack_s = repack_time()
  return {**_with_added(_terms(weights_cached), repack_s, "memory_s"), "repack_s": repack_s}


@functools.cache
def calibrated_model_with_regime(backend: Literal["numpy", "jax"] = "numpy"):
  """`calibrated_model` with the re-pack term (`repack_time`): values also hold
  `REGIME_FACTOR_NAMES`; r_pack = 0 gives `calibrated_model`'s outputs."""
  return lambdified(_regime_terms(), INPUTS + FACTORS + REGIME_FACTORS, backend)


def _engine_terms() -> dict[str, sp.Expr]:
  """The calibrated terms with the re-pack and an engine's own terms: a decode step of B
  sequences pays t0_seq each (as the iteration cost model's t0_seq * n_seq), reads the
  weights once more past `m_pass` rows (`weight_passes`) and the first c_llc bytes of them
  from the cache (`weight_read_time`), and runs its elementwise kernels over each row's A_w
  activation elements at t_act each (as the iteration cost model's)."""
  passes_s = weight_passes(B, formulas.weight_traffic(N, q))
  terms = _with_added(_regime_terms(weights_cached=True), passes_s, "memory_s")
  elementwise_s = t_act * B * A_w
  terms = _with_added(_with_added(terms, t0_seq * B, "fixed_s"), elementwise_s)
  return {**terms, "weight_passes_s": passes_s, "elementwise_s": elementwise_s}


@functools.cache
def calibrated_model_with_engine(backend: Literal["numpy", "jax"] = "numpy"):
  """`calibrated_model_with_regime` with an engine's own terms: values also hold
  `ENGINE_FACTOR_NAMES` and A_w (the model's activation elements per token; 0 leaves the
  elementwise term out); every engine factor at 0 gives `calibrated_model_with_regime`'s
  outputs."""
  return lambdified(_engine_terms(), INPUTS + FACTORS + REGIME_FACTORS + ENGINE_FACTORS + (A_w,),
                    backend)
