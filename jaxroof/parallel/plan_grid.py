"""The planner's search space: every (accelerator, layout, bytes) a model may run as, each a
group of the one cost model's constants on one chip of the layout.

A group is an accelerator, a layout (tp, pp, ep, microbatches) and a class of storage
formats with identical bytes and rates (dtypes that cost the same are merged). Its
constants are `IterationModel.on_device`'s for the formats, scaled to one chip's share
along a token's path (`layout.chip_shares`), with the layout's collectives
(`layout.pass_comm`); its slots are what the busiest chip's memory holds
(`layout.replica_sequences`). Arrays of shape (G, 1) hold the G groups, so the cost
model evaluates them all at once over running counts (G, S).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxroof import errors
from jaxroof.engines import engine_rules
from jaxroof.parallel import engine_drive
from jaxroof.parallel import layout as layout_lib
from jaxroof.parallel.layout import Layout
from jaxroof.specs import step_inputs
from jaxroof.specs.accelerators import ATTENTION_DTYPE, Accelerator
from jaxroof.specs.iteration_model import IterationModel
from jaxroof.specs.model_spec import ModelSpec
from jaxroof.symbolic import cost_model

TP_CHOICES = (1, 2, 4, 8, 16, 32, 64)
PP_CHOICES = (1, 2, 4, 8)
EP_CHOICES = (1, 2, 4, 8, 16, 32, 64)
_SHARE_OF = {
    "W_b": "weights", "W_h": "weights", "r_e": "weights", "W_x": "experts", "k_full": "kv",
    "k_win": "kv", "k_mla": "kv", "s_st": "kv", "N_b": "flops", "N_h": "flops", "a_full": "flops",
    "a_win": "flops", "a_mla": "flops", "ap_mla": "flops", "u_mla": "flops", "A_w": "flops"
}  # As `IterationModel.on_layout` scales them.


def candidate_layouts(spec: ModelSpec,
                      device: Accelerator) -> list[tuple[Layout, layout_lib.LinkChoice]]:
  """Every layout of the search grid this model and device accept, with its links."""
  eps = EP_CHOICES if spec.is_moe else (1,)
  out = []
  for tp in TP_CHOICES:
    for pp in PP_CHOICES:
      for ep in eps:
        for m in sorted({1, pp}):
          layout = Layout(tp=tp, pp=pp, ep=ep, microbatches=m)
          try:
            layout_lib.validate(layout, spec, device)
          except errors.InputError:
            continue
          out.append((layout, layout_lib.links(layout, device)))
  return out


@dataclasses.dataclass(frozen=True)
class Grid:
  """G groups (see the module docstring), each field indexed by group.

  `device`, `cls` (G,) ints; `tp`, `pp`, `ep`, `microbatches`, `per_replica` (G,);
  `max_batch` (G,) sequences a replica fits; `kv_per_token` (G,) K/V bytes of one token,
  whole model (a prompt's transfer between pools); `constants` name -> (G, 1);
  `comm` `layout.COMM_SYMBOLS` name -> (G, 1); `links` one per group; `class_members`
  class -> [(weight dtype, K/V dtype)], the first named; `base` a class's cost model (for
  its window and MLA form)."""

  device: np.ndarray
  cls: np.ndarray
  tp: np.ndarray
  pp: np.ndarray
  ep: np.ndarray
  microbatches: np.ndarray
  per_replica: np.ndarray
  max_batch: np.ndarray
  kv_per_token: np.ndarray
  constants: dict[str, np.ndarray]
  comm: dict[str, np.ndarray]
  links: list[layout_lib.LinkChoice]
  class_members: dict[int, list[tuple[str, str]]]
  base: IterationModel
  comm_overlap: float
  memory: dict[str, np.ndarray]  # W_res, W_x, W_e, W_h, x_tie, s, u_kv (G,): chip bytes.

  @property
  def size(self) -> int:
    return int(self.device.size)

  def cost(self, index: np.ndarray) -> IterationModel:
    """The cost model of the groups `index`: constants (len(index), 1)."""
    index = np.asarray(index)
    constants = {name: v[index] for name, v in self.constants.items()}
    comm = {name: v[index] for name, v in self.comm.items()}
    single = np.all(comm["tp"] * comm["pp"] * comm["ep"] == 1)
    return dataclasses.replace(
        self.base, constants=constants, comm=None if single else
        (lambda rows: layout_lib.pass_comm(comm, rows)), comm_overlap=self.comm_overlap)


def build(spec: ModelSpec, devices: Sequence[Accelerator], *, context: int, prompt_tokens: int,
          weight_dtypes: Sequence[str], kv_dtypes: Sequence[str], workspace_fraction: float,
          mla_prefill: str = "mha", comm_overlap: float = 0.0,
          activation_bytes: float = layout_lib.DEFAULT_ACTIVATION_BYTES,
          engine: str = engine_drive.BOUND) -> Grid:
  """Every group of `devices` x layouts x format classes (`context`: the tokens each
  sequence reserves in the memory fit; an `engine`: its reservation rule and running
  cap on each device and layout, `engine_drive.replica_sequences`, in place of the
  workspace fraction)."""
  del prompt_tokens  # The costs take it when evaluated.
  terms = layout_lib.model_terms(spec)
  rows: dict[str, list[Any]] = {}
  classes: dict[tuple, int] = {}
  members: dict[int, list[tuple[str, str]]] = {}
  links: list[layout_lib.LinkChoice] = []
  base = None
  formats: dict[tuple[str, str], tuple[Any, IterationModel]] = {}
  for di, device in enumerate(devices):
    layouts = candidate_layouts(spec, device)
    if not layouts:
      continue
    # Per layout, once: its shares of the cost model's constants and its collectives.
    per_layout = [(layout, link, layout_lib.chip_shares(layout, spec),
                   layout_lib.symbol_values(layout, spec, link, activation_bytes=activation_bytes,
                                            overlap=comm_overlap)) for layout, link in layouts]
    degrees = {
        n: np.array([float(getattr(lay, n)) for lay, *_ in per_layout])
        for n in ("tp", "pp", "ep", "microbatches")
    }
    for wdt in weight_dtypes:
      for kdt in kv_dtypes:
        if (wdt, kdt) not in formats:  # Bytes and constants are the device's only in BW, F.
          first = step_inputs.decode_step_inputs(spec, device, context=context, batch_sizes=[1],
                                                 weight_dtype=wdt, kv_dtype=kdt,
                                                 workspace_fraction=workspace_fraction)
          formats[(wdt, kdt)] = (first,
                                 IterationModel.from_spec(spec, BW=1.0, F=1.0, weight_dtype=wdt,
                                                          kv_dtype=kdt, mla_prefill=mla_prefill))
        inputs, shape = formats[(wdt, kdt)]
        rates = {
            "BW": device.memory_bandwidth_bytes_per_s,
            "F": device.flops(inputs.weight_format.dtype), "F_attn": device.flops(ATTENTION_DTYPE)
        }
        cost = dataclasses.replace(shape, constants={**shape.constants, **rates})
        base = base or cost
        name = inputs.weight_dtype + (" (published)" if wdt == "published" else "")
        weights = layout_lib.weight_byte_values(spec, inputs.weight_format)
        key = (di, tuple(round(float(cost.constants[n]), 9) for n in cost_model.MODEL_NAMES),
               round(float(inputs.kv_allocated_bytes_per_sequence),
                     3), tuple(round(v, 3) for v in weights.values()))
        fresh = key not in classes
        cls = classes.setdefault(key, len(classes))
        members.setdefault(cls, []).append((name, kdt))
        if not fresh:
          continue
        kv = float(inputs.kv_allocated_bytes_per_sequence)
        fit = layout_lib.replica_sequences(capacity=device.memory_capacity_bytes,
                                           workspace=workspace_fraction, weights=weights, kv=kv,
                                           tp=degrees["tp"], pp=degrees["pp"], ep=degrees["ep"],
                                           u_kv=float(terms.kv_units))
        if engine != engine_drive.BOUND:
          fit = _engine_fit(engine, device, spec, weights, kv, degrees, float(terms.kv_units))
        for (layout, link, shares, values), fits in zip(per_layout,
                                                        np.broadcast_to(fit, (len(per_layout),))):
          add = dict(device=di, cls=cls, tp=layout.tp, pp=layout.pp, ep=layout.ep,
                     microbatches=layout.microbatches, per_replica=layout.chips_per_replica,
                     max_batch=float(fits), kv_per_token=float(inputs.k))
          memory = {**weights, "s": kv, "u_kv": float(terms.kv_units)}
          for n, v in memory.items():
            rows.setdefault("b:" + n, []).append(v)
          for n, v in add.items():
            rows.setdefault(n, []).append(v)
          for n, v in cost.constants.items():
            rows.setdefault("c:" + n, []).append(float(v) * shares.get(_SHARE_OF.get(n, ""), 1.0))
          for n in layout_lib.COMM_SYMBOLS:
            rows.setdefault("m:" + n, []).append(float(values[n]))
          links.append(link)
  if base is None:
    raise errors.InputError(
        f"no layout of {spec.name} fits any of "
        f"{', '.join(d.name for d in devices)}'s interconnects.", field="accelerators")
  col = lambda n, dtype=float: np.asarray(rows[n], dtype=dtype)  # noqa: E731
  return Grid(device=col("device", int), cls=col("cls", int), tp=col("tp"), pp=col("pp"),
              ep=col("ep"), microbatches=col("microbatches"), per_replica=col("per_replica"),
              max_batch=col("max_batch"), kv_per_token=col("kv_per_token"),
              constants={n[2:]: col(n).reshape(-1, 1) for n in rows if n.startswith("c:")
                        }, comm={n[2:]: col(n).reshape(-1, 1) for n in rows if n.startswith("m:")
                                }, links=links, class_members=members, base=base,
              comm_overlap=comm_overlap, memory={n[2:]: col(n) for n in rows if n.startswith("b:")})


def _engine_fit(engine: str, device: Accelerator, spec: ModelSpec, weights: dict[str, float],
                kv: float, degrees: dict[str, np.ndarray], u_kv: float) -> np.ndarray:
  """Sequences each layout's replica runs under `engine`'s reservation and cap."""
  chip_w, chip_kv = layout_lib.chip_shares_of_memory(capacity=device.memory_capacity_bytes,
                                                     weights=weights, kv=kv, tp=degrees["tp"],
                                                     pp=degrees["pp"], ep=degrees["ep"], u_kv=u_kv)
  out = []
  for i, (tp, pp, ep) in enumerate(zip(degrees["tp"], degrees["pp"], degrees["ep"])):
    settings = engine_rules.settings(engine, device, tp=int(tp), pp=int(pp))
    out.append(
        engine_drive.replica_sequences(settings, capacity=device.memory_capacity_bytes,
                                       chip_weights=np.broadcast_to(chip_w, degrees["tp"].shape)[i],
                                       chip_kv=np.broadcast_to(chip_kv, degrees["tp"].shape)[i],
                                       width=float(spec.hidden_size), ep=ep))
  return np.asarray(out, dtype=float)


def chip_bytes(grid: Grid, index: np.ndarray, batch: np.ndarray) -> np.ndarray:
  """The busiest chip's bytes of the groups `index` at `batch` sequences per replica."""
  m = {n: v[index] for n, v in grid.memory.items()}
  return layout_lib.chip_bytes(batch,
                               weights={n: m[n] for n in ("W_res", "W_x", "W_e", "W_h", "x_tie")},
                               kv=m["s"], tp=grid.tp[index], pp=grid.pp[index], ep=grid.ep[index],
                               u_kv=m["u_kv"])
