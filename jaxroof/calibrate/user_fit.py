"""Calibration from users' measured step times, per device: checks, held-out error, result.

The factors are fitted by `row_fit` (the cost model's calibrated decode step and
prefill, one optax fit of both). Held-out error is leave-one-model-out when the rows
hold two or more models: each model's rows are predicted by factors fitted without any
row of that model. With one model's rows it is k-fold over the rows
(`heldout_by_rows`), which says how well other batches and contexts of that model are
predicted, never how well another model is (a carry-over whose error these rows cannot
show; the result warns). The profile's factors are then fitted on every row. The
bound's error on the same rows is reported beside it.

Before any fit every row is checked against its analytic bound (`suspicious_rows`): a
row faster than the bound, or more than `SLOWER_LIMIT` times slower, is flagged with
its line and ratio; the caller keeps it (with a warning) or leaves it out.
"""

from __future__ import annotations

import datetime
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from jaxroof import errors
from jaxroof.calibrate import fitting
from jaxroof.calibrate import row_checks
from jaxroof.calibrate import row_fit
from jaxroof.measure import profiles
from jaxroof.measure import user_measurements as um
from jaxroof.specs import accelerators
from jaxroof.specs import models
from jaxroof.specs import parameters
from jaxroof.symbolic import calibrated

MIN_MODELS = 2  # Models needed to hold one out.
MAX_FOLDS = 5  # Folds of the hold-out by rows (fewer rows: one row per fold).
SLOWER_LIMIT = 20.0  # A row this many times slower than its bound is suspicious.
# A row faster than its bound by more than this share is suspicious; closer
# than that it is "at the bound" (said, not flagged): step times are given to
# two or three digits, and what the bound counts (the output projection, the
# embedding row) moves it by about a percent.
AT_BOUND_TOLERANCE = 0.01
HELDOUT_BY_MODEL = "model"
HELDOUT_BY_ROWS = "rows"


def row_report(rows: Sequence[um.Row], predicted: np.ndarray, bound: np.ndarray,
               heldout: Sequence[bool]) -> list[dict[str, Any]]:
  """Per row: the measurement, both predictions and their relative errors."""
  measured = np.asarray([r.time_s for r in rows])
  return [{
      "line": r.line, "model": r.model, "phase": r.phase, "batch": r.batch, "context": r.context,
      "prompt_tokens": r.prompt_tokens, "tp": r.tp, "pp": r.pp, "ep": r.ep,
      "weight_dtype": r.weight_dtype, "kv_dtype": r.kv_dtype, "measured_s": r.time_s,
      "calibrated_s": float(p), "bound_s": float(b), "calibrated_rel_error": float(abs(p - m) / m),
      "bound_rel_error": float(abs(b - m) / m), "heldout": bool(h)
  } for r, p, b, m, h in zip(rows, predicted, bound, measured, heldout)]


def _heldout(folds: Sequence[tuple[str, list[um.Row], list[um.Row]]], *, inputs: row_fit.InputsFn,
             **fit_kw) -> dict[str, Any]:
  """Each fold's test rows predicted by factors fitted on its train rows only."""
  out, report = [], []
  for name, train, test in folds:
    fit = row_fit.fit_rows(train, inputs=inputs, **fit_kw)
    predicted = row_fit.predict_rows(test, fit.factors, inputs=inputs)
    report += row_report(test, predicted, row_fit.bound_rows(test, inputs=inputs),
                         [True] * len(test))
    out.append({
        "heldout": name, "trained_on_lines": [r.line for r in train],
        "heldout_lines": [r.line for r in test], "free": list(fit.free), "factors": fit.factors
    })
  return {"folds": out, "rows": report}


def heldout_by_model(rows: Sequence[um.Row], *,
                     inputs: row_fit.InputsFn = row_fit.ideal_split_inputs,
                     **fit_kw) -> dict[str, Any]:
  """Leave-one-model-out: each model predicted by a fit without its rows.

  Raises:
    InputError: rows of fewer than `MIN_MODELS` models.
  """
  names = sorted({r.model for r in rows})
  if len(names) < MIN_MODELS:
    raise errors.InputError(
        f"models={names!r}: held-out rows are chosen by model, so a fit needs rows "
        f"of at least {MIN_MODELS} models (and {row_fit.MIN_ROWS} rows without each); with one "
        "model's rows hold out by rows instead.")
  folds = [(name, [r for r in rows if r.model != name], [r for r in rows if r.model == name])
           for name in names]
  result = _heldout(folds, inputs=inputs, **fit_kw)
  for fold in result["folds"]:
    fold["heldout_model"] = fold.pop("heldout")
  return result


