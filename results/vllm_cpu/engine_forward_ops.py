"""Where a served prefill's time goes inside vLLM's forward, by kind of op, on one core.

Runs vLLM offline in one process pinned to core 1 (the served worker's core, one thread),
with the server's scheduler settings and dummy weights, and prefills one prompt of each
length (one output token). Per length: the model forward's wall time (median of ROUNDS
calls, `GPUModelRunner._model_forward` timed with perf_counter), then PROFILED calls under
torch.profiler, whose op self-times are summed into kinds (`KINDS`): the linear layers,
the attention kernel, the K/V cache write, the compiled graph's own kernels (norms, rotary,
SiLU-and-multiply, residual adds: inductor code) and the rest ("other": everything else in
the profiled `generate` call: input preparation, sampling, the engine's bookkeeping).

Why one core: the served worker runs alone on its core. The same forward run unpinned in
one process also uses the other core (w512L1, 512 tokens: 3.5 ms against 6.2 pinned), so an
unpinned offline timing is not the served engine's.

Usage (the engine's python; each model folder needs config.json and a tokenizer; one
process per model, its caches under WORK):
  WORK=DIR DIR/bin/python results/vllm_cpu/engine_forward_ops.py OUT.json MODEL_DIR ...
Environment: LENGTHS=16,64,... (prompt tokens), ROUNDS, PROFILED; FLUSH_MB=600 touches that
many MB before every prefill, evicting the caches as the serving processes do between steps
(0, the default: caches kept).
"""
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

LENGTHS = tuple(int(n) for n in os.environ.get("LENGTHS", "16,64,128,256,512").split(","))
ROUNDS = int(os.environ.get("ROUNDS", "9"))
PROFILED = int(os.environ.get("PROFILED", "3"))
FLUSH_MB = int(os.environ.get("FLUSH_MB", "0"))
# Kind of op -> the profiler names (op self-times) it sums; the first match wins.
KINDS = (
    ("linear", ("_C::onednn_mm", "_C::weight_packed_linear", "aten::mm", "aten::addmm",
                "aten::linear")),
    ("attention", ("_C::cpu_attention_with_kv_cache",)),
    ("kv_write", ("_C::cpu_attn_reshape_and_cache",)),
    ("compiled_kernels", ("## Call CompiledFxGraph",)),
)


def kind_of(name: str) -> str:
  for kind, names in KINDS:
    if any(name.startswith(n) for n in names):
      return kind
  return "other"


def model_name(model_dir: str) -> str:
  """The shape's name: a bench's model folder is NAME/model."""
  path = model_dir.rstrip("/")
  return os.path.basename(os.path.dirname(path) if path.endswith("/model") else path)


def probe(model_dir: str) -> dict:
  os.sched_setaffinity(0, {1})
  os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_OMP_THREADS_BIND="1",
                    VLLM_CPU_KVCACHE_SPACE="1", VLLM_TARGET_DEVICE="cpu", VLLM_NO_USAGE_STATS="1",
                    HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
  import numpy as np
  import torch.profiler as tp
  from vllm import LLM, SamplingParams
  from vllm.inputs import TokensPrompt
  from vllm.v1.worker import gpu_model_runner

  forwards: list[float] = []
  runner = gpu_model_runner.GPUModelRunner
  original = runner._model_forward

  def timed(self, *args, **kwargs):
    start = time.perf_counter()
    try:
      return original(self, *args, **kwargs)
    finally:
      forwards.append(time.perf_counter() - start)

  runner._model_forward = timed
  llm = LLM(model=model_dir, load_format="dummy", dtype="bfloat16", max_model_len=2048, seed=0,
            max_num_seqs=32, max_num_batched_tokens=2048, enable_prefix_caching=False,
            block_size=128)
  params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
  rng = np.random.default_rng(0)
  flush = np.ones(FLUSH_MB << 20, np.uint8) if FLUSH_MB else None

  def prefill(n: int) -> float:
    prompt = TokensPrompt(prompt_token_ids=rng.integers(10, 8000, n).tolist())
    if flush is not None:
      flush[::64] += 1  # Every cache line of FLUSH_MB.
    del forwards[:]
    llm.generate([prompt], params, use_tqdm=False)
    return forwards[0]

  for n in LENGTHS:  # warm-up: each length once (compilation for a new size)
    prefill(n)
  rows = {}
  for n in LENGTHS:
    walls = [prefill(n) for _ in range(ROUNDS)]
    kinds = collections.defaultdict(list)
    for _ in range(PROFILED):
      with tp.profile(activities=[tp.ProfilerActivity.CPU]) as prof:
        prefill(n)
      sums = collections.Counter()
      for event in prof.key_averages():
        sums[kind_of(event.key)] += event.self_cpu_time_total * 1e-6
      for kind in [k for k, _ in KINDS] + ["other"]:
        kinds[kind].append(sums[kind])
    rows[n] = {
        "forward_s": statistics.median(walls), "forward_s_min": min(walls),
        "forward_s_max": max(walls),
        "profiled_self_s": {k: statistics.median(v) for k, v in kinds.items()}
    }
    print(f"{model_name(model_dir)} {n}: forward "
          f"{rows[n]['forward_s'] * 1e3:.2f} ms", file=sys.stderr, flush=True)
  return rows


