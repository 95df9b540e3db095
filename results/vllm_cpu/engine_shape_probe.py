"""The engine's decode step of one sequence over width and depth: engine_shape_probe.json.

Six Llama shapes, tiny-llama's config with the width (64, 512, 1536; heads of 64, MLP as
nano-, tiny- and medium-llama) and the depth (1, 4 layers) changed
(`models/w{64,512,1536}L{1,4}`), each timed by `engine_phase_probe.py` (isolated requests,
vLLM's own /metrics) and its decoder GEMMs alone by `engine_token_rates.py`, in five passes.
Made by, per pass N (S holds the six model folders, written from tiny-llama's with these
configs):

  python engine_token_rates.py S/*/model/config.json > S/gemm_runN.jsonl   (engine venv)
  python engine_phase_probe.py ENV S/work_runN S/w64L1/model ... > S/probe_runN.jsonl

then `python results/vllm_cpu/engine_shape_probe.py S` (project venv) collects them here
(env DEVICE: the CPU, default the AMD EPYC of the first passes).
"""
import json
import os
import statistics
import sys

SHAPES = ("w64L1", "w64L4", "w512L1", "w512L4", "w1536L1", "w1536L4")
TOKENS_PER_MODEL = 7  # engine_token_rates.py's M values, in its order: M = 1 first.


def collect(folder: str) -> dict:
  passes = sorted(
      int(f[len("probe_run"):-len(".jsonl")]) for f in os.listdir(folder)
      if f.startswith("probe_run") and f.endswith(".jsonl"))
  rows = {
      s: {"decode_step_s": [], "prefill_s": [], "gemm_m1_s": [], "load_after": []} for s in SHAPES
  }
  for n in passes:
    gemm = [json.loads(line) for line in open(os.path.join(folder, f"gemm_run{n}.jsonl"))]
    for i, shape in enumerate(SHAPES):
      rows[shape]["gemm_m1_s"].append(gemm[i * TOKENS_PER_MODEL]["median_s"])
    for line in open(os.path.join(folder, f"probe_run{n}.jsonl")):
      probe = json.loads(line)
      shape = os.path.basename(os.path.dirname(probe["model_dir"].rstrip("/")))
      rows[shape]["decode_step_s"].append(probe["decode_step_s"])
      rows[shape]["prefill_s"].append(probe["engine_mean_s"]["request_prefill_time_seconds"])
      rows[shape]["load_after"].append(probe["load_after"][0])
  for shape, row in rows.items():
    steps = row["decode_step_s"]
    row.update(config=f"results/vllm_cpu/models/{shape}/config.json",
               decode_step_median_s=statistics.median(steps),
               decode_step_spread=(max(steps) - min(steps)) / statistics.median(steps),
               gemm_m1_median_s=statistics.median(row["gemm_m1_s"]))
  return {"passes": passes, "rows": rows}


FIRST_DATE = ("2026-12-02 07:37-08:36 UTC, passes 1-5; light pytest runs of this project "
              "overlapped pass 3's first shapes (07:50-07:53) and pass 5's middle ones "
              "(08:33-08:34)")

if __name__ == "__main__":
  # Arguments: the folder, then optionally the JSON to write and its date line (a pass of
  # the same-hour sets, e.g. pass7/engine_shape_probe.json).
  folder = sys.argv[1]
  target = sys.argv[2] if len(sys.argv) > 2 else "results/vllm_cpu/engine_shape_probe.json"
  data = collect(folder)
  out = {
      "kind": "measurement",
      "what": ("vLLM's decode step of one sequence (isolated requests: 256 prompt tokens, 64 "
               "out, 8 after a warm-up, engine_phase_probe.py: vLLM's /metrics decode time / "
               "63) and the decoder's GEMMs alone at M = 1 (engine_token_rates.py), for six "
               "shapes of width 64/512/1536 and depth 1/4; one row per pass"),
      "device": (os.environ.get("DEVICE", "AMD EPYC") +
                 ", 2 cores: engine worker on core 1, API server on core 0"),
      "engine": "vllm 0.32.0+cpu, torch 2.13.0+cpu, bf16, dummy weights (/work/vllm-env)",
      "date": sys.argv[3] if len(sys.argv) > 3 else FIRST_DATE,
      "made_by": "python results/vllm_cpu/engine_shape_probe.py " + " ".join(sys.argv[1:3]),
      **data,
  }
  with open(target, "w") as f:
    json.dump(out, f, indent=1)
  for shape, row in data["rows"].items():
    print(
        shape, f"{row['decode_step_median_s'] * 1e3:.2f} ms "
        f"(spread {row['decode_step_spread']:.0%}), GEMMs {row['gemm_m1_median_s'] * 1e3:.2f} ms")
