"""A served prefill's time against its prompt length: what a prefill step pays per token and
what it pays whatever the length.

Isolated requests (one at a time, one output token, prompt ids at random) of several prompt
lengths against `vllm serve` as `vllm_bench` starts it (engine worker on core 1, API server
and engine core on core 0, the engine core at ServerConfig's niceness). Per request: vLLM's
own prefill time (its /metrics histogram `request_prefill_time_seconds`, engine-side: from
scheduling to the first token), its TTFT histogram and the client's time to the response.
One warm-up round over every length first (the engine builds its GEMM kernels per token
count, engine_cold_rows.py), then ROUNDS rounds, the lengths shuffled in each; last, DECODES
requests of the shortest prompt and DECODE_TOKENS + 1 tokens out give the same server's decode
step (vLLM's decode-time histogram over the tokens after the first). Writes OUT_JSON: per
model, per length the requests' times and their medians, a least-squares line of the engine's
prefill time over the length (intercept, per-token slope, residuals), the decode step, and
`prefill_over_decode_s`: the shortest prompt's prefill less that decode step, what a prefill
step pays beyond a decode step of one sequence when its FLOPs are few.
Kind: measurement (engine-side histogram sums; client: time.perf_counter around the POST).
Run with the project's python from the repository root:
  PYTHONPATH=. python results/vllm_cpu/engine_prefill_lengths.py ENV_DIR WORK_DIR OUT_JSON \
      MODEL_DIR [MODEL_DIR ...]
where each MODEL_DIR (config.json and tokenizer) is named by its parent folder (S/w512L4/model:
w512L4), as full_pass.sh writes them. ENGINE_CORE (environment) as engine_phase_probe.py;
DEVICE (environment) names the CPU in the file.
"""
import contextlib
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator

import numpy as np

from engine_phase_probe import metrics, post
from jaxroof import files
from jaxroof.measure import vllm_engine

LENGTHS = tuple(int(x) for x in os.environ.get("LENGTHS", "16,64,128,192,256,384,512").split(","))
ROUNDS = int(os.environ.get("ROUNDS", "6"))
DECODES, DECODE_TOKENS = 4, 32
PAUSE_S = 0.2
HISTOGRAMS = ("request_prefill_time_seconds", "time_to_first_token_seconds",
              "request_decode_time_seconds")


def one_request(port: int, rng: random.Random, length: int, out: int = 1) -> dict[str, float]:
  """One request's engine-side prefill, TTFT and decode time (histogram sum deltas) and its
  client time."""
  body = {
      "model": "tiny", "prompt": [rng.randrange(3, 8192) for _ in range(length)], "max_tokens": out,
      "min_tokens": out, "ignore_eos": True, "temperature": 0
  }
  before = metrics(port)
  start = time.perf_counter()
  post(port, body)
  client = time.perf_counter() - start
  after = metrics(port)
  sums = {name: after[f"{name}_sum"] - before[f"{name}_sum"] for name in HISTOGRAMS}
  return {
      "prefill_s": sums[HISTOGRAMS[0]], "ttft_s": sums[HISTOGRAMS[1]],
      "decode_s": sums[HISTOGRAMS[2]], "client_s": client
  }


def fit_line(lengths: list[int], seconds: list[float]) -> dict[str, float]:
  """Least squares seconds = intercept + slope * length, with its residuals' rms."""
  x, y = np.asarray(lengths, float), np.asarray(seconds, float)
  slope, intercept = np.polyfit(x, y, 1)
  residual = y - (intercept + slope * x)
  return {
      "intercept_s": float(intercept), "per_token_s": float(slope),
      "rms_residual_s": float(np.sqrt(np.mean(residual**2)))
  }


def summary(rows: dict[str, dict]) -> dict[str, float | str]:
  """The front end's cost (client time less the engine's prefill time; median over every
  model and length): what `calibrate --engine_request_ms` holds."""
  front = [m["client_s"] - m["prefill_s"] for row in rows.values() for m in row["median"].values()]
  return {
      "front_end_s_median": statistics.median(front), "front_end_s_min": min(front),
      "front_end_s_max": max(front),
      "front_end_what": "client time to a one-token response less vLLM's own prefill time "
                        "(HTTP, API server, the engine core's receipt and the response), the "
                        "median over every model and prompt length"
  }


