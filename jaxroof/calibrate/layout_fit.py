"""Users' measured step times on parallel layouts: per-chip inputs, eta_comm, carry-over.

A measured row names its layout (`tp`, `pp`, `ep` columns of
`jaxroof.measure.user_measurements`). Here each row becomes one chip's
inputs along a token's path (`jaxroof.symbolic.collectives.path_inputs`:
weights over tp*pp, routed experts also over ep, K/V by `Max(1/tp, 1/u_kv)`
and the ep groups, linear FLOPs and prefill attention heads over tp*ep) and
the analytic communication of the pass (`jaxroof.symbolic.collectives.
pass_comm_s`: two ring all-reduces of (rows, D) per block and one for the
embedding, the logits gather, MoE all-to-alls, pp - 1 hand-offs, at the
accelerator's link figures). A decode step passes B rows, a prefill of the
batch B*P rows. The calibrated step adds that communication serially at a
fitted fraction eta_comm of its modelled speed
(`jaxroof.symbolic.collectives.calibrated_with_comm`); everything else is
`jaxroof.calibrate.user_fit` with these inputs.

`layout_carry_over` asks the issue's question for layouts: factors fitted on
some layouts predict the others (single chip -> several; tp <= 2 -> larger;
leave one layout out), the bound and the ideal-split fit (no
communication, `user_measurements.TP_ASSUMPTION`) on the same rows beside it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxroof import errors
from jaxroof.measure import profiles
from jaxroof.calibrate import row_fit
from jaxroof.calibrate import user_fit
from jaxroof.measure import user_measurements as um
from jaxroof.parallel import layout as layout_lib
from jaxroof.parallel.layout import Layout
from jaxroof.specs import accelerators
from jaxroof.specs import models
from jaxroof.specs import step_inputs
from jaxroof.symbolic import collectives
from jaxroof.symbolic import symbols as S
from jaxroof.symbolic.evaluate import lambdified

COMM_NAMES = ("tp", "pp", "ep", "n_blk", "L_moe", "K", "D", "V", "a_act",
              *(str(s) for s in collectives.LINK_SYMBOLS))
LAYOUT_NOTES = (
    "rows on a layout (tp, pp, ep): one chip's weights, K/V and FLOPs along a token's path "
    "(jaxroof.symbolic.collectives.path_inputs), plus the analytic communication of the pass "
    "(pass_comm_s: ring all-reduces of (rows, D) bf16 activations, 2 per block + 1, the "
    "logits all-gather, MoE all-to-alls, pp - 1 hand-offs; datasheet link bandwidth and "
    "per-hop latency) added serially and divided by the fitted eta_comm",
    "a decode step passes B rows, a prefill of the batch B*P rows",
)
STUDIES = ("single_chip_to_layouts", "up_to_2_chips_to_larger", "leave_one_layout_out")


def _layout(row: um.Row) -> Layout:
  return Layout(tp=row.tp, pp=row.pp, ep=row.ep)


LAYOUT_COLUMNS = ("tp", "pp", "ep")


def _refused_column(layout: Layout, spec, device) -> tuple[str, errors.InputError] | None:
  """The first layout column whose degree the model or device refuses, and why.

  Each degree is validated on top of the ones before it (tp, then pp, then ep),
  so the column at fault comes from the check that failed, never from its words.
  """
  for index, column in enumerate(LAYOUT_COLUMNS):
    partial = Layout(**{c: getattr(layout, c) for c in LAYOUT_COLUMNS[:index + 1]})
    try:
      layout_lib.validate(partial, spec, device)
    except errors.InputError as e:
      return column, e
  return None


def check_row(path: str, row: um.Row) -> None:
  """Refuses a row whose layout the model or device cannot take (one line).

  Raises:
    InputError: naming the file, line and column: tp not dividing the
      heads, ep on a dense model, a replica beyond the scale-up domain with no
      scale-out figure, weights that do not fit one chip of the layout.
  """
  spec = models.load_model(row.model)
  device = accelerators.load_accelerator(row.accelerator)
  layout = _layout(row)
  refused = _refused_column(layout, spec, device)
  if refused:
    column, error = refused
    raise errors.InputError(f"{path} line {row.line}, column {column!r}: {error}", field=column)
  inputs = step_inputs.decode_step_inputs(spec, device, context=row.context or row.prompt_tokens,
                                          batch_sizes=[1], weight_dtype=row.weight_dtype,
                                          kv_dtype=row.kv_dtype)
  per_chip = inputs.resident_weight_bytes / (layout.tp * layout.pp)
  if per_chip > device.memory_capacity_bytes:
    raise errors.InputError(
        f"{path} line {row.line}, column 'tp': {row.model} in {row.weight_dtype} on "
        f"tp*pp = {layout.tp * layout.pp} {device.name} chips holds {per_chip / 1e9:.1f} GB "
        f"per chip, more than its {device.memory_capacity_bytes / 1e9:.0f} GB: the row cannot "
        "have been measured on this layout.")


def check_rows(measurements: um.Measurements) -> None:
  """`check_row` on every row (the first bad one raises)."""
  for row in measurements.rows:
    check_row(measurements.path, row)


@functools.cache
def _path_model():
  return lambdified(collectives.path_inputs(), (S.N, S.N_x, S.k, S.N_act, S.tp, S.pp, S.ep, S.u_kv))


@functools.cache
def _comm_model():
  return lambdified({"comm_s": collectives.pass_comm_s(S.B)},
                    (S.B,) + tuple(getattr(S, n) for n in COMM_NAMES))


def _single(row: um.Row) -> um.Row:
  return dataclasses.replace(row, tp=1, pp=1, ep=1)


def _per_chip(row: um.Row, N: float, N_x: float, k: float, N_act: float,
              rows: float) -> tuple[dict[str, float], float]:
  """One chip's N, k, N_act on the row's layout, and the pass's communication (s)."""
  spec = models.load_model(row.model)
  device = accelerators.load_accelerator(row.accelerator)
  layout = _layout(row)
  terms = layout_lib.model_terms(spec)
  path = _path_model()(N=N, N_x=N_x, k=k, N_act=N_act, tp=float(layout.tp), pp=float(layout.pp),
                       ep=float(layout.ep), u_kv=float(terms.kv_units))
  if layout.chips_per_replica == 1:
    return {n: float(v) for n, v in path.items()}, 0.0
  values = layout_lib.symbol_values(layout, spec, layout_lib.links(layout, device))
  comm = _comm_model()(B=float(rows), **{n: float(values[n]) for n in COMM_NAMES})["comm_s"]
  return {n: float(v) for n, v in path.items()}, float(comm)


