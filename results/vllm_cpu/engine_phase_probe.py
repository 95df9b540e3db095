"""Isolated requests against vLLM, timed by the engine itself: its /metrics histograms split a
request into queue, prefill and decode time (engine-side), beside the client's end-to-end time.

One request at a time (256 prompt tokens as ids, OUT tokens out, ignore_eos), so the prefill
is one step of one sequence and every decode step holds one sequence: per model, the engine's
own prefill time and decode step time with no batching and no queueing, for the fit's terms.
Run with the project's python (it uses jaxroof.measure.vllm_engine to start and stop vLLM):
  python results/vllm_cpu/engine_phase_probe.py ENV_DIR WORK_DIR MODEL_DIR [MODEL_DIR ...]
where each MODEL_DIR holds config.json and the tokenizer (vllm_bench writes one per run).
ENGINE_CORE (environment, default empty) moves the engine core process onto those cores once
the server is up, as vllm_bench's --engine_core_cpus; its niceness is ServerConfig's default,
as vllm_bench's --engine_core_nice."""
import json, os, random, re, sys, time, urllib.request
from jaxroof.measure import vllm_engine

PROMPT, OUT, REQUESTS = 256, 64, 8
NAMES = ("request_queue_time_seconds", "request_prefill_time_seconds",
         "request_decode_time_seconds", "time_to_first_token_seconds",
         "e2e_request_latency_seconds", "request_inference_time_seconds")


def post(port, body):
  req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                               data=json.dumps(body).encode(),
                               headers={"Content-Type": "application/json"})
  with urllib.request.urlopen(req, timeout=120) as r:
    return json.load(r)


def metrics(port):
  with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
    text = r.read().decode()
  out = {}
  for name in NAMES:
    for kind in ("sum", "count"):
      m = re.search(rf"^vllm:{name}_{kind}\{{[^}}]*\}} ([0-9.e+-]+)$", text, re.M)
      out[f"{name}_{kind}"] = float(m.group(1)) if m else None
  return out


def probe(env_dir, work_dir, model_dir):
  config = vllm_engine.ServerConfig(frontend_cpus="0",
                                    engine_core_cpus=os.environ.get("ENGINE_CORE", ""))
  port = vllm_engine.require_free_port(0)
  rng = random.Random(0)

  def body():
    return {
        "model": "tiny", "prompt": [rng.randrange(3, 8192) for _ in range(PROMPT)],
        "max_tokens": OUT, "min_tokens": OUT, "ignore_eos": True, "temperature": 0
    }

  with vllm_engine.serving(env_dir, model_dir, config, port, work_dir, 300.0):
    post(port, body())  # warm-up, not counted
    before = metrics(port)
    e2e = []
    for _ in range(REQUESTS):
      t = time.perf_counter()
      post(port, body())
      e2e.append(time.perf_counter() - t)
      time.sleep(0.3)
    after = metrics(port)
  n = after["e2e_request_latency_seconds_count"] - before["e2e_request_latency_seconds_count"]
  mean = {name: (after[f"{name}_sum"] - before[f"{name}_sum"]) / n for name in NAMES}
  return {
      "model_dir": model_dir, "requests": n, "client_e2e_s": sorted(e2e), "engine_mean_s": mean,
      "decode_step_s": mean["request_decode_time_seconds"] / (OUT - 1),
      "load_after": os.getloadavg()
  }


if __name__ == "__main__":
  env_dir, work_dir = sys.argv[1], sys.argv[2]
  for model_dir in sys.argv[3:]:
    wd = os.path.join(work_dir, os.path.basename(os.path.dirname(model_dir.rstrip("/"))))
    os.makedirs(wd, exist_ok=True)
    print(json.dumps(probe(env_dir, wd, model_dir)), flush=True)