@contextlib.contextmanager
def served(env_dir: str, work_dir: str, model_dir: str) -> Iterator[int]:
  """`vllm serve` as `vllm_bench` starts it (ENGINE_CORE as engine_phase_probe.py's): its
  port, the server stopped on leaving."""
  config = vllm_engine.ServerConfig(frontend_cpus="0",
                                    engine_core_cpus=os.environ.get("ENGINE_CORE", ""))
  port = vllm_engine.require_free_port(0)
  with vllm_engine.serving(env_dir, model_dir, config, port, work_dir, 300.0):
    yield port


def main(argv: list[str], probe: Callable[[str, str, str], dict], summary: Callable[[dict], dict],
         describe: Callable[[dict], str], what: str, timing: str) -> None:
  """`argv` = ENV_DIR WORK_DIR OUT_JSON MODEL_DIR ...: each model probed (a progress line
  each), then OUT_JSON written with the rows and their summary."""
  env_dir, work_dir, out_json = argv[:3]
  rows = {}
  for model_dir in argv[3:]:
    name = os.path.basename(os.path.dirname(model_dir.rstrip("/")))
    wd = os.path.join(work_dir, name)
    os.makedirs(wd, exist_ok=True)
    rows[name] = probe(env_dir, wd, model_dir)
    print(f"{name}: {describe(rows[name])}", flush=True)
  files.write_json(
      out_json, {
          "kind": "measurement", "what": what, "timing": timing, "device": os.environ.get(
              "DEVICE", vllm_engine.cpu_model()),
          "engine": f"vllm {vllm_engine.ENGINE_VERSION}, bf16, dummy weights ({env_dir})",
          "date": vllm_engine.now_utc(), "summary": summary(rows), "rows": rows
      })


def probe(env_dir: str, work_dir: str, model_dir: str) -> dict:
  rng = random.Random(0)
  rows: dict[int, list[dict[str, float]]] = {n: [] for n in LENGTHS}
  with served(env_dir, work_dir, model_dir) as port:
    for n in LENGTHS:  # warm-up: every token count once, not counted
      one_request(port, rng, n)
    for _ in range(ROUNDS):
      for n in rng.sample(LENGTHS, len(LENGTHS)):
        rows[n].append(one_request(port, rng, n))
        time.sleep(PAUSE_S)
    decodes = []
    for _ in range(DECODES):
      decodes.append(
          one_request(port, rng, LENGTHS[0], DECODE_TOKENS + 1)["decode_s"] / DECODE_TOKENS)
      time.sleep(PAUSE_S)
  medians = {
      n: {k: statistics.median(r[k] for r in rows[n]) for k in ("prefill_s", "ttft_s", "client_s")}
      for n in LENGTHS
  }
  decode_step = statistics.median(decodes)
  return {
      "model_dir": model_dir, "lengths": list(LENGTHS), "rounds": ROUNDS, "decode_step_s": decodes,
      "decode_step_median_s": decode_step,
      "prefill_over_decode_s": medians[LENGTHS[0]]["prefill_s"] - decode_step,
      "requests": {str(n): rows[n] for n in LENGTHS}, "median": {str(n): medians[n] for n in LENGTHS},
      "prefill_line": fit_line(list(LENGTHS), [medians[n]["prefill_s"] for n in LENGTHS]),
      "client_line": fit_line(list(LENGTHS), [medians[n]["client_s"] for n in LENGTHS]),
      "load_after": os.getloadavg(), "date": vllm_engine.now_utc()
  }


def _line(row: dict) -> str:
  fit = row["prefill_line"]
  return (f"prefill {fit['intercept_s'] * 1e3:.2f} ms + {fit['per_token_s'] * 1e6:.2f} "
          f"us/token, decode step {row['decode_step_median_s'] * 1e3:.2f} ms")


if __name__ == "__main__":
  main(
      sys.argv[1:], probe, summary, _line,
      what="isolated requests of several prompt lengths and one output token against vllm "
      "serve: the engine's prefill time (its /metrics histogram), TTFT and the client's time "
      "per length, and the same server's decode step (engine_prefill_lengths.py)",
      timing="vLLM's histogram sums read before and after each request; client: "
      "time.perf_counter around the POST; medians over the rounds")
