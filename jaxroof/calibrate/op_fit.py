"""The calibrated model's factors, fitted from operation timings.

The calibrated step (`jaxroof.symbolic.calibrated`) is a sum of terms, and
each term belongs to one operation, so each factor is fitted where its
operation is timed alone:

* `eta_w`, `eta_f`, `r_ovl`: the linear layer x (M, d_in) @ w (d_in, d_out) at
  the toy step's shapes over M = 1 ... 2048, as the step's `linear_s` with
  N = d_in * d_out weights and B = M rows. In stages: `eta_w` from M = 1
  (where weights dominate), then `eta_f` and `r_ovl` from M >= 2 with it
  held, alternated `ALTERNATIONS` times. A joint fit lets the many M >= 2
  points pull `eta_w` away from what M = 1 shows; on XLA:CPU, whose M = 2-16
  matmuls are slower per row than its M = 1 and M >= 64 ones, that made
  batch-1 steps 30-130% slower in prediction than measured;
* `eta_kv`: one layer's decode attention over batch x context, as the
  step's `kv_s` with that layer's K/V bytes per position; then, where the fit
  models' K/V-heavy steps were timed (`KV_STEP_TOKENS` retained tokens or
  more), refitted on the fit models' steps (the K/V-heavy ones; on a CPU every
  step at B >= 2, with `r_pack`) with every other factor held: XLA reads K/V faster
  inside a whole step than in the attention timed alone (on this CPU about
  26 against 16 GB/s), so the operation's `eta_kv` over-predicted K/V-heavy
  steps by up to 50%. The shipped fit models' steps have two K/V layouts (on this
  CPU the same bytes read up to 45% faster or slower in another); where the fit
  models share one, the caller (`toy_fit.layout_scale`) moves `eta_kv` to the rate
  midway between theirs and a probe layout's;
* `r_pack` (a CPU, below): fitted from the linear layer at M >= 2, then refitted with
  `eta_kv` on the fit models' steps at B >= 2 (every other factor held). The
  operation's figure (about 0.45 weight reads here, beside it as
  `r_pack_operation`) over-predicted those steps by about 12% at B = 2, and so
  every held-out model at B = 4-16; it also moved with the M = 1 timings, which
  vary about 10% between processes, while the whole steps at B >= 2 repeat
  within about 2%;
* `t0_step`, `t0_layer`: the fit models' batch-1 decode steps at short
  contexts (two depths), the other factors held at their operation values.

With `regime=True` (a CPU: XLA's GEMM re-packs the weights for two or more
rows, about 1.5 weight reads) the model has the re-pack term
(`jaxroof.engines.xla_cpu`) and `r_pack` is fitted with `eta_f` and `r_ovl`
from M >= 2; without it `r_pack` is 0 (accelerators) and not returned.

With the factors the fit returns how each moves with its timed points
(`fit_sensitivity`, `details["sensitivity"]`): d log(factor) / d log(time), the
Gauss-Newton linearisation chained through the stages. On this CPU `eta_kv`
moves -0.6 to -0.8x with the shallow model's 16 x 2048 step and -0.2 to -0.6x with
each other K/V-heavy one; `r_pack` +2.5 to +3x with each B = 2 step.

A single operation call has a fixed cost of its own (dispatch, launch) that a
step does not pay per operation; each operation fit absorbs it in a nuisance
`t0_step` that is not carried over. All fits go through
`fitting.fit_factors` (optax, log space).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxroof import errors
from jaxroof.calibrate import fitting
from jaxroof.engines import xla_cpu
from jaxroof.measure import measurement
from jaxroof.symbolic import formulas
from jaxroof.symbolic.calibrated import FACTOR_NAMES

LINEAR_FACTORS = ("eta_w", "eta_f", "r_ovl")
ATTENTION_FACTORS = ("eta_kv",)
FIXED_FACTORS = ("t0_step", "t0_layer")
_CALL_COST = "t0_step"  # The nuisance of an operation fit (one call's cost).
ALTERNATIONS = 3  # Rounds of (eta_w from M = 1, then eta_f and r_ovl).
REPACK_START = 0.5  # r_pack's start (weight reads), fitted from M >= 2.
KV_STEP_TOKENS = 8192  # Retained tokens (batch x context) of a K/V-heavy fit step.


def _column(values) -> np.ndarray:
  return np.asarray(values, dtype=np.float64)


def linear_inputs(records: Sequence[measurement.Measurement], bandwidth: float,
                  flop_rate: float) -> dict[str, np.ndarray]:
  """Calibrated-model inputs of timed linear layers (no K/V, no layers)."""
  n = _column([r.shapes["d_in"] * r.shapes["d_out"] for r in records])
  zeros = np.zeros(len(records))
  return {
      "B": _column([r.shapes["rows"] for r in records]), "T": zeros, "N": n, "N_act": n,
      "q": _column([_itemsize(r) for r in records]), "k": zeros, "L": zeros,
      "BW": np.full(len(records), bandwidth), "F": np.full(len(records), flop_rate)
  }


def attention_inputs(records: Sequence[measurement.Measurement], bandwidth: float,
                     flop_rate: float) -> dict[str, np.ndarray]:
  """Calibrated-model inputs of one layer's timed decode attention.

  Its K/V bytes per position are one layer's; no weights are read (N = 1,
  a negligible stand-in that keeps the linear term defined).
  """
  ones = np.ones(len(records))
  k = _column([
      float(
          formulas.kv_bytes_per_position(1, r.shapes["kv_heads"], r.shapes["head_dim"],
                                         _itemsize(r))) for r in records
  ])
  return {
      "B": _column([r.shapes["batch"] for r in records]),
      "T": _column([r.shapes["context"] for r in records]), "N": ones, "N_act": ones, "q": ones,
      "k": k, "L": np.zeros(len(records)), "BW": np.full(len(records), bandwidth),
      "F": np.full(len(records), flop_rate)
  }


def _itemsize(record: measurement.Measurement) -> int:
  return int(np.dtype(measurement.require_dtype(record.dtype)).itemsize)


def _medians(records: Sequence[measurement.Measurement]) -> np.ndarray:
  return _column([r.median_s for r in records])


def _scored(inputs: Mapping[str, np.ndarray], measured: np.ndarray,
            factors: Mapping[str, float]) -> dict[str, Any]:
  rel = fitting.relative_errors(fitting.predict(inputs, factors), measured)
  return fitting.error_summary(rel)


def _start(measured: np.ndarray) -> dict[str, float]:
  return fitting.initial_factors(measured, np.ones(1))


def step_subsets(step_inputs: Mapping[str, np.ndarray], regime: bool) -> dict[str, Any]:
  """Which of the fit models' steps each step stage of `fit_operations` uses.

  "fixed": the smallest batch (`t0_step`, `t0_layer`); "refit": the steps `eta_kv`
  (and with `regime` `r_pack`) are refitted on, B >= 2 with a re-pack, else the
  K/V-heavy ones (`KV_STEP_TOKENS`); "refit_free": the factors that refit frees
  (eta_kv only where K/V-heavy steps were timed), empty for none.
  """
  batches = np.asarray(step_inputs["B"])
  heavy = batches * np.asarray(step_inputs["T"]) >= KV_STEP_TOKENS
  batched = batches >= 2
  free = (("eta_kv",) if heavy.any() else ()) + (xla_cpu.TERM_NAMES if regime and batched.any() else
                                                 ())
  return {
      "fixed": batches == np.min(batches), "refit": batched if regime else heavy, "refit_free": free
  }


def fit_linear(single: Sequence[measurement.Measurement], many: Sequence[measurement.Measurement],
               *, bandwidth: float, flop_rate: float, fit_steps: int = 2000,
               regime: bool = False) -> dict[str, float]:
  """The linear layer's factors, in stages (module docstring).

  `single`: timings at M = 1; `many`: at M >= 2. Returns every factor name,
  `t0_step` being the timed call's own cost (a nuisance, fitted with `eta_w`
  at M = 1 only, so that what M >= 2 cannot explain does not move it); with
  `regime`, `r_pack` too, fitted from M >= 2 (M = 1 does not re-pack).
  """
  x1, t1 = linear_inputs(single, bandwidth, flop_rate), _medians(single)
  xm, tm = linear_inputs(many, bandwidth, flop_rate), _medians(many)
  current = {**_start(t1), "eta_f": 0.5, "r_ovl": 1.0}
  many_free: tuple[str, ...] = ("eta_f", "r_ovl")
  if regime:
    current["r_pack"] = REPACK_START
    many_free += xla_cpu.TERM_NAMES
  for _ in range(ALTERNATIONS):
    current = fitting.fit_factors(x1, t1, init=current, steps=fit_steps,
                                  free=("eta_w", _CALL_COST)).factors
    current = fitting.fit_factors(xm, tm, init=current, steps=fit_steps, free=many_free).factors
  return current


def fit_operations(
    linear: Sequence[measurement.Measurement],
    attention: Sequence[measurement.Measurement],
    steps: Sequence[measurement.Measurement],
    step_inputs: Mapping[str, np.ndarray],
    *,
    bandwidth: float,
    flop_rate: float,
    fit_steps: int = 2000,
    regime: bool = False,
) -> tuple[dict[str, float], dict[str, Any]]:
  """Fits every factor from operations, the fixed costs from small steps.

  Args:
    linear: timed linear layers (`op_sweeps.op_sweep`).
    attention: timed one-layer decode attention.
    steps: the smallest timed decode steps of the fit's models; those at
      the smallest batch fit the fixed costs.
    step_inputs: their calibrated-model inputs (`toy_fit.model_inputs`).
    bandwidth, flop_rate: the measured ceilings the factors are fractions of.
    fit_steps: Adam steps of each fit.
    regime: fit the re-pack term's `r_pack` too (a CPU); it is then in the
      returned factors, which hold `FACTOR_NAMES` otherwise.

  Returns:
    The factors, and per stage: the points, the fit's error on them and the
    nuisance call cost of each operation; under "sensitivity" the numpy rows of
    `fit_sensitivity` (not JSON: `toy_fit.fit_steps` names them by point).
  """
  for name, group, least in (("linear", linear, 3), ("attention", attention, 2), ("steps", steps,
                                                                                  2)):
    if len(group) < least:
      raise errors.InputError(
          f"only {len(group)} {name} points were measured: the operation fit "
          f"needs at least {least}; give a larger budget_s.", field="budget_s")
  details: dict[str, Any] = {}
  single = [r for r in linear if r.shapes["rows"] == 1]
  many = [r for r in linear if r.shapes["rows"] > 1]
  if not single or len(many) < 2:
    raise errors.InputError(
        f"the linear layer was measured at {len(single)} points with M = 1 and "
        f"{len(many)} with M >= 2: the fit needs at least 1 and 2; give a "
        "larger budget_s.", field="budget_s")
  linear_fit = fit_linear(single, many, bandwidth=bandwidth, flop_rate=flop_rate,
                          fit_steps=fit_steps, regime=regime)
  factors = {n: linear_fit[n] for n in LINEAR_FACTORS + (xla_cpu.TERM_NAMES if regime else ())}
  x = linear_inputs(linear, bandwidth, flop_rate)
  details["linear"] = {
      "points": len(linear), "points_m1": len(single), "call_cost_s": linear_fit[_CALL_COST],
      **_scored(x, _medians(linear), linear_fit)
  }
  x = attention_inputs(attention, bandwidth, flop_rate)
  t = _medians(attention)
  fit = fitting.fit_factors(x, t, init=_start(t), steps=fit_steps,
                            free=ATTENTION_FACTORS + (_CALL_COST,))  # N = 1: no re-pack.
  attention_fit = fit.factors
  factors["eta_kv"] = fit.factors["eta_kv"]
  details["attention"] = {
      "points": len(attention), "call_cost_s": fit.factors[_CALL_COST],
      **_scored(x, t, fit.factors)
  }
  subsets = step_subsets(step_inputs, regime)
  smallest = subsets["fixed"]
  fixed_inputs = {n: np.asarray(v)[smallest] for n, v in step_inputs.items()}
  t = _medians(steps)[smallest]
  start = {**_start(t), **factors}
  start["t0_layer"] = 0.1 * float(np.min(t) / np.max(fixed_inputs["L"]))
  fit = fitting.fit_factors(fixed_inputs, t, init=start, steps=fit_steps, free=FIXED_FACTORS)
  factors.update({n: fit.factors[n] for n in FIXED_FACTORS})
  details["fixed"] = {"points": int(smallest.sum()), **_scored(fixed_inputs, t, factors)}
  chosen, free = subsets["refit"], subsets["refit_free"]
  before_refit = dict(factors)
  if free:
    refit_inputs = {n: np.asarray(v)[chosen] for n, v in step_inputs.items()}
    t = _medians(steps)[chosen]
    fit = fitting.fit_factors(refit_inputs, t, init=dict(factors), steps=fit_steps, free=free)
    if "eta_kv" in free:
      details["attention"]["eta_kv_operation"] = factors["eta_kv"]
    if "r_pack" in free:
      details["linear"]["r_pack_operation"] = factors["r_pack"]
    factors.update({n: fit.factors[n] for n in free})
    details["step_refit"] = {
        "points": int(chosen.sum()), "free": list(free), **_scored(refit_inputs, t, factors)
    }
  details["sensitivity"] = fit_sensitivity([
      linear_inputs(single, bandwidth, flop_rate),
      linear_inputs(many, bandwidth, flop_rate),
      attention_inputs(attention, bandwidth, flop_rate), step_inputs
  ], subsets, [linear_fit, attention_fit, before_refit, factors])
  names = FACTOR_NAMES + (xla_cpu.TERM_NAMES if regime else ())
  return {n: factors[n] for n in names}, details


def _stage_sensitivity(x: Mapping[str, np.ndarray], at: Mapping[str, float], free: Sequence[str],
                       chosen: np.ndarray, held: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Rows over every point of one least-squares stage's free factors: they follow the
  stage's own points (`chosen`) and, through the model's slopes at `at`, the rows of
  the factors it holds (`held`), the other way."""
  inverse = fitting.sensitivity(fitting.log_slopes(x, at, free))
  out = np.zeros((len(free), len(chosen)))
  out[:, chosen] = inverse
  if held:
    out -= inverse @ fitting.log_slopes(x, at, tuple(held)) @ np.stack(list(held.values()))
  return dict(zip(free, out))