def summary(rows: dict) -> dict:
  """Per shape, the compiled kernels' growth per prompt token (least squares over the
  lengths) per activation element (layers x (hidden + intermediate)): what
  `calibrate --engine_act_ns` holds (the median over shapes)."""
  import numpy as np
  per_element = {}
  for name, row in rows.items():
    by_length = {int(n): r for n, r in row["lengths"].items()}
    lengths = sorted(by_length)
    kernels = [by_length[n]["profiled_self_s"]["compiled_kernels"] for n in lengths]
    widths = row["num_layers"] * (row["hidden_size"] + row["intermediate_size"])
    per_element[name] = float(np.polyfit(lengths, kernels, 1)[0]) / widths
  return {
      "t_act_s": per_element, "t_act_s_median": statistics.median(per_element.values()),
      "t_act_what": "seconds per prompt token and activation element (layers x (hidden + "
                    "intermediate)) of the compiled graph's own kernels: slope over the lengths"
  }


def one_model(model_dir: str, env: dict, work: str) -> dict:
  """`probe(model_dir)` in its own process (vLLM's engine is one per process)."""
  rows_json = os.path.join(work, "rows.json")
  subprocess.run([sys.executable, __file__, "--one", model_dir, rows_json], env=env, check=True)
  with open(rows_json) as f:
    return {int(n): row for n, row in json.load(f).items()}


def main(out_json: str, model_dirs: list[str]) -> None:
  missing = [d for d in model_dirs if not os.path.isfile(os.path.join(d, "config.json"))]
  if not model_dirs or missing:
    sys.exit(f"engine_forward_ops: give model folders with a config.json and a tokenizer "
             f"(a bench's NAME/model); not found: {', '.join(missing) or 'none given'}")
  work = os.environ.get("WORK") or tempfile.mkdtemp(prefix="forward_ops_")
  env = {
      **os.environ, "VLLM_CACHE_ROOT": os.path.join(work, "vllm_cache"),
      "TORCHINDUCTOR_CACHE_DIR": os.path.join(work, "inductor_cache"),
      "TMPDIR": os.path.join(work, "tmp")
  }
  os.makedirs(env["TMPDIR"], exist_ok=True)
  version = subprocess.run([sys.executable, "-c", "import vllm; print(vllm.__version__)"],
                           capture_output=True, text=True, env=env, check=True).stdout.split()[-1]
  out = {
      "kind": "measurement",
      "what": "vLLM's model forward of one prompt by length, pinned to one core, and its "
              "op self-times by kind under torch.profiler",
      "timing": f"perf_counter around GPUModelRunner._model_forward, median of {ROUNDS} "
                f"after a warm-up per length; kinds: median of {PROFILED} profiled calls "
                "(the profiler adds its own time; compare kinds, not totals)" +
                (f"; {FLUSH_MB} MB touched before every prefill" if FLUSH_MB else ""),
      "device": next((line.split(":", 1)[1].strip()
                      for line in open("/proc/cpuinfo") if line.startswith("model name")),
                     "unknown CPU"),
      "engine": f"vllm {version}, bf16, dummy weights, offline in one process on "
                "core 1", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": {}
  }
  for model_dir in model_dirs:
    with open(os.path.join(model_dir, "config.json")) as f:
      config = json.load(f)
    name = model_name(model_dir)
    out["rows"][name] = {
        "hidden_size": config["hidden_size"], "num_layers": config["num_hidden_layers"],
        "intermediate_size": config["intermediate_size"],
        "lengths": one_model(model_dir, env, work)
    }
  out["summary"] = summary(out["rows"])
  tmp = tempfile.NamedTemporaryFile("w", dir=os.path.dirname(os.path.abspath(out_json)),
                                    delete=False, suffix=".tmp")
  with tmp:
    json.dump(out, tmp, indent=1)
  os.replace(tmp.name, out_json)


if __name__ == "__main__":
  if sys.argv[1] == "--one":
    with open(sys.argv[3], "w") as f:
      json.dump(probe(sys.argv[2]), f)
  else:
    main(sys.argv[1], sys.argv[2:])
