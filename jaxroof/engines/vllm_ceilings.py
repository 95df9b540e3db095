"""This machine's ceilings as vLLM's CPU path computes them, and its accelerator entry.

`measure_ceilings` times bf16/fp32 matmuls (the fastest of torch.mm, F.linear and vLLM's
oneDNN matmul) and a memory read through the engine's torch, on its pinned cores with its
thread count; `measure_linear_rates` one decoder block's linear layers at the engine's
token counts; `accelerator_entry` writes the machine in the shipped accelerator schema
(`ceiling_rates`: each measurement's fastest repeat, the median over measurements).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
from collections.abc import Sequence
from typing import Any

from jaxroof import errors
from jaxroof.engines.vllm_server import ServerConfig, engine_python, parse_cpus

CEILINGS_SCRIPT = r"""
import json, os, sys, time, torch
import torch.nn.functional as F
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
cpus, threads, n, mb = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
os.sched_setaffinity(0, set(cpus))
torch.set_num_threads(threads)
try:
  from vllm import _custom_ops as ops
except Exception:
  ops = None
def timed(fn, reps):
  fn(); ts = []
  for _ in range(reps):
    t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
  ts.sort(); return ts
def paths(dt):
  def mm(k):
    a, b = torch.randn(k, k).to(dt), torch.randn(k, k).to(dt)
    return lambda: torch.mm(a, b)
  def linear(k):
    x, w = torch.randn(k, k).to(dt), torch.randn(k, k).to(dt)
    return lambda: F.linear(x, w)
  def onednn(k):
    x, w = torch.randn(k, k).to(dt), torch.randn(k, k).to(dt)
    handler = ops.create_onednn_mm(w.t(), 32)
    return lambda: ops.onednn_mm(handler, x, None)
  return {"torch.mm": mm, "F.linear": linear, **({"vllm oneDNN": onednn} if ops else {})}
def sized(make):
  k = 256  # Doubled up to n while the next size's call would take under a second.
  while k < n:
    fn = make(k); fn()
    t = time.perf_counter(); fn()
    if 8 * (time.perf_counter() - t) > 1.0:
      break
    k *= 2
  return k, timed(make(k), 7)
out = {"torch": torch.__version__, "threads": torch.get_num_threads(), "cpus": cpus,
       "isa": torch.backends.cpu.get_cpu_capability(), "matmul_n": n, "read_mb": mb}
