"""Published points as the cost model's inputs, stacked: one array entry per point.

Each point's setup (model, accelerator, dtypes, layout) is a replica built the way
`iteration` and `batch_sweep` build theirs (`serving.replica.from_model`): its
`IterationModel` gives one chip's share of every cost-model constant and the
communication of a pass. `stack` stacks those constants over the points, with the
two unit mixes an iteration is made of (`uniform_mix`): one decode row at the point's
mean context, and one prompt prefilled whole. Any iteration of `rows` decode rows and
`prompts` prompts is then their sum, evaluated for every point in one call of the one
lambdified cost model (`iteration`). A point whose setup cannot be built (a model that
does not fit, a length the source does not give) is left out with its reason.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxroof import errors
from jaxroof.engines.published import Point, model_path
from jaxroof.parallel import layout as layout_lib
from jaxroof.parallel.layout import Layout
from jaxroof.serving import replica
from jaxroof.specs import accelerators
from jaxroof.specs import kv_sizing
from jaxroof.specs import models
from jaxroof.specs import parameters as params
from jaxroof.specs.iteration_model import IterationModel
from jaxroof.symbolic import cost_model

# Mix names that count rows or sequences (the rest scale with them too: per row or prompt).
_ROWS = ("n_dec", "n_samp", "n_seq")


@dataclasses.dataclass(frozen=True)
class Setup:
  """One served configuration: a replica's chip, its memory, and what built it."""

  cost: IterationModel  # One chip of the replica (constants, communication).
  weight_bytes: float  # Resident weights on the busiest chip.
  kv_bytes_per_token: float  # K/V one token of one sequence holds on that chip.
  capacity_bytes: float  # Device memory.
  width: float  # Hidden size (the activation workspace scales with it).
  ep: int
  notes: tuple[str, ...]


def kv_dtype_of(point: Point) -> str:
  """The K/V dtype: the source's, else the weights' when it is a K/V dtype, else bf16
  (stated in `ASSUMPTIONS`)."""
  if point.kv_dtype:
    return point.kv_dtype
  return point.weight_dtype if point.weight_dtype in kv_sizing.KV_DTYPES else "bf16"


ASSUMPTIONS: tuple[str, ...] = (
    "K/V dtype not given by the source: the weights' dtype where it is a K/V dtype, else bf16",
    "a point whose prompt or output length the source does not give is not predicted",
    "a mean or a median is predicted as the mean; a p99 is not predicted",
)


@functools.cache
def setup(model: str, accelerator: str, weight_dtype: str, kv_dtype: str, tp: int, pp: int,
          ep: int) -> Setup:
  """The replica of one setup (`replica.from_model`, as the experiments build it)."""
  spec = models.load_model(model_path(model))
  device = accelerators.load_accelerator(accelerator)
  layout = Layout(tp=tp, pp=pp, ep=ep)
  rep = replica.from_model(spec, device, context=1, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                           layout=layout)
  fmt = params.weight_format(spec, weight_dtype, None)
  token = kv_sizing.size_kv(spec, context=1, kv_dtype=kv_dtype, block_size=1)
  chip = layout_lib.chip_memory(layout, spec, device, weight_format=fmt,
                                kv_allocated_bytes_per_sequence=token.allocated_bytes_per_sequence,
                                workspace_fraction=0.0)
  return Setup(rep.cost, chip.resident_weight_bytes, chip.kv_allocated_bytes_per_sequence,
               device.memory_capacity_bytes, float(spec.hidden_size), ep,
               tuple(rep.description["notes"]))


def setup_of(point: Point) -> Setup:
  return setup(point.model, point.accelerator, point.weight_dtype, kv_dtype_of(point),
               *point.layout)


# Rows whose measurement the cost model cannot describe, with the reason (a data issue, not
# a missing term): they are neither fitted nor refereed.
DATA_ISSUES: dict[tuple[str, str], str] = {
    ("trtllm-0.9.0-dli", "mixtral-8x7b"):
        "fake weights (the source's note): the router's choices are not uniform, and at "
        "batch 16-64 the step is faster than reading the experts uniform routing touches; "
        "the data's README doubts the rows' dtype too",
}


def why_not(point: Point) -> str | None:
  """Why a point is not predicted, or None."""
  issue = DATA_ISSUES.get((point.source, point.model))
  if issue:
    return f"data issue: {issue}"
  if point.statistic == "p99":
    return "a p99: the predictor gives means"
  if point.prompt_tokens is None or point.output_tokens is None:
    return "the source gives no prompt or output length"
  try:
    setup_of(point)
  except errors.InputError as e:
    return f"its setup cannot be built: {e}"
  return None


