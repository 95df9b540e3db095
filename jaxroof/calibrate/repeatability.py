"""Whether two toy calibrations agree, and what in their timings moved a factor.

Two calibrations agree when their factors lie within `toy_fit.REPEAT_FACTOR_REL` (the
efficiencies compared as the rates they give: `effective_rates`) and their held-out
medians within `toy_fit.REPEAT_MEDIAN_POINTS` points. A factor that moved beyond that
is the machine's when the fit's response to its own points' move (`data_driven_change`,
from each profile's timing basis and sensitivity) accounts for at least `DATA_SHARE` of
its change.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxroof.calibrate import op_fit
from jaxroof.calibrate.toy_fit import REPEAT_FACTOR_REL, REPEAT_MEDIAN_POINTS
from jaxroof.engines import xla_cpu
from jaxroof.measure import profiles
from jaxroof.symbolic import calibrated as calibration

# A factor outside REPEAT_FACTOR_REL is the machine's when the fit's response to its
# points' move is at least this share of its change (and the rest within the criterion).
DATA_SHARE = 0.5

_SCALED_BY = {"eta_w": "bandwidth", "eta_kv": "bandwidth", "eta_f": "flop_rate"}


def effective_rates(prof: profiles.Profile) -> dict[str, float]:
  """What a profile's efficiencies amount to: `eta_w x BW`, `eta_kv x BW` (B/s) and
  `eta_f x F` (FLOP/s), BW and F its own measured ceilings; with a re-pack, the
  batched weight rate `eta_w x BW / (1 + r_pack)` under "r_pack". Only these products reach
  a prediction: the split into a fraction and a ceiling is not determined by step
  timings, and the ceiling itself is one noisy measurement of a shared machine."""
  bandwidth = float(prof.ceilings.get("bandwidth_Bps") or 0.0)
  flops = prof.ceilings.get("flops_per_s") or {}
  flop_rate = float(flops.get(prof.dtype) or next(iter(flops.values()), 0.0)) if flops else 0.0
  ceiling = {"bandwidth": bandwidth, "flop_rate": flop_rate}
  rates = {n: prof.factors[n] * ceiling[c] for n, c in _SCALED_BY.items() if ceiling[c] > 0}
  if "r_pack" in prof.regime_factors and "eta_w" in rates:
    # From B = 2 the weights stream at eta_w x BW / (1 + r_pack): the rate a batched
    # prediction uses, whatever the split between the two factors.
    rates["r_pack"] = rates["eta_w"] / (1.0 + prof.regime_factors["r_pack"])
  return rates


def compare_profiles(previous: profiles.Profile, current: profiles.Profile) -> dict[str, Any]:
  """Whether two calibrations agree: factors within 10%, medians 3 points.

  The efficiencies are compared as the rates they give (`effective_rates`: the
  fraction times that run's own measured ceiling), since the ceilings of a shared
  machine move between runs (119 and 53 GB/s in two runs ten minutes apart here)
  and a fraction of a moving ceiling cannot repeat when the rate does; each plain
  fraction's difference is reported beside (`fraction_rel_diff`). The overlap
  `r_ovl` enters as the exponent p = 1 + r_ovl, so it is compared on p, and the
  re-pack `r_pack` as the batched weight rate `eta_w x BW / (1 + r_pack)` (a noisy
  `eta_w` moves `r_pack` the other way, the rate stays). A fixed
  cost (t0_step, t0_layer) smaller than the previous run's fastest fit step is
  compared with that step: a few microseconds beneath a millisecond step are not
  determined by the fit, and moving them changes no prediction. The held-out
  medians' difference is in points.

  Each factor's timed points (`timing_basis`) are compared as well. A factor
  outside the criterion is named in `factors_outside_as_their_data` (the machine
  moved, the fit followed) when its own points moved by more than the criterion
  (median) between the two processes, or when it is within the criterion once
  the change its points' move makes in the fit is taken off
  (`factor_rel_change_from_data`: the fit's sensitivity, `basis_sensitivity`,
  times the points' log moves; one point of six that moved 18% can move a factor
  12% while the median point stays) and that change is at least half the factor's,
  the same way (`factor_data_amplification`, the sum of |sensitivity|, says how much
  the fit magnifies its points' moves). One whose points' rounds disagree by more
  than the criterion within either run, weighted by how much the factor moves with
  each (`factor_round_noise`), is in `factors_outside_within_round_noise` (the
  machine's floor for that factor); `outside_explained_by_machine` when every
  factor outside is one or the other. `basis_rel_diff["heldout"]` is how far
  the held-out steps moved.
  """
  fastest = previous.fit.get("fastest_fit_step_s")
  old_rates, new_rates = effective_rates(previous), effective_rates(current)
  signed, fractions, first_order = _signed_changes(previous, current)
  diffs = {n: abs(v) for n, v in signed.items()}
  old, new = (previous.heldout_median_rel_error, current.heldout_median_rel_error)
  median_points = (None if old is None or new is None else abs(new - old) * 100)
  failing = [n for n, d in diffs.items() if d > REPEAT_FACTOR_REL]
  median_ok = median_points is not None and (median_points <= REPEAT_MEDIAN_POINTS)
  old_basis, new_basis = previous.fit.get("basis") or {}, current.fit.get("basis") or {}
  moved = {
      n: basis_moved(old_basis[n], new_basis[n]) for n in sorted(set(old_basis) & set(new_basis))
  }
  moved = {n: m for n, m in moved.items() if m is not None}
  sensitivities = (compared_sensitivity(previous), compared_sensitivity(current))
  from_data = data_driven_change(previous, current, sensitivities, first_order)
  data_removed = {n: abs(signed[n] - v) for n, v in from_data.items() if n in signed}
  # A factor cannot repeat better than the timings it is fitted from: the machine
  # moved it where those moved by more than the criterion between the two
  # processes, or where the move the fit makes from its timings' move (linearised)
  # is most of the factor's, same way, and the rest within the criterion.
  data_moved = [
      n for n in failing if moved.get(n, 0.0) > REPEAT_FACTOR_REL or
      (data_removed.get(n, math.inf) <= REPEAT_FACTOR_REL and from_data[n] *
       signed[n] >= DATA_SHARE * signed[n]**2)
  ]
  # Nor better than its timings' own rounds agree within either run.
  old_noise = previous.fit.get("basis_round_spread") or {}
  new_noise = current.fit.get("basis_round_spread") or {}
  noise = {
      n: max(old_noise.get(n, 0.0), new_noise.get(n, 0.0))
      for n in sorted(set(old_noise) | set(new_noise))
  }
  inherited = {
      n: max([noise.get(n, 0.0)] + [
          inherited_noise(prof, rows.get(n, {}), n, first_order)
          for prof, rows in zip((previous, current), sensitivities)
      ]) for n in diffs
  }
  within_noise = [
      n for n in failing if n not in data_moved and inherited.get(n, 0.0) > REPEAT_FACTOR_REL
  ]
  ceiling_diffs = {
      name: abs(float(current.ceilings[name]) - float(previous.ceilings[name])) /
            float(previous.ceilings[name]) for name in ("bandwidth_Bps", "read_bandwidth_Bps")
      if previous.ceilings.get(name) and current.ceilings.get(name)
  }
  return {
      "previous": previous.path,
      "previous_created": previous.created,
      "factor_rel_diff": diffs,
      "max_factor_rel_diff": max(diffs.values()),
      "factors_outside": failing,
      "fraction_rel_diff": fractions,
      "effective_rates": {"previous": old_rates, "current": new_rates},
      "ceiling_rel_diff": ceiling_diffs,
      "heldout_median_previous": old,
      "heldout_median_current": new,
      "heldout_median_diff_points": median_points,
      "basis_rel_diff": moved,
      "factors_outside_as_their_data": data_moved,
      "factor_rel_change": signed,
      "factors_as_share_of_fastest_step": [
          n for n, (value, scale) in first_order.items()
          if n in op_fit.FIXED_FACTORS and scale > value
      ],
      "factor_rel_change_from_data": from_data,
      "factor_rel_diff_data_removed": data_removed,
      "factor_data_amplification": {
          n: max(sum(map(abs,
                         rows.get(n, {}).values())) for rows in sensitivities) for n in from_data
      },
      "basis_round_spread": noise,
      "factor_round_noise": inherited,
      "factors_outside_within_round_noise": within_noise,
      "outside_explained_by_machine": bool(failing)
                                      and set(failing) <= set(data_moved + within_noise),
      "criteria": {
          "factor_rel_diff_max": REPEAT_FACTOR_REL,
          "heldout_median_diff_points_max": REPEAT_MEDIAN_POINTS,
          "efficiencies_compared_as": "eta x that run's own ceiling (B/s, FLOP/s)",
          "r_ovl_compared_as": "p = 1 + r_ovl",
          "r_pack_compared_as": "eta_w x BW / (1 + r_pack), the batched weight rate (B/s)",
          "basis_rel_diff": ("median relative change, between the two runs, of the timed "
                             "points each factor was fitted from ('heldout': the held-out "
                             "steps)"), "fixed_costs_relative_to":
                                 (f"the previous run's fastest fit step ({fastest:.3g} s)"
                                  " where larger than the cost" if fastest else "themselves"),
          "factor_rel_change_from_data":
              ("the change the fit makes to each compared factor given its timed points' "
               "move between the runs: sum of d log(factor) / d log(time) "
               "(fit.basis_sensitivity, the two runs' mean) x log(time ratio); a factor is "
               "the machine's when this is at least half of its change, the same way, and "
               "the rest within the criterion"), "factor_round_noise":
                   ("what each factor inherits from its points' round spreads within either run: "
                    "the root sum of squares of sensitivity x round spread "
                    "(fit.point_round_spread), or the median round spread "
                    "(fit.basis_round_spread), the larger")
      },
      "pass": not failing and median_ok,
  }


def _signed_changes(
    previous: profiles.Profile, current: profiles.Profile
) -> tuple[dict[str, float], dict[str, float], dict[str, tuple[float, float]]]:
  """Each factor's signed change as `compare_profiles` scores it, each plain
  fraction's change, and, for the quantities scored to first order (fixed costs,
  p = 1 + r_ovl, a re-pack without rates), their (value, scale): a change is
  `(new - old) / scale`."""
  fastest = previous.fit.get("fastest_fit_step_s")
  old_rates, new_rates = effective_rates(previous), effective_rates(current)
  signed, fractions, first_order = {}, {}, {}
  for n in calibration.FACTOR_NAMES:
    value = previous.factors[n]
    fractions[n] = abs(current.factors[n] - value) / value
    scale = value
    if n in op_fit.FIXED_FACTORS and fastest:
      # A fixed cost far below the fastest step is not determined by it;
      # its change matters as a share of that step, not of itself.
      scale = max(value, fastest)
    if n == "r_ovl":
      scale = 1 + value
    if n in op_fit.FIXED_FACTORS or n == "r_ovl":
      first_order[n] = (value, scale)
    signed[n] = (current.factors[n] - value) / scale
    if n in old_rates and n in new_rates:
      signed[n] = new_rates[n] / old_rates[n] - 1.0
  for n in xla_cpu.TERM_NAMES:
    if n in previous.regime_factors and n in current.regime_factors:
      value = previous.regime_factors[n]
      scale = max(value, 1.0)  # A re-pack near zero is compared with one weight read.
      signed[n] = (current.regime_factors[n] - value) / scale
      fractions[n] = abs(signed[n])
      if n in old_rates and n in new_rates:
        signed[n] = new_rates[n] / old_rates[n] - 1.0
      else:
        first_order[n] = (value, scale)
  return signed, fractions, first_order


def compared_sensitivity(prof: profiles.Profile) -> dict[str, dict[str, float]]:
  """d log(compared quantity) / d log(time) per timed point, for the quantities
  `compare_profiles` compares: the efficiencies' rates and the fixed costs move as
  the factors do; the batched weight rate `eta_w x BW / (1 + r_pack)` (where the
  profile has rates) as `eta_w` and, weighted by -r_pack / (1 + r_pack), `r_pack`."""
  sens = prof.fit.get("basis_sensitivity") or {}
  out = {n: dict(v) for n, v in sens.items() if n in calibration.FACTOR_NAMES}
  if "r_pack" in sens and "r_pack" in effective_rates(prof):
    r = prof.regime_factors["r_pack"]
    rate = dict(sens.get("eta_w", {}))
    for key, value in sens["r_pack"].items():
      rate[key] = rate.get(key, 0.0) - r / (1.0 + r) * value
    out["r_pack"] = rate
  elif "r_pack" in sens:
    out["r_pack"] = dict(sens["r_pack"])
  return out


def _point_times(prof: profiles.Profile) -> dict[str, float]:
  """Every timed point's figure (`fit.point_median_s`; older profiles: those of `fit.basis`)."""
  if prof.fit.get("point_median_s"):
    return dict(prof.fit["point_median_s"])
  return {k: v for points in (prof.fit.get("basis") or {}).values() for k, v in points.items()}


def _as_compared(name: str, log_change: float, first_order: Mapping[str, tuple[float,
                                                                               float]]) -> float:
  """A log change of a factor as the relative change `compare_profiles` scores; the
  quantities scored by their difference to first order (a small intercept can have a
  log slope of 40, whose exponential means nothing)."""
  if name in first_order:
    value, scale = first_order[name]
    return value * log_change / scale
  return math.expm1(log_change)


def data_driven_change(previous: profiles.Profile, current: profiles.Profile,
                       sensitivities: Sequence[Mapping[str, Mapping[str, float]]],
                       first_order: Mapping[str, tuple[float, float]]) -> dict[str, float]:
  """Per factor with a sensitivity, the signed change the fit makes to it given its
  timed points' move from `previous`'s times to `current`'s (linearised with the
  mean of the two runs' `compared_sensitivity`, `sensitivities`, where both have
  them, so the comparison is the same both ways round)."""
  rows = [r for r in sensitivities if r]
  old, new = _point_times(previous), _point_times(current)
  out = {}
  for name in sorted({n for r in rows for n in r}):
    mean: dict[str, float] = {}
    for r in rows:
      for key, value in r.get(name, {}).items():
        mean[key] = mean.get(key, 0.0) + value / len(rows)
    shared = [k for k in mean if k in old and k in new]
    if shared:
      log_change = sum(mean[k] * math.log(new[k] / old[k]) for k in shared)
      out[name] = _as_compared(name, log_change, first_order)
  return out


def inherited_noise(prof: profiles.Profile, slopes: Mapping[str, float], name: str,
                    first_order: Mapping[str, tuple[float, float]]) -> float:
  """The round noise a factor inherits from its timed points within one run: the
  root sum of squares of sensitivity (`slopes`, its `compared_sensitivity` row) x
  round spread (0 without them)."""
  spreads = prof.fit.get("point_round_spread") or {}
  log_noise = math.sqrt(sum((v * spreads[k])**2 for k, v in slopes.items() if k in spreads))
  return abs(_as_compared(name, log_noise, first_order))


def basis_moved(previous: Mapping[str, float], current: Mapping[str, float]) -> float | None:
  """The median relative change of the points two runs both timed, or None."""
  shared = sorted(set(previous) & set(current))
  if not shared:
    return None
  return float(np.median([abs(current[k] / previous[k] - 1.0) for k in shared]))
