"""Measured ceilings and autotuned Pallas kernels against XLA, per case.

The library behind `experiments/gpu_bench.py`. For each case (an op at a
shape): autotune the Pallas kernel, time the winner and XLA's own (jit of the
reference; for attention also `jax.nn.dot_product_attention`, xla and cudnn),
and relate each time to the analytic traffic and FLOPs (`jaxroof.symbolic.formulas`)
and to this device's measured ceilings (`jaxroof.measure.ceilings`: copy
bandwidth, bytes read plus written of an in-place update, and the bf16
matmul rate). The Markdown of the results is `jaxroof.report.kernels`.

Every time is a measurement on the device at hand, timed by
`kernels.device_timing.time_chained` (chained dependent calls in one jit,
`jaxroof.timing.time_call` median of repeats). Bytes and FLOPs are analytic
bounds: all lengths full, each weight and K/V byte read once. On a CPU the
kernels are interpreted and their times mean nothing; only tests do that.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import sympy as sp

from jaxroof.errors import InputError
from jaxroof.measure import ceilings as ceilings_lib
from jaxroof.symbolic import formulas
from kernels import _backend
from kernels import autotune
from kernels import decode_attention as da
from kernels import device_timing
from kernels import linear
from kernels import paged_attention as pa

BF16 = "bfloat16"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Case:
  """One op at one shape."""

  name: str
  op: autotune.TunableOp
  problem: Any


def attention_case(b, h, kv, t, d) -> Case:
  """bf16 decode attention: batch, heads, KV heads, cache length, head size."""
  p = da.DecodeProblem(batch=b, heads=h, kv_heads=kv, max_len=t, head_dim=d, dtype=BF16)
  return Case(name=f"decode_attention_b{b}_h{h}_kv{kv}_t{t}_d{d}_bf16", op=da.TUNABLE, problem=p)


def paged_case(b, h, kv, t, d, page) -> Case:
  """bf16 paged decode attention, each sequence in t // page pages."""
  p = pa.PagedProblem(batch=b, heads=h, kv_heads=kv, head_dim=d, num_pages=b * t // page,
                      page_size=page, pages_per_seq=t // page, dtype=BF16)
  return Case(name=f"paged_attention_b{b}_h{h}_kv{kv}_t{t}_d{d}_p{page}_bf16", op=pa.TUNABLE,
              problem=p)


def linear_case(m, k, n) -> Case:
  """bf16 linear layer: x (m, k) @ w (k, n)."""
  p = linear.LinearProblem(m=m, k=k, n=n, dtype=BF16)
  return Case(name=f"linear_m{m}_k{k}_n{n}_bf16", op=linear.TUNABLE, problem=p)


# Tiny float32 shapes for the dry run on a CPU (interpreted: plumbing only).
DRY_RUN_CASES = (
    Case(name="dry_linear_m16_k64_n32_f32", op=linear.TUNABLE,
         problem=linear.LinearProblem(m=16, k=64, n=32, dtype="float32")),
    Case(
        name="dry_decode_attention_b2_h4_kv2_t64_d16_f32", op=da.TUNABLE,
        problem=da.DecodeProblem(batch=2, heads=4, kv_heads=2, max_len=64, head_dim=16,
                                 dtype="float32")),
    Case(
        name="dry_paged_attention_b2_h4_kv2_t64_d16_p16_f32", op=pa.TUNABLE,
        problem=pa.PagedProblem(batch=2, heads=4, kv_heads=2, head_dim=16, num_pages=8,
                                page_size=16, pages_per_seq=4, dtype="float32")),
)


def cases_by_name(dry_run: bool, quick: bool) -> dict[str, Case]:
  """The cases a run measures, in priority order, by name."""
  cases = DRY_RUN_CASES if dry_run else QUICK_CASES if quick else CASES
  return {case.name: case for case in cases}


# In priority order: the targets first. K/V reads of the first three
# attention cases are 1.07 GB.
CASES = (
    attention_case(32, 32, 8, 8192, 128),
    linear_case(16, 8192, 8192),
    linear_case(4096, 8192, 8192),
    linear_case(1, 8192, 8192),
    attention_case(8, 32, 8, 32768, 128),
    linear_case(16, 8192, 28672),
    attention_case(16, 32, 32, 4096, 128),
    paged_case(32, 32, 8, 8192, 128, 64),
    linear_case(8192, 4096, 14336),
    attention_case(8, 32, 8, 4096, 128),
)
QUICK_CASES = (
    attention_case(4, 8, 2, 1024, 128),
    linear_case(16, 1024, 1024),
    linear_case(512, 1024, 1024),
    paged_case(4, 8, 2, 1024, 128, 64),
)

# Analytic traffic and work --------------------------------------------------


def analytic(case: Case, lengths: Sequence[int] | None = None) -> dict[str, float]:
  """Bytes moved and FLOPs of one call, from `jaxroof.symbolic.formulas`.

  Analytic bounds: each weight and K/V byte read once. For attention, K/V
  traffic and FLOPs grow with each sequence's length and the query and output
  with the batch, so a ragged batch is `batch` sequences of the mean length
  (T = sum(lengths) / batch, an exact rational); without lengths all are full.

  Args:
    case: the op and shape.
    lengths: attention only: each sequence's length (default: all full).

  Raises:
    InputError: lengths for a linear case, or of the wrong count or range.
  """
  p = case.problem
  size = jnp.dtype(p.dtype).itemsize
  if case.op is linear.TUNABLE:
    if lengths is not None:
      raise InputError(f"{lengths=} is not allowed for a linear case.")
    return {
        "bytes": float(formulas.linear_bytes(p.m, p.k, p.n, size)),
        "flops": float(formulas.linear_flops(p.k * p.n, p.m)),
        "weight_bytes": float(formulas.weight_traffic(p.k * p.n, size))
    }
  if case.op is pa.TUNABLE:
    positions = p.pages_per_seq * p.page_size
  else:
    positions = p.max_len
  if lengths is None:
    mean_len = sp.Integer(positions)
  else:
    lengths = [int(n) for n in lengths]
    if len(lengths) != p.batch or not all(1 <= n <= positions for n in lengths):
      raise InputError(f"{lengths=} is not allowed: give {p.batch} lengths (batch), each "
                       f"in 1..{positions}.")
    mean_len = sp.Rational(sum(lengths), p.batch)
  per_position = formulas.kv_bytes_per_position(1, p.kv_heads, p.head_dim, size)
  kv = formulas.retained_kv_bytes(p.batch, mean_len, per_position)
  return {
      "bytes": float(
          formulas.attention_bytes(p.batch, mean_len, p.heads, p.kv_heads, p.head_dim, size)),
      "flops": float(formulas.attention_flops(p.batch, mean_len, p.heads, p.head_dim)),
      "kv_bytes": float(kv),
  }


# Measurements -----------------------------------------------------------------


def _rates(timing, work: dict[str, float], ceilings: dict[str, Any] | None) -> dict[str, Any]:
  """A timing with achieved rates and fractions of the measured ceilings.

  Without ceilings (their measurement failed) the fractions are None.
  """
  seconds = timing.median_s
  bytes_per_s = work["bytes"] / seconds
  flop_per_s = work["flops"] / seconds
  copy = (ceilings or {}).get("copy", {}).get("bytes_per_s")
  matmul = (ceilings or {}).get("matmul", {}).get("flop_per_s")
  return {
      "timing": timing.to_json(),
      "median_s": seconds,
      "bytes_per_s": bytes_per_s,
      "flop_per_s": flop_per_s,
      "fraction_of_copy_bandwidth": bytes_per_s / copy if copy else None,
      "fraction_of_matmul_rate": flop_per_s / matmul if matmul else None,
  }


def time_per_call(fn, args, feed, repeats, inner: int | None = None):
  """Per-call device time (see `kernels.device_timing`)."""
  return device_timing.time_chained(fn, args, feed=feed, repeats=repeats, inner=inner)


def chain_length(work: dict[str, float], ceilings: dict[str, Any] | None, *, target_s: float = 0.05,
                 max_inner: int = 1000) -> int | None:
  """Calls per timed chain so that a chain lasts about `target_s`.

  From the analytic bytes at the measured copy bandwidth (the fastest a call
  can be), so no single call has to be timed (nor compiled) to choose it.
  None (without ceilings) lets `device_timing` time single calls instead.
  """
  copy = (ceilings or {}).get("copy", {}).get("bytes_per_s")
  if not copy:
    return None
  fastest_s = work["bytes"] / copy
  return max(1, min(max_inner, int(target_s / max(fastest_s, 1e-9))))


def ceilings_record(measured: ceilings_lib.Ceilings) -> dict[str, Any]:
  """The benchmark's view of measured ceilings: copy B/s, bf16 FLOP/s."""
  return {
      "what": "jaxroof.measure.ceilings.measure_ceilings (best round's "
              "median; copy: in-place update, bytes read + written)",
      "device_kind": measured.device_kind,
      "copy": {"bytes_per_s": measured.copy_bandwidth_Bps},
      "read": {"bytes_per_s": measured.read_bandwidth_Bps},
      "matmul": {"flop_per_s": measured.flop_rate(BF16), "dtype": BF16},
      "measured": measured.to_json(),
  }


def measure_device_ceilings(*, quick: bool, repeats: int = 5, rounds: int = 2) -> dict[str, Any]:
  """This device's ceilings, or {"error": ...} when measuring them fails.

  A failure (out of memory, a driver fault) must not stop the benchmark: its
  records then carry times and rates without fractions of the ceilings.
  `quick` shrinks the arrays (the dry run on a CPU).
  """
  dtypes = (BF16, "float32")  # float32 for the dry run's toy calibration.
  try:
    if quick:
      measured = ceilings_lib.measure_ceilings(dtypes, bandwidth_bytes=8 * 2**20, matmul_size=256,
                                               repeats=3, rounds=1)
    else:
      measured = ceilings_lib.measure_ceilings(dtypes, repeats=repeats, rounds=rounds)
  except Exception as e:  # noqa: BLE001 - any failure falls back to none.
    return {"error": f"{type(e).__name__}: {str(e)[:300]}"}
  return ceilings_record(measured)


def dot_product_attention(implementation: str) -> Callable[..., Any]:
  """Decode attention through `jax.nn.dot_product_attention` (one query row)."""

  def fn(q, k, v, lengths):
    out = jax.nn.dot_product_attention(
        q[:, None],
        k,
        v,
        key_value_seq_lengths=lengths,
        implementation=implementation,
    )
    return out[:, 0]

  return fn


def xla_variants(case: Case) -> dict[str, Callable[..., Any]]:
  """XLA's own ways to compute the case, by name."""
  variants = {"xla_reference": case.op.reference}
  if case.op is da.TUNABLE:
    variants["xla_dot_product_attention"] = dot_product_attention("xla")
    variants["cudnn_dot_product_attention"] = dot_product_attention("cudnn")
  return variants


def check_targets(case: Case, work, pallas, xla_best) -> dict[str, Any]:
  """The issue's H200 targets that apply to this case, with pass/fail.

  Fractions of ceilings are judged only when the ceilings were measured.
  """
  verdicts = {}
  p = case.problem
  if pallas["fraction_of_copy_bandwidth"] is None:
    return verdicts
  if case.op is da.TUNABLE and work["kv_bytes"] >= 1e9:
    verdicts["attention_fraction_of_copy_bw>=0.8"] = {
        "value": pallas["fraction_of_copy_bandwidth"],
        "threshold": 0.8,
        "pass": pallas["fraction_of_copy_bandwidth"] >= 0.8,
    }
    if xla_best is not None:
      verdicts["attention_not_slower_than_xla"] = {
          "value": pallas["median_s"],
          "threshold": xla_best,
          "pass": pallas["median_s"] <= xla_best,
      }
  if case.op is linear.TUNABLE and p.m <= 16:
    verdicts["linear_m<=16_fraction_of_copy_bw>=0.8"] = {
        "value": pallas["fraction_of_copy_bandwidth"],
        "threshold": 0.8,
        "pass": pallas["fraction_of_copy_bandwidth"] >= 0.8,
    }
  if case.op is linear.TUNABLE and p.m >= 4096:
    verdicts["linear_m>=4096_fraction_of_matmul>=0.6"] = {
        "value": pallas["fraction_of_matmul_rate"],
        "threshold": 0.6,
        "pass": pallas["fraction_of_matmul_rate"] >= 0.6,
    }
  return verdicts


def run_case(
    case: Case,
    ceilings,
    out_dir: str,
    repeats: int,
    max_candidates: int,
    tune_budget_s: float,
    *,
    max_inner: int = 1000,
    on_trial: Callable[[autotune.Trial], None] | None = None,
) -> dict[str, Any]:
  """Tunes, times and compares one case; returns its JSON record.

  With measured ceilings each candidate is compiled once, as its timed
  chain (whose first output is checked), the chain length coming from the
  analytic bytes (`chain_length`, at most `max_inner`). `on_trial` sees
  every tuning trial as it is decided.
  """
  target = _backend.resolve_target()
  args = case.op.example_args(case.problem, jax.random.key(1))
  work = analytic(case)
  inner = chain_length(work, ceilings, max_inner=max_inner)
  tuned = autotune.tune(
      case.op,
      case.problem,
      target=target,
      args=args,
      cache_dir=os.path.join(out_dir, "autotune_cache"),
      max_candidates=max_candidates,
      time_budget_s=tune_budget_s,
      timer=autotune.default_timer(repeats=max(3, repeats // 2), inner=inner),
      progress=False,
      on_trial=on_trial,
      chain=None if inner is None else autotune.ChainTiming(inner=inner, repeats=max(
          3, repeats // 2)),
  )
  kernel = functools.partial(case.op.kernel, config=tuned.config, target=target)
  pallas = _rates(time_per_call(kernel, args, case.op.chain_feed, repeats, inner), work, ceilings)
  xla = {}
  for name, fn in xla_variants(case).items():
    try:
      timing = time_per_call(fn, args, case.op.chain_feed, repeats, inner)
      xla[name] = _rates(timing, work, ceilings)
    except Exception as e:  # noqa: BLE001 - e.g. cudnn refuses the shape.
      xla[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
  xla_times = [v["median_s"] for v in xla.values() if "median_s" in v]
  xla_best = min(xla_times) if xla_times else None
  return {
      "case": case.name,
      "op": case.op.name,
      "problem": dataclasses.asdict(case.problem),
      "device_kind": _backend.device_kind(),
      "platform": target.platform,
      "backend": target.backend,
      "jax_version": jax.__version__,
      "config": dataclasses.asdict(tuned.config),
      "tuning": {
          "tuned": tuned.tuned,
          "message": tuned.message,
          **{k: (tuned.entry or {}).get(k) for k in ("key", "checked_on", "timed_on")},
          "trials": tuned.entry["trials"] if tuned.entry else [],
      },
      "analytic": {
          **work, "label": "analytic: each byte read once, lengths "
                           "full (jaxroof.symbolic.formulas)"
      },
      "pallas": pallas,
      "xla": xla,
      "xla_best_median_s": xla_best,
      "pallas_over_xla_best": (pallas["median_s"] / xla_best if xla_best else None),
      "targets": check_targets(case, work, pallas, xla_best),
  }


def summary_line(record: dict[str, Any]) -> str:
  """One printed line per case: Pallas time, rates, fractions, XLA, targets."""
  p = record["pallas"]
  xla = record["xla_best_median_s"]
  xla_text = f"{xla * 1e6:9.1f}" if xla else "      n/a"
  verdicts = " ".join(
      f"{name}={'PASS' if t['pass'] else 'FAIL'}" for name, t in record["targets"].items())
  fractions = " ".join(f"{label} {p[key]:5.1%}" if p[key] is not None else f"{label}   n/a"
                       for label, key in (("copy", "fraction_of_copy_bandwidth"),
                                          ("mm", "fraction_of_matmul_rate")))
  return (f"{record['case']:52s} {p['median_s'] * 1e6:9.1f} us "
          f"{p['bytes_per_s'] / 1e12:6.2f} TB/s "
          f"{p['flop_per_s'] / 1e12:7.1f} TFLOP/s "
          f"{fractions} xla {xla_text} us {verdicts}")
