"""Whole requests on a parallel layout: per-chip step inputs, communication, memory fit.

`model_inputs` is `requests.model_inputs` for a replica of tp x pp x ep chips
(and dp replicas). One chip returns `requests.model_inputs` unchanged. Several
chips take the single-device figures and turn them into one chip's along a
token's path through the pp stages (`jaxroof.symbolic.collectives.path_inputs`:
weights over tp*pp, experts also over ep, K/V by `Max(1/tp, 1/u_kv)` and the
ep groups, linear FLOPs over tp*ep), fit the busiest chip's memory
(`jaxroof.parallel.layout.chip_memory`), and carry the layout's link figures
so that `requests` adds the communication of every pass
(`jaxroof.symbolic.collectives.pass_comm_s`) serially to each decode step and
prefill. Rates in the rows and the decision are per replica; fleet rates are
dp times them.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from jaxroof.parallel import layout as layout_lib
from jaxroof.parallel.layout import Layout
from jaxroof.serving import requests
from jaxroof.specs import parameters as params
from jaxroof.specs import step_inputs
from jaxroof.specs.accelerators import Accelerator
from jaxroof.specs.model_spec import ModelSpec
from jaxroof.symbolic import collectives
from jaxroof.symbolic import symbols as S
from jaxroof.symbolic.evaluate import lambdified


def path_values(layout: Layout, spec: ModelSpec, *, N: float, N_x: float, k: float,
                N_act: float) -> dict[str, float]:
  """One chip's N, k and N_act along a token's path (`parallel.path_inputs`)."""
  terms = layout_lib.model_terms(spec)
  out = layout_lib._path_model()(  # noqa: SLF001 (the one lambdified path model)
      N=N, N_x=N_x, k=k, N_act=N_act, tp=float(layout.tp), pp=float(layout.pp), ep=float(layout.ep),
      u_kv=float(terms.kv_units))
  return {name: float(value) for name, value in out.items()}


chip_shares = layout_lib.chip_shares


def assumptions(inputs: requests.ServingInputs) -> list[str]:
  """What a layout's serving rows assume (empty on one chip)."""
  if inputs.comm is None and inputs.replicas == 1:
    return []
  return [
      f"{inputs.chips_per_replica} chips per replica, {inputs.replicas} replica(s): N, N_act "
      "and k are one chip's along a token's path through the pp stages; memory fit on the "
      "busiest chip (with pp > 1 an end stage: its blocks plus the embedding table or LM head)",
      "communication (tensor all-reduces, logits gather, MoE all-to-alls, stage hand-offs) "
      f"of each decode step (B rows) and each prefill (P*B rows), {inputs.comm_overlap:g} of "
      "it hidden under the iteration (0: serial)",
      "prefill attention FLOPs split over tp*ep like the linear ones",
      "rates and the decision per replica; the arrival rate is the fleet's, split evenly "
      "over the replicas; fleet rates are dp times a replica's",
  ]


def model_inputs(spec: ModelSpec, device: Accelerator, *, layout: Layout | None = None,
                 prompt_tokens: int, output_tokens: int, weight_dtype: str = "bf16",
                 kv_dtype: str = "bf16", mla_prefill: str = "mha", comm_overlap: float = 0.0,
                 **step_input_kw: Any) -> requests.ServingInputs:
  """`ServingInputs` for one replica of `layout` (one chip: `requests.model_inputs`).

  Raises:
    InputError: a layout the model or device does not allow (`layout.validate`).
  """
  layout = layout or Layout()
  single = requests.model_inputs(spec, device, prompt_tokens=prompt_tokens,
                                 output_tokens=output_tokens, weight_dtype=weight_dtype,
                                 kv_dtype=kv_dtype, mla_prefill=mla_prefill,
                                 comm_overlap=comm_overlap, **step_input_kw)
  if layout.chips_per_replica == 1:
    return dataclasses.replace(single, replicas=layout.dp)
  layout_lib.validate(layout, spec, device)
  link = layout_lib.links(layout, device)
  memory = layout_lib.chip_memory(
      layout, spec, device, weight_format=params.weight_format(spec, weight_dtype,
                                                               step_input_kw.get("group_size")),
      kv_allocated_bytes_per_sequence=single.memory["kv_allocated_bytes_per_sequence"],
      workspace_fraction=single.memory["workspace_fraction"])
  fit = max(memory.max_batch_per_replica, 1)
  at_fit = step_inputs.decode_step_inputs(spec, device, context=prompt_tokens, batch_sizes=[fit],
                                          weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                                          max_new_tokens=output_tokens, **step_input_kw)
  n_x = float(layout_lib.expert_weights_read(spec, [float(fit)])[0])
  path = path_values(layout, spec, N=float(at_fit.N[0]), N_x=n_x, k=single.k, N_act=single.N_act)
  values = layout_lib.symbol_values(layout, spec, link)
  comm = {name: float(values[name]) for name in requests.COMM_SYMBOLS}
  chip_memory = {
      **single.memory,
      "resident_weight_bytes_per_chip": memory.resident_weight_bytes,
      "kv_allocated_bytes_per_sequence_per_chip": memory.kv_allocated_bytes_per_sequence,
      "usable_memory_bytes_per_chip": memory.usable_bytes,
      "layout": layout.as_dict(),
      "network": link.network,
      "link_note": link.note,
  }
  cost = single.cost.on_layout(**chip_shares(layout, spec),
                               comm=lambda rows: requests.pass_comm_s(comm, rows),
                               comm_overlap=single.comm_overlap)
  return dataclasses.replace(
      single, N=path["N"], N_act=path["N_act"], k=path["k"], cost=cost,
      max_batch_in_memory=memory.max_batch_per_replica, memory=chip_memory, comm=comm,
      attention_share=1.0 / (layout.tp * layout.ep), replicas=layout.dp,
      chips_per_replica=layout.chips_per_replica,
      label=(f"{single.label}, tp={layout.tp} pp={layout.pp} ep={layout.ep} "
             f"dp={layout.dp} ({layout.chips} chips)"))
