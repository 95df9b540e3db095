"""Report section "Checked against a real engine": vLLM on a 2-core CPU vs the simulator.

Renders two committed fits of the calibrate experiment's vllm source (a folder
`FOLDER` under the results folder it is given): the fit (`FIT`: its held-out
table of measured, calibrated prediction and analytic bound, and the measured
against predicted CDFs of TTFT and ITL) and the same fit on a second pass of
the same runs (`REPEAT`: how far the measurement itself moved). What the CPU
engine work found beyond these two files, on other CPUs and passes, is
`docs/cpu-engine.md`. Computes nothing.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxroof.report import accuracy
from jaxroof.report import paths
from jaxroof.report import simulation
from jaxroof.report import table

FOLDER = "vllm_cpu"
FIT = "calibration.json"  # The fit shown.
REPEAT = "calibration_repeat.json"  # The same fit on a second pass of the same runs.
DOC = "docs/cpu-engine.md"  # What the CPU engine work found, with the commit of its data.
# Held-out targets: p50 TTFT and TPOT within 10%, p90 within 20%.
P50_TARGET, P90_TARGET = 0.10, 0.20
# The searched factors.
_SHOWN = ("eta_w", "eta_f", "t0_step", "t0_layer", "t0_request", "t0_seq", "t_wake")
# The engine terms held as measured, where a fit held them.
_HELD = ("r_ovl", "m_pass", "eta_kv", "eta_attn", "c_llc", "bw_llc", "s_lru", "t_build", "t_act",
         "s_cold", "t0_request", "t_wake")
HEADER = ("held-out run", "metric", "measured ms", "predicted ms", "error", "bound ms")
_HELD_WORDS = (
    "r_ovl: how the engine's GEMMs overlap weight reads and FLOPs; m_pass: the rows its GEMM "
    "multiplies in one pass over the weights, a step of more reading them again per m_pass "
    "rows, 0: no limit; eta_kv and eta_attn: its attention kernel's K/V rate as a share of the "
    "read bandwidth and FLOP rate as a share of F; c_llc, bw_llc, s_lru, s_cold: the weight "
    "bytes of a step found in the CPU's cache, their rate, the share an outgrown cache loses "
    "and the share an idle gap evicts; t_build: seconds per layer and token to build GEMM "
    "kernels at a new token count; t_act: seconds per token and activation element of its "
    "elementwise kernels; t0_request and t_wake: the measured per-request cost and wake of an "
    "idle engine, s")


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


def _targets_words(result: dict[str, Any]) -> str:
  met = targets_met(result)
  return ("p50 TTFT/TPOT rows within 10%: {} of {}; p90 within 20%: {} of {}".format(
      *met["p50"], *met["p90"]))


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
      series, path, "vLLM on a 2-core CPU: measured (solid) vs calibrated "
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
      f"median error {table.percent(second.get('heldout_median_rel_error'))}; "
      f"{_targets_words(second)}. Fitted: " +
      ", ".join(f"{n} = {table.factor_value(n, v)}" for n, v in second.get("factors", {}).items()
                if n in _SHOWN and n not in second.get("fixed", {})) +
      ". The measurement itself moved between the passes (median |second - first| / "
      "first over the held-out runs): " +
      ", ".join(f"{k} {table.percent(float(np.median(v)))} (max "
                f"{table.percent(float(np.max(v)))})"
                for k, v in spreads.items()) + "; ITL left out (coalesced gaps)."
  ]


def _what_was_held_out(result: dict[str, Any]) -> str:
  """The held-out runs in words: of models the fit also saw, and of models it never saw."""
  source = result.get("source", {})
  if "fit_models" not in source:  # Which models the runs were of is not recorded.
    return ""
  held = accuracy.held_out({"source": source})
  return f"The held-out error is measured {accuracy.held_out_words(held)}. "


def _measured_lines(first: dict[str, Any], folder: str) -> list[str]:
  meta, factors = first.get("engine_run", {}), first.get("factors", {})
  fixed = first.get("fixed", {})
  return [
      "Measurement: vLLM " + str(meta.get("vllm_version", "")) + " (vllm-cpu) "
      f"served small Llama models (dummy bf16 weights) on a 2-core CPU "
      f"({meta.get('device', 'CPU')}, {meta.get('date', '')}), `vllm bench serve` on loopback; "
      f"load average {meta.get('load', 'n/a')} on 2 cores. "
      "Calibrated prediction: the simulator with its `vllm` scheduler (vLLM V1's), "
      "each run replayed with its own arrivals and lengths, on ceilings measured through the "
      "engine's torch beside the runs; factors fitted on " +
      ", ".join(f"`{_short(f)}`" for f in first["source"]["files"]) + ". " +
      _what_was_held_out(first) + "Analytic bound: the same simulation at eta = 1 with no "
      f"fixed cost. (Files: `{paths.in_repository(folder)}/`.)",
      "",
      "Fitted: " + ", ".join(f"{n} = {table.factor_value(n, v)}"
                             for n, v in factors.items() if n in _SHOWN and n not in fixed) +
      " (t0_step, t0_request, t0_seq and t_wake in seconds; t0_request: the fixed "
      "per-request cost, HTTP + API server + tokenisation, before the engine sees a request; "
      "t0_seq: the engine's cost per running sequence in each step)." +
      ("" if not fixed else " Held: " +
       ", ".join(f"{n} = {v:g}" for n, v in fixed.items() if n in _HELD) + f" ({_HELD_WORDS})."),
  ]


def report_section(results_dir: str, out_dir: str, measure_commands: Sequence[str] = ()) -> str:
  """The section; where no results are committed, says how to produce them:
  `measure_commands` (the caller's command lines, in order) or the experiments by name."""
  folder = os.path.join(results_dir, FOLDER)
  first = _load(os.path.join(folder, FIT))
  lines = ["## Checked against a real engine", ""]
  if first is None:
    steps = ("; then ".join(f"`{c}`" for c in measure_commands) if measure_commands else
             "`experiments/vllm_setup.sh`, then `experiments.vllm_bench`, then the calibrate "
             "experiment's vllm source")
    return "\n".join(lines + [
        f"No committed results under `{paths.in_repository(folder)}`. To measure: {steps} "
        f"(README). What the CPU engine work found: `{DOC}`."
    ])
  png = os.path.join(out_dir, "real_engine_cdfs.png")
  if first.get("cdfs"):
    plot(first, png)
  lines += _measured_lines(first, folder) + [
      "",
      table.markdown_table(HEADER, heldout_rows(first)),
      "",
      f"Held-out median error {table.percent(first.get('heldout_median_rel_error'))}, max "
      f"{table.percent(first.get('heldout_max_rel_error'))} over "
      f"{first.get('heldout_points', 0)} points; by metric: " +
      ", ".join(f"{k} {table.percent(v)}"
                for k, v in first.get("heldout_median_rel_error_by_metric", {}).items()) +
      f"; {_targets_words(first)}.",
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
  second = _load(os.path.join(folder, REPEAT))
  if second is not None:
    lines += [""] + _spread(first, second)
  lines += [
      "", f"The same check on other CPUs and later passes, the engine's measured terms, and why "
      f"the held-out targets were not met on every pass: `{DOC}`."
  ]
  if first.get("cdfs"):
    lines += ["", f"![measured vs predicted CDFs]({os.path.basename(png)})"]
  return "\n".join(lines)
