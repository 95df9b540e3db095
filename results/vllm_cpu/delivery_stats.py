"""How a vLLM bench result's tokens reached its client: per result JSON, the share of token
gaps under 0.1 ms (coalesced: several tokens in one read, `engine_fit.COALESCED_S`), the
requests delivered whole (every gap but at most one coalesced: their TTFT is their duration)
and the measured p50/p90 TTFT and TPOT. Usage (project venv, repository root):
  python results/vllm_cpu/delivery_stats.py [--json_out=OUT.json] RESULT.json [RESULT.json ...]
"""
import json
import sys

import numpy as np

from jaxroof import files
from jaxroof.calibrate import engine_fit


def stats(path: str) -> dict:
  run = json.load(open(path))
  gaps = [np.asarray(g, float) for g in run["itls"] if g]
  every = np.concatenate(gaps) if gaps else np.zeros(0)
  whole = sum(int(np.sum(g < engine_fit.COALESCED_S) >= len(g) - 1) for g in gaps)
  return {
      "result": path, "requests": len(run["ttfts"]),
      "coalesced_share": float(np.mean(every < engine_fit.COALESCED_S)) if len(every) else None,
      "whole_deliveries": whole, "p50_ttft_ms": run["median_ttft_ms"],
      "p90_ttft_ms": run["p90_ttft_ms"], "p50_tpot_ms": run["median_tpot_ms"],
      "p90_tpot_ms": run["p90_tpot_ms"], "request_throughput": run["request_throughput"], "load":
          (run.get("jaxroof_engine_run") or {}).get("load")
  }


if __name__ == "__main__":
  args = sys.argv[1:]
  out = next((a.split("=", 1)[1] for a in args if a.startswith("--json_out=")), None)
  rows = [stats(p) for p in args if not p.startswith("--json_out=")]
  for r in rows:
    share = "n/a" if r["coalesced_share"] is None else f"{r['coalesced_share']:.2f}"
    print(f"{r['result']}: coalesced {share}, whole {r['whole_deliveries']}"
          f"/{r['requests']}, TTFT p50 {r['p50_ttft_ms']:.1f} p90 {r['p90_ttft_ms']:.0f} ms, "
          f"TPOT p50 {r['p50_tpot_ms']:.2f} p90 {r['p90_tpot_ms']:.2f} ms")
  if out:
    files.write_json(
        out, {
            "kind": "measurement", "what": "token deliveries of vLLM bench results "
                                           "(results/vllm_cpu/delivery_stats.py)",
            "coalesced_s": engine_fit.COALESCED_S, "rows": rows
        })