def _size(row: um.Row) -> tuple[str, int, int]:
  """Sort key of a row: phase, then tokens the step touches, then batch."""
  tokens = row.batch * (row.context if row.phase == "decode" else row.prompt_tokens)
  return (row.phase, tokens, row.batch)


def row_folds(rows: Sequence[um.Row], folds: int = MAX_FOLDS) -> list[int]:
  """The fold of each row (in the rows' order), spread over the grid.

  Rows are ranked by phase and size (`_size`) and dealt to the folds in turn,
  so every fold holds small and large steps; with fewer rows than `folds`
  each row is its own fold (leave-one-out).
  """
  count = min(folds, len(rows))
  order = sorted(range(len(rows)), key=lambda i: (_size(rows[i]), rows[i].line))
  fold = [0] * len(rows)
  for rank, i in enumerate(order):
    fold[i] = rank % count
  return fold


def heldout_by_rows(rows: Sequence[um.Row], *,
                    inputs: row_fit.InputsFn = row_fit.ideal_split_inputs, folds: int = MAX_FOLDS,
                    **fit_kw) -> dict[str, Any]:
  """k-fold over the rows: each fold predicted by a fit on the other folds.

  Each row is held out exactly once (`row_folds`). The error says how well
  other batches and contexts of the same models are predicted.

  Raises:
    InputError: too few rows to leave `row_fit.MIN_ROWS` in every fit.
  """
  assignment = row_folds(rows, folds)
  count = max(assignment) + 1 if assignment else 0
  splits = []
  for k in range(count):
    train = [r for r, f in zip(rows, assignment) if f != k]
    test = [r for r, f in zip(rows, assignment) if f == k]
    if len(train) < row_fit.MIN_ROWS:
      raise errors.InputError(
          f"rows={len(rows)} are too few to hold any out: each fit needs "
          f"{row_fit.MIN_ROWS} rows beside the held-out ones; give at least {row_fit.MIN_ROWS + 1} "
          "measured steps.")
    splits.append((f"fold {k + 1} of {count}", train, test))
  return _heldout(splits, inputs=inputs, **fit_kw)


def ratios_to_bound(rows: Sequence[um.Row], *,
                    inputs: row_fit.InputsFn = row_fit.ideal_split_inputs) -> np.ndarray:
  """measured / analytic bound of each row."""
  return np.asarray([r.time_s for r in rows]) / row_fit.bound_rows(rows, inputs=inputs)


def extrapolation(rows: Sequence[um.Row], *, inputs: row_fit.InputsFn = row_fit.ideal_split_inputs,
                  share: float = 0.25, **fit_kw) -> dict[str, Any] | None:
  """The largest steps predicted by a fit on the smaller ones (per phase).

  The rows touching the most tokens (batch x context, or batch x prompt), a
  `share` of each phase (at least one), are held out together: the question
  "what happens at larger batches and contexts than I measured". None when too
  few rows remain to fit.
  """
  test: list[um.Row] = []
  for phase in um.PHASES:
    mine = sorted((r for r in rows if r.phase == phase), key=_size)
    if len(mine) >= 2:
      test += mine[-max(1, int(round(share * len(mine)))):]
  train = [r for r in rows if r not in test]
  if not test or len(train) < row_fit.MIN_ROWS:
    return None
  result = _heldout([("largest steps", train, test)], inputs=inputs, **fit_kw)
  return {
      "method": f"the largest {share:.0%} of each phase's rows (tokens touched) held "
                "out together, predicted by a fit on the rest",
      "heldout_lines": [r.line for r in test],
      "calibrated": error_summary_of(result["rows"], "calibrated_rel_error"),
      "bound": error_summary_of(result["rows"], "bound_rel_error"), "rows": result["rows"]
  }


