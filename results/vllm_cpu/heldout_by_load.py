"""Held-out requests by the load they met: measured against predicted, per request.

For each run, every request's measured TTFT and TPOT beside the simulator's for the same
request (its own arrival and lengths, replayed under a fit's factors), grouped by how many
earlier requests were still in flight when it arrived (from the measured start times and
latencies: 0, 1, 2, 3 or more). A term the model lacks that grows with the running
sequences shows as a gap that grows with the group; a fixed per-request or per-step error
does not. Kinds: measurement (measured), calibrated prediction (predicted).
Usage (project venv): python results/vllm_cpu/heldout_by_load.py FIT.json OUT.json
  RUN.json=MODEL_DIR [RUN.json=MODEL_DIR ...]
"""
import dataclasses
import json
import sys

import numpy as np

from jaxroof import files
from jaxroof.calibrate import engine_fit
from jaxroof.measure import vllm_results

GROUPS = (0, 1, 2, 3)  # Requests in flight at arrival; the last group is "3 or more".


def by_load(fit: dict, run_path: str, model: str) -> dict:
  setup = engine_fit.ServingSetup(**fit["setup"])
  [run] = vllm_results.read_runs([run_path])
  run = dataclasses.replace(run, model=model)
  simulated = engine_fit.simulate_run(run, setup, fit["factors"], detail=True)["detail"]
  raw = json.load(open(run_path))
  starts = np.asarray(raw["start_times"], float)
  ends = starts + np.asarray(raw["latencies"], float)
  in_flight = np.array(
      [int(np.sum((starts[:i] < s) & (ends[:i] > s))) for i, s in enumerate(starts)])
  measured_tpot = (np.asarray(raw["latencies"]) -
                   np.asarray(raw["ttfts"])) / (np.asarray(raw["output_lens"]) - 1)
  rows = []
  for group in GROUPS:
    pick = in_flight >= group if group == GROUPS[-1] else in_flight == group
    if not pick.any():
      continue
    ttft_m, ttft_p = np.asarray(raw["ttfts"])[pick], np.asarray(simulated["ttft_s"])[pick]
    tpot_m, tpot_p = measured_tpot[pick], np.asarray(simulated["tpot_s"])[pick]
    rows.append({
        "in_flight_at_arrival": f"{group}+" if group == GROUPS[-1] else group,
        "requests": int(pick.sum()),
        "ttft_measured_median_s": float(np.median(ttft_m)),
        "ttft_predicted_median_s": float(np.median(ttft_p)),
        "ttft_median_gap_s": float(np.median(ttft_m - ttft_p)),
        "tpot_median_rel_gap": float(np.median(tpot_m / tpot_p - 1)),
    })
  return {"run": run_path, "model": model, "groups": rows}


if __name__ == "__main__":
  fit_path, out_path, *pairs = sys.argv[1:]
  fit = json.load(open(fit_path))
  result = {
      "kind": "measurement against calibrated prediction, per request",
      "fit": fit_path,
      "factors": fit["factors"],
      "what": __doc__.split("\n\n")[1].replace("\n", " "),
      "runs": [by_load(fit, *pair.split("=")) for pair in pairs],
  }
  files.write_json(out_path, result)
  for run in result["runs"]:
    print(run["run"])
    for g in run["groups"]:
      print(f"  in flight {g['in_flight_at_arrival']!s:>2}: {g['requests']:2d} requests, TTFT "
            f"{g['ttft_measured_median_s'] * 1e3:7.1f} ms measured, "
            f"{g['ttft_predicted_median_s'] * 1e3:7.1f} predicted (gap "
            f"{g['ttft_median_gap_s'] * 1e3:+6.1f} ms), TPOT gap {g['tpot_median_rel_gap']:+.1%}")
