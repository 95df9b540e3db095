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
ROW_HEADERS = ("accelerator", "batch", "step ms", "aggregate tok/s", "per-seq tok/s",
               "binds", "fits")


def summary_rows(result: dict[str, Any]) -> list[list[str]]:
  """One display row per accelerator; `*` marks the best of a column."""
  best = result["best"]
  return [[e["name"], f"{e['memory_capacity_bytes'] / 1e9:,.1f}",
           f"{e['memory_bandwidth_bytes_per_s'] / 1e12:,.3f}",
           f"{e['flops_per_s'] / 1e12:,.1f} {e['compute_dtype']}",
           _mark(f"{e['ridge_flop_per_byte']:,.1f}", e["name"] in best["ridge_flop_per_byte"]),
           _mark(_batches(e["compute_crossover_batch"]),
                 e["name"] in best["compute_crossover_batch"]),
           _batches(e["weight_kv_crossover_batch"]),
           _mark(f"{e['max_batch_in_memory']:,}", e["name"] in best["max_batch_in_memory"])]
          for e in result["accelerators"]]


def batch_rows(result: dict[str, Any]) -> list[list[str]]:
  """One display row per accelerator and batch; `*` marks the best that fit."""
  out = []
  for e in result["accelerators"]:
    for row in e["rows"]:
      best = result["best"]["by_batch"][str(row["batch"])]
      out.append([
          e["name"], f"{row['batch']}",
          _mark(f"{row['step_s'] * 1e3:,.3f}", e["name"] in best["step_s"]),
          _mark(f"{row['aggregate_tokens_per_s']:,.1f}",
                e["name"] in best["aggregate_tokens_per_s"]),
          _mark(f"{row['per_sequence_tokens_per_s']:,.1f}",
                e["name"] in best["per_sequence_tokens_per_s"]),
          row["bound"], "yes" if row["fits_in_memory"] else "NO",
      ])
  return out


def plot(result: dict[str, Any], path: str | os.PathLike[str]) -> None:
  """Aggregate and per-sequence rates against batch, a line per accelerator.

  Batches that do not fit in memory are drawn as hollow markers on a dotted line.
  """
  plt = plots.plt
  fig, (agg, per) = plt.subplots(1, 2, figsize=(12, 4.8))
  colors = plt.get_cmap("tab10")
  for i, e in enumerate(result["accelerators"]):
    color, marker = colors(i % 10), "os^D"[i // 10 % 4]
    batch = np.array([r["batch"] for r in e["rows"]])
    fits = np.array([r["fits_in_memory"] for r in e["rows"]])
    for axis, key in ((agg, "aggregate_tokens_per_s"), (per, "per_sequence_tokens_per_s")):
      y = np.array([r[key] for r in e["rows"]])
      axis.plot(batch, y, ":", color=color, linewidth=1)
      axis.plot(batch[fits], y[fits], marker=marker, linestyle="-", color=color,
                markersize=4, label=e["name"] if axis is agg else None)
      axis.plot(batch[~fits], y[~fits], marker=marker, linestyle="none", color=color,
                markerfacecolor="none", markersize=6)
  for axis, label in ((agg, "aggregate tokens/s (B / step)"),
                      (per, "per-sequence tokens/s (1 / step)")):
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xlabel("batch (sequences)")
    axis.set_ylabel(label)
    axis.grid(True, alpha=0.3)
  inputs = result["inputs"]
  fig.suptitle(f"{result['model']}, context {inputs['context']} tokens, "
               f"{inputs['weight_dtype']} weights, {inputs['kv_dtype']} K/V "
               "(analytic bound; hollow = does not fit in memory)", fontsize=10)
  fig.legend(loc="center left", bbox_to_anchor=(0.92, 0.5), fontsize=8)
  plots.save(fig, path)
