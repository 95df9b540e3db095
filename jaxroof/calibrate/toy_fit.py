"""The toy calibration's fit and verdict: inputs, predictions, errors, status.

No timing here: `fit_steps` takes the measured operations and decode steps
(`jaxroof.measure.toy_steps`) and returns a `CalibrationRun` (the profile,
the fit's and the held-out rows, the status against `TARGET_MEDIAN` and
`TARGET_MAX`), with each factor's timing basis, its noise and sensitivity
(`timing_basis`, `basis_noise`, `basis_sensitivity`), by which
`jaxroof.calibrate.repeatability` tells whether two calibrations agree
(`REPEAT_FACTOR_REL`, `REPEAT_MEDIAN_POINTS`).
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxroof import errors
from jaxroof.calibrate import fitting
from jaxroof.calibrate import op_fit
from jaxroof.engines import xla_cpu
from jaxroof.measure import calibration_models
from jaxroof.measure import ceilings as ceilings_lib
from jaxroof.measure import measurement
from jaxroof.measure import op_sweeps
from jaxroof.measure import profiles
from jaxroof.measure import step_sweeps
from jaxroof.measure import toy_steps
from jaxroof.symbolic import calibrated as calibration
from jaxroof.symbolic.step_model import StepModel
from jaxroof.toy.config import ToyConfig

FITS = ("ops", "steps")
MIN_FIT_STEPS = 8  # Decode steps an end-to-end fit (`fit="steps"`) needs at least.
# What a calibration must reach on each held-out model to report "ok".
TARGET_MEDIAN = 0.08
TARGET_MAX = 0.20
# Two calibrations agree when (the repeatability criteria):
REPEAT_FACTOR_REL = 0.10
REPEAT_MEDIAN_POINTS = 3.0


def model_inputs(records: Sequence[measurement.Measurement], bandwidth: float,
                 flop_rate: float) -> dict[str, np.ndarray]:
  """The calibrated model's inputs of measured decode steps."""
  steps = [r.extra["step_inputs"] for r in records]

  def column(values):
    return np.asarray(values, dtype=np.float64)

  return {
      "B": column([r.shapes["batch"] for r in records]),
      "T": column([r.extra["retained_tokens"] for r in records]),
      "N": column([s["N"] for s in steps]),
      "N_act": column([s["N_act"] for s in steps]),
      "q": column([s["q"] for s in steps]),
      "k": column([s["k"] for s in steps]),
      "L": column([s["L"] for s in steps]),
      "BW": np.full(len(records), bandwidth),
      "F": np.full(len(records), flop_rate),
  }


def bound_errors(records: Sequence[measurement.Measurement],
                 inputs: Mapping[str, np.ndarray]) -> np.ndarray:
  """Relative error of the analytic bound (the step floor at the measured
  ceilings) on measured steps: the yardstick a calibrated profile must beat."""
  names = ("B", "T", "N", "q", "k", "BW", "F", "N_act")
  bound = StepModel.bound().evaluate(**{n: np.asarray(inputs[n]) for n in names})["step_s"]
  return fitting.relative_errors(np.asarray(bound), [r.median_s for r in records])


def point_row(record: measurement.Measurement, predicted: float, subset: str) -> dict[str, Any]:
  measured = record.median_s
  return {
      "model": record.extra["model"],
      "batch": record.shapes["batch"],
      "context": record.shapes["context"],
      "layers": record.shapes["layers"],
      "measured_s": measured,
      "predicted_s": predicted,
      "rel_error": abs(predicted - measured) / measured,
      "set": subset,
      "spread": record.spread,
      "round_medians_s": record.extra.get("round_medians_s", [measured]),
      "round_spread": _finite(record.extra.get("round_spread")),
      "load_avg_1m": record.extra.get("load_avg_1m"),
  }


def _finite(value: float | None) -> float | None:
  return None if value is None or not np.isfinite(value) else float(value)


def _named_configs(configs: Mapping[str, ToyConfig]) -> list[dict[str, Any]]:
  return [{"name": name, **dataclasses.asdict(c)} for name, c in configs.items()]