@dataclasses.dataclass(frozen=True)
class Stacked:
  """The points' inputs, one array entry per point (SI units)."""

  points: tuple[Point, ...]
  constants: Mapping[str, np.ndarray]  # `cost_model.MODEL_NAMES`, one chip's share.
  decode_unit: Mapping[str, np.ndarray]  # One decode row at the mean context.
  prefill_unit: Mapping[str, np.ndarray]  # One prompt prefilled whole.
  groups: tuple[tuple[np.ndarray, Any], ...]  # (point indices, comm fn or None) per setup.
  prompt: np.ndarray
  output: np.ndarray
  weight_bytes: np.ndarray
  kv_per_token: np.ndarray  # Per chip, divided by the ep groups that pool sequences.
  capacity: np.ndarray
  width: np.ndarray
  index: Mapping[str, int]  # point_id -> entry.

  def __len__(self) -> int:
    return len(self.points)

  def take(self, keep: np.ndarray) -> Stacked:
    """The entries where `keep` (a bool mask) holds."""
    where = np.flatnonzero(keep)
    return stack([self.points[i] for i in where])


def _unit(cost: IterationModel, **mix: float) -> dict[str, float]:
  out = cost.uniform_mix(**mix)
  return {name: float(np.asarray(value)) for name, value in out.items()}


def stack(points: Sequence[Point]) -> Stacked:
  """Every point's setup and unit mixes, stacked (points `why_not` refuses must be gone)."""
  columns: dict[str, list[float]] = {n: [] for n in cost_model.MODEL_NAMES}
  decode: dict[str, list[float]] = {n: [] for n in cost_model.MIX_NAMES}
  prefill: dict[str, list[float]] = {n: [] for n in cost_model.MIX_NAMES}
  groups: dict[tuple, list[int]] = {}
  memory: dict[str, list[float]] = {n: [] for n in ("w", "kv", "c", "d")}
  for i, point in enumerate(points):
    s = setup_of(point)
    p, g = float(point.prompt_tokens), float(point.output_tokens)
    for name in cost_model.MODEL_NAMES:
      columns[name].append(float(s.cost.constants[name]))
    for name, value in _unit(s.cost, decode_rows=1.0, context=p + g / 2).items():
      decode[name].append(value)
    for name, value in _unit(s.cost, prefill_sequences=1.0, prompt_tokens=p).items():
      prefill[name].append(value)
    groups.setdefault((id(s),), []).append(i)
    memory["w"].append(s.weight_bytes)
    memory["kv"].append(s.kv_bytes_per_token / s.ep)
    memory["c"].append(s.capacity_bytes)
    memory["d"].append(s.width)
  setups = {id(setup_of(points[idx[0]])): setup_of(points[idx[0]]) for idx in groups.values()}
  array = lambda d: {n: np.asarray(v, dtype=float) for n, v in d.items()}  # noqa: E731
  return Stacked(
      points=tuple(points), constants=array(columns), decode_unit=array(decode),
      prefill_unit=array(prefill), groups=tuple(
          (np.asarray(idx), setups[key[0]].cost.comm) for key, idx in groups.items()),
      prompt=np.asarray([p.prompt_tokens for p in points], dtype=float),
      output=np.asarray([p.output_tokens for p in points],
                        dtype=float), weight_bytes=np.asarray(memory["w"]),
      kv_per_token=np.asarray(memory["kv"]), capacity=np.asarray(memory["c"]),
      width=np.asarray(memory["d"]), index={p.point_id: i for i, p in enumerate(points)})


def mix(stacked: Stacked, rows: Any, prompts: Any) -> dict[str, np.ndarray]:
  """The mix of `rows` decode rows at each point's mean context and `prompts` whole
  prompts: the unit mixes scaled and summed (every mix quantity is a sum over rows)."""
  rows, prompts = np.asarray(rows, dtype=float), np.asarray(prompts, dtype=float)
  return {
      n: rows * stacked.decode_unit[n] + prompts * stacked.prefill_unit[n]
      for n in cost_model.MIX_NAMES
  }


def comm_s(stacked: Stacked, tokens: np.ndarray) -> np.ndarray:
  """The communication of a pass of `tokens` rows at each point (0 on one chip)."""
  out = np.zeros(len(stacked))
  tokens = np.broadcast_to(np.asarray(tokens, dtype=float), out.shape)
  for idx, comm in stacked.groups:
    if comm is not None:
      out[idx] = comm(tokens[idx])
  return out


def iteration(stacked: Stacked, terms: Mapping[str, Any], rows: Any, prompts: Any, *,
              kind: str = "calibrated") -> dict[str, np.ndarray]:
  """Every point's iteration of `rows` decode rows and `prompts` whole prompts under the
  cost model: `kind` "calibrated" with `terms` (`cost_model.CALIBRATED_TERMS` by name,
  arrays or floats), or "bound" (the per-operation roofline; `terms` unused)."""
  m = mix(stacked, rows, prompts)
  values = {**stacked.constants, **m, "o_ovl": 0.0}
  values["t_comm"] = comm_s(stacked, m["n_dec"] + m["n_pre"])
  if kind == "bound":
    return cost_model.evaluator("bound", "per_op", "numpy", True)(**values)
  names = [str(s) for s in cost_model.CALIBRATED_TERMS]
  with np.errstate(divide="ignore", invalid="ignore"):
    return cost_model.evaluator("calibrated", "per_op", "numpy",
                                True)(**values, **{n: terms[n] for n in names})