def fit_sensitivity(inputs: Sequence[Mapping[str, np.ndarray]], subsets: Mapping[str, Any],
                    ended_at: Sequence[Mapping[str, float]]) -> dict[str, np.ndarray]:
  """d log(factor) / d log(time) of every factor over every timed point, the
  stages of `fit_operations` linearised (`fitting.sensitivity`, with the fit's weak
  prior held at its start, though each stage starts where the data put the last)
  and chained: a stage's free factors follow its own points and, through the
  model's slopes, the factors it holds, so `eta_kv` refitted on the steps moves
  with the M = 1 linear layers too, through `eta_w`. `fit_linear`'s alternation is
  taken as converged (`_alternation_sensitivity`). A probe layout's
  `toy_fit.layout_scale` is not in it.

  Args:
    inputs: the model inputs of the linear layer at M = 1, at M >= 2, of the
      attention and of the fit models' steps; the points are in this order.
    subsets: `step_subsets` of the steps.
    ended_at: the factors the linear stages, the attention stage, the fixed
      stage and the step refit ended at.

  Returns:
    Per factor, a row over every point, in the order of `inputs`.
  """
  starts = np.cumsum([0] + [len(np.asarray(x["B"])) for x in inputs])

  def columns(part: int, mask: np.ndarray | None = None) -> np.ndarray:
    chosen = np.zeros(starts[-1], dtype=bool)
    chosen[starts[part]:starts[part + 1]] = True if mask is None else mask
    return chosen

  def rows_of(part: int, mask: np.ndarray) -> dict[str, np.ndarray]:
    return {n: np.asarray(v)[mask] for n, v in inputs[part].items()}

  linear_at, attention_at, fixed_at, refit_at = ended_at
  rows = _alternation_sensitivity(inputs[0], inputs[1], linear_at, columns(0), columns(1))
  rows["eta_kv"] = _stage_sensitivity(inputs[2], attention_at, ("eta_kv", _CALL_COST), columns(2),
                                      {})["eta_kv"]
  fixed = np.asarray(subsets["fixed"])
  rows.update(
      _stage_sensitivity(rows_of(3, fixed), fixed_at, FIXED_FACTORS, columns(3, fixed), dict(rows)))
  free = tuple(subsets["refit_free"])
  if free:
    chosen = np.asarray(subsets["refit"])
    held = {n: v for n, v in rows.items() if n not in free}
    rows.update(_stage_sensitivity(rows_of(3, chosen), refit_at, free, columns(3, chosen), held))
  return rows