def layout_inputs(rows: Sequence[um.Row]) -> row_fit.StepInputs:
  """Per-chip inputs and communication of each row (`row_fit.InputsFn`).

  Single-device inputs come from `user_measurements` (the row with tp = pp =
  ep = 1), then become one chip's along the path; no row is checked here
  (`check_rows` does that once, with the file's name).
  """
  decode = [r for r in rows if r.phase == "decode"]
  prefill = [r for r in rows if r.phase == "prefill"]
  out_decode: dict[str, np.ndarray] = {}
  decode_comm = np.zeros(len(decode))
  if decode:
    out_decode = um.decode_inputs([_single(r) for r in decode])
    for i, row in enumerate(decode):
      spec = models.load_model(row.model)
      n_x = float(layout_lib.expert_weights_read(spec, [float(row.batch)])[0])
      path, decode_comm[i] = _per_chip(row, out_decode["N"][i], n_x, out_decode["k"][i],
                                       out_decode["N_act"][i], row.batch)
      for name, value in path.items():
        out_decode[name][i] = value
  out_prefill: dict[str, np.ndarray] = {}
  prefill_comm = np.zeros(len(prefill))
  if prefill:
    out_prefill = um.prefill_inputs([_single(r) for r in prefill])
    for i, row in enumerate(prefill):
      spec = models.load_model(row.model)
      tokens = float(row.batch * row.prompt_tokens)
      n_x = float(layout_lib.expert_weights_read(spec, [tokens])[0])
      path, prefill_comm[i] = _per_chip(row, out_prefill["N"][i], n_x, 0.0, out_prefill["N_act"][i],
                                        tokens)
      out_prefill["N"][i], out_prefill["N_act"][i] = path["N"], path["N_act"]
      out_prefill["H"][i] /= row.tp * row.ep
  return row_fit.StepInputs(decode=out_decode, prefill=out_prefill, decode_comm_s=decode_comm,
                            prefill_comm_s=prefill_comm)


def calibrate_layouts(measurements: um.Measurements, *, accelerator: str | None = None,
                      **fit_kw) -> tuple[profiles.Profile, dict[str, Any]]:
  """`user_fit.calibrate` with per-chip inputs and a fitted eta_comm.

  Raises:
    InputError: a row whose layout is impossible (`check_row`), or what
      `user_fit.calibrate` refuses.
  """
  check_rows(measurements)
  prof, result = user_fit.calibrate(measurements, accelerator=accelerator, inputs=layout_inputs,
                                    layout_notes=LAYOUT_NOTES, **fit_kw)
  result["kind"] = "user_calibration_layouts"
  result["layouts"] = sorted({_key(r) for r in measurements.rows})
  return prof, result


def _key(row: um.Row) -> str:
  return f"tp{row.tp}-pp{row.pp}-ep{row.ep}"


def _chips(row: um.Row) -> int:
  return row.tp * row.pp * row.ep


def _splits(study: str, rows: Sequence[um.Row]) -> list[tuple[str, list[um.Row], list[um.Row]]]:
  """(name, train, test) of each fold of a study; folds without test rows are dropped."""
  if study == "single_chip_to_layouts":
    folds = [("fit chips == 1", [r for r in rows if _chips(r) == 1],
              [r for r in rows if _chips(r) > 1])]
  elif study == "up_to_2_chips_to_larger":
    folds = [("fit chips <= 2", [r for r in rows if _chips(r) <= 2],
              [r for r in rows if _chips(r) > 2])]
  else:
    folds = [(f"hold out {key}", [r for r in rows
                                  if _key(r) != key], [r for r in rows if _key(r) == key])
             for key in sorted({_key(r) for r in rows})]
  return [f for f in folds if f[2]]


