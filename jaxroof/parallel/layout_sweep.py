"""A real model's decode sweep on a parallel layout: per-chip rows with communication.

`layout_sweep` is `jaxroof.specs.model_sweep.model_sweep` for several chips.
One chip (tp = pp = ep = dp = 1) runs `model_sweep` itself, unchanged, and
only adds the `comm_s` (0) and `chips` (1) columns. Several chips evaluate the
same `StepModel` (bound or calibrated) on the per-chip path inputs of
`jaxroof.symbolic.collectives.path_inputs` with the path's communication time
added serially; each row then says whether communication binds.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from jaxroof.parallel import layout as layout_lib
from jaxroof.parallel.layout import Layout
from jaxroof.specs import step_inputs
from jaxroof.specs.accelerators import Accelerator
from jaxroof.specs.model_spec import ModelSpec
from jaxroof.specs.model_sweep import model_sweep
from jaxroof.symbolic import collectives
from jaxroof.symbolic import symbols as S
from jaxroof.symbolic.evaluate import lambdified
from jaxroof.symbolic.step_model import StepModel
from jaxroof.symbolic.sweep import sweep


@functools.cache
def _path_model():
  outputs = {**collectives.path_inputs(), "fleet_scale": collectives.fleet_rate(1)}
  return lambdified(outputs, (S.N, S.N_x, S.k, S.N_act, S.tp, S.pp, S.ep, S.u_kv, S.dp))


def layout_sweep(spec: ModelSpec, device: Accelerator, *, context: int, batch_sizes: Sequence[int],
                 layout: Layout | None = None, weight_dtype: str = "bf16", kv_dtype: str = "bf16",
                 model: StepModel | None = None, token_gap_s: float | None = None,
                 comm_overlap: float = 0.0, **kwargs: Any) -> dict[str, Any]:
  """The step model at each batch on `layout` (per replica), memory fit per chip.

  Rows gain `comm_s`, `chips` and `fleet_tokens_per_s` (dp replicas); `bound`
  may be "communication". Keywords as in `model_sweep`.
  """
  layout = layout or Layout()
  if layout.is_single_chip:
    result = model_sweep(spec, device, context=context, batch_sizes=batch_sizes,
                         weight_dtype=weight_dtype, kv_dtype=kv_dtype, model=model,
                         token_gap_s=token_gap_s, **kwargs)
    for row in result["rows"]:
      row["comm_s"] = 0.0
      row["chips"] = 1
      row["fleet_tokens_per_s"] = row["aggregate_tokens_per_s"]
    result["inputs"]["layout"] = layout.as_dict()
    result["units"] = {
        **result["units"], "comm_s": "s", "chips": "chips", "fleet_tokens_per_s": "tokens/s"
    }
    return result
  layout_lib.validate(layout, spec, device)
  if layout.microbatches != 1:
    raise ValueError("layout_sweep models one microbatch; the planner takes more")
  model = model or StepModel.bound()
  link = layout_lib.links(layout, device)
  inputs = step_inputs.decode_step_inputs(spec, device, context=context, batch_sizes=batch_sizes,
                                          weight_dtype=weight_dtype, kv_dtype=kv_dtype, **kwargs)
  batch = inputs.batch_sizes.astype(float)
  n_x = layout_lib.expert_weights_read(spec, batch)
  values = layout_lib.symbol_values(layout, spec, link)
  path = _path_model()(N=inputs.N, N_x=n_x, k=inputs.k, N_act=inputs.N_act, tp=values["tp"],
                       pp=values["pp"], ep=values["ep"], u_kv=values["u_kv"], dp=float(layout.dp))
  full = layout_lib.decode_model()(B=batch, T=float(context), N=inputs.N, N_x=n_x, q=inputs.q,
                                   k=inputs.k, BW=inputs.BW, F=inputs.F, N_act=inputs.N_act,
                                   **values)
  memory = layout_lib.chip_memory(
      layout, spec, device, weight_format=inputs.weight_format,
      kv_allocated_bytes_per_sequence=inputs.kv_allocated_bytes_per_sequence,
      workspace_fraction=inputs.workspace_fraction)
  fits = batch <= memory.max_batch_per_replica
  result = sweep(model, list(batch_sizes), N=path["N"], q=inputs.q, T=float(context),
                 k=float(path["k"]), BW=inputs.BW, F=inputs.F, N_act=float(path["N_act"]),
                 layers=spec.num_layers, fits=list(fits), token_gap_s=token_gap_s,
                 comm_s=full["comm_s"], max_batch_in_memory=memory.max_batch_per_replica,
                 A_t=inputs.A_t * float(path["N_act"]) / inputs.N_act, comm_overlap=comm_overlap)
  for row in result["rows"]:
    row["chips"] = layout.chips
    row["fleet_tokens_per_s"] = float(row["aggregate_tokens_per_s"] * path["fleet_scale"])
  result["units"] = {
      **result["units"], "comm_s": "s", "chips": "chips", "fleet_tokens_per_s": "tokens/s"
  }
  result["assumptions"] = (list(inputs.assumptions)[:1] + list(inputs.assumptions)[2:] +
                           layout_lib.layout_assumptions(layout, spec, link) +
                           (result["assumptions"] if model.kind == "calibrated" else []))
  result["summary"]["max_batch_in_memory"] = memory.max_batch_per_replica
  result["summary"]["notes"].append(
      "weight_bytes, kv_bytes, memory_s and compute_s are one chip's along the token's path "
      "through the pp stages; rates are per replica, fleet_tokens_per_s for dp replicas")
  result["inputs"] = {
      "model": inputs.model,
      "accelerator": inputs.accelerator,
      "context": context,
      "weight_dtype": inputs.weight_dtype,
      "kv_dtype": kv_dtype,
      "weight_dtype_label": inputs.weight_format.label,
      "weight_format": inputs.weight_format.describe(),
      "weight_dtype_published": inputs.weight_format.published,
      "compute_dtype": inputs.compute_dtype,
      "batch_sizes": list(batch_sizes),
      "layout": layout.as_dict(),
      "network": link.network,
      "link_note": link.note,
      "interconnect_bytes_per_s": link.bytes_per_s,
      "hop_latency_s": link.hop_latency_s,
      "max_batch_in_memory": memory.max_batch_per_replica,
      "memory_capacity_bytes": inputs.memory_capacity_bytes,
      "si": {
          "N": path["N"], "q": inputs.q, "T": float(context), "k": float(path["k"]),
          "BW": inputs.BW, "F": inputs.F, "N_act": float(path["N_act"]), "comm_s": full["comm_s"]
      },
      "resident_weight_bytes": memory.resident_weight_bytes,
      "resident_weight_bytes_per_chip": memory.resident_weight_bytes,
      "kv_allocated_bytes_per_sequence_per_chip": memory.kv_allocated_bytes_per_sequence,
  }
  return result
