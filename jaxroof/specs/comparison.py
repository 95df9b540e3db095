"""One model on several accelerators: crossovers, memory fit, rates per batch.

Every number is an analytic bound from datasheet figures (see
`step_inputs.decode_step_inputs` for the assumptions). "Best" per column: the
lowest ridge point and compute crossover (the fewest sequences needed to use
the arithmetic), the largest batch that fits, and, among batches that fit,
the shortest step and the highest aggregate and per-sequence rates. Ties
share the mark. The weight/KV crossover depends on the model alone, so it is
the same on every device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jaxroof.specs.accelerators import COMPUTE_DTYPE, Accelerator
from jaxroof.specs.model_spec import ModelSpec
from jaxroof.specs import parameters
from jaxroof.specs.model_sweep import model_sweep
from jaxroof.specs.step_inputs import crossover_batches
from jaxroof.symbolic.step_model import BOUND_UNITS, StepModel

UNITS = {
    **BOUND_UNITS, "ridge_flop_per_byte": "FLOP/B", "max_batch_in_memory": "sequences",
    "memory_capacity_bytes": "B", "memory_bandwidth_bytes_per_s": "B/s", "flops_per_s": "FLOP/s",
    "resident_weight_bytes": "B", "comm_s": "s", "chips": "chips"
}
SUMMARY_BEST = {
    "ridge_flop_per_byte": min, "compute_crossover_batch": min, "max_batch_in_memory": max
}
ROW_BEST = {"step_s": min, "aggregate_tokens_per_s": max, "per_sequence_tokens_per_s": max}


def _entry(spec: ModelSpec, device: Accelerator, batch: list[int], model: StepModel,
           sweeper=model_sweep, **kw) -> dict[str, Any]:
  swept = sweeper(spec, device, batch_sizes=batch, model=model, **kw)
  inputs, summary = swept["inputs"], swept["summary"]
  cross = crossover_batches(spec, device, context=kw["context"], weight_dtype=kw["weight_dtype"],
                            kv_dtype=kw["kv_dtype"], group_size=kw.get("group_size"))
  return {
      "name": device.name,
      "full_name": device.full_name,
      "memory_capacity_bytes": device.memory_capacity_bytes,
      "memory_bandwidth_bytes_per_s": inputs["si"]["BW"],
      "flops_per_s": inputs["si"]["F"],
      "compute_dtype": inputs["compute_dtype"],
      "compute_fallback": inputs["compute_dtype"] != COMPUTE_DTYPE[inputs["weight_dtype"]],
      "ridge_flop_per_byte": device.ridge_point(inputs["weight_dtype"]),
      "compute_crossover_batch": cross.compute_crossover_batch,
      "weight_kv_crossover_batch": cross.weight_kv_crossover_batch,
      "max_batch_in_memory": summary["max_batch_in_memory"],
      "resident_weight_bytes": inputs["resident_weight_bytes"],
      "rows": swept["rows"],
      "_assumptions": swept["assumptions"],
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
            batch_sizes: Sequence[int], weight_dtype: str = "bf16", kv_dtype: str = "bf16",
            step_model: StepModel | Mapping[str, StepModel] | None = None, sweeper=None,
            **kw: Any) -> dict[str, Any]:
  """Per accelerator: ridge point, crossovers, max batch, and a row per batch.

  With a calibrated `step_model`, rows are calibrated predictions: its fitted
  factors and fixed costs applied to each device's datasheet figures (a
  what-if: the factors were measured on the profile's device). Extra keywords
  (`block_size`, `workspace_fraction`, `max_new_tokens`, `group_size`) go to
  `step_inputs.decode_step_inputs`. `sweeper` replaces `model_sweep` (same
  signature), e.g. a multi-chip layout's sweep. `step_model` may map each accelerator's
  name to its own (an engine profile's entries, each with its accelerator's terms).
  """
  batch = [int(b) for b in batch_sizes]
  own = dict(step_model) if isinstance(step_model, Mapping) else {}
  step = (next(iter(own.values())) if own else step_model) or StepModel.bound()
  fmt = parameters.weight_format(model, weight_dtype, kw.get("group_size"))
  entries = [
      _entry(model, d, batch, own.get(d.name, step), sweeper=sweeper or model_sweep,
             context=context, weight_dtype=weight_dtype, kv_dtype=kv_dtype, **kw)
      for d in accelerators
  ]
  device_notes = ("datasheet", f"{fmt.dtype} weights multiply at")  # Per device: in rows.
  shared = [
      a for a in entries[0]["_assumptions"]
      if not a.startswith(device_notes) and a not in step.assumptions
  ]
  for e in entries:
    del e["_assumptions"]
  calibrated = []
  if step.kind == "calibrated":
    origin = step.provenance
    error = origin.get("heldout_median_rel_error")
    calibrated = [
        f"calibrated: factors of the profile measured on {origin.get('device_kind')} "
        f"({origin.get('backend')}, {origin.get('dtype')}; held-out median error "
        f"{'unknown' if error is None else f'{error:.1%}'}) applied to every device's "
        "datasheet figures; crossovers and max batch stay analytic bounds"
    ]
  return {
      "kind": step.kind,
      "model": model.name,
      "inputs": {
          "model": model.name, "context": context, "batch_sizes": batch, "weight_dtype": fmt.dtype,
          "weight_dtype_label": fmt.label, "weight_format": fmt.describe(), "kv_dtype": kv_dtype,
          **kw
      },
      "units": UNITS,
      "assumptions": [
          "datasheet bandwidth and dense FLOP/s of each accelerator taken "
          "as sustained rates (upper bounds)"
      ] + shared + calibrated,
      "accelerators": entries,
      "best": _best(entries, batch),
  }