def suspicious_rows(rows: Sequence[um.Row], *,
                    inputs: row_fit.InputsFn = row_fit.ideal_split_inputs,
                    slower_limit: float = SLOWER_LIMIT,
                    tolerance: float = AT_BOUND_TOLERANCE) -> list[dict[str, Any]]:
  """Rows faster than their analytic bound (by more than `tolerance`), or more
  than `slower_limit` x slower.

  A step cannot beat the bound at the datasheet's BW and F: such a row means a
  wrong model, device, dtype, batch or context, or a time that is not one
  step. A step many times slower than the bound spends its time on what the
  model does not name (host overhead, a wrong unit).

  Returns:
    One entry per suspicious row: line, ratio_to_bound (measured / bound),
    measured_s, bound_s and reason.
  """
  if not rows:
    return []
  bound = row_fit.bound_rows(rows, inputs=inputs)
  out = []
  for row, b in zip(rows, bound):
    ratio = row.time_s / float(b)
    if ratio < 1.0 - tolerance:
      reason = (f"faster than the analytic bound ({row.time_s * 1e3:.4g} ms against "
                f"{b * 1e3:.4g} ms): check the model, accelerator, dtypes, batch, "
                "context and that the time is one step")
    elif ratio > slower_limit:
      reason = (f"more than {slower_limit:g}x slower than the analytic bound "
                f"({row.time_s * 1e3:.4g} ms against {b * 1e3:.4g} ms): host overhead, "
                "a wrong unit or a wrong row?")
    else:
      continue
    out.append({
        "line": row.line, "model": row.model, "phase": row.phase, "batch": row.batch,
        "context": row.context, "prompt_tokens": row.prompt_tokens, "measured_s": row.time_s,
        "bound_s": float(b), "ratio_to_bound": ratio, "reason": reason
    })
  return out


def error_summary_of(report: Sequence[Mapping[str, Any]], key: str) -> dict[str, Any]:
  """Median and max of one error column of a `row_report`."""
  return fitting.error_summary([r[key] for r in report])


CARRY_OVER_WARNING = ("the rows hold one model ({model}): the k-fold error is over its other "
                      "batches and contexts, not a held-out error on another model; predicting "
                      "another model (size, architecture, layout) with this profile is a "
                      "carry-over whose error is unknown (these rows cannot show it)")


def _check_rows(rows: Sequence[um.Row], *, inputs: row_fit.InputsFn,
                drop_suspicious: bool) -> tuple[list[um.Row], list[dict[str, Any]], list[str]]:
  """The rows the fit uses, every suspicious row (with `dropped`), and warnings."""
  flagged = suspicious_rows(rows, inputs=inputs)
  lines = {f["line"] for f in flagged}
  warnings = []
  for f in flagged:
    f["dropped"] = drop_suspicious
  ratios = ratios_to_bound(rows, inputs=inputs)
  near = [(r.line, x) for r, x in zip(rows, ratios) if 1.0 - AT_BOUND_TOLERANCE <= x < 1.0]
  if near:
    warnings.append("at the analytic bound, within its "
                    f"{AT_BOUND_TOLERANCE:.0%} tolerance (kept, not flagged): " +
                    ", ".join(f"line {line} ({x:.4f}x the bound)" for line, x in near))
  if flagged:
    listing = ", ".join(f"line {f['line']} ({f['ratio_to_bound']:.3f}x the bound)" for f in flagged)
    warnings.append(
        f"{len(flagged)} suspicious row(s), faster than the analytic bound or more than "
        f"{SLOWER_LIMIT:g}x slower: {listing}; " +
        ("left out of the fit and of the held-out error" if drop_suspicious else
         "kept in the fit and the held-out error: check them, or leave them out"))
  used = [r for r in rows if r.line not in lines] if drop_suspicious else list(rows)
  if len(used) < row_fit.MIN_ROWS <= len(rows):
    raise errors.InputError(
        f"rows={len(used)} remain after leaving out {len(rows) - len(used)} suspicious "
        f"row(s) (lines {', '.join(str(n) for n in sorted(lines))}): give at least "
        f"{row_fit.MIN_ROWS} measured steps a fit can trust.")
  return used, flagged, warnings


