"""How the host's memory rate drifts over minutes (issue 25): vLLM's bf16 linear path over one
model's whole decoder weight set at M = 1 (as engine_token_rates.py times it), and one core
reading 512 MiB (as vllm_bench's read ceiling), sampled every EVERY seconds for MINUTES
minutes on core 1. Each sample: the median of 7 passes after one warm-up, and the fastest
of 5 reads. A pass's probes and its served runs are minutes apart: if the rate moves between
samples, no probe taken at another minute holds a served run's. Writes JSON; usage (the
engine's venv, a quiet machine):
  python memory_drift.py CONFIG.json OUT.json [MINUTES [EVERY]]"""
import datetime
import json
import os
import statistics
import sys
import time

import torch

from engine_token_rates import onednn_handlers, timed_passes

READ_BYTES = 512 * 2**20


def read_rate(buffer) -> float:
  """Bytes per second of torch.sum over the buffer, the fastest of 5."""
  best = float("inf")
  for _ in range(5):
    t = time.perf_counter()
    torch.sum(buffer)
    best = min(best, time.perf_counter() - t)
  return READ_BYTES / best


def main(config: str, out_path: str, minutes: float = 10.0, every: float = 20.0) -> None:
  handlers, shapes, params = onednn_handlers(config)
  weight_bytes = 2 * params
  xs = {k: torch.randn(1, k).to(torch.bfloat16) for k, _ in shapes}
  buffer = torch.ones(READ_BYTES // 4, dtype=torch.float32)
  samples, start = [], time.time()
  while time.time() - start < minutes * 60:
    began = time.time()
    gemm = statistics.median(timed_passes(handlers, xs))
    read = read_rate(buffer)
    samples.append({
        "t_s": round(began - start, 1), "gemm_s": gemm, "gemm_GBps": weight_bytes / gemm / 1e9,
        "read_GBps": read / 1e9, "load": os.getloadavg()[0]
    })
    print(json.dumps(samples[-1]), flush=True)
    time.sleep(max(0.0, every - (time.time() - began)))

  def spread(key: str) -> dict:
    values = [s[key] for s in samples]
    steps = [abs(b / a - 1) for a, b in zip(values, values[1:])]
    return {
        "median": statistics.median(values), "min": min(values), "max": max(values),
        "max_over_min": max(values) / min(values),
        "median_change_between_samples": statistics.median(steps) if steps else None,
        "max_change_between_samples": max(steps) if steps else None
    }

  result = {
      "kind": "measurement",
      "what": "the host's memory rate over minutes: vLLM's bf16 oneDNN GEMMs over a model's "
              "decoder weights at M = 1 and one core's torch.sum read, sampled on core 1",
      "timing": "per sample: GEMMs the median of 7 passes after a warm-up; read the fastest of "
                f"5 over {READ_BYTES >> 20} MiB; perf_counter; a sample every {every:g} s",
      "device": os.environ.get("DEVICE", ""),
      "engine": f"torch {torch.__version__}, vLLM's oneDNN handler (create_onednn_mm)",
      "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
      "model": config, "weight_bytes": weight_bytes, "samples": samples,
      "summary": {"gemm_GBps": spread("gemm_GBps"), "read_GBps": spread("read_GBps")}
  }
  tmp = out_path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(result, f, indent=1)
  os.replace(tmp, out_path)
  print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
  if len(sys.argv) not in (3, 4, 5) or not os.path.isfile(sys.argv[1]):
    raise SystemExit(f"memory_drift: give a model's config.json (got {sys.argv[1:2]}) and OUT.json"
                     " [MINUTES [EVERY]]")
  def positive(text: str) -> bool:
    try:
      return float(text) > 0 and float(text) != float("inf")
    except ValueError:
      return False

  if not all(positive(a) for a in sys.argv[3:5]):
    raise SystemExit(f"memory_drift: MINUTES and EVERY must be positive numbers, got {sys.argv[3:5]}")
  os.sched_setaffinity(0, {1})
  torch.set_num_threads(1)
  main(sys.argv[1], sys.argv[2], *(float(a) for a in sys.argv[3:5]))
