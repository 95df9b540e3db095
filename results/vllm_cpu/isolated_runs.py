"""Isolated-request decode steps as benchmark results the engine fit reads: isolated/*.json.

Each shape of engine_shape_probe.json becomes one vLLM-bench-like result: 8 requests of 256
prompt and 64 output tokens, at most one in flight (`max_concurrency: 1`, rate "inf": the
simulator runs them one at a time, as the probe sent them), with `median_tpot_ms` the
median over the passes of the engine's own decode step. `calibrate --source=vllm` fits it
with `--fit_model=results/vllm_cpu/models/<shape>`: steps of one sequence at two depths and
three widths, which serving runs of one depth cannot split into per-step and per-layer cost.
TTFT is not in the file (the probe's is engine-side, without the client's HTTP).
Usage (project venv): python results/vllm_cpu/isolated_runs.py [PROBE_JSON OUT_DIR]
(default: engine_shape_probe.json to isolated/; a same-hour pass: pass7/engine_shape_probe.json
to pass7/isolated).
"""
import json
import os
import sys

PROBE = "results/vllm_cpu/engine_shape_probe.json"
OUT = "results/vllm_cpu/isolated"
REQUESTS, PROMPT, OUTPUT = 8, 256, 64

if __name__ == "__main__":
  PROBE, OUT = sys.argv[1:3] if len(sys.argv) > 2 else (PROBE, OUT)
  probe = json.load(open(PROBE))
  os.makedirs(OUT, exist_ok=True)
  for shape, row in probe["rows"].items():
    result = {
        "endpoint_type": "openai", "model_id": shape, "request_rate": "inf", "burstiness": 1.0,
        "max_concurrency": 1, "completed": REQUESTS, "input_lens": [PROMPT] * REQUESTS,
        "output_lens": [OUTPUT] * REQUESTS, "median_tpot_ms": row["decode_step_median_s"] * 1e3,
        "jaxroof_isolated": {
            "from": PROBE, "passes": probe["passes"], "date": probe["date"],
            "decode_step_s": row["decode_step_s"], "spread": row["decode_step_spread"],
            "what": "measurement: vLLM's /metrics decode time per step of isolated requests, "
                    "median over the passes"
        }
    }
    with open(os.path.join(OUT, f"{shape}.json"), "w") as f:
      json.dump(result, f, indent=1)
    print(os.path.join(OUT, f"{shape}.json"), f"{result['median_tpot_ms']:.2f} ms")