@dataclasses.dataclass(frozen=True)
class CalibrationRun:
  """What a calibration job measured, fitted and concluded."""

  profile: profiles.Profile
  ceilings: ceilings_lib.Ceilings
  points: list[dict[str, Any]]  # One row per measured step (`point_row`).
  records: list[measurement.Measurement]  # The decode steps.
  elapsed_s: float
  budget_s: float
  operations: list[measurement.Measurement] = dataclasses.field(default_factory=list)

  def rows(self, subset: str) -> list[dict[str, Any]]:
    return [p for p in self.points if p["set"] == subset]

  @property
  def status(self) -> str:
    return self.profile.fit.get("status", "unknown")

  @property
  def warnings(self) -> list[str]:
    return list(self.profile.fit.get("warnings", []))

  def to_json(self) -> dict[str, Any]:
    fit = self.profile.fit
    model = self.profile.model
    return {
        "kind": "calibrated",
        "what": ("calibrated step model: factors fitted from " +
                 ("operation sweeps and the smallest decode steps" if fit.get("method") == "ops"
                  else "decode steps") + " of the fit models; error measured on held-out models"),
        "device_kind": self.profile.device_kind,
        "platform": self.profile.platform,
        "backend": self.profile.backend,
        "dtype": self.profile.dtype,
        "jax_version": self.profile.jax_version,
        "created": self.profile.created,
        "method": self.profile.method,
        "fit": fit.get("method"),
        "status": fit.get("status"),
        "warnings": list(fit.get("warnings", [])),
        "targets": fit.get("targets"),
        "heldout_median_rel_error": fit["heldout_median_rel_error"],
        "heldout_max_rel_error": fit["heldout_max_rel_error"],
        "heldout_by_model": fit.get("heldout_by_model"),
        "train_median_rel_error": fit["train_median_rel_error"],
        "train_max_rel_error": fit["train_max_rel_error"],
        "fit_models": model.get("fit_models", []),
        "heldout_models": model.get("heldout_models", []),
        "factors": dict(self.profile.factors),
        "regime_factors": dict(self.profile.regime_factors),
        "factor_units": dict(calibration.FACTOR_UNITS),
        "operation_fit": fit.get("operations"),
        "expression": str(calibration.calibrated_step()),
        "readable_expression": calibration.readable_step(),
        "ceilings": self.ceilings.to_json(),
        "load": fit.get("load"),
        "training_points": self.rows("train"),
        "heldout_points": self.rows("heldout"),
        "model": dict(model),
        "budget_s": self.budget_s,
        "elapsed_s": self.elapsed_s,
        "measurements": [r.to_json() for r in self.records],
        "operations": [r.to_json() for r in self.operations],
    }


