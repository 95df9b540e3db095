"""The engine's prefill step with decodes beside it, timed by the engine itself.

A term the model may lack: held-out medium-llama requests that arrived while others decoded
waited 18-55 ms more than the simulator says (heldout_by_load.py), one that arrived to an
idle server did not. This probe measures the prefill step alone and with K sequences
decoding in the same steps: K background requests (BG_PROMPT prompt tokens, long outputs)
are started and left decoding, then PROBES requests of 256 prompt tokens and one output
token are sent one at a time; vLLM's own /metrics give their engine-side prefill time
(scheduled to first token). Background prompts of two lengths tell a cost per decode row
that grows with its context from a fixed one.
Run with the project's python:
  python results/vllm_cpu/engine_mixed_probe.py ENV_DIR WORK_DIR MODEL_DIR [MODEL_DIR ...]
One JSON line per (model, K, background prompt length); then
  python results/vllm_cpu/engine_mixed_probe.py --collect RUN.jsonl [RUN.jsonl ...]
writes engine_mixed_probe.json (each row with its prefill's increase over K = 0)."""
import json, os, random, re, sys, threading, time, urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_phase_probe import metrics, post  # noqa: E402
from jaxroof.measure import vllm_engine  # noqa: E402

PROMPT, PROBES = 256, 4
SETTINGS = ((0, 0), (1, 64), (3, 64), (1, 1024), (3, 1024))  # (K decoding, their prompt).
BG_SECONDS = 4.0  # Each background request decodes at least this long.


def prompt_tokens_done(port):
  """vLLM's counter of prompt tokens prefilled so far."""
  with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
    text = r.read().decode()
  return sum(
      float(v) for v in re.findall(r"^vllm:prompt_tokens_total\{[^}]*\} ([0-9.e+-]+)$", text, re.M))


def probe(env_dir, work_dir, model_dir, step_s):
  """Rows for one model; `step_s`, its decode step, sizes the background outputs."""
  config = vllm_engine.ServerConfig(frontend_cpus="0")
  port = vllm_engine.require_free_port(0)
  rng = random.Random(0)

  def body(prompt, out):
    return {
        "model": "tiny", "prompt": [rng.randrange(3, 8192) for _ in range(prompt)],
        "max_tokens": out, "min_tokens": out, "ignore_eos": True, "temperature": 0
    }

  rows = []
  with vllm_engine.serving(env_dir, model_dir, config, port, work_dir, 300.0):
    post(port, body(PROMPT, 4))  # warm-up, not counted
    for k, bg_prompt in SETTINGS:
      # Long enough to outlast the probes, within the server's context.
      out = min(int(BG_SECONDS / step_s), config.max_model_len - bg_prompt - 8)
      background = [
          threading.Thread(target=post, args=(port, body(bg_prompt, out))) for _ in range(k)
      ]
      done = prompt_tokens_done(port)
      for t in background:
        t.start()
      waited = time.monotonic()
      while prompt_tokens_done(port) < done + k * bg_prompt:  # Their prefills done.
        if time.monotonic() - waited > 30:
          raise RuntimeError("the background prefills did not finish: no vllm:prompt_tokens?")
        time.sleep(0.05)
      time.sleep(0.2)  # They decode.
      before = metrics(port)
      for _ in range(PROBES):
        post(port, body(PROMPT, 1))
      after = metrics(port)
      for t in background:
        t.join()
      name = "request_prefill_time_seconds"
      n = after[f"{name}_count"] - before[f"{name}_count"]
      rows.append({
          "model_dir": model_dir, "decoding": k, "decoding_prompt_tokens": bg_prompt, "probes": n,
          "prefill_s": (after[f"{name}_sum"] - before[f"{name}_sum"]) / n,
          "background_output_tokens": out, "load_after": os.getloadavg()
      })
      print(json.dumps(rows[-1]), flush=True)
  return rows


def collect(paths):
  """Every row, with its prefill over the same model's K = 0 one."""
  rows = [{**json.loads(line), "run": p} for p in paths for line in open(p)]
  alone = {(r["run"], r["model_dir"]): r["prefill_s"] for r in rows if r["decoding"] == 0}
  for r in rows:
    r["model"] = os.path.basename(os.path.dirname(r["model_dir"].rstrip("/")))
    r["prefill_over_alone_s"] = r["prefill_s"] - alone[(r["run"], r["model_dir"])]
  return {
      "kind": "measurement", "what":
          ("vLLM's own prefill time (/metrics request_prefill_time_seconds: scheduled to "
           "first token) of 256-token prompts with one output token, alone and with K "
           "requests decoding in the same steps (their prompts of 64 or 1024 tokens), mean "
           f"of {PROBES} per row"),
      "device": "AMD EPYC, 2 cores: engine worker on core 1, API server on core 0",
      "engine": "vllm 0.32.0+cpu, torch 2.13.0+cpu, bf16, dummy weights",
      "made_by": "results/vllm_cpu/engine_mixed_probe.py (its docstring has the commands)",
      "runs": list(paths), "rows": rows
  }


if __name__ == "__main__":
  if sys.argv[1] == "--collect":
    from jaxroof import files
    files.write_json(
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "engine_mixed_probe.json"),
        collect(sys.argv[2:]))
    sys.exit(0)
  env_dir, work_dir = sys.argv[1], sys.argv[2]
  for spec in sys.argv[3:]:
    model_dir, step_ms = spec.split("=") if "=" in spec else (spec, "25")
    wd = os.path.join(work_dir, os.path.basename(os.path.dirname(model_dir.rstrip("/"))))
    os.makedirs(wd, exist_ok=True)
    probe(env_dir, wd, model_dir, float(step_ms) / 1e3)