def _fold(slug: str, name: str, train: list[um.Row], test: list[um.Row],
          fit_kw) -> tuple[dict[str, Any], list[dict[str, Any]]]:
  fit = row_fit.fit_rows(train, inputs=layout_inputs, **fit_kw)
  report = user_fit.row_report(test, row_fit.predict_rows(test, fit.factors, inputs=layout_inputs),
                               row_fit.bound_rows(test, inputs=layout_inputs), [True] * len(test))
  ideal_ok = all(r.pp == 1 and r.ep == 1 for r in train + test)
  ideal = None
  if ideal_ok:
    ideal_fit = row_fit.fit_rows(train, **fit_kw)
    ideal = row_fit.predict_rows(test, ideal_fit.factors)
  for i, r in enumerate(report):
    r.update(accelerator=slug, fold=name, layout=_key(test[i]))
    if ideal is not None:
      r["ideal_split_s"] = float(ideal[i])
      r["ideal_split_rel_error"] = float(abs(ideal[i] - r["measured_s"]) / r["measured_s"])
  train_layouts = sorted({_key(r) for r in train})
  assert not {id(r) for r in train} & {id(r) for r in test}
  return ({
      "accelerator": slug, "fold": name, "train_lines": [r.line for r in train
                                                        ], "train_layouts": train_layouts,
      "heldout_lines": [r.line for r in test], "heldout_layouts": sorted({_key(r) for r in test}),
      "free": list(fit.free), "fixed": fit.fixed, "factors": fit.factors,
      "calibrated": user_fit.error_summary_of(report, "calibrated_rel_error"),
      "bound": user_fit.error_summary_of(report, "bound_rel_error")
  }, report)


def _summaries(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
  cal = user_fit.error_summary_of(rows, "calibrated_rel_error")
  bound = user_fit.error_summary_of(rows, "bound_rel_error")
  with_ideal = [r for r in rows if "ideal_split_rel_error" in r]
  ratio = (bound["median_rel_error"] / cal["median_rel_error"] if cal["median_rel_error"] else None)
  return {
      "calibrated": cal, "bound": bound,
      "ideal_split_calibrated": user_fit.error_summary_of(with_ideal, "ideal_split_rel_error"),
      "bound_over_calibrated_median_error": ratio,
      "meets_targets": bool(cal["median_rel_error"] is not None and
                            cal["median_rel_error"] <= 0.10 and ratio is not None and ratio >= 2.0)
  }


def layout_carry_over(measurements: um.Measurements, **fit_kw) -> dict[str, Any]:
  """Factors fitted on some layouts predict the others, per device (`STUDIES`).

  Held-out rows are chosen by layout, never at random, and never enter the
  fold's fit (each fold lists its training and held-out lines). A fold whose
  training rows are too few is reported as skipped.
  """
  check_rows(measurements)
  studies: dict[str, Any] = {}
  for study in STUDIES:
    folds, rows = [], []
    for slug in measurements.accelerators():
      device_rows = [r for r in measurements.rows if r.accelerator == slug]
      for name, train, test in _splits(study, device_rows):
        try:
          fold, report = _fold(slug, name, train, test, fit_kw)
        except errors.InputError as e:
          folds.append({"accelerator": slug, "fold": name, "skipped": str(e)})
          continue
        folds.append(fold)
        rows += report
    by_layout = {
        key: _summaries([r for r in rows if r["layout"] == key])
        for key in sorted({r["layout"] for r in rows})
    }
    studies[study] = {
        **_summaries(rows), "by_heldout_layout": by_layout, "folds": folds, "rows": rows
    }
  return {
      "kind": "layout_carry_over",
      "what": "factors (with eta_comm) fitted on some parallel layouts' measured steps predict "
              "other layouts' steps on the same device (calibrated prediction), beside the "
              "analytic bound and the ideal-split fit without communication; errors relative "
              "to the measurement",
      "file": measurements.path,
      "engine": measurements.engine,
      "studies": studies,
      "targets": {"median_rel_error_at_most": 0.10, "bound_over_calibrated_at_least": 2.0},
      "bound": row_fit.BOUND_NOTE,
      "assumptions": list(LAYOUT_NOTES) + [
          "ideal_split_calibrated: the measure layer's fit (tp divides weights, K/V and "
          "FLOPs; no communication), shown to say what the communication term adds"
      ],
      "units": {
          "measured_s": "s", "calibrated_s": "s", "bound_s": "s", "ideal_split_s": "s",
          "calibrated_rel_error": "1", "bound_rel_error": "1", "ideal_split_rel_error": "1"
      },
  }
