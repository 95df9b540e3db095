"""Fitting the calibrated factors to users' measured rows of one device (optax).

The decode rows are fitted with the cost model's calibrated decode step
(`jaxroof.symbolic.calibrated.decode_model`: eta_w, eta_kv, eta_f, t0_step,
t0_layer, r_ovl), the prefill rows with its calibrated prefill
(`calibrated.prefill_model`), which shares eta_w, the fixed costs and the
overlap and adds its own FLOP efficiency eta_f_prefill. One optax (Adam)
fit takes both, minimising the mean squared log error.

Physical ranges hold by construction: each efficiency is a sigmoid of a free
parameter (in (0, 1)), each time and the overlap an exponential (> 0). An
efficiency that ends within 1% of 1 is flagged: the data want the device
faster than its datasheet, so a datasheet figure or an input is suspect.

Which factors the data can fix is decided from the Jacobian of log time with
respect to the free parameters: factors are added in `PRIORITY` order and one
is kept only if it raises the Jacobian's numerical rank (columns normalised,
smallest singular value above `RANK_TOLERANCE` of the largest) while fewer
factors than rows are free. The others keep `FIXED_VALUES` and are listed, with
the reason, in the result.

Rows become model inputs through an `InputsFn`. The default,
`ideal_split_inputs`, is the measure layer's ideal tensor split without
communication (`user_measurements.TP_ASSUMPTION`); the parallel layer's
`jaxroof.calibrate.layout_fit.layout_inputs` gives per-chip inputs of a real
layout and the analytic communication of each step, which the fit scales by
eta_comm (`jaxroof.symbolic.collectives.calibrated_with_comm`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxroof import errors
from jaxroof.calibrate import fitting
from jaxroof.measure import user_measurements as um
from jaxroof.symbolic import calibrated
from jaxroof.symbolic import collectives
from jaxroof.symbolic import symbols as S
from jaxroof.symbolic.evaluate import lambdified
from jaxroof.symbolic.step_model import StepModel

DECODE_FACTORS = calibrated.FACTOR_NAMES
COMM_FACTORS = ("eta_comm",)
ALL_FACTORS = DECODE_FACTORS + ("eta_f_prefill",) + COMM_FACTORS
EFFICIENCIES = ("eta_w", "eta_kv", "eta_f", "eta_f_prefill", "eta_comm")
PRIORITY = ("eta_w", "eta_kv", "eta_f_prefill", "t0_step", "eta_comm", "eta_f", "t0_layer", "r_ovl")

# Values of factors the data cannot fix: no fixed cost (1 ns, as profiles
# hold positive factors), p = 2 overlap, and efficiencies typical of tuned
# kernels (stated with the result); collectives at half their modelled speed
# (NCCL's small-message all-reduce runs well below the ring model's figures).
FIXED_VALUES = {
    "eta_w": 0.8, "eta_kv": 0.8, "eta_f": 0.5, "eta_f_prefill": 0.6, "t0_step": 1e-9,
    "t0_layer": 1e-9, "r_ovl": 1.0, "eta_comm": 0.5
}

# A factor the rows cannot separate from its partner takes the partner's value:
# K/V reads stream like weight reads; decode matmuls run like prefill's.
TIES = {"eta_kv": "eta_w", "eta_f": "eta_f_prefill", "eta_f_prefill": "eta_f"}
RANK_TOLERANCE = 0.2

# A factor whose parameter moves no row's log time by this much per unit is
# not determined by the rows (e.g. eta_kv at batch 1 and a short context,
# where K/V is a fraction of a percent of the traffic).
MIN_SENSITIVITY = 0.01
ROWS_PER_FACTOR = 2  # At most one free factor per this many rows.
MIN_ROWS = 3  # Rows a fit needs (decode and prefill together).
AT_CEILING = 0.99


@dataclasses.dataclass(frozen=True)
class UserFit:
  """Fitted factors of one device, and what was fixed and why."""

  factors: dict[str, float]  # Every name in ALL_FACTORS.
  free: tuple[str, ...]
  fixed: dict[str, str]  # name -> reason.
  flags: tuple[str, ...]
  loss: float
  rows: int


def _split(rows: Sequence[um.Row]) -> tuple[list[um.Row], list[um.Row]]:
  return ([r for r in rows if r.phase == "decode"], [r for r in rows if r.phase == "prefill"])


@dataclasses.dataclass(frozen=True)
class StepInputs:
  """Model inputs of rows, each phase in the rows' order, and their communication.

  `decode` holds `calibrated.INPUT_NAMES`, `prefill`
  `calibrated.PREFILL_INPUT_NAMES` (one chip's share on a layout); the
  `*_comm_s` arrays are each row's analytic communication (0 on one chip).
  """

  decode: dict[str, np.ndarray]
  prefill: dict[str, np.ndarray]
  decode_comm_s: np.ndarray
  prefill_comm_s: np.ndarray


InputsFn = Callable[[Sequence[um.Row]], StepInputs]


def ideal_split_inputs(rows: Sequence[um.Row]) -> StepInputs:
  """The measure layer's inputs: an ideal tp split, no communication (`TP_ASSUMPTION`)."""
  decode, prefill = _split(rows)
  return StepInputs(decode=um.decode_inputs(decode) if decode else {},
                    prefill=um.prefill_inputs(prefill) if prefill else {},
                    decode_comm_s=np.zeros(len(decode)), prefill_comm_s=np.zeros(len(prefill)))


@functools.cache
def with_comm_model(backend: str = "numpy"):
  """`f(t_floor=, t_comm=, eta_comm=) -> {"step_s"}`: communication serial, scaled."""
  return lambdified({"step_s": collectives.calibrated_with_comm(overlap=0)},
                    (S.t_floor, S.t_comm, S.eta_comm), backend)


@dataclasses.dataclass(frozen=True)
class _Data:
  inputs: StepInputs
  decode_s: np.ndarray
  prefill_s: np.ndarray

  @property
  def decode(self) -> dict[str, np.ndarray]:
    return self.inputs.decode

  @property
  def prefill(self) -> dict[str, np.ndarray]:
    return self.inputs.prefill

  @property
  def has_comm(self) -> bool:
    return bool(np.any(self.inputs.decode_comm_s > 0) or np.any(self.inputs.prefill_comm_s > 0))


def _data(rows: Sequence[um.Row], inputs: InputsFn) -> _Data:
  decode, prefill = _split(rows)
  return _Data(inputs=inputs(rows), decode_s=np.asarray([r.time_s for r in decode],
                                                        dtype=np.float64),
               prefill_s=np.asarray([r.time_s for r in prefill], dtype=np.float64))


def _scales(data: _Data) -> dict[str, float]:
  """Typical magnitudes of the fixed costs, so the parameters are O(1)."""
  times = np.concatenate([data.decode_s, data.prefill_s])
  layers = np.concatenate([data.decode.get("L", []), data.prefill.get("L", [])])
  start = fitting.initial_factors(times, layers)
  return {name: start[name] for name in ("t0_step", "t0_layer", "r_ovl")}


def _to_factor(name: str, u, scales: Mapping[str, float]):
  if name in EFFICIENCIES:
    return jax.nn.sigmoid(u)
  return jnp.exp(u) * scales[name]


def _from_factor(name: str, value: float, scales: Mapping[str, float]) -> float:
  if name in EFFICIENCIES:
    return float(np.log(value / (1 - value)))
  return float(np.log(value / scales[name]))


def _log_predictions(data: _Data, factors: Mapping[str, Any]):
  """Log predicted time of every row (decode first), JAX."""
  parts = []
  comm = with_comm_model("jax")
  if data.decode_s.size:
    f = {n: factors[n] for n in DECODE_FACTORS}
    floor = calibrated.decode_model("jax")(**data.decode, **f)["step_s"]
    parts.append(
        jnp.log(
            comm(t_floor=floor, t_comm=data.inputs.decode_comm_s,
                 eta_comm=factors["eta_comm"])["step_s"]))
  if data.prefill_s.size:
    f = {n: factors[n] for n in calibrated.PREFILL_FACTOR_NAMES}
    floor = calibrated.prefill_model("jax")(**data.prefill, **f)["step_s"]
    parts.append(
        jnp.log(
            comm(t_floor=floor, t_comm=data.inputs.prefill_comm_s,
                 eta_comm=factors["eta_comm"])["step_s"]))
  return jnp.concatenate(parts)


def _relevant(data: _Data) -> list[str]:
  """Factors the model of these rows contains."""
  names = set(DECODE_FACTORS) if data.decode_s.size else set()
  if data.prefill_s.size:
    names |= set(calibrated.PREFILL_FACTOR_NAMES)
  if data.has_comm:
    names |= set(COMM_FACTORS)
  return [n for n in PRIORITY if n in names]


def _start(names: Sequence[str], scales: Mapping[str, float]) -> dict[str, float]:
  start = {
      "eta_w": 0.7, "eta_kv": 0.7, "eta_f": 0.5, "eta_f_prefill": 0.5, "t0_step": scales["t0_step"],
      "t0_layer": scales["t0_layer"], "r_ovl": 1.0, "eta_comm": 0.5
  }
  return {n: _from_factor(n, start[n], scales) for n in names}


def _factors(params: Mapping[str, Any], fixed: Mapping[str, float | str],
             scales: Mapping[str, float]) -> dict[str, Any]:
  """Factor values: free ones from parameters, fixed ones by value or tie."""
  out = {n: _to_factor(n, u, scales) for n, u in params.items()}
  for name, value in fixed.items():
    out[name] = out.get(value, FIXED_VALUES[name]) if isinstance(value, str) else value
  return out


def _fixed_values(free: Sequence[str]) -> dict[str, float | str]:
  """Each factor not free: tied to its partner where that is free, else a value."""
  return {
      n: (TIES[n] if TIES.get(n) in free else FIXED_VALUES[n]) for n in ALL_FACTORS if n not in free
  }


def _choose_free(data: _Data, scales: Mapping[str, float]) -> tuple[list[str], dict[str, str]]:
  """Factors the data can determine (Jacobian rank), the rest with reasons."""
  candidates = _relevant(data)
  start = _start(candidates, scales)
  fixed_values = {n: FIXED_VALUES[n] for n in ALL_FACTORS if n not in candidates}

  def log_time(vector):
    params = dict(zip(candidates, vector))
    return _log_predictions(data, _factors(params, fixed_values, scales))

  jac = np.asarray(
      jax.jacfwd(log_time)(jnp.asarray([start[n] for n in candidates], jnp.float32)),
      dtype=np.float64)
  rows = jac.shape[0]
  free: list[str] = []
  fixed: dict[str, str] = {}
  for i, name in enumerate(candidates):
    room = max(rows // ROWS_PER_FACTOR, 1)
    if len(free) >= room:
      fixed[name] = (f"too few rows: {rows} rows leave room for {room} free "
                     f"factor(s) (one per {ROWS_PER_FACTOR} rows)")
      continue
    trial = jac[:, [candidates.index(n) for n in free] + [i]]
    norms = np.linalg.norm(trial, axis=0)
    if norms[-1] < 1e-9 * max(1.0, float(norms.max())):
      fixed[name] = "the rows do not depend on it (Jacobian column is zero)"
      continue
    if float(np.max(np.abs(jac[:, i]))) < MIN_SENSITIVITY:
      fixed[name] = ("the rows hardly depend on it (no row's log time moves by "
                     f"{MIN_SENSITIVITY:g} per unit of its parameter)")
      continue
    singular = np.linalg.svd(trial / norms, compute_uv=False)
    if singular[-1] < RANK_TOLERANCE * singular[0]:
      fixed[name] = ("the rows cannot separate it from "
                     f"{', '.join(free)} (Jacobian rank {len(free)} with it added; "
                     "too few distinct batches, contexts or models)")
      continue
    free.append(name)
  for name in ALL_FACTORS:
    if name not in candidates:
      fixed.setdefault(
          name, "no rows with communication (one chip, or the ideal tp "
          "split)" if name in COMM_FACTORS else "no rows of the phase it "
          "belongs to")
  return free, fixed


def fit_rows(rows: Sequence[um.Row], *, steps: int = 3000, learning_rate: float = 0.05,
             prior_weight: float = 1e-4, inputs: InputsFn = ideal_split_inputs) -> UserFit:
  """Fits one device's factors to measured rows (decode and prefill).

  `inputs` turns rows into model inputs (default: the ideal tp split).

  Raises:
    InputError: fewer than `MIN_ROWS` rows.
  """
  if len(rows) < MIN_ROWS:
    raise errors.InputError(
        f"rows={len(rows)} is too few to fit: give at least {MIN_ROWS} measured "
        "steps of one device.")
  data = _data(rows, inputs)
  scales = _scales(data)
  free, fixed = _choose_free(data, scales)
  start = _start(free, scales)
  fixed_values = _fixed_values(free)
  log_measured = jnp.log(jnp.asarray(np.concatenate([data.decode_s, data.prefill_s]), jnp.float32))
  start_j = {n: jnp.float32(v) for n, v in start.items()}

  def loss_fn(params):
    predicted = _log_predictions(data, _factors(params, fixed_values, scales))
    prior = sum((params[n] - start_j[n])**2 for n in free)
    return jnp.mean((predicted - log_measured)**2) + prior_weight * prior

  params, loss = fitting.minimize(loss_fn, start_j, steps=steps, learning_rate=learning_rate)
  factors = {n: float(v) for n, v in _factors(params, fixed_values, scales).items()}
  flags = tuple(f"{n} = {factors[n]:.3f} is at its ceiling (1): the rows are faster "
                "than the datasheet allows at this efficiency; check the accelerator "
                "and dtypes" for n in EFFICIENCIES if n in free and factors[n] > AT_CEILING)
  fixed_reasons = {
      n: (f"tied to {fixed_values[n]}" if isinstance(fixed_values[n], str) else
          f"fixed at {FIXED_VALUES[n]:g}") + f": {why}" for n, why in fixed.items()
  }
  return UserFit(factors=factors, free=tuple(free), fixed=fixed_reasons, flags=flags,
                 loss=float(loss), rows=len(rows))


def predict_rows(rows: Sequence[um.Row], factors: Mapping[str, float], *,
                 inputs: InputsFn = ideal_split_inputs) -> np.ndarray:
  """Calibrated prediction (seconds) of each row, in the rows' order."""
  out = np.empty(len(rows))
  decode, prefill = _split(rows)
  x = inputs(rows)
  comm = with_comm_model("numpy")
  eta_comm = factors.get("eta_comm", FIXED_VALUES["eta_comm"])
  index = {id(r): i for i, r in enumerate(rows)}
  if decode:
    f = {n: factors[n] for n in DECODE_FACTORS}
    floor = calibrated.decode_model("numpy")(**x.decode, **f)["step_s"]
    out[[index[id(r)] for r in decode]] = comm(t_floor=floor, t_comm=x.decode_comm_s,
                                               eta_comm=eta_comm)["step_s"]
  if prefill:
    f = {n: factors[n] for n in calibrated.PREFILL_FACTOR_NAMES}
    floor = calibrated.prefill_model("numpy")(**x.prefill, **f)["step_s"]
    out[[index[id(r)] for r in prefill]] = comm(t_floor=floor, t_comm=x.prefill_comm_s,
                                                eta_comm=eta_comm)["step_s"]
  return out


BOUND_NOTE = ("analytic bound at datasheet BW and F: decode = the step floor "
              "(max of memory and compute time); prefill = weights once, linear and "
              "causal attention FLOPs at peak, the larger binding, no fixed cost; on a "
              "layout, one chip's share plus the analytic communication, serial")

_IDEAL = {"eta_w": 1.0, "eta_f_prefill": 1.0, "t0_step": 0.0, "t0_layer": 0.0, "r_ovl": 1e3}


def bound_rows(rows: Sequence[um.Row], *, inputs: InputsFn = ideal_split_inputs) -> np.ndarray:
  """The analytic bound (seconds) of each row (`BOUND_NOTE`)."""
  out = np.empty(len(rows))
  decode, prefill = _split(rows)
  inp = inputs(rows)
  comm = with_comm_model("numpy")
  index = {id(r): i for i, r in enumerate(rows)}
  if decode:
    x = inp.decode
    floor = StepModel.bound().evaluate(B=x["B"], T=x["T"], N=x["N"], q=x["q"], k=x["k"], BW=x["BW"],
                                       F=x["F"], N_act=x["N_act"])["step_s"]
    out[[index[id(r)] for r in decode]] = comm(t_floor=floor, t_comm=inp.decode_comm_s,
                                               eta_comm=1.0)["step_s"]
  if prefill:
    floor = calibrated.prefill_model("numpy")(**inp.prefill, **_IDEAL)["step_s"]
    out[[index[id(r)] for r in prefill]] = comm(t_floor=floor, t_comm=inp.prefill_comm_s,
                                                eta_comm=1.0)["step_s"]
  return out
