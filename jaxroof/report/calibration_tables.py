"""Every calibration's result as terminal text: tables and labelled lines.

`experiments.calibrate` prints these for each source (toy steps and operations,
users' rows, layouts, vLLM runs through the simulator); nothing here fits or
times. Every number is labelled measured, calibrated prediction or bound.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jaxroof.calibrate import toy_fit
from jaxroof.calibrate import user_fit
from jaxroof.measure import profiles
from jaxroof.report import calibration as calibration_report
from jaxroof.report import table
from jaxroof.symbolic import calibrated
from jaxroof.symbolic import terms


def points_table(rows: Sequence[Mapping[str, Any]]) -> str:
  """Toy decode steps: measured against the calibrated prediction."""
  headers = ("set", "model", "batch", "context", "measured ms", "predicted ms", "error")
  cells = [[
      r["set"], r["model"], r["batch"], r["context"], f"{r['measured_s'] * 1e3:,.2f}",
      f"{r['predicted_s'] * 1e3:,.2f}", f"{r['rel_error']:.1%}"
  ] for r in rows]
  return table.format_table(headers, cells)


def status_lines(status: str, warnings: Sequence[str]) -> list[str]:
  """The warnings, then one STATUS line that says whether the targets were met."""
  lines = [f"WARNING: {w}" for w in warnings]
  if status != "ok":
    lines.append(f"STATUS: {status}: this calibration did not reach its accuracy "
                 "targets; do not use its figures as if it had.")
  else:
    lines.append("STATUS: ok (every held-out model within its targets)")
  return lines


def toy_text(job: toy_fit.CalibrationRun) -> str:
  """A toy calibration: ceilings, factors, every step, held-out errors, status."""
  prof, fit = job.profile, job.profile.fit
  lines = [
      f"Calibration on {prof.device_kind} ({prof.platform}), backend {prof.backend}, "
      f"{prof.dtype}, jax {prof.jax_version}; fit {fit['method']}: "
      f"{len(job.operations)} operation and {len(job.points)} step points in "
      f"{job.elapsed_s:.0f} s.", "Ceilings (measurement):",
      table.format_table(("ceiling", "value"), calibration_report.ceiling_rows(job.ceilings)),
      f"Calibrated model: step = {calibrated.readable_step()}"
  ]
  if prof.regime_factors:
    lines.append(f"  plus {calibrated.readable_extras(prof.regime_factors)}")
  lines += [
      table.format_table(("factor", "value", "meaning"),
                         calibration_report.factor_rows(prof.factors, prof.regime_factors)),
      points_table(job.points),
      "fit models: " + ", ".join(m["name"] for m in prof.model["fit_models"]) + "; held out: " +
      ", ".join(m["name"] for m in prof.model["heldout_models"])
  ]
  for name, errs in fit["heldout_by_model"].items():
    lines.append(f"held-out {name}: median {errs['median_rel_error']:.1%}, max "
                 f"{errs['max_rel_error']:.1%} ({errs['points']} points)")
  lines.append(f"held-out relative error: median {fit['heldout_median_rel_error']:.1%}, max "
               f"{fit['heldout_max_rel_error']:.1%} ({fit['heldout_points']} points on models the "
               "fit never saw); analytic bound's median on the same points: "
               f"{table.percent(fit.get('bound_heldout_median_rel_error'))}")
  load = fit["load"]
  if load["load_avg_1m_max"] is not None:
    lines.append(f"load average during the timings: {load['load_avg_1m_min']:.1f}-"
                 f"{load['load_avg_1m_max']:.1f} on {load['cpu_count']} cores")
  return "\n".join(lines + status_lines(job.status, job.warnings))


def repeatability_line(repeat: Mapping[str, Any], previous: str) -> str:
  """Whether this calibration repeats an earlier one (`toy_fit.compare_profiles`)."""
  diff = repeat["heldout_median_diff_points"]
  moved = repeat.get("ceiling_rel_diff", {}).get("bandwidth_Bps")
  outside = ", ".join(repeat["factors_outside"]) or "none"
  return (f"repeatability against {previous}: largest factor difference "
          f"{repeat['max_factor_rel_diff']:.1%} (outside: {outside}; efficiencies as the "
          "rates eta x ceiling"
          f"{'' if moved is None else f', the measured bandwidth itself moved {moved:.0%}'}), "
          "held-out median difference "
          f"{'n/a' if diff is None else f'{diff:.1f} points'}: "
          f"{'PASS' if repeat['pass'] else 'FAIL'} (factors within "
          f"{toy_fit.REPEAT_FACTOR_REL:.0%}, medians within "
          f"{toy_fit.REPEAT_MEDIAN_POINTS:g} points)" + _data_moved(repeat))


def _data_moved(repeat: Mapping[str, Any]) -> str:
  """What of a failed repeat the timings themselves explain (the machine's floor)."""
  moved = repeat.get("basis_rel_diff") or {}
  noise = repeat.get("factor_round_noise") or repeat.get("basis_round_spread") or {}
  change = repeat.get("factor_rel_change") or {}
  from_data = repeat.get("factor_rel_change_from_data") or {}

  def as_data(n: str) -> str:
    if moved.get(n, 0.0) > toy_fit.REPEAT_FACTOR_REL or n not in from_data:
      return f"{n}'s timed points moved {moved.get(n, 0.0):.0%}"
    of = " of the fastest step" if n in repeat.get("factors_as_share_of_fastest_step", []) else ""
    return (f"{n} moved {change[n]:+.0%}{of}, of which its timed points' move makes "
            f"{from_data[n]:+.0%} in the fit")

  parts = [as_data(n) for n in repeat.get("factors_outside_as_their_data", [])] + [
      f"{n} inherits {noise[n]:.0%} of noise from its timed points' rounds within one run"
      for n in repeat.get("factors_outside_within_round_noise", [])
  ]
  if "heldout" in moved:
    parts.append(f"the held-out steps moved {moved['heldout']:.1%} (median)")
  verdict = ("; every factor outside is within this machine's floor"
             if repeat.get("outside_explained_by_machine") else "")
  return ("; between the two processes " + ", ".join(parts) + verdict) if parts else ""


def validation_text(path: str, prof: profiles.Profile, rows: Sequence[Mapping[str, Any]],
                    errs: Mapping[str, Any]) -> str:
  """A profile validated at fresh points: measured afresh against calibrated."""
  return "\n".join([
      f"Validation of {path} on {prof.device_kind} ({prof.backend}, {prof.dtype}): "
      "measured afresh vs calibrated.",
      points_table(rows), f"relative error: median {errs['median_rel_error']:.1%}, max "
      f"{errs['max_rel_error']:.1%} ({errs['points']} points)"
  ])


def _user_rows(rows: Sequence[Mapping[str, Any]], title: str) -> str:
  headers = ("line", "model", "phase", "batch", "context/prompt", "tp", "measured ms",
             "calibrated ms", "error", "bound ms", "bound error")
  cells = [[
      r["line"], r["model"], r["phase"], r["batch"], r["context"] or r["prompt_tokens"], r["tp"],
      f"{r['measured_s'] * 1e3:,.2f}", f"{r['calibrated_s'] * 1e3:,.2f}",
      f"{r['calibrated_rel_error']:.1%}", f"{r['bound_s'] * 1e3:,.2f}",
      f"{r['bound_rel_error']:.1%}"
  ] for r in rows]
  return title + "\n" + table.format_table(headers, cells)


def _suspicious(flagged: Sequence[Mapping[str, Any]]) -> list[str]:
  if not flagged:
    return []
  cells = [[
      f["line"], f["model"], f["phase"], f["batch"], f["context"] or f["prompt_tokens"],
      f"{f['measured_s'] * 1e3:,.3f}", f"{f['bound_s'] * 1e3:,.3f}", f"{f['ratio_to_bound']:.3f}",
      "left out" if f["dropped"] else "kept"
  ] for f in flagged]
  return [
      "Suspicious rows (measurement / analytic bound; a step cannot beat the bound, "
      f"and more than {user_fit.SLOWER_LIMIT:g}x slower is doubtful):",
      table.format_table(("line", "model", "phase", "batch", "context/prompt", "measured ms",
                          "bound ms", "ratio", "in the fit"), cells)
  ]


def user_fit_text(result: Mapping[str, Any], source: str, engine: str, drop_hint: str) -> str:
  """A fit to users' measured rows (`user_fit.calibrate`); `drop_hint` says how to
  leave the suspicious rows out, shown when some were kept."""
  by_model = result["heldout_by"] == user_fit.HELDOUT_BY_MODEL
  by = "leave-one-model-out" if by_model else "k-fold over the rows of one model"
  lines = [
      f"Calibration of {result['accelerator']} from {result['rows_used']} of "
      f"{result['rows_read']} measured rows of {source} (engine: {engine}).",
      *_suspicious(result["suspicious_rows"]),
      table.factor_table(dict(result)),
      _user_rows(
          result["heldout_rows"],
          (f"Held-out rows ({by}; " if by_model else f"Rows predicted by the other folds ({by}; ") +
          "calibrated prediction vs measurement, and the analytic bound):"),
      table.heldout_line(dict(result)) +
      f" (held out by {result['heldout_by']})" if by_model else table.heldout_line(
          dict(result), "within-model (k-fold over one model's rows; the error "
          "on other models is unknown)")
  ]
  larger = result.get("extrapolation")
  if larger:
    lines.append(f"larger steps (line(s) {', '.join(str(n) for n in larger['heldout_lines'])}, "
                 "predicted by a fit on the smaller ones): calibrated median "
                 f"{table.percent(larger['calibrated']['median_rel_error'])}, bound median "
                 f"{table.percent(larger['bound']['median_rel_error'])}")
  lines += [f"WARNING: {w}" for w in result["warnings"]]
  if any(not f["dropped"] for f in result["suspicious_rows"]):
    lines.append(f"({drop_hint} leaves the suspicious rows out of the fit.)")
  return "\n".join(lines)


def carry_over_text(result: Mapping[str, Any], source: str, engine: str) -> str:
  """The carry-over study: fit on one model, predict another, per device."""
  cells = [[
      p["accelerator"], p["fit_model"], p["target"], ", ".join(p["relation"]), ", ".join(p["free"]),
      table.percent(p["bound"]["median_rel_error"]),
      table.percent(p["calibrated"]["median_rel_error"]) +
      (" (worse than the bound)"
       if p["calibrated"]["median_rel_error"] > p["bound"]["median_rel_error"] else "")
  ] for p in result["pairs"] if "skipped" not in p]
  lines = [
      f"Carry-over from {source} (engine: {engine}):",
      table.format_table(("device", "fit on", "predict", "relation", "free factors", "bound median",
                          "calibrated median"), cells)
  ]
  lines += [
      f"skipped {p['accelerator']} {p['fit_model']} -> {p['target']}: {p['skipped']}"
      for p in result["pairs"] if "skipped" in p
  ]
  lines.append(
      f"all predicted rows: calibrated median {table.percent(result['median_rel_error'])}, "
      f"max {table.percent(result['max_rel_error'])}; bound median "
      f"{table.percent(result['bound_median_rel_error'])}; targets (median <= 10%, "
      f"calibrated >= 2x better than bound) met: {result['meets_targets']}")
  return "\n".join(lines)


def layout_fit_text(result: Mapping[str, Any], source: str) -> str:
  """A fit to rows on parallel layouts, with eta_comm."""
  return "\n".join([
      f"Calibration of {result['accelerator']} from {result['rows_used']} measured rows "
      f"of {source} on layouts {', '.join(result['layouts'])}.",
      table.factor_table(dict(result)),
      table.heldout_line(dict(result), "held-out (leave-one-model-out)")
  ])


def layout_carry_over_text(result: Mapping[str, Any], source: str, engine: str) -> str:
  """The layout carry-over studies: median errors per held-out layout."""
  cells = []
  for study, block in result["studies"].items():
    summaries = [*block["by_heldout_layout"].items(), ("all held out", block)]
    for key, summary in summaries:
      cells.append([
          study, key, summary["calibrated"]["points"],
          table.percent(summary["calibrated"]["median_rel_error"]),
          table.percent(summary["ideal_split_calibrated"]["median_rel_error"]),
          table.percent(summary["bound"]["median_rel_error"])
      ])
  lines = [
      f"Layout carry-over from {source} (engine: {engine}); median relative error "
      "vs the measurement:",
      table.format_table(("study", "held-out layout", "rows", "calibrated (eta_comm)",
                          "calibrated (ideal split)", "bound"), cells)
  ]
  lines += [
      f"skipped {fold['accelerator']} {fold['fold']}: {fold['skipped']}"
      for block in result["studies"].values() for fold in block["folds"] if "skipped" in fold
  ]
  return "\n".join(lines)


def _ms(value: float | None) -> str:
  return f"{value * 1e3:.2f}" if value else "n/a"


def engine_fit_text(result: Mapping[str, Any]) -> str:
  """vLLM runs fitted through the simulator: factors, per-run medians, held out."""
  lines = [
      f"Fitted through the simulator ({result['simulations']} loss evaluations): " +
      ", ".join(f"{n} = {v:.4g}" for n, v in result["factors"].items())
  ]
  cells = [[
      run["run"], name,
      _ms(cal["measured_s"]),
      _ms(cal["simulated_s"]),
      table.percent(cal["rel_error"]),
      _ms(run["bound"][name]["simulated_s"]),
      table.percent(run["bound"][name]["rel_error"])
  ] for run in result["runs"] for name, cal in run["calibrated"].items()]
  lines.append(
      table.format_table(
          ("run", "metric", "measured ms", "calibrated ms", "error", "bound ms", "bound error"),
          cells))
  lines += [f"FLAG: {flag}" for flag in result["flags"]]
  return "\n".join(lines + [_heldout_text(result)])


def engine_prediction_text(result: Mapping[str, Any]) -> str:
  """vLLM runs predicted with an earlier calibration's factors: factors, held-out rows."""
  lines = [
      f"Predicted with the factors of {result['factors_from'] or 'the caller'} on "
      f"{result['source']['accelerator']} (no fit): " +
      ", ".join(f"{n} = {v:.4g}" for n, v in result["factors"].items())
  ]
  return "\n".join(lines + [_heldout_text(result)])


def _heldout_text(result: Mapping[str, Any]) -> str:
  """The held-out rows, throughputs and medians of an engine fit or prediction."""
  lines = []
  if result.get("heldout"):
    lines.append(
        table.format_table(
            ("held-out run", "metric", "measured ms", "predicted ms", "error", "bound ms"), [[
                r["run"], f"p{r['percentile']} {r['metric']}",
                _ms(r["measured_s"]),
                _ms(r["predicted_s"]),
                table.heldout_error(r),
                _ms(r["bound_s"])
            ] for r in result["heldout"]]))
    lines += [
        f"{r['run']}: throughput measured {r['measured_per_s']:.3f} req/s, predicted "
        f"{r['predicted_per_s']:.3f} ({table.percent(r['rel_error'])})"
        for r in result["heldout_throughput"]
    ]
  coalesced = result.get("heldout_points_coalesced")
  paced = result.get("heldout_points_client_bound")
  lines.append(f"held-out ({result['heldout_method']}): median "
               f"{table.percent(result['heldout_median_rel_error'])}, max "
               f"{table.percent(result['heldout_max_rel_error'])}" +
               (f" ({coalesced} coalesced measurement(s) without a relative error left out)"
                if coalesced else "") +
               (f" ({paced} point(s) of client-bound runs left out)" if paced else ""))
  return "\n".join(lines)


def _pct(value: float | None) -> str:
  return "n/a" if value is None else f"{100 * value:.1f}%"


def error_cells(row: Mapping[str, Any]) -> list[str]:
  """median, p90 and max relative error, as percentages."""
  return [_pct(row.get(k)) for k in ("median_rel_error", "p90_rel_error", "max_rel_error")]


def published_fit_text(profile: Mapping[str, Any]) -> str:
  """An engine profile refitted from published points: its terms (a share of a ceiling
  only where the term is one and lies in (0, 1]), its error by source held out, and the
  derivation rule's error by accelerator held out."""
  lines = [
      f"engine profile {profile['engine']} (covers {', '.join(profile['covers'])}): "
      f"{profile['points_used']} published training points, sources "
      f"{', '.join(profile['data']['sources']) or 'none usable'}"
  ]
  rows = []
  for name, value in profile["terms"].items():
    term = terms.get(name)
    share = term.unit == "1" and name.startswith("eta_")
    shown = (f"{value:.3g} of its ceiling" if share and 0 < value <= 1 else f"{value:.3g}" +
             ("" if term.unit == "1" else f" {term.unit}") +
             (" (OUTSIDE (0, 1]: not a share)" if share else ""))
    rows.append([name, shown, term.label])
  lines.append(table.format_table(("term", "value", "what"), rows))
  held = [[r["source"], str(r["points"]), *error_cells(r)] for r in profile["heldout_by_source"]]
  if held:
    held.append([
        "all sources",
        str(sum(r["points"] for r in profile["heldout_by_source"])), *error_cells(profile)
    ])
    lines.append(f"held-out error, {profile['heldout_method']}:")
    lines.append(table.format_table(("source", "points", "median", "p90", "max"), held))
  else:
    lines.append(f"held-out error: {profile['heldout_method']}")
  derived = profile.get("derived", {})
  lines.append(f"an accelerator not measured: {derived.get('rule', 'refused')}; its error "
               f"median {_pct(derived.get('median_rel_error'))}, p90 "
               f"{_pct(derived.get('p90_rel_error'))}, max {_pct(derived.get('max_rel_error'))}")
  lines.append(f"scheduler and memory: {profile['rules']}")
  return "\n".join(lines)


def terms_table_text(result: Mapping[str, Mapping[str, Any]]) -> str:
  """The leave-one-source-out error of each variant of the engine profiles' design."""
  profiles_ = sorted({p for row in result.values() for p in row["profiles"]})
  rows = [[name, str(row["points"]), *error_cells(row)] +
          [" / ".join(error_cells(row["profiles"].get(p, {}))) for p in profiles_]
          for name, row in result.items()]
  return ("held-out error leaving out one whole source at a time, with and without each term "
          "(median / p90 / max):\n" + table.format_table(
              ("variant", "points", "median", "p90", "max", *profiles_), rows))
