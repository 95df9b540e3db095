"""A real model on a real accelerator, swept over batch: bound or calibrated rows.

`model_sweep` joins `step_inputs.decode_step_inputs` (step-model inputs and the
memory fit from a `ModelSpec` and an `Accelerator`) with the one sweep of
`jaxroof.symbolic.sweep`, for any `StepModel`. It is what `batch_sweep` of a
named model, `compare_accelerators` and the serving layer evaluate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxroof.specs import parameters
from jaxroof.specs import step_inputs
from jaxroof.specs.accelerators import Accelerator, device_kind_matches
from jaxroof.specs.model_spec import ModelSpec
from jaxroof.symbolic.step_model import StepModel
from jaxroof.symbolic.sweep import sweep


def model_sweep(spec: ModelSpec, device: Accelerator, *, context: int, batch_sizes: Sequence[int],
                weight_dtype: str = "bf16", kv_dtype: str = "bf16", model: StepModel | None = None,
                token_gap_s: float | None = None, **kwargs: Any) -> dict[str, Any]:
  """The step model at each batch, with each batch's memory fit marked.

  Args:
    spec: the model.
    device: the accelerator (datasheet bandwidth and dense FLOP/s).
    context: tokens each sequence retains.
    batch_sizes: sequences per step.
    weight_dtype, kv_dtype: storage dtypes.
    model: `StepModel.bound()` (default) or a calibrated model; a calibrated
      model's factors scale this device's datasheet figures unless it
      carries its own ceilings.
    token_gap_s: optional token-gap target.
    **kwargs: `block_size`, `workspace_fraction`, `max_new_tokens`,
      `group_size` for `step_inputs.decode_step_inputs`.

  Returns:
    The sweep (`jaxroof.symbolic.sweep.sweep`) with `inputs` describing the
    model, device and memory fit, and `summary.max_batch_in_memory`.
  """
  model = model or StepModel.bound()
  inputs = step_inputs.decode_step_inputs(spec, device, context=context, batch_sizes=batch_sizes,
                                          weight_dtype=weight_dtype, kv_dtype=kv_dtype, **kwargs)
  step_kwargs = inputs.step_kwargs()
  del step_kwargs["B"]  # The sweep takes the batch sizes themselves.
  crossovers = None
  if model.kind == "bound":
    # Crossovers of the model as evaluated (per-batch MoE weight reads), not of its largest N.
    solved = step_inputs.crossover_batches(spec, device, context=context, weight_dtype=weight_dtype,
                                           kv_dtype=kv_dtype, group_size=kwargs.get("group_size"),
                                           form=model.form)
    crossovers = {
        "weight_kv_crossover_batch": solved.weight_kv_crossover_batch,
        "compute_crossover_batch": solved.compute_crossover_batch
    }
  counts = parameters.parameter_counts(spec)
  result = sweep(
      model, list(batch_sizes), fits=inputs.fits, layers=spec.num_layers, token_gap_s=token_gap_s,
      crossovers=crossovers,
      weights_read=lambda batch: parameters.weights_read_per_step(counts, batch),
      bytes_per_weight_read=lambda batch: np.broadcast_to(
          inputs.weight_format.read_bytes_per_weight(counts, batch), np.shape(batch)),
      max_batch_in_memory=inputs.max_batch_in_memory, **step_kwargs)
  result["assumptions"] = list(
      inputs.assumptions) + (result["assumptions"] if model.kind == "calibrated" else [])
  result["inputs"] = {
      "model": inputs.model,
      "accelerator": inputs.accelerator,
      "context": inputs.context,
      "weight_dtype": inputs.weight_dtype,
      "kv_dtype": inputs.kv_dtype,
      "weight_dtype_label": inputs.weight_format.label,
      "weight_format": inputs.weight_format.describe(),
      "weight_dtype_published": inputs.weight_format.published,
      "compute_dtype": inputs.compute_dtype,
      "batch_sizes": list(batch_sizes),
      "si": step_kwargs,
      "max_batch_in_memory": inputs.max_batch_in_memory,
      "memory_capacity_bytes": inputs.memory_capacity_bytes,
      "resident_weight_bytes": inputs.resident_weight_bytes,
      "kv_payload_bytes_per_sequence": inputs.kv_payload_bytes_per_sequence,
      "kv_allocated_bytes_per_sequence": inputs.kv_allocated_bytes_per_sequence,
  }
  summary = result["summary"]
  summary["max_batch_in_memory"] = inputs.max_batch_in_memory
  measured_kind = str(model.provenance.get("device_kind", ""))
  if model.kind == "calibrated" and model.provenance.get("accelerator") == inputs.accelerator:
    summary["notes"].append(f"profile fitted on {inputs.accelerator} itself: its factors scale "
                            f"{inputs.accelerator}'s datasheet figures, as in the fit")
  elif (model.kind == "calibrated" and not model.provenance.get("accelerator") and
        device_kind_matches(inputs.accelerator, measured_kind)):
    scaled = ("the ceilings measured with them"
              if model.ceilings is not None else f"{inputs.accelerator}'s datasheet figures")
    summary["notes"].append(f"profile measured on {measured_kind}, this accelerator: a calibrated "
                            f"prediction, its factors scaling {scaled}")
  elif model.kind == "calibrated":
    summary["notes"].append(
        f"profile measured on {model.provenance.get('device_kind', 'another device')}, "
        f"its factors applied to {inputs.accelerator}'s datasheet figures: a what-if, "
        "not a measurement there")
  elif spec.is_moe:
    summary["notes"].append("MoE: crossovers solved numerically with the expected "
                            "distinct experts read at each batch (uniform routing)")
  return result
