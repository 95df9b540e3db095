"""One model on several accelerators: crossovers, memory fit, rates per batch.

Every number is an analytic bound from datasheet figures (see
`workload.decode_step_inputs` for the assumptions). "Best" per column: the
lowest ridge point and compute crossover (the fewest sequences needed to use
the arithmetic), the largest batch that fits, and, among batches that fit,
the shortest step and the highest aggregate and per-sequence rates. Ties
share the mark. The weight/KV crossover depends on the model alone, so it is
the same on every device.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxroof.report import plots
from jaxroof.specs.accelerators import Accelerator
from jaxroof.measure import profiles as profile_lib
from jaxroof.symbolic.evaluate import step_model
from jaxroof.symbolic.sweep import estimate_rows, mark_targets
from jaxroof.specs.model_spec import ModelSpec
from jaxroof.specs.workload import crossover_batches, decode_step_inputs

UNITS = {
    "ridge_flop_per_byte": "FLOP/B", "compute_crossover_batch": "sequences",
    "weight_kv_crossover_batch": "sequences", "max_batch_in_memory": "sequences",
    "memory_capacity_bytes": "B", "memory_bandwidth_bytes_per_s": "B/s",
    "flops_per_s": "FLOP/s", "resident_weight_bytes": "B", "batch": "sequences",
    "weight_bytes": "B", "kv_bytes": "B", "traffic_bytes": "B", "memory_s": "s",
    "compute_s": "s", "step_s": "s", "aggregate_tokens_per_s": "tokens/s",
    "per_sequence_tokens_per_s": "tokens/s",
}
SUMMARY_BEST = {"ridge_flop_per_byte": min, "compute_crossover_batch": min,
                "max_batch_in_memory": max}
ROW_BEST = {"step_s": min, "aggregate_tokens_per_s": max, "per_sequence_tokens_per_s": max}


def _calibrated_rows(prof: profile_lib.Profile, model: ModelSpec, batch: list[int],
                     inputs) -> list[dict[str, Any]]:
  """Rows of the calibrated model: the profile's factors on this device's datasheet."""
  kwargs = inputs.step_kwargs()
  del kwargs["B"]
  sweep = profile_lib.calibrated_sweep(prof, batch, layers=model.num_layers,
                                       use_profile_ceilings=False, **kwargs)
  mark_targets(sweep["rows"], sweep["summary"], fits=inputs.fits)
  return sweep["rows"]


def _entry(model: ModelSpec, device: Accelerator, batch: list[int],
           prof: profile_lib.Profile | None = None, **kw) -> dict[str, Any]:
  inputs = decode_step_inputs(model, device, batch_sizes=batch, **kw)
  if prof is not None:
    rows = _calibrated_rows(prof, model, batch, inputs)
  else:
    rows = estimate_rows(batch, step_model("numpy")(**inputs.step_kwargs()))
    mark_targets(rows, {}, fits=inputs.fits)
  cross = crossover_batches(model, device, context=kw["context"],
                            weight_dtype=kw["weight_dtype"], kv_dtype=kw["kv_dtype"],
                            group_size=kw.get("group_size"))
  return {
      "name": device.name,
      "full_name": device.full_name,
      "memory_capacity_bytes": device.memory_capacity_bytes,
      "memory_bandwidth_bytes_per_s": inputs.BW,
      "flops_per_s": inputs.F,
      "compute_dtype": inputs.compute_dtype,
      "ridge_flop_per_byte": device.ridge_point(kw["weight_dtype"]),
      "compute_crossover_batch": cross.compute_crossover_batch,
      "weight_kv_crossover_batch": cross.weight_kv_crossover_batch,
      "max_batch_in_memory": inputs.max_batch_in_memory,
      "resident_weight_bytes": inputs.resident_weight_bytes,
      "rows": rows,
      "_assumptions": inputs.assumptions,
  }


def _best_of(candidates: dict[str, float | None], pick) -> list[str]:
  """Every name whose value is the best (ties share it); [] if none has one."""
  valid = {name: v for name, v in candidates.items() if v is not None}
  if not valid:
    return []
  target = pick(valid.values())
  return [name for name, v in valid.items() if v == target]


def _best(entries: list[dict], batch: list[int]) -> dict[str, Any]:
  best: dict[str, Any] = {
      column: _best_of({e["name"]: e[column] for e in entries}, pick)
      for column, pick in SUMMARY_BEST.items()
  }
  best["by_batch"] = {}
  for i, b in enumerate(batch):
    fitting = [e for e in entries if e["rows"][i]["fits_in_memory"]]
    best["by_batch"][str(b)] = {
        column: _best_of({e["name"]: e["rows"][i][column] for e in fitting}, pick)
        for column, pick in ROW_BEST.items()
    }
  return best


def compare(model: ModelSpec, accelerators: Sequence[Accelerator], *, context: int,
            batch_sizes: Sequence[int], weight_dtype: str = "bf16",
            kv_dtype: str = "bf16", profile: profile_lib.Profile | None = None,
            **kw: Any) -> dict[str, Any]:
  """Per accelerator: ridge point, crossovers, max batch, and a row per batch.

  With a `profile`, rows are calibrated predictions: its fitted factors and
  fixed costs applied to each device's datasheet figures (a what-if: the
  factors were measured on the profile's device). Extra keywords
  (`block_size`, `workspace_fraction`, `max_new_tokens`, `group_size`) go to
  `workload.decode_step_inputs`.
  """
  batch = [int(b) for b in batch_sizes]
  entries = [_entry(model, d, batch, profile, context=context, weight_dtype=weight_dtype,
                    kv_dtype=kv_dtype, **kw) for d in accelerators]
  shared = [a for a in entries[0]["_assumptions"] if not a.startswith("datasheet")]
  for e in entries:
    del e["_assumptions"]
  calibrated = [] if profile is None else [
      f"calibrated: factors of the profile measured on {profile.device_kind} "
      f"({profile.backend}, {profile.dtype}; held-out median error "
      f"{profile.heldout_median_rel_error:.1%}) applied to every device's datasheet "
      "figures; crossovers and max batch stay analytic bounds"]
  return {
      "kind": "bound" if profile is None else "calibrated",
      "model": model.name,
      "inputs": {"model": model.name, "context": context, "batch_sizes": batch,
                 "weight_dtype": weight_dtype, "kv_dtype": kv_dtype, **kw},
      "units": UNITS,
      "assumptions": ["datasheet bandwidth and dense FLOP/s of each accelerator taken "
                      "as sustained rates (upper bounds)"] + shared + calibrated,
      "accelerators": entries,
      "best": _best(entries, batch),
  }


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
