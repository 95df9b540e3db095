"""Does a served prefill cost more when the engine was idle before it?

Served tiny-llama at 8 req/s had a lower p50 TTFT (pass I7: 13.5 ms) than at 2 req/s (18.2)
and than an isolated request's own engine-side prefill (engine_prefill_lengths.py: 13.1 ms
at 128 tokens, plus about 4 ms of front end). This probe times short prefills (PROMPT
tokens, one output token) against `vllm serve` as `vllm_bench` starts it, two ways:
  idle: the engine had nothing to do for GAP seconds before the request (GAPS, shuffled);
  busy: sent while another request decodes (BUSY_OUT tokens), so the prefill joins a
        running engine's step.
Per request, vLLM's own prefill time (/metrics histogram sums read around it: the
background request records its prefill before and its decode only when it ends) and the
client's time. Writes OUT_JSON: per model the requests and their medians per condition, and
the same server's decode step (the background requests' decode time per token).
Kind: measurement. Run with the project's python from the repository root:
  PYTHONPATH=. python results/vllm_cpu/engine_idle_probe.py ENV_DIR WORK_DIR OUT_JSON \\
      MODEL_DIR [MODEL_DIR ...]
(MODEL_DIR as engine_prefill_lengths.py's). ENGINE_CORE and DEVICE (environment) as there;
PROMPT (environment): the probe's prompt tokens, default 16 (the background request's stay 16).
"""
import os
import random
import statistics
import sys
import threading
import time

from engine_phase_probe import metrics, post
from engine_prefill_lengths import main, one_request, served

PROMPT = int(os.environ.get("PROMPT", "16"))
BUSY_PROMPT = 16  # The background request's prompt: it only has to decode.
GAPS = (0.0, 0.005, 0.02, 0.05, 0.2, 1.0)
ROUNDS = int(os.environ.get("ROUNDS", "6"))
BUSY_OUT, BUSY_REQUESTS = 400, 6
WAKE_GAP_S = 0.2  # The idle gap `summary` reads the wake at (2-4 req/s leave gaps of this size).


def _background(port: int, out: int, done: threading.Event) -> None:
  rng = random.Random(1)
  post(
      port, {
          "model": "tiny", "prompt": [rng.randrange(3, 8192) for _ in range(BUSY_PROMPT)],
          "max_tokens": out, "min_tokens": out, "ignore_eos": True, "temperature": 0
      })
  done.set()


def summary(rows: dict[str, dict], gap: float = WAKE_GAP_S) -> dict:
  """Each shape's wake: its median prefill after `gap` seconds idle less its median beside a
  running decode; and their median over the shapes (what `--engine_wake_ms` holds)."""
  wake = {
      shape: row["idle"][str(gap)]["median"]["prefill_s"] - row["busy"]["median"]["prefill_s"]
      for shape, row in rows.items()
  }
  return {
      "wake_s": wake, "wake_s_median": statistics.median(wake.values()), "idle_gap_s": gap,
      "wake_what": "a prompt's prefill after the idle gap less the same beside a running "
                   "decode (medians over the rounds), per shape"
  }


def probe(env_dir: str, work_dir: str, model_dir: str) -> dict:
  rng = random.Random(0)
  idle: dict[float, list[dict[str, float]]] = {g: [] for g in GAPS}
  busy: list[dict[str, float]] = []
  decode_steps: list[float] = []
  with served(env_dir, work_dir, model_dir) as port:
    one_request(port, rng, PROMPT)  # warm-up
    for _ in range(ROUNDS):
      for gap in rng.sample(GAPS, len(GAPS)):
        time.sleep(gap)
        idle[gap].append(one_request(port, rng, PROMPT))
      time.sleep(0.3)
    time.sleep(0.5)
    for _ in range(BUSY_REQUESTS):
      before = metrics(port)
      done = threading.Event()
      thread = threading.Thread(target=_background, args=(port, BUSY_OUT, done))
      thread.start()
      time.sleep(0.1)  # its prefill done, it decodes
      while not done.is_set():
        busy.append(one_request(port, rng, PROMPT))
        time.sleep(0.03)
      thread.join()
      after = metrics(port)
      decode = (after["request_decode_time_seconds_sum"] -
                before["request_decode_time_seconds_sum"])
      # The probe requests' own decode time is 0 (one token each).
      decode_steps.append(decode / (BUSY_OUT - 1))
      time.sleep(0.3)
  busy = busy[:-1]  # The last may have overlapped the background request's end.

  def medians(rows):
    return {k: statistics.median(r[k] for r in rows) for k in ("prefill_s", "client_s")}

  return {
      "model_dir": model_dir, "prompt_tokens": PROMPT,
      "idle": {str(g): {"requests": idle[g], "median": medians(idle[g])} for g in GAPS},
      "busy": {"requests": busy, "median": medians(busy)}, "decode_step_s": decode_steps,
      "decode_step_median_s": statistics.median(decode_steps), "load_after": os.getloadavg()
  }


def _line(row: dict) -> str:
  idle = {g: round(v["median"]["prefill_s"] * 1e3, 2) for g, v in row["idle"].items()}
  return (f"prefill ms by idle gap: {idle}, busy {row['busy']['median']['prefill_s'] * 1e3:.2f} "
          f"({len(row['busy']['requests'])}), decode step "
          f"{row['decode_step_median_s'] * 1e3:.2f}")


if __name__ == "__main__":
  main(
      sys.argv[1:], probe, summary, _line,
      what="served prefills of a prompt (one output token) after the engine was idle "
      "for several gaps, and while another request decodes (engine_idle_probe.py)",
      timing="vLLM's /metrics histogram sums read around each request; client: "
      "time.perf_counter around the POST; medians")