def heldout_method(heldout_by: str) -> str:
  """How the held-out rows were chosen, in words."""
  if heldout_by == HELDOUT_BY_MODEL:
    return ("leave-one-model-out: each model's rows predicted by factors fitted without "
            "any of its rows; the profile's factors are then fitted on every row")
  return (f"k-fold over the rows (up to {MAX_FOLDS} folds, each spanning small and large "
          "steps): each row predicted by factors fitted without it; the profile's "
          "factors are then fitted on every row")


def calibrate(measurements: um.Measurements, *, accelerator: str | None = None,
              inputs: row_fit.InputsFn = row_fit.ideal_split_inputs,
              layout_notes: Sequence[str] | None = None, drop_suspicious: bool = False,
              **fit_kw) -> tuple[profiles.Profile, dict[str, Any]]:
  """Fits a device's profile to measured rows; the result JSON beside it.

  Rows of two or more models are held out by model; one model's rows by
  rows (k-fold), with a warning that other models are a carry-over. Rows
  faster than the bound or more than `SLOWER_LIMIT` x slower are flagged and,
  with `drop_suspicious`, left out.

  `inputs` and `layout_notes` come from the parallel layer for rows on a
  layout (`jaxroof.calibrate.layout_fit`); by default tp rows are an ideal
  split and `um.TP_ASSUMPTION` is stated.
  """
  all_rows = list(measurements.rows)
  row_checks.refuse_impossible(measurements.path, all_rows, inputs=inputs)
  rows, flagged, warnings = _check_rows(all_rows, inputs=inputs, drop_suspicious=drop_suspicious)
  slugs = measurements.accelerators()
  slug = accelerator or slugs[0]
  device = accelerators.load_accelerator(slug)
  model_names = sorted({r.model for r in rows})
  if len(model_names) >= MIN_MODELS:
    heldout_by = HELDOUT_BY_MODEL
    heldout = heldout_by_model(rows, inputs=inputs, **fit_kw)
  else:
    heldout_by = HELDOUT_BY_ROWS
    try:
      heldout = heldout_by_rows(rows, inputs=inputs, **fit_kw)
    except errors.InputError as e:
      dropped = len(all_rows) - len(rows)
      raise errors.InputError(f"{e}" +
                              (f" ({dropped} suspicious row(s) were left out: check them, or keep "
                               "them with a warning)" if dropped else "")) from None
    warnings.append(CARRY_OVER_WARNING.format(model=model_names[0]))
  larger = extrapolation(rows, inputs=inputs, **fit_kw) if heldout_by == HELDOUT_BY_ROWS else None
  fit = row_fit.fit_rows(rows, inputs=inputs, **fit_kw)
  predicted = row_fit.predict_rows(rows, fit.factors, inputs=inputs)
  bound = row_fit.bound_rows(rows, inputs=inputs)
  training = row_report(rows, predicted, bound, [False] * len(rows))
  held_cal = error_summary_of(heldout["rows"], "calibrated_rel_error")
  held_bound = error_summary_of(heldout["rows"], "bound_rel_error")
  train_cal = error_summary_of(training, "calibrated_rel_error")
  if (held_cal["median_rel_error"] is not None and held_bound["median_rel_error"] is not None and
      held_cal["median_rel_error"] > held_bound["median_rel_error"]):
    which = "held-out" if heldout_by == HELDOUT_BY_MODEL else "within-model (k-fold)"
    warnings.append(
        f"the calibrated prediction's {which} median error "
        f"({held_cal['median_rel_error']:.1%}) is larger than the analytic bound's on the "
        f"same rows ({held_bound['median_rel_error']:.1%}): prefer the bound")
  warnings += list(fit.flags)
  created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
  tp_rows = sum(r.tp > 1 for r in rows)
  if layout_notes is not None:
    notes = list(layout_notes)
  else:
    notes = [um.TP_ASSUMPTION] if tp_rows else []
  notes += [f"{n} {why}" for n, why in fit.fixed.items()]
  notes += list(fit.flags)
  dropped = [f["line"] for f in flagged if f["dropped"]]
  source = {
      "file": measurements.path,
      "engine": measurements.engine or "not named in the rows",
      "date": created,
      "rows_used": [r.line for r in rows],
      "rows_dropped": dropped,
      "accelerator": device.name,
      "phases": sorted({r.phase for r in rows}),
      "models": model_names,
      "what": "step times measured by the user's engine; factors are fractions of the "
              "accelerator's datasheet BW and F",
  }
  method = heldout_method(heldout_by)
  fit_block = {
      "heldout_by": heldout_by,
      "heldout_median_rel_error": held_cal["median_rel_error"],
      "heldout_max_rel_error": held_cal["max_rel_error"],
      "heldout_points": held_cal["points"],
      "heldout_method": method,
      "train_median_rel_error": train_cal["median_rel_error"],
      "train_max_rel_error": train_cal["max_rel_error"],
      "train_points": train_cal["points"],
      "bound_heldout_median_rel_error": held_bound["median_rel_error"],
      "bound_heldout_max_rel_error": held_bound["max_rel_error"],
      "loss": fit.loss,
      "statistic": "mean squared log error",
      "free_factors": list(fit.free),
      "fixed_factors": fit.fixed,
      "flags": list(fit.flags),
      "comm_factors": {n: fit.factors[n] for n in row_fit.COMM_FACTORS},
      "models": model_names,
      "suspicious_rows": flagged,
      "warnings": warnings,
  }
  dtypes = sorted({r.weight_dtype for r in rows})
  prof = profiles.Profile(
      device_kind=device.full_name, platform="", backend=source["engine"],
      dtype=dtypes[0] if len(dtypes) == 1 else ",".join(dtypes), jax_version=jax.__version__,
      created=created, ceilings={}, factors={n: fit.factors[n] for n in row_fit.DECODE_FACTORS},
      fit=fit_block, model={"rows": [r.to_json() for r in rows]},
      method="user measurements (see source); decode rows fitted with the calibrated "
      "step, prefill rows with the calibrated prefill", accelerator=device.name, source=source,
      prefill_factors=({"eta_f_prefill": fit.factors["eta_f_prefill"]}
                       if "eta_f_prefill" in fit.free else {}))
  result = {
      "kind": "user_calibration",
      "what": "calibrated factors fitted to measured step times (measurements from the "
              "file named in source); errors of the calibrated prediction and of the "
              "analytic bound on the same rows",
      "accelerator": device.name,
      "source": source,
      "heldout_by": heldout_by,
      "heldout_median_rel_error": held_cal["median_rel_error"],
      "heldout_max_rel_error": held_cal["max_rel_error"],
      "bound_heldout_median_rel_error": held_bound["median_rel_error"],
      "bound_heldout_max_rel_error": held_bound["max_rel_error"],
      "suspicious_rows": flagged,
      "warnings": warnings,
      "factors": fit.factors,
      "free_factors": list(fit.free),
      "fixed_factors": fit.fixed,
      "flags": list(fit.flags),
      "rows_used": len(rows),
      "rows_read": len(all_rows),
      "heldout_method": method,
      "folds": heldout["folds"],
      "heldout_rows": heldout["rows"],
      "training_rows": training,
      "extrapolation": larger,
      "bound": row_fit.BOUND_NOTE,
      "assumptions": list(calibrated.ASSUMPTIONS) + list(calibrated.PREFILL_ASSUMPTIONS) + notes,
      "units": {
          "measured_s": "s", "calibrated_s": "s", "bound_s": "s", "calibrated_rel_error": "1",
          "bound_rel_error": "1", "ratio_to_bound": "1 (measured / bound)"
      },
  }
  return prof, row_checks.finite_result(measurements.path, rows, result, inputs=inputs)


