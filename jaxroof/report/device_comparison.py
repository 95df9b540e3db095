"""The accelerator comparison, displayed: table rows with the best marked, and a plot."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from jaxroof.report import plots


def _mark(text: str, is_best: bool) -> str:
  return f"{text} *" if is_best else text


def _batches(value: float | None) -> str:
  return "never" if value is None else f"{value:,.1f}"


SUMMARY_HEADERS = ("accelerator", "memory GB", "TB/s", "dense TFLOP/s", "ridge FLOP/B",
                   "compute crossover B", "weight/KV crossover B", "max batch in memory")
ROW_HEADERS = ("accelerator", "batch", "step ms", "aggregate tok/s", "per-seq tok/s", "binds",
               "fits")


def summary_rows(result: dict[str, Any]) -> list[list[str]]:
  """One display row per accelerator; `*` marks the best of a column."""
  best = result["best"]
  return [[
      e["name"], f"{e['memory_capacity_bytes'] / 1e9:,.1f}",
      f"{e['memory_bandwidth_bytes_per_s'] / 1e12:,.3f}",
      f"{e['flops_per_s'] / 1e12:,.1f} {e['compute_dtype']}" +
      (" (fallback)" if e.get("compute_fallback") else ""),
      _mark(f"{e['ridge_flop_per_byte']:,.1f}", e["name"] in best["ridge_flop_per_byte"]),
      _mark(_batches(e["compute_crossover_batch"]), e["name"] in best["compute_crossover_batch"]),
      _batches(e["weight_kv_crossover_batch"]),
      _mark(f"{e['max_batch_in_memory']:,}", e["name"] in best["max_batch_in_memory"])
  ] for e in result["accelerators"]]


def batch_rows(result: dict[str, Any]) -> list[list[str]]:
  """One display row per accelerator and batch; `*` marks the best that fit."""
  out = []
  for e in result["accelerators"]:
    for row in e["rows"]:
      best = result["best"]["by_batch"][str(row["batch"])]
      out.append([
          e["name"],
          f"{row['batch']}",
          _mark(f"{row['step_s'] * 1e3:,.3f}", e["name"] in best["step_s"]),
          _mark(f"{row['aggregate_tokens_per_s']:,.1f}", e["name"]
                in best["aggregate_tokens_per_s"]),
          _mark(f"{row['per_sequence_tokens_per_s']:,.1f}", e["name"]
                in best["per_sequence_tokens_per_s"]),
          row["bound"],
          "yes" if row["fits_in_memory"] else "NO",
      ])
  return out


def engine_columns(headers, cells, result: dict[str, Any]):
  """The rows with the bound's step and the entry's held-out error beside each."""
  rows = [(e, r) for e in result["accelerators"] for r in e["rows"]]
  headers = tuple(headers) + ("bound step ms", "calibrated (engine, held-out med/p90/max)")
  cells = [
      list(c) + [f"{r['bound_step_s'] * 1e3:,.3f}", _error(e)] for c, (e, r) in zip(cells, rows)
  ]
  return headers, cells


def _error(e: dict[str, Any]) -> str:
  err = e["heldout_error"]
  shown = "/".join("?" if err.get(k) is None else f"{100 * err[k]:.0f}%"
                   for k in ("median_rel_error", "p90_rel_error", "max_rel_error"))
  return f"{e['engine']}{' (derived)' if e['derived_entry'] else ''} {shown}"


def plot(result: dict[str, Any], path: str | os.PathLike[str], *, batch: int | None = None,
         top_n: int = 12) -> None:
  """Both rates at one batch, a sorted bar per accelerator (the top `top_n`).

  The batch is the largest swept one unless given. A device on which that
  batch does not fit is drawn hatched and grey, with its largest batch that
  does; sorting is by aggregate rate among the devices that fit, then the rest.
  """
  rows_batch = [r["batch"] for r in result["accelerators"][0]["rows"]]
  batch = max(rows_batch) if batch is None else batch
  if batch not in rows_batch:
    raise ValueError(f"batch {batch} was not swept: {rows_batch}")
  at = rows_batch.index(batch)
  entries = [(e, e["rows"][at]) for e in result["accelerators"]]
  entries.sort(key=lambda er: (not er[1]["fits_in_memory"], -er[1]["aggregate_tokens_per_s"]))
  entries = entries[:top_n][::-1]  # Best at the top of a horizontal bar chart.
  names = [e["name"] for e, _ in entries]
  fig, axes = plots.pyplot().subplots(1, 2, figsize=(12, 0.45 * len(entries) + 1.8), sharey=True)
  for axis, key, label in ((axes[0], "aggregate_tokens_per_s", "aggregate tokens/s (B / step)"),
                           (axes[1], "per_sequence_tokens_per_s",
                            "per-sequence tokens/s (1 / step)")):
    values = np.array([row[key] for _, row in entries])
    fits = [row["fits_in_memory"] for _, row in entries]
    bars = axis.barh(names, values, color=["tab:blue" if f else "lightgray" for f in fits],
                     hatch=None)
    for bar, fit, (e, _) in zip(bars, fits, entries):
      if not fit:
        bar.set_hatch("//")
        axis.annotate(f" does not fit (max B = {e['max_batch_in_memory']:,})",
                      (bar.get_width(), bar.get_y() + bar.get_height() / 2), va="center",
                      fontsize=7, color="dimgray")
      else:
        axis.annotate(f" {bar.get_width():,.0f}",
                      (bar.get_width(), bar.get_y() + bar.get_height() / 2), va="center",
                      fontsize=7)
    axis.set_xlabel(label)
    axis.grid(True, axis="x", alpha=0.3)
    axis.margins(x=0.35)
  inputs = result["inputs"]
  kind = "analytic bound" if result["kind"] == "bound" else "calibrated prediction"
  shown = f"top {len(entries)} of {len(result['accelerators'])}"
  fig.suptitle(
      f"{result['model']}, context {inputs['context']:,} tokens, "
      f"{inputs.get('weight_dtype_label', inputs['weight_dtype'])} weights, "
      f"{inputs['kv_dtype']} K/V, batch {batch} "
      f"({kind}; {shown}; hatched = does not fit in memory)", fontsize=10)
  fig.tight_layout()
  plots.save(fig, path)
