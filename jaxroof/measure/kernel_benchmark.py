"""Measured ceilings and autotuned Pallas kernels against XLA, per case.

The library behind `experiments/gpu_bench.py`. For each case (an op at a
shape): autotune the Pallas kernel, time the winner and XLA's own (jit of the
reference; for attention also `jax.nn.dot_product_attention`, xla and cudnn),
and relate each time to the analytic traffic and FLOPs (`jaxroof.symbolic.formulas`)
and to this device's measured ceilings (copy bandwidth: an elementwise
negate of a 1 GiB array, bytes read plus written; bf16 matmul rate: an XLA
8192^3 matmul).

Every time is a measurement on the device at hand, timed by
`kernels.device_timing.time_chained` (chained dependent calls in one jit,
`jaxroof.timing.time_call` median of repeats). Bytes and FLOPs are analytic
bounds: all lengths full, each weight and K/V byte read once. On a CPU the
kernels are interpreted and their times mean nothing; only tests do that.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import sympy as sp

from jaxroof.symbolic import formulas
from jaxroof.report import table
from jaxroof.errors import InputError
from kernels import _backend
from kernels import autotune
from kernels import decode_attention as da
from kernels import device_timing
from kernels import linear
from kernels import paged_attention as pa

BF16 = "bfloat16"
COPY_BYTES = 2**30
MATMUL_SIZE = 8192


@dataclasses.dataclass(frozen=True, kw_only=True)
class Case:
  """One op at one shape."""

  name: str
  op: autotune.TunableOp
  problem: Any


def attention_case(b, h, kv, t, d) -> Case:
  """bf16 decode attention: batch, heads, KV heads, cache length, head size."""
  p = da.DecodeProblem(batch=b, heads=h, kv_heads=kv, max_len=t, head_dim=d,
                       dtype=BF16)
  return Case(name=f"decode_attention_b{b}_h{h}_kv{kv}_t{t}_d{d}_bf16",
              op=da.TUNABLE, problem=p)


def paged_case(b, h, kv, t, d, page) -> Case:
  """bf16 paged decode attention, each sequence in t // page pages."""
  p = pa.PagedProblem(batch=b, heads=h, kv_heads=kv, head_dim=d,
                      num_pages=b * t // page, page_size=page,
                      pages_per_seq=t // page, dtype=BF16)
  return Case(name=f"paged_attention_b{b}_h{h}_kv{kv}_t{t}_d{d}_p{page}_bf16",
              op=pa.TUNABLE, problem=p)


def linear_case(m, k, n) -> Case:
  """bf16 linear layer: x (m, k) @ w (k, n)."""
  p = linear.LinearProblem(m=m, k=k, n=n, dtype=BF16)
  return Case(name=f"linear_m{m}_k{k}_n{n}_bf16", op=linear.TUNABLE,
              problem=p)


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


def analytic(case: Case,
             lengths: Sequence[int] | None = None) -> dict[str, float]:
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
    return {"bytes": float(formulas.linear_bytes(p.m, p.k, p.n, size)),
            "flops": float(formulas.linear_flops(p.k * p.n, p.m)),
            "weight_bytes": float(formulas.weight_traffic(p.k * p.n, size))}
  if case.op is pa.TUNABLE:
    positions = p.pages_per_seq * p.page_size
  else:
    positions = p.max_len
  if lengths is None:
    mean_len = sp.Integer(positions)
  else:
    lengths = [int(n) for n in lengths]
    if len(lengths) != p.batch or not all(1 <= n <= positions
                                          for n in lengths):
      raise InputError(
          f"{lengths=} is not allowed: give {p.batch} lengths (batch), each "
          f"in 1..{positions}."
      )
    mean_len = sp.Rational(sum(lengths), p.batch)
  per_position = formulas.kv_bytes_per_position(1, p.kv_heads, p.head_dim,
                                                size)
  kv = formulas.retained_kv_bytes(p.batch, mean_len, per_position)
  return {
      "bytes": float(formulas.attention_bytes(
          p.batch, mean_len, p.heads, p.kv_heads, p.head_dim, size)),
      "flops": float(formulas.attention_flops(p.batch, mean_len, p.heads,
                                              p.head_dim)),
      "kv_bytes": float(kv),
  }


# Measurements -----------------------------------------------------------------


def _rates(timing, work: dict[str, float], ceilings: dict[str, Any]):
  """A timing with achieved rates and fractions of the measured ceilings."""
  seconds = timing.median_s
  bytes_per_s = work["bytes"] / seconds
  flop_per_s = work["flops"] / seconds
  return {
      "timing": timing.to_json(),
      "median_s": seconds,
      "bytes_per_s": bytes_per_s,
      "flop_per_s": flop_per_s,
      "fraction_of_copy_bandwidth":
          bytes_per_s / ceilings["copy"]["bytes_per_s"],
      "fraction_of_matmul_rate":
          flop_per_s / ceilings["matmul"]["flop_per_s"],
  }


def time_per_call(fn, args, feed, repeats):
  """Per-call device time (see `kernels.device_timing`)."""
  return device_timing.time_chained(fn, args, feed=feed, repeats=repeats)


def measure_ceilings(repeats: int, quick: bool) -> dict[str, Any]:
  """Copy bandwidth and bf16 matmul rate of this device, measured."""
  copy_bytes = COPY_BYTES // (16 if quick else 1)
  x = jnp.ones((copy_bytes // 2,), jnp.bfloat16)
  copy = time_per_call(lambda a: -a, (x,), lambda args, out: (out,), repeats)
  del x
  size = MATMUL_SIZE // (4 if quick else 1)
  key_a, key_b = jax.random.split(jax.random.key(0))
  a = jax.random.normal(key_a, (size, size), jnp.bfloat16)
  b = (jax.random.normal(key_b, (size, size), jnp.float32)
       / math.sqrt(size)).astype(jnp.bfloat16)
  matmul = time_per_call(lambda x, y: x @ y, (a, b),
                         lambda args, out: (out, args[1]), repeats)
  return {
      "copy": {
          "what": f"jit(lambda a: -a) on a {copy_bytes}-byte bf16 array; "
                  "bytes = read + written",
          "bytes": 2 * copy_bytes,
          "timing": copy.to_json(),
          "bytes_per_s": 2 * copy_bytes / copy.median_s,
      },
      "matmul": {
          "what": f"XLA bf16 matmul {size}x{size}x{size}",
          "flops": 2.0 * size**3,
          "timing": matmul.to_json(),
          "flop_per_s": 2.0 * size**3 / matmul.median_s,
      },
  }


def dot_product_attention(implementation: str) -> Callable[..., Any]:
  """Decode attention through `jax.nn.dot_product_attention` (one query row)."""

  def fn(q, k, v, lengths):
    out = jax.nn.dot_product_attention(
        q[:, None], k, v, key_value_seq_lengths=lengths,
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
  """The issue's H200 targets that apply to this case, with pass/fail."""
  verdicts = {}
  p = case.problem
  if case.op is da.TUNABLE and work["kv_bytes"] >= 1e9:
    verdicts["attention_fraction_of_copy_bw>=0.8"] = {
        "value": pallas["fraction_of_copy_bandwidth"], "threshold": 0.8,
        "pass": pallas["fraction_of_copy_bandwidth"] >= 0.8,
    }
    if xla_best is not None:
      verdicts["attention_not_slower_than_xla"] = {
          "value": pallas["median_s"], "threshold": xla_best,
          "pass": pallas["median_s"] <= xla_best,
      }
  if case.op is linear.TUNABLE and p.m <= 16:
    verdicts["linear_m<=16_fraction_of_copy_bw>=0.8"] = {
        "value": pallas["fraction_of_copy_bandwidth"], "threshold": 0.8,
        "pass": pallas["fraction_of_copy_bandwidth"] >= 0.8,
    }
  if case.op is linear.TUNABLE and p.m >= 4096:
    verdicts["linear_m>=4096_fraction_of_matmul>=0.6"] = {
        "value": pallas["fraction_of_matmul_rate"], "threshold": 0.6,
        "pass": pallas["fraction_of_matmul_rate"] >= 0.6,
    }
  return verdicts


def run_case(case: Case, ceilings, out_dir: str, repeats: int,
             max_candidates: int, tune_budget_s: float) -> dict[str, Any]:
  """Tunes, times and compares one case; returns its JSON record."""
  target = _backend.resolve_target()
  args = case.op.example_args(case.problem, jax.random.key(1))
  tuned = autotune.tune(
      case.op, case.problem, target=target, args=args,
      cache_dir=os.path.join(out_dir, "autotune_cache"),
      max_candidates=max_candidates, time_budget_s=tune_budget_s,
      timer=autotune.default_timer(repeats=max(3, repeats // 2)),
      progress=True,
  )
  work = analytic(case)
  kernel = functools.partial(case.op.kernel, config=tuned.config,
                             target=target)
  pallas = _rates(time_per_call(kernel, args, case.op.chain_feed, repeats),
                  work, ceilings)
  xla = {}
  for name, fn in xla_variants(case).items():
    try:
      timing = time_per_call(fn, args, case.op.chain_feed, repeats)
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
          **{k: (tuned.entry or {}).get(k)
             for k in ("key", "checked_on", "timed_on")},
          "trials": tuned.entry["trials"] if tuned.entry else [],
      },
      "analytic": {**work, "label": "analytic: each byte read once, lengths "
                   "full (jaxroof.symbolic.formulas)"},
      "pallas": pallas,
      "xla": xla,
      "xla_best_median_s": xla_best,
      "pallas_over_xla_best": (pallas["median_s"] / xla_best
                               if xla_best else None),
      "targets": check_targets(case, work, pallas, xla_best),
  }


def summary_line(record: dict[str, Any]) -> str:
  """One printed line per case: Pallas time, rates, fractions, XLA, targets."""
  p = record["pallas"]
  xla = record["xla_best_median_s"]
  xla_text = f"{xla * 1e6:9.1f}" if xla else "      n/a"
  verdicts = " ".join(
      f"{name}={'PASS' if t['pass'] else 'FAIL'}"
      for name, t in record["targets"].items()
  )
  return (f"{record['case']:52s} {p['median_s'] * 1e6:9.1f} us "
          f"{p['bytes_per_s'] / 1e12:6.2f} TB/s "
          f"{p['flop_per_s'] / 1e12:7.1f} TFLOP/s "
          f"copy {p['fraction_of_copy_bandwidth']:5.1%} "
          f"mm {p['fraction_of_matmul_rate']:5.1%} xla {xla_text} us "
          f"{verdicts}")


# Report section ---------------------------------------------------------------

RESULTS_ROOT = "results"


def latest_summary(
    root: str = RESULTS_ROOT,
) -> tuple[str, dict[str, Any]] | None:
  """The newest `summary.json` written by experiments/gpu_bench under root."""
  found = []
  for folder, _, files in os.walk(root):
    if "summary.json" in files:
      path = os.path.join(folder, "summary.json")
      with open(path, encoding="utf-8") as f:
        data = json.load(f)
      if "ceilings" in data and "cases" in data:
        found.append((data.get("date", ""), path, data))
  if not found:
    return None
  _, path, data = max(found, key=lambda item: item[0])
  return path, data


def report_section(out_dir: str, root: str = RESULTS_ROOT) -> str:
  """Markdown: the latest GPU benchmark (measurements), or why there is none."""
  del out_dir  # Unused: the section has no plot.
  latest = latest_summary(root)
  title = "## Kernels on a GPU (measurements)"
  if latest is None:
    return "\n".join([
        title, "",
        f"No GPU benchmark under `{root}/` yet. On a machine with a GPU run "
        "`PYTHONPATH=. bash experiments/gpu_bench.sh OUT` and commit "
        "`OUT/*.json`. On the CPU the Pallas kernels are only interpreted "
        "(correctness, never speed) and cross-lowered for Triton and Mosaic.",
    ])
  path, data = latest
  copy = data["ceilings"]["copy"]["bytes_per_s"]
  matmul = data["ceilings"]["matmul"]["flop_per_s"]
  rows = []
  for name, case in data["cases"].items():
    p = case["pallas"]
    xla = case.get("xla_best_median_s")
    verdicts = ", ".join(
        f"{k}: {'pass' if t['pass'] else '**FAIL**'}"
        for k, t in case["targets"].items()
    ) or "-"
    rows.append([
        name, f"{p['median_s'] * 1e6:.1f}", f"{p['bytes_per_s'] / 1e12:.2f}",
        f"{p['flop_per_s'] / 1e12:.1f}",
        f"{p['fraction_of_copy_bandwidth']:.0%}",
        f"{p['fraction_of_matmul_rate']:.0%}",
        f"{xla * 1e6:.1f}" if xla else "-", verdicts,
    ])
  skipped = data.get("skipped", []) + list(data.get("errors", {}))
  return "\n".join([
      title, "",
      f"Measured on {data['device_kind']} with jax {data['jax_version']} on "
      f"{data['date'][:10]} (`{path}`). Ceilings (measured): copy "
      f"{copy / 1e12:.2f} TB/s (read + write), bf16 matmul "
      f"{matmul / 1e12:.0f} TFLOP/s. Times: {data['timing']}. Rates use "
      "analytic bytes and FLOPs (all lengths full).", "",
      table.markdown_table(
          ("case", "Pallas us", "TB/s", "TFLOP/s", "of copy BW",
           "of matmul", "XLA best us", "targets"), rows),
  ] + ([f"\nNot measured: {', '.join(skipped)}."] if skipped else []))