def _relation(fit_model: str, target: str) -> list[str]:
  a, b = models.load_model(fit_model), models.load_model(target)
  out = []
  if a.is_moe != b.is_moe:
    out.append("dense to MoE" if b.is_moe else "MoE to dense")
  size_a = parameters.parameter_counts(a).total
  size_b = parameters.parameter_counts(b).total
  out.append("small to large" if size_b > size_a else "large to small")
  return out


def carry_over(measurements: um.Measurements, *,
               inputs: row_fit.InputsFn = row_fit.ideal_split_inputs, **fit_kw) -> dict[str, Any]:
  """Fit on one model's rows, predict each other model's, per device.

  For every device and ordered pair of models with rows on it, the factors
  are fitted to the first model's rows only and predict the second's; the
  bound's error on the same rows is reported beside it.

  Raises:
    InputError: no device has rows of two models (nothing to carry over).
  """
  row_checks.refuse_impossible(measurements.path, measurements.rows, inputs=inputs)
  pairs, all_rows = [], []
  for slug in measurements.accelerators():
    rows = [r for r in measurements.rows if r.accelerator == slug]
    names = sorted({r.model for r in rows})
    for fit_model, target in itertools.permutations(names, 2):
      train = [r for r in rows if r.model == fit_model]
      test = [r for r in rows if r.model == target]
      try:
        fit = row_fit.fit_rows(train, inputs=inputs, **fit_kw)
      except errors.InputError as e:
        pairs.append(
            {"accelerator": slug, "fit_model": fit_model, "target": target, "skipped": str(e)})
        continue
      report = row_report(test, row_fit.predict_rows(test, fit.factors, inputs=inputs),
                          row_fit.bound_rows(test, inputs=inputs), [True] * len(test))
      for r in report:
        r.update(accelerator=slug, fit_model=fit_model)
      all_rows += report
      pairs.append({
          "accelerator": slug, "fit_model": fit_model, "target": target,
          "relation": _relation(fit_model,
                                target), "row_fit.fit_rows": len(train), "free": list(fit.free),
          "factors": fit.factors, "calibrated": error_summary_of(report, "calibrated_rel_error"),
          "bound": error_summary_of(report, "bound_rel_error")
      })
  if not pairs:
    raise errors.InputError(
        f"carry_over needs rows of at least 2 models on one device; {measurements.path} has "
        f"{', '.join(sorted({r.model for r in measurements.rows}))} only: fit it without "
        "carry_over (held out by rows).", field="carry_over")
  cal = error_summary_of(all_rows, "calibrated_rel_error")
  bound = error_summary_of(all_rows, "bound_rel_error")
  by_relation = {}
  for relation in ("dense to MoE", "MoE to dense", "small to large", "large to small"):
    chosen = [r for r in all_rows if relation in _relation(r["fit_model"], r["model"])]
    by_relation[relation] = {
        "calibrated": error_summary_of(chosen, "calibrated_rel_error"),
        "bound": error_summary_of(chosen, "bound_rel_error")
    }
  by_phase = {
      phase: {
          "calibrated": error_summary_of([r for r in all_rows if r["phase"] == phase],
                                         "calibrated_rel_error"),
          "bound": error_summary_of([r for r in all_rows if r["phase"] == phase], "bound_rel_error")
      } for phase in um.PHASES
  }
  ratio = (bound["median_rel_error"] / cal["median_rel_error"] if cal["median_rel_error"] else None)
  result = {
      "kind": "carry_over",
      "what": "factors fitted to one model's measured rows on a device predict another "
              "model's rows on the same device (calibrated prediction) vs the analytic "
              "bound; errors relative to the measurement",
      "file": measurements.path,
      "engine": measurements.engine,
      "median_rel_error": cal["median_rel_error"],
      "max_rel_error": cal["max_rel_error"],
      "bound_median_rel_error": bound["median_rel_error"],
      "bound_max_rel_error": bound["max_rel_error"],
      "bound_over_calibrated_median_error": ratio,
      "targets": {"median_rel_error_at_most": 0.10, "bound_over_calibrated_at_least": 2.0},
      "meets_targets": bool(cal["median_rel_error"] is not None and
                            cal["median_rel_error"] <= 0.10 and ratio is not None and ratio >= 2.0),
      "points": cal["points"],
      "by_relation": by_relation,
      "by_phase": by_phase,
      "pairs": pairs,
      "rows": all_rows,
      "bound": row_fit.BOUND_NOTE,
      "assumptions": [
          um.TP_ASSUMPTION, "bf16 to fp8: no same-device pair in the data "
          "(TensorRT-LLM publishes H100/H200 in fp8 and A100 in fp16 only)"
      ],
      "units": {
          "measured_s": "s", "calibrated_s": "s", "bound_s": "s", "calibrated_rel_error": "1",
          "bound_rel_error": "1"
      },
  }
  return row_checks.finite_result(measurements.path, measurements.rows, result, inputs=inputs)