for name, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
  found = {}
  for path, make in paths(dt).items():
    try:
      k, ts = sized(make)
    except RuntimeError as error:  # oneDNN refuses bf16 on a CPU without AVX512-BF16.
      found[path] = {"error": str(error).splitlines()[0][:160]}
      continue
    found[path] = {"n": k, "s": ts, "flops_per_s": 2 * k ** 3 / ts[len(ts) // 2]}
  best = max((p for p in found if "s" in found[p]), key=lambda p: found[p]["flops_per_s"])
  out[name + "_flops_per_s"] = found[best]["flops_per_s"]
  out[name + "_matmul_s"] = found[best]["s"]
  out[name + "_matmul_n"] = found[best]["n"]
  out[name + "_matmul_path"] = best
  out[name + "_paths"] = {p: {k: v for k, v in f.items() if k != "s"} for p, f in found.items()}
x = torch.ones(mb * 2 ** 20 // 4, dtype=torch.float32)
ts = timed(lambda: torch.sum(x), 9)
out["read_bytes_per_s"] = x.numel() * 4 / ts[len(ts) // 2]
out["read_s"] = ts
print(json.dumps(out))
"""


def _engine_script(env_dir: str, cpus: Sequence[int], what: str, script: str,
                   args: Sequence[str]) -> Any:
  """Runs `script` in the engine's python on its pinned cores (one thread per core);
  returns the JSON of its last line."""
  env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
  env["OMP_NUM_THREADS"] = str(len(cpus))
  try:
    out = subprocess.run([engine_python(env_dir), "-c", script, *args], capture_output=True,
                         text=True, timeout=300, env=env, check=False)
  except subprocess.TimeoutExpired:
    raise errors.InputError(f"{what} took over 300 s.") from None
  if out.returncode:
    tail = " | ".join(out.stderr.strip().splitlines()[-3:])
    raise errors.InputError(f"{what} failed in the engine's python: {tail}")
  return json.loads(out.stdout.strip().splitlines()[-1])


def measure_ceilings(env_dir: str, config: ServerConfig, matmul_n: int = 2048,
                     read_mb: int = 512) -> dict[str, Any]:
  """bf16/fp32 matmul rate and memory read bandwidth through the engine's torch,
  on the engine's cores with its thread count (median of repeats)."""
  cpus = parse_cpus(config.engine_cpus)
  return _engine_script(
      env_dir, cpus, "the ceiling micro-benchmark", CEILINGS_SCRIPT,
      [json.dumps(cpus), str(len(cpus)),
       str(matmul_n), str(read_mb)])


LINEAR_SCRIPT = r"""
import json, os, sys, time, torch
cpus, threads, shapes, tokens, budget_s = (json.loads(a) for a in sys.argv[1:6])
os.sched_setaffinity(0, set(cpus))
torch.set_num_threads(threads)
out, started = [], time.perf_counter()
for m in tokens:
  if time.perf_counter() - started > budget_s:  # bf16 without AVX512-BF16: a few GFLOP/s.
    out.append({"tokens": m, "skipped": f"over the {budget_s:g} s budget"})
    continue
  xs = {k: torch.randn(m, k).to(torch.bfloat16) for k, _ in shapes}
  ws = [torch.randn(k, n).to(torch.bfloat16) for k, n in shapes]
  def block():
    for (k, _), w in zip(shapes, ws):
      torch.mm(xs[k], w)
  t = time.perf_counter(); block(); ts = [time.perf_counter() - t]
  repeats = 7 if ts[0] < budget_s / 50 else 1  # The warm-up alone where one call is slow.
  if repeats > 1:
    ts = []
    for _ in range(repeats):
      t = time.perf_counter(); block(); ts.append(time.perf_counter() - t)
  flops = sum(2 * m * k * n for k, n in shapes)
  out.append({"tokens": m, "flops": flops, "best_s": min(ts), "median_s": sorted(ts)[len(ts) // 2],
              "flops_per_s": flops / min(ts), "repeats": len(ts)})
print(json.dumps(out))
"""

# The linear-layer probe's time: bf16 GEMMs on a CPU without AVX512-BF16 run at a few
# GFLOP/s (`bf16_note`), where 7 repeats at every token count would take many minutes.
LINEAR_BUDGET_S = 60.0


def linear_shapes(config: dict[str, Any]) -> list[tuple[int, int]]:
  """(K, N) of one decoder block's linear layers (qkv, o, gate+up, down) of a Llama-like config."""
  h, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
  kv, hd = int(config.get("num_key_value_heads") or
               heads), int(config.get("head_dim") or h // heads)
  inter = int(config["intermediate_size"])
  return [(h, (heads + 2 * kv) * hd), (heads * hd, h), (h, 2 * inter), (inter, h)]


def measure_linear_rates(
    env_dir: str, config: ServerConfig, model_config: dict[str, Any],
    tokens: Sequence[int] = (1, 32, 128, 256)) -> dict[str, Any]:
  """bf16 FLOP/s of one block's linear layers at each token count (torch.mm in the engine's
  venv, its pinned core): how far the engine's own shapes reach the 2048^3 ceiling."""
  cpus = parse_cpus(config.engine_cpus)
  shapes = linear_shapes(model_config)
  rates = _engine_script(env_dir, cpus, "the linear-layer micro-benchmark", LINEAR_SCRIPT, [
      json.dumps(cpus),
      str(len(cpus)),
      json.dumps(shapes),
      json.dumps(list(tokens)),
      json.dumps(LINEAR_BUDGET_S)
  ])
  return {
      "shapes_k_n": shapes, "rates": rates,
      "what": "one block's qkv, o, gate+up and down projections in bf16, torch.mm, fastest "
              f"of 7 repeats (of 1 where a call takes over {LINEAR_BUDGET_S / 50:g} s), on the "
              f"engine's pinned core; token counts left once {LINEAR_BUDGET_S:g} s are spent "
              "are skipped"
  }


# The CPU flags that choose vLLM's CPU kernels: its bf16 GEMM path (oneDNN needs AVX512-BF16
# or AMX, else torch's F.linear) and its attention ISA (amx, vec, vec16).
ENGINE_ISA_FLAGS = ("amx_bf16", "avx512_bf16", "avx512f", "avx2")


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
  """The CPU's model name with the flags that pick the engine's kernels, e.g. "Some CPU
  (amx_bf16, avx512_bf16, avx512f, avx2)": two VMs of one model name can differ in them
  (one with AVX512-BF16, another with AVX2 only)."""
  try:
    with open(cpuinfo, encoding="utf-8") as f:
      text = f.read()
  except OSError:
    return platform.processor() or "CPU"
  name = next((
      line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")),
              platform.processor() or "CPU")
  words = set(text.split())
  flags = [flag for flag in ENGINE_ISA_FLAGS if flag in words]
  return f"{name} ({', '.join(flags)})" if flags else name


def memory_bytes() -> float:
  try:
    with open("/proc/meminfo", encoding="ascii") as f:
      for line in f:
        if line.startswith("MemTotal:"):
          return float(line.split()[1]) * 1024
  except OSError:
    pass
  return 0.0


def ceiling_rates(measured: Sequence[dict[str, Any]]) -> dict[str, float]:
  """Each ceiling (FLOP/s, B/s): the fastest repeat within a measurement, the median over
  measurements.

  Within one measurement a repeat is only ever slowed down (by the other jobs of a shared
  machine), so its fastest repeat is its estimate. Between measurements the machine itself
  moves: on one CPU with AMX the first invocation of a pass read memory 20-30% (15.7-16.2 GB/s) than the next four (12.3-13.6), while the engine's own GEMMs and served
  steps in the same pass did not; the fastest over invocations trusted that one. The median
  keeps a pass's typical machine, as the engine meets it.
  """
  keys = ("bf16_flops_per_s", "fp32_flops_per_s", "read_bytes_per_s")
  per: dict[str, list[float]] = {key: [] for key in keys}
  for m in measured:
    for dtype in ("bf16", "fp32"):  # Each dtype's own size where it was shrunk (older: one).
      n = m.get(f"{dtype}_matmul_n", m["matmul_n"])
      per[f"{dtype}_flops_per_s"].append(2 * n**3 / min(m[f"{dtype}_matmul_s"]))
    per["read_bytes_per_s"].append(m["read_mb"] * 2**20 / min(m["read_s"]))
  return {key: float(statistics.median(values)) for key, values in per.items()}


def _matmul_source(ceilings: dict[str, Any]) -> str:
  """How the matmul ceilings were timed: each dtype's fastest path and its size."""
  if "bf16_matmul_path" not in ceilings:  # Measured before the paths were compared.
    return f"torch.mm of {ceilings['matmul_n']}^2 matrices"
  return ("the fastest of torch.mm, F.linear and vLLM's oneDNN matmul (where it builds) on "
          "n^2 matrices, n doubled from 256 towards "
          f"{ceilings['matmul_n']} while a call takes under 1/8 s: " +
          ", ".join(f"{d} by {ceilings[f'{d}_matmul_path']} at n = {ceilings[f'{d}_matmul_n']}"
                    for d in ("bf16", "fp32")) + " (every path's rate in `measured`)")


def accelerator_entry(ceilings: dict[str, Any] | Sequence[dict[str, Any]], config: ServerConfig,
                      measured_at: str | None = None) -> dict[str, Any]:
  """This machine as an accelerator in the shipped schema, ceilings as the engine computes
  (each measurement's fastest repeat, the median over several: `ceiling_rates`);
  `measured_at` the measurements' time where they are merged later (default: now)."""
  measured = [ceilings] if isinstance(ceilings, dict) else list(ceilings)
  ceilings = measured[0]
  best = ceiling_rates(measured)
  cores = f"{ceilings['threads']} thread(s) pinned to core(s) {ceilings['cpus']}"
  how = (
      f"measured here {measured_at or now_utc()}: torch {ceilings['torch']} in the vLLM engine's venv, "
      f"{cores} (VLLM_CPU_OMP_THREADS_BIND={config.engine_cpus}), ISA "
      f"{ceilings['isa']}, the fastest of each measurement's {len(ceilings['read_s'])} read and "
      f"{len(ceilings['bf16_matmul_s'])} matmul repeats, the median over {len(measured)} "
      "measurement(s) (each one's median repeat in `measured`)")
  return {
      "name": f"{cpu_model()} ({cores}; torch, as vLLM CPU computes)",
      "vendor": "user",
      "memory_capacity_gb": round(memory_bytes() / 1e9, 3),
      "memory_type": "host DRAM",
      "memory_bandwidth_tb_s": best["read_bytes_per_s"] / 1e12,
      "dense_tflops": {
          "bf16": best["bf16_flops_per_s"] / 1e12, "fp32": best["fp32_flops_per_s"] / 1e12
      },
      "sources": {
          "memory_bandwidth_tb_s": f"torch.sum over {ceilings['read_mb']} MiB of float32; {how}",
          "dense_tflops": _matmul_source(ceilings) + f"; {how}",
          "memory_capacity_gb": "/proc/meminfo MemTotal (the engine's K/V space is set apart: "
                                "VLLM_CPU_KVCACHE_SPACE)"
      },
      "decisions": ["label: measurement (ceilings as the engine computes, not a datasheet)"],
      "measured": measured[0] if len(measured) == 1 else measured,
  }


def now_utc() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def bf16_note(best: dict[str, float]) -> str | None:
  """A warning where bf16 matmuls run slower than fp32 ones through the engine's torch.

  On a CPU without AVX512-BF16 or AMX (one with AVX2 only) vLLM's oneDNN refuses a bf16
  matmul ("could not create a primitive descriptor") and its bf16 linear layers fall back to
  torch's F.linear, whose bf16 GEMM ran at 5-9 GFLOP/s there (torch.mm: 1.3) against about
  60 in fp32 (docs/cpu-engine.md): the engine serves bf16 that slowly.
  """
  bf16, fp32 = best["bf16_flops_per_s"], best["fp32_flops_per_s"]
  if bf16 >= fp32:
    return None
  return (f"bf16 matmuls run at {bf16 / 1e9:,.1f} GFLOP/s here, slower than fp32's "
          f"{fp32 / 1e9:,.1f}: without AVX512-BF16 or AMX vLLM's bf16 linear layers leave "
          "oneDNN for torch's fallback, and the engine serves at that rate "
          "(docs/cpu-engine.md, 'A CPU without AVX512-BF16').")
