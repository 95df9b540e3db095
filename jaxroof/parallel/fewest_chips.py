"""The fewest chips that hold a model, and one sequence on 1..8 tensor-parallel chips.

Two layout questions the report asks of every shipped model (analytic bounds):
which layout of the planner's grid, with the fewest chips per replica, has room
for the weights and one sequence's K/V (`fewest_chips`), and how the step of a
single stream changes as tensor parallelism spreads it (`single_stream`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jaxroof.errors import InputError
from jaxroof.parallel import layout as layout_lib
from jaxroof.parallel import plan_grid
from jaxroof.parallel.layout import Layout
from jaxroof.parallel.layout_sweep import layout_sweep
from jaxroof.specs import step_inputs
from jaxroof.specs.accelerators import Accelerator
from jaxroof.specs.model_spec import ModelSpec
from jaxroof.symbolic import collectives
from jaxroof.symbolic.symbols import n_blk

SINGLE_STREAM_TP = (1, 2, 4, 8)


def fewest_chips(spec: ModelSpec, device: Accelerator, *, context: int, weight_dtype: str = "bf16",
                 kv_dtype: str = "bf16") -> Layout | None:
  """The layout with the fewest chips per replica in which one sequence fits.

  Candidates are the planner's layouts without microbatching, fewest chips
  first, then fewer pipeline stages, then fewer expert groups; None when
  nothing within the interconnect's reach fits.
  """
  inputs = step_inputs.decode_step_inputs(spec, device, context=context, batch_sizes=[1],
                                          weight_dtype=weight_dtype, kv_dtype=kv_dtype)
  candidates = sorted(
      (lay for lay, _ in plan_grid.candidate_layouts(spec, device) if lay.microbatches == 1),
      key=lambda lay: (lay.chips_per_replica, lay.pp, lay.ep))
  for lay in candidates:
    memory = layout_lib.chip_memory(
        lay, spec, device, weight_format=inputs.weight_format,
        kv_allocated_bytes_per_sequence=inputs.kv_allocated_bytes_per_sequence,
        workspace_fraction=inputs.workspace_fraction)
    if memory.max_batch_per_replica >= 1:
      return lay
  return None


def fewest_chips_grid(specs: dict[str, ModelSpec], devices: Sequence[Accelerator], *,
                      context: int) -> dict[str, dict[str, Layout | None]]:
  """`fewest_chips` (bf16 weights and K/V) per model name and accelerator name."""
  return {
      name: {d.name: fewest_chips(spec, d, context=context) for d in devices}
      for name, spec in specs.items()
  }


def tp_allreduces_per_token(spec: ModelSpec) -> int:
  """All-reduces on one token's path under tensor parallelism (`collectives`)."""
  blocks = layout_lib.model_terms(spec).blocks
  return int(collectives.tp_allreduces_per_pass().subs(n_blk, blocks))


def single_stream(spec: ModelSpec, device: Accelerator, *, context: int,
                  tps: Sequence[int] = SINGLE_STREAM_TP) -> list[dict[str, Any]]:
  """Batch one at `context` on each tensor-parallel degree the model accepts.

  One row per accepted degree: the layout sweep's row (step, memory and
  communication times, rate, what binds, whether it fits) with its `tp`.
  """
  rows = []
  for tp in tps:
    try:
      swept = layout_sweep(spec, device, context=context, batch_sizes=[1], layout=Layout(tp=tp))
    except InputError:
      continue
    rows.append({"tp": tp, **swept["rows"][0]})
  return rows