def _now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def errors_by_model(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
  out = {}
  for name in sorted({r["model"] for r in rows}):
    out[name] = fitting.error_summary([r["rel_error"] for r in rows if r["model"] == name])
  return out


def assess(rows: Sequence[Mapping[str, Any]], expected: int, *, spread_limit: float = 0.08,
           load: Mapping[str, Any] | None = None) -> tuple[str, list[str]]:
  """The run's status and its warnings, from its held-out rows.

  "ok" only when every held-out model is within `TARGET_MEDIAN` and
  `TARGET_MAX`; "inaccurate" when one is not; "incomplete" when fewer
  held-out points were measured than planned (the budget ran out).
  """
  warnings = []
  status = "ok"
  if len(rows) < expected:
    status = "incomplete"
    warnings.append(f"only {len(rows)} of {expected} held-out points were "
                    "measured: give a larger budget_s")
  for name, errs in errors_by_model(rows).items():
    if errs["median_rel_error"] > TARGET_MEDIAN or (errs["max_rel_error"] > TARGET_MAX):
      status = "inaccurate" if status == "ok" else status
      warnings.append(f"held-out model {name}: median {errs['median_rel_error']:.1%}, max "
                      f"{errs['max_rel_error']:.1%} misses the target (median <= "
                      f"{TARGET_MEDIAN:.0%}, max <= {TARGET_MAX:.0%})")
  if not rows:
    status = "incomplete"
  unsettled = [r for r in rows if r["round_spread"] is None or r["round_spread"] > spread_limit]
  if unsettled:
    warnings.append(f"{len(unsettled)} of {len(rows)} held-out points still vary by more "
                    f"than {spread_limit:.0%} between their fastest rounds (a busy "
                    "machine?): their errors include that noise")
  cores = (load or {}).get("cpu_count")
  busiest = (load or {}).get("load_avg_1m_max")
  if cores and busiest is not None and busiest > cores:
    warnings.append(f"the load average reached {busiest:.1f} on {cores} "
                    "cores during the timings: other processes competed")
  return status, warnings


def noise_floor(rows: Sequence[Mapping[str, Any]]) -> float | None:
  """The median spread between a point's fastest rounds (`round_spread`): how
  far the same step's timing moves on this machine, a floor for any error."""
  spreads = [r["round_spread"] for r in rows if r.get("round_spread") is not None]
  return float(np.median(spreads)) if spreads else None


def point_key(record: measurement.Measurement) -> str:
  """A timed point's name, the same in every run that times it."""
  s = record.shapes
  if record.op == "linear":
    return f"linear M={s['rows']} {s['d_in']}x{s['d_out']}"
  if record.op == "decode_attention":
    return f"attention B={s['batch']} T={s['context']} kv_heads={s['kv_heads']}"
  return f"step {record.extra['model']} B={s['batch']} T={s['context']}"


def fitted_attention(operations: Sequence[measurement.Measurement],
                     models: Mapping[str, ToyConfig]) -> list[measurement.Measurement]:
  """The timed attention at the fit models' own K/V layouts (not the layout probe's)."""
  layouts = {(c.num_heads, c.num_kv_heads) for c in models.values()}
  return [
      r for r in operations
      if r.op == "decode_attention" and (r.shapes["heads"], r.shapes["kv_heads"]) in layouts
  ]


def _kv_rates(operations: Sequence[measurement.Measurement]) -> list[tuple[tuple[int, int], float]]:
  """((heads, kv_heads), K/V bytes per second) of each K/V-heavy attention timing."""
  out = []
  for r in operations:
    s = r.shapes
    if r.op != "decode_attention" or s["batch"] * s["context"] < op_fit.KV_STEP_TOKENS:
      continue
    point = op_sweeps.OpPoint(r.op,
                              (s["batch"], s["context"], s["heads"], s["kv_heads"], s["head_dim"]))
    nbytes = toy_steps.attention_kv_bytes(point, measurement.require_dtype(r.dtype))
    out.append(((s["heads"], s["kv_heads"]), nbytes / r.median_s))
  return out


def _midway(rates: Sequence[float]) -> float:
  """The single rate that misses the fastest and the slowest alike."""
  return (min(rates) + max(rates)) / 2


def layout_floor(operations: Sequence[measurement.Measurement]) -> dict[str, Any] | None:
  """How far one K/V rate can hold over the K/V-heavy attention timed at two or more
  K/V layouts (`toy_steps.layout_probe`); None with fewer.

  Each point's rate is its K/V bytes over its time. One rate predicts them all at
  best with a relative error of (max - min) / (max + min) (the rate midway), so a
  K/V-heavy step of a layout the fit never saw can miss by about that much whatever
  the fit: a floor of the machine and of XLA's attention, not of the fit.
  """
  rated = _kv_rates(operations)
  layouts = sorted({layout for layout, _ in rated})
  if len(layouts) < 2:
    return None
  rates = [rate for _, rate in rated]
  low, high = min(rates), max(rates)
  return {
      "layouts_heads_kv_heads": [list(x) for x in layouts], "points": len(rated),
      "kv_rate_min_Bps": low, "kv_rate_max_Bps": high,
      "floor_rel_error": (high - low) / (high + low),
      "what": "one layer's decode attention timed alone at K/V-heavy shapes (batch x "
              f"context >= {op_fit.KV_STEP_TOKENS}) over these K/V layouts: the error of the "
              "best single K/V rate (midway), a floor for K/V-heavy steps of an unseen layout"
  }


def layout_scale(operations: Sequence[measurement.Measurement],
                 models: Mapping[str, ToyConfig]) -> float | None:
  """The midway K/V rate over every timed layout over the midway rate over the fit
  models' own (None without a second layout).

  `eta_kv` is fitted where the fit models' K/V is read, so it carries their layout's
  rate. A model the fit never saw has another layout, whose rate is unknown; the one
  rate that misses no timed layout by more than the floor is the midway one over all
  of them, so the ops fit scales `eta_kv` by this ratio.
  """
  own = {(c.num_heads, c.num_kv_heads) for c in models.values()}
  rated = _kv_rates(operations)
  fitted = [rate for layout, rate in rated if layout in own]
  if not fitted or len({layout for layout, _ in rated}) < 2:
    return None
  return _midway([rate for _, rate in rated]) / _midway(fitted)


def _median_s(record: measurement.Measurement) -> float:
  return record.median_s


def _round_spread(record: measurement.Measurement) -> float | None:
  spread = record.extra.get("round_spread")
  return None if spread is None or not math.isfinite(spread) else float(spread)


def timing_basis(
    measured: "Measured", fit: str, regime: bool, models: Mapping[str, ToyConfig],
    value: Callable[[measurement.Measurement], float | None] = _median_s
) -> dict[str, dict[str, float]]:
  """Per factor, the medians of the timed points it was fitted from (and the
  held-out steps under "heldout"), so that a later run can tell a factor that
  moved from the data it stands on moving (`compare_profiles`). The steps are
  chosen as `op_fit.fit_operations` chooses them (`op_fit.step_subsets`).
  `value` takes another figure of each point (`basis_noise`: its round spread)."""

  def medians(records) -> dict[str, float]:
    return {point_key(r): v for r in records if (v := value(r)) is not None}

  steps = measured.fit_records
  basis = {"heldout": medians(measured.heldout_records)}
  if fit != "ops":
    return {**basis, **{n: medians(steps) for n in calibration.FACTOR_NAMES}}
  linear = [r for r in measured.operations if r.op == "linear"]
  ceilings = measured.ceilings
  subsets = op_fit.step_subsets(model_inputs(steps, ceilings.bandwidth_Bps, 1.0), regime)
  fixed = [r for r, use in zip(steps, subsets["fixed"]) if use]
  refit = [r for r, use in zip(steps, subsets["refit"]) if use]
  basis["eta_w"] = medians(r for r in linear if r.shapes["rows"] == 1)
  basis["eta_f"] = basis["r_ovl"] = medians(r for r in linear if r.shapes["rows"] > 1)
  basis["eta_kv"] = (medians(refit) if "eta_kv" in subsets["refit_free"] else medians(
      fitted_attention(measured.operations, models)))
  basis["t0_step"] = basis["t0_layer"] = medians(fixed)
  if "r_pack" in subsets["refit_free"]:
    basis["r_pack"] = medians(refit)
  return basis


def basis_noise(measured: "Measured", fit: str, regime: bool,
                models: Mapping[str, ToyConfig]) -> dict[str, float]:
  """Per factor, the median round spread of its timed points within this run
  (`step_sweeps.round_spread`): how far the machine moved the data under it
  from round to round, below which no two runs' factor can be told apart."""
  spreads = timing_basis(measured, fit, regime, models, value=_round_spread)
  return {n: float(np.median(list(v.values()))) for n, v in spreads.items() if v}


def basis_sensitivity(measured: "Measured", models: Mapping[str, ToyConfig],
                      sensitivity: Mapping[str, np.ndarray] | None) -> dict[str, dict[str, float]]:
  """Per factor, d log(factor) / d log(time) of each timed point it moves with
  (`op_fit.fit_sensitivity`), by point name; empty for a fit without them
  (`fit="steps"`)."""
  if not sensitivity:
    return {}
  linear = [r for r in measured.operations if r.op == "linear"]
  points = ([r for r in linear if r.shapes["rows"] == 1] +
            [r for r in linear if r.shapes["rows"] > 1] +
            fitted_attention(measured.operations, models) + measured.fit_records)
  return {
      n: {point_key(r): float(v) for r, v in zip(points, row, strict=True) if v != 0.0}
      for n, row in sensitivity.items()
  }


@dataclasses.dataclass(frozen=True)
class Measured:
  """What a toy calibration timed, ready to fit."""

  ceilings: ceilings_lib.Ceilings
  operations: list[measurement.Measurement]  # Linear layers and decode attention.
  fit_records: list[measurement.Measurement]  # The fit models' decode steps.
  heldout_records: list[measurement.Measurement]  # The held-out models' steps.
  heldout_planned: int  # Held-out points the plan asked for.


def _fit_factors(
    measured: Measured, fit: str, regime: bool, inputs: Mapping[str, np.ndarray], bandwidth: float,
    flop_rate: float, models: Mapping[str, ToyConfig]
) -> tuple[dict[str, float], dict[str, float], dict[str, Any], float | None]:
  """The factors, the regime factors, the operation fit's details and the loss."""
  if fit == "ops":
    factors, details = op_fit.fit_operations([r for r in measured.operations if r.op == "linear"],
                                             fitted_attention(measured.operations, models),
                                             measured.fit_records, inputs, bandwidth=bandwidth,
                                             flop_rate=flop_rate, regime=regime)
    scale = layout_scale(measured.operations, models)
    if scale is not None:
      details["attention"]["eta_kv_own_layouts"] = factors["eta_kv"]
      details["attention"]["layout_scale"] = scale
      factors["eta_kv"] *= scale
    regime_factors = {n: factors.pop(n) for n in xla_cpu.TERM_NAMES if n in factors}
    return factors, regime_factors, details, None
  if len(measured.fit_records) < MIN_FIT_STEPS:
    raise errors.InputError(
        f"only {len(measured.fit_records)} fit points were measured: the fit needs at "
        f"least {MIN_FIT_STEPS}; give a larger budget_s.", field="budget_s")
  result = fitting.fit_factors(inputs, np.asarray([r.median_s for r in measured.fit_records]))
  return result.factors, {}, {}, result.loss


def fit_steps(measured: Measured, *, fit: str, dtype: str, backend: str, regime: bool,
              models: Mapping[str, ToyConfig], heldout_models: Mapping[str, ToyConfig],
              budget_s: float, plan: Mapping[str, Any]) -> CalibrationRun:
  """Fits the factors, predicts every measured step, and judges the held-out ones.

  Args:
    measured: the timed operations and steps (`jaxroof.calibrate.toy_job.run`).
    fit: "ops" (factors from the operations, fixed costs from the smallest
      steps) or "steps" (every factor from the fit models' steps).
    dtype: the weights' and K/V's dtype name.
    backend: the operations' backend ("xla" or "pallas").
    regime: also fit XLA:CPU's weight re-pack (`fit="ops"` only).
    models, heldout_models: the fit's and the held-out toy models.
    budget_s: the job's budget, recorded.
    plan: rounds, warmup, repeats and interleaved, recorded in the profile.

  Returns:
    The run with its profile; `elapsed_s` is the caller's to set.
  """
  errors.require_choice("fit", fit, FITS)
  if not measured.heldout_records:
    raise errors.InputError("no held-out point was measured: give a larger budget_s.",
                            field="budget_s")
  if not measured.fit_records:
    raise errors.InputError("no fit point was measured: give a larger budget_s.", field="budget_s")
  ceilings = measured.ceilings
  bandwidth, flop_rate = ceilings.bandwidth_Bps, ceilings.flop_rate(dtype)
  fit_inputs = model_inputs(measured.fit_records, bandwidth, flop_rate)
  factors, regime_factors, details, loss = _fit_factors(measured, fit, regime, fit_inputs,
                                                        bandwidth, flop_rate, models)
  sensitivity = details.pop("sensitivity", None)
  every = {**factors, **regime_factors}
  rows = [
      point_row(r, float(p), "train")
      for r, p in zip(measured.fit_records, fitting.predict(fit_inputs, every))
  ]
  held_inputs = model_inputs(measured.heldout_records, bandwidth, flop_rate)
  rows += [
      point_row(r, float(p), "heldout")
      for r, p in zip(measured.heldout_records, fitting.predict(held_inputs, every))
  ]
  held_rows = [r for r in rows if r["set"] == "heldout"]
  steps = measured.fit_records + measured.heldout_records
  load = toy_steps.load_summary(measured.operations + steps)
  status, warnings = assess(held_rows, measured.heldout_planned, load=load)
  floor = noise_floor(held_rows)
  if status != "ok" and floor is not None:
    warnings.append(f"this machine's floor: the same held-out point's fastest rounds "
                    f"differ by {floor:.1%} (median over the points), which no fit "
                    "can go below")
  layouts = layout_floor(measured.operations)
  if status != "ok" and layouts is not None:
    named = ", ".join(f"{h}/{k}" for h, k in layouts["layouts_heads_kv_heads"])
    warnings.append(
        f"one layer's attention, timed alone at K/V-heavy shapes with query/K-V heads "
        f"{named}, reads K/V at {layouts['kv_rate_min_Bps'] / 1e9:.1f}-"
        f"{layouts['kv_rate_max_Bps'] / 1e9:.1f} GB/s: one K/V rate misses some by "
        f"{layouts['floor_rel_error']:.0%}, a floor for K/V-heavy steps of a layout the fit "
        "never saw")
  bound_errs = fitting.error_summary(bound_errors(measured.heldout_records, held_inputs))
  fit_info: dict[str, Any] = {
      "basis": timing_basis(measured, fit, regime and fit == "ops", models),
      "basis_round_spread": basis_noise(measured, fit, regime and fit == "ops", models),
      "basis_sensitivity": basis_sensitivity(measured, models, sensitivity),
      "point_median_s": {point_key(r): r.median_s for r in measured.operations + steps},
      "point_round_spread": {
          point_key(r): spread for r in measured.operations + steps
          if (spread := _round_spread(r)) is not None
      },
      "noise_floor_median_round_spread": floor,
      "attention_layout_floor": layouts,
      "method": fit,
      "loss": loss,
      "statistic": step_sweeps.STATISTIC,
      "objective": "mean squared log error (Adam on log factors)",
      "status": status,
      "warnings": warnings,
      "targets": {
          "heldout_median_rel_error": TARGET_MEDIAN, "heldout_max_rel_error": TARGET_MAX,
          "per": "held-out model"
      },
      "heldout_by_model": errors_by_model(held_rows),
      "fastest_fit_step_s": min(r.median_s for r in measured.fit_records),
      "operations": details,
      "load": load,
      "heldout_by": "model",
      "bound_heldout_median_rel_error": bound_errs["median_rel_error"],
      "bound_heldout_max_rel_error": bound_errs["max_rel_error"],
  }
  for subset in ("train", "heldout"):
    errs = fitting.error_summary([r["rel_error"] for r in rows if r["set"] == subset])
    fit_info[f"{subset}_median_rel_error"] = errs["median_rel_error"]
    fit_info[f"{subset}_max_rel_error"] = errs["max_rel_error"]
    fit_info[f"{subset}_points"] = errs["points"]
  known = {**models, **heldout_models}
  dtype_value = measurement.require_dtype(dtype)
  model_info = {
      "configs": {name: dataclasses.asdict(c) for name, c in known.items()},
      "fit_models": _named_configs(models),
      "heldout_models": _named_configs(heldout_models),
      "step_inputs": {
          name: calibration_models.step_inputs(c, dtype_value).to_json()
          for name, c in known.items()
      },
      "points": len(rows),
      "operations": len(measured.operations),
      **plan,
  }
  device = measurement.current_device()
  prof = profiles.Profile(
      device_kind=device.device_kind, platform=device.platform,
      backend=backend if fit == "ops" else "xla", dtype=dtype, jax_version=device.jax_version,
      created=_now(), ceilings={
          "bandwidth_Bps": ceilings.bandwidth_Bps,
          "copy_bandwidth_Bps": ceilings.copy_bandwidth_Bps,
          "read_bandwidth_Bps": ceilings.read_bandwidth_Bps,
          "flops_per_s": dict(ceilings.flops_per_s)
      }, factors=factors, fit=fit_info, model=model_info, terms=regime_factors,
      method=(f"{steps[0].method}; {step_sweeps.STATISTIC} of up to {plan['rounds']} "
              "rounds visiting the points in random order, points whose fastest "
              "rounds disagree re-measured; cache donated; "
              f"{measurement.allocator()}"))
  return CalibrationRun(profile=prof, ceilings=ceilings, points=rows, records=steps, elapsed_s=0.0,
                        budget_s=budget_s, operations=measured.operations)
