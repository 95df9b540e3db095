"""The model forward inside the served worker over the prompt length, beside the same
forward offline (engine_forward_ops.py): how much slower serving makes it, by shape.

Isolated requests (one at a time, one output token, PAUSE_S apart) of several prompt lengths
against `vllm serve` as `vllm_bench` starts it (engine worker on core 1, API server and engine
core on core 0), with `forward_hook/` on the engine's PYTHONPATH: each process that runs
vLLM's `GPUModelRunner._model_forward` logs its tokens and perf_counter time. One warm-up
round over every length, then ROUNDS rounds, the lengths shuffled in each. Writes OUT_JSON:
per model and length the forward times and their median, and, given OFFLINE (environment: an
engine_forward_ops.py JSON of the same shapes), the median's ratio to the offline forward.
Kind: measurement (perf_counter in the served worker around the model forward).
Run with the project's python from the repository root:
  PYTHONPATH=. python results/vllm_cpu/engine_served_forward.py ENV_DIR WORK_DIR OUT_JSON \
      MODEL_DIR [MODEL_DIR ...]
MODEL_DIR as engine_prefill_lengths.py takes them; LENGTHS, ROUNDS, ENGINE_CORE and DEVICE
(environment) as there.
"""
import contextlib
import glob
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Iterator

import engine_prefill_lengths as lengths_probe
from jaxroof.measure import vllm_engine

HOOK_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "forward_hook")
LENGTHS = lengths_probe.LENGTHS
ROUNDS = lengths_probe.ROUNDS
OFFLINE = os.environ.get("OFFLINE")


@contextlib.contextmanager
def _hooked(log_dir: str) -> Iterator[None]:
  """Servers started inside get the forward hook on their PYTHONPATH and its log folder
  (vllm_engine.engine_environment, extended while inside)."""
  plain = vllm_engine.engine_environment

  def environment(*args, **kwargs):
    return {**plain(*args, **kwargs), "PYTHONPATH": HOOK_DIR, "JAXROOF_FORWARD_LOG": log_dir}

  vllm_engine.engine_environment = environment
  try:
    yield
  finally:
    vllm_engine.engine_environment = plain


def _forwards(log_dir: str) -> list[tuple[int, float]]:
  out = []
  for path in sorted(glob.glob(os.path.join(log_dir, "forward_*.log"))):
    with open(path) as f:
      out += [(int(t), float(s)) for t, s in (line.split() for line in f if line.strip())]
  return out


def probe(env_dir: str, work_dir: str, model_dir: str) -> dict:
  log_dir = os.path.join(work_dir, "forward_log")
  os.makedirs(log_dir, exist_ok=True)
  for stale in glob.glob(os.path.join(log_dir, "forward_*.log")):
    os.remove(stale)
  rng = random.Random(0)
  times: dict[int, list[float]] = {n: [] for n in LENGTHS}
  with _hooked(log_dir), lengths_probe.served(env_dir, work_dir, model_dir) as port:
    for n in LENGTHS:
      lengths_probe.one_request(port, rng, n)
    for _ in range(ROUNDS):
      for n in rng.sample(LENGTHS, len(LENGTHS)):
        seen = len(_forwards(log_dir))
        time.sleep(lengths_probe.PAUSE_S)
        lengths_probe.one_request(port, rng, n)
        times[n] += [s for t, s in _forwards(log_dir)[seen:] if t == n]
  if not any(times.values()):
    raise SystemExit(f"engine_served_forward: no forward was logged under {log_dir}: the "
                     "engine did not load forward_hook/sitecustomize.py")
  row = {
      "model_dir": model_dir, "forward_s": {str(n): times[n] for n in LENGTHS},
      "median_s": {str(n): statistics.median(times[n]) for n in LENGTHS if times[n]},
      "load_after": os.getloadavg(), "date": vllm_engine.now_utc()
  }
  if OFFLINE:
    with open(OFFLINE) as f:
      offline = json.load(f)["rows"].get(shape_name(model_dir), {}).get("lengths", {})
    row["over_offline"] = {
        n: m / offline[n]["forward_s"] for n, m in row["median_s"].items() if n in offline
    }
  return row


def shape_name(model_dir: str) -> str:
  """S/w512L4/model -> w512L4, as engine_prefill_lengths.main names a model's row."""
  return os.path.basename(os.path.dirname(model_dir.rstrip("/")))


def summary(rows: dict) -> dict:
  ratios = [r for row in rows.values() for r in row.get("over_offline", {}).values()]
  return {
      "over_offline_median": statistics.median(ratios) if ratios else None,
      "over_offline_what": "the served forward's median over the offline forward's "
                           "(engine_forward_ops.py, OFFLINE) at the same length, median over "
                           "every model and length"
  }


def _line(row: dict) -> str:
  ratios = row.get("over_offline", {})
  return " ".join(f"{n}: {m * 1e3:.2f} ms" + (f" (x{ratios[n]:.2f})" if n in ratios else "")
                  for n, m in row["median_s"].items())


if __name__ == "__main__":
  lengths_probe.main(
      sys.argv[1:], probe, summary, _line,
      what="isolated requests of several prompt lengths and one output token against vllm "
      "serve: the model forward's time inside the served worker per length "
      "(engine_served_forward.py), and its ratio to the offline forward",
      timing="perf_counter around GPUModelRunner._model_forward in the served worker "
      "(forward_hook/sitecustomize.py); medians over the rounds")
