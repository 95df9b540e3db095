"""How vLLM's bf16 GEMM on this CPU grows past 256 rows: engine_gemm_blocks.json.

A mixed step (one 256-token prompt with k sequences decoding) took the engine 20 ms more
per decoding sequence on medium-llama (engine_mixed_probe.json), where the model charges
a fraction of a millisecond. `engine_token_rates.py` times the decoder's GEMMs through
vLLM's own oneDNN handlers at M rows around 128, 256, 384 and 512, three times (engine venv,
core 1):

  TOKENS=1,4,128,129,131,132,255,256,257,258,259,260,264,288,320,384,385,512,513 \\
    python engine_token_rates.py models/tiny-llama/config.json \\
    models/medium-llama/config.json > gemm_blocks_runN.jsonl

then `python results/vllm_cpu/engine_gemm_blocks.py RUN1.jsonl RUN2.jsonl` (project venv)
writes the JSON (env OUT: another path, DEVICE: another CPU's description): per model and M
the runs' medians, and the reading, each M's time over the straight line through 128-256
rows, in passes at M = 4 (one read of the weights at a decode's rate), and `m_pass`: the
rows per pass whose extra reads of the weights in the cost model (`calibrated.weight_passes`:
ceil(M / m_pass) - 1) best match those passes, least squares over both models.
`python results/vllm_cpu/engine_gemm_blocks.py --m_pass FILE.json [FILE.json ...]` prints
that reading for committed files.
"""
import json
import math
import os
import statistics
import sys

import numpy as np

from jaxroof import files

BLOCK = 256


def collect(paths: list[str]) -> dict:
  """Per model and M the runs' medians; the reading: each M past `BLOCK` over the straight
  line fitted through 128-`BLOCK` rows, in reads of the weights at M = 4."""
  runs = [[json.loads(line) for line in open(p)] for p in paths]
  times: dict[str, dict[int, list[float]]] = {}
  for run in runs:
    for row in run:
      times.setdefault(row["model"], {}).setdefault(row["tokens"], []).append(row["median_s"])
  reading = {}
  for model, by_m in times.items():
    median = {m: statistics.median(t) for m, t in by_m.items()}
    line_m = [m for m in median if 128 <= m <= BLOCK]
    slope, intercept = np.polyfit(line_m, [median[m] for m in line_m], 1)
    one_pass = median[4]
    reading[model] = {
        "one_pass_at_4_rows_s": one_pass,
        "line_through_128_to_256": {"intercept_s": intercept, "per_row_s": slope},
        "over_the_line_in_passes": {
            m: (t - intercept - slope * m) / one_pass for m, t in sorted(median.items()) if m > 128
        },
    }
  return {
      "rows": {model: {m: t for m, t in sorted(by_m.items())} for model, by_m in times.items()},
      "reading": reading, "m_pass": m_pass_fit(reading)
  }


def m_pass_fit(reading: dict) -> dict:
  """The m_pass among the probed rows (>= `BLOCK`) whose extra reads, ceil(M / m_pass) - 1,
  leave the least squared residual against every model's passes over the line."""
  passes = [(int(m), v) for r in reading.values() for m, v in r["over_the_line_in_passes"].items()]
  candidates = sorted({m for m, _ in passes if m >= BLOCK})
  rms = {
      c: float(np.sqrt(np.mean([(max(0,
                                     math.ceil(m / c) - 1) - v)**2
                                for m, v in passes]))) for c in candidates
  }
  best = min(candidates, key=lambda c: (rms[c], c))
  return {
      "m_pass": best, "rms_passes": rms[best], "rms_passes_by_candidate": rms,
      "what": "ceil(M / m_pass) - 1 extra reads of the weights, fitted to the passes over "
              "the line (rows probed: a value between two probed rows fits as well)"
  }


if __name__ == "__main__" and sys.argv[1:2] == ["--m_pass"]:
  for path in sys.argv[2:]:
    fit = m_pass_fit(json.load(open(path))["reading"])
    print(path, f"m_pass {fit['m_pass']} (rms {fit['rms_passes']:.2f} passes;",
          ", ".join(f"{c}: {v:.2f}" for c, v in fit["rms_passes_by_candidate"].items()) + ")")
elif __name__ == "__main__":
  data = collect(sys.argv[1:])
  files.write_json(
      os.environ.get("OUT", "results/vllm_cpu/engine_gemm_blocks.json"), {
          "kind": "measurement", "what":
              ("vLLM's bf16 linear path (create_onednn_mm/onednn_mm) over each model's whole "
               "decoder weight set at M rows, median of 7 passes after a warm-up, one "
               "thread on core 1; per model and M, the runs' medians (s)"
              ), "device": os.environ.get("DEVICE", "AMD EPYC, 2 cores (avx512_bf16, no AMX)"),
          "engine": "vllm 0.32.0+cpu, torch 2.13.0+cpu, bf16, random weights",
          "made_by": "results/vllm_cpu/engine_gemm_blocks.py (its docstring has the commands)",
          "runs": sys.argv[1:], **data
      })
  print(f"m_pass {data['m_pass']['m_pass']} (rms {data['m_pass']['rms_passes']:.2f} passes)")
  for model, r in data["reading"].items():
    print(model, f"one pass {r['one_pass_at_4_rows_s'] * 1e3:.2f} ms;",
          ", ".join(f"{m}: {v:+.2f}" for m, v in r["over_the_line_in_passes"].items()))