def _alternation_sensitivity(single: Mapping[str, np.ndarray], many: Mapping[str, np.ndarray],
                             at: Mapping[str, float], single_columns: np.ndarray,
                             many_columns: np.ndarray) -> dict[str, np.ndarray]:
  """`fit_linear`'s factors over every point, its alternation taken at its fixed
  point: `eta_w` (and the call cost) optimal on M = 1 given the M >= 2 factors, and
  they optimal on M >= 2 given it, linearised and solved together."""
  first = ("eta_w", _CALL_COST)
  second = ("eta_f", "r_ovl") + tuple(n for n in xla_cpu.TERM_NAMES if n in at)
  inverse_1 = fitting.sensitivity(fitting.log_slopes(single, at, first))
  inverse_2 = fitting.sensitivity(fitting.log_slopes(many, at, second))
  coupling = np.block([[np.eye(len(first)), inverse_1 @ fitting.log_slopes(single, at, second)],
                       [inverse_2 @ fitting.log_slopes(many, at, first),
                        np.eye(len(second))]])
  own = np.zeros((len(first) + len(second), len(single_columns)))
  own[:len(first), single_columns] = inverse_1
  own[len(first):, many_columns] = inverse_2
  solved = dict(zip(first + second, np.linalg.solve(coupling, own)))
  return {n: solved[n] for n in ("eta_w",) + second}
