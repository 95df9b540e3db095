"""PNG plots, written atomically. Uses matplotlib's non-interactive Agg backend."""

from __future__ import annotations

import functools
import os
from typing import Any

from jaxroof.files import atomic_path


@functools.cache
def pyplot() -> Any:
  """matplotlib.pyplot on the Agg backend, imported on first use: a run that draws nothing
  (most, and every refused flag) does not pay its import."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  return plt


def save(fig: Any, path: str | os.PathLike[str]) -> None:
  """Saves and closes a figure; the PNG appears whole or not at all."""
  with atomic_path(path) as tmp:
    fig.savefig(tmp, dpi=120, bbox_inches="tight")
  pyplot().close(fig)


def plot_sweep(sweep: dict[str, Any], path: str | os.PathLike[str], title: str) -> None:
  """Aggregate and per-sequence rates against batch, crossovers marked."""
  rows = sweep["rows"]
  batch = [r["batch"] for r in rows]
  fig, left = pyplot().subplots(figsize=(7.5, 4.5))
  right = left.twinx()
  left.plot(batch, [r["aggregate_tokens_per_s"] for r in rows], "o-", color="tab:blue",
            label="aggregate (B / step)")
  right.plot(batch, [r["per_sequence_tokens_per_s"] for r in rows], "s--", color="tab:orange",
             label="per sequence (1 / step)")
  misfits = [r for r in rows if r.get("fits_in_memory") is False]
  if misfits:
    left.plot([r["batch"] for r in misfits], [r["aggregate_tokens_per_s"] for r in misfits], "x",
              color="red", markersize=10, label="does not fit in memory")
  summary = sweep["summary"]
  marks = (("weight_kv_crossover_batch", "weight = KV traffic", "tab:green"),
           ("compute_crossover_batch", "compute = memory time", "tab:red"))
  for key, label, color in marks:
    value = summary.get(key)
    if value is not None and batch[0] <= value <= batch[-1] * 2:
      left.axvline(value, color=color, linestyle=":", label=f"{label} (B={value:,.0f})")
  capacity = summary.get("max_batch_in_memory")
  if capacity:
    left.axvline(capacity, color="red", linestyle="--", alpha=0.6,
                 label=f"largest batch in memory (B={capacity:,})")
  limit = summary.get("memory_limit_tokens_per_s")
  if limit is not None:
    left.axhline(limit, color="gray", linestyle="-.", label=f"memory-only limit {limit:,.0f} tok/s")
  left.set_ylim(bottom=0)
  right.set_ylim(bottom=0)
  left.set_xscale("log", base=2)
  left.set_xlabel("batch (sequences)")
  left.set_ylabel("aggregate tokens/s", color="tab:blue")
  right.set_ylabel("per-sequence tokens/s", color="tab:orange")
  label = {"bound": "analytic bound", "calibrated": "calibrated prediction"}
  left.set_title(f"{title} ({label.get(sweep['kind'], sweep['kind'])})")
  handles = left.get_legend_handles_labels()
  extra = right.get_legend_handles_labels()
  left.legend(handles[0] + extra[0], handles[1] + extra[1], fontsize=8, loc="center right")
  left.grid(True, alpha=0.3)
  save(fig, path)


def plot_variants(sweeps: list[dict[str, Any]], path: str | os.PathLike[str], title: str) -> None:
  """Aggregate rate against batch for several (weight dtype, K/V dtype, context) sweeps.

  One line per combination; batches that do not fit memory are drawn as
  crosses and the line stops being solid there.
  """
  fig, axis = pyplot().subplots(figsize=(11, 5))
  for index, sweep in enumerate(sweeps):
    inputs, rows = sweep["inputs"], sweep["rows"]
    color = f"C{index % 10}"
    marker = "osd^v<>ph*"[index // 10 % 10]
    label = (f"{inputs.get('weight_dtype_label', inputs['weight_dtype'])} weights, "
             f"{inputs['kv_dtype']} K/V, "
             f"context {inputs['context']:,}")
    fits = [r for r in rows if r.get("fits_in_memory") is not False]
    misfits = [r for r in rows if r.get("fits_in_memory") is False]
    axis.plot([r["batch"] for r in fits], [r["aggregate_tokens_per_s"] for r in fits],
              marker=marker, linestyle="-", color=color,
              label=f"{label} (fits up to B={sweep['summary'].get('max_batch_in_memory', 0):,})")
    if misfits:
      axis.plot([r["batch"] for r in misfits], [r["aggregate_tokens_per_s"] for r in misfits], "x:",
                color=color)
  axis.set_xscale("log", base=2)
  axis.set_yscale("log")
  axis.set_xlabel("batch (sequences per replica)")
  axis.set_ylabel("aggregate tokens/s per replica")
  kind = {"bound": "analytic bound", "calibrated": "calibrated prediction"}
  axis.set_title(
      f"{title} ({kind.get(sweeps[0]['kind'], sweeps[0]['kind'])}); "
      "x: does not fit memory", fontsize=9)
  axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
  axis.grid(True, which="both", alpha=0.3)
  fig.tight_layout()
  save(fig, path)
