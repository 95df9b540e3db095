"""Where vLLM's CPU worker spends a decode-heavy run: py-spy samples, grouped.

Record (py-spy in the engine's venv: `DIR/bin/python -m pip install py-spy`, which vllm_setup.sh
leaves out; the worker is the `VLLM::Worker` process) while
`experiments.vllm_bench` serves the model, e.g. medium-llama at 1 req/s:

  py-spy record --pid $(pgrep -f VLLM::Worker) --duration 25 --rate 200 \
      --format raw --nonblocking -o worker.raw
  py-spy record --pid $(pgrep -f VLLM::Worker) --duration 12 --rate 100 \
      --native --format raw -o worker_native.raw

then `python results/vllm_cpu/worker_profile.py worker.raw worker_native.raw > OUT.json`.
"""

import collections
import json
import sys

GROUPS = (
    ("model forward (compiled graph)", "Runner.call"),
    ("attention (vLLM's CPU kernel)", "cpu_attention_with_kv_cache"),
    ("logits (LM head)", "compute_logits"),
    ("sampling", "sample_tokens"),
    ("waiting for work (shared-memory queue)", "MessageQueue.acquire_read"),
)


def read(path):
  for line in open(path):
    line = line.rstrip()
    if line:
      stack, count = line.rsplit(" ", 1)
      yield stack.split(";"), int(count)


def python_shares(path):
  """Share of the worker's samples under each group's frame (a sample may be in two)."""
  counts, total = collections.Counter(), 0
  for frames, n in read(path):
    total += n
    for name, marker in GROUPS:
      if any(marker in f for f in frames):
        counts[name] += n
  return {"samples": total, "share": {name: counts[name] / total for name, _ in GROUPS}}


def native_split(path):
  """Within the compiled forward: JIT code (oneDNN's generated GEMM kernels have no
  symbols), vLLM's attention kernel, and named native code (elementwise, copies)."""
  counts, total = collections.Counter(), 0
  for frames, n in read(path):
    if not any("Runner.call" in f for f in frames):
      continue
    total += n
    stack = ";".join(frames)
    if "cpu_attention" in stack:
      counts["attention kernel"] += n
    elif frames[-1].startswith("0x"):
      counts["JIT code without symbols (oneDNN GEMM)"] += n
    else:
      counts["named native code"] += n
  return {"samples": total, "share": {k: v / total for k, v in counts.most_common()}}


if __name__ == "__main__":
  out = {"python": python_shares(sys.argv[1])}
  if len(sys.argv) > 2:
    out["forward_native"] = native_split(sys.argv[2])
  json.dump(out, sys.stdout, indent=1)
