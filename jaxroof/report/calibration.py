"""The calibration, displayed: ceilings and factors as tables, measured vs
predicted as a plot, and the report's calibration section."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxroof import files
from jaxroof.calibrate import toy_fit
from jaxroof.measure import ceilings
from jaxroof.measure import profiles
from jaxroof.report import plots
from jaxroof.report import table
from jaxroof.symbolic import calibrated
from jaxroof.symbolic import terms
from jaxroof.symbolic.symbols import FACTOR_QUANTITIES


def plot(points: Sequence[Mapping[str, Any]], path: str | os.PathLike[str], title: str) -> None:
  """Measured against calibrated step time, log-log, with 10%/25% bands."""
  fig, ax = plots.pyplot().subplots(figsize=(6.5, 6))
  styles = {
      "train": ("o", "tab:blue", "fit models' steps"),
      "heldout": ("s", "tab:red", "held-out models"), "validation": ("D", "tab:green", "validation")
  }
  values = [v for p in points for v in (p["measured_s"], p["predicted_s"])]
  low, high = min(values) / 1.5, max(values) * 1.5
  line = np.geomspace(low, high, 50)
  ax.plot(line, line, color="black", linewidth=1, label="predicted = measured")
  for band, shade in ((0.10, 0.25), (0.25, 0.12)):
    ax.fill_between(line, line * (1 - band), line * (1 + band), color="gray", alpha=shade,
                    linewidth=0, label=f"±{band:.0%}")
  for subset, (marker, color, label) in styles.items():
    chosen = [p for p in points if p.get("set", "validation") == subset]
    if chosen:
      ax.scatter([p["measured_s"] for p in chosen], [p["predicted_s"] for p in chosen],
                 marker=marker, color=color, label=f"{label} ({len(chosen)})", s=24)
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlim(low, high)
  ax.set_ylim(low, high)
  ax.set_xlabel("measured step time, s")
  ax.set_ylabel("calibrated prediction, s")
  ax.set_title(title, fontsize=9)
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=8, loc="upper left")
  plots.save(fig, path)


def title(prof: profiles.Profile) -> str:
  return (f"Toy decode step on {prof.device_kind} ({prof.platform}, "
          f"{prof.backend}, {prof.dtype}): measured vs calibrated")


def factor_rows(factors: Mapping[str, float],
                regime: Mapping[str, float] | None = None) -> list[list[str]]:
  """Display cells of fitted factors with units and meanings (and the regime
  factors, such as XLA:CPU's re-pack, where fitted). An efficiency outside (0, 1]
  is flagged in place of its meaning: it is no achieved fraction."""
  out = []
  regime = regime or {}
  for quantity in FACTOR_QUANTITIES + tuple(terms.get(n) for n in regime):
    name = str(quantity.symbol)
    value = factors[name] if name in factors else regime[name]
    if quantity.unit == "s":
      out.append([f"`{name}`", f"{value * 1e6:,.1f} µs", quantity.meaning])
      continue
    flagged = table.outside_fraction(name, value)
    out.append([
        f"`{name}`",
        table.factor_value(name, value, ".3f"),
        table.OUTSIDE_FRACTION if flagged else quantity.meaning
    ])
  return out


def flagged_factors(factors: Mapping[str, float]) -> str:
  """A sentence naming the efficiencies outside (0, 1] ('' if none)."""
  bad = [f"`{n}` = {v:.3g}" for n, v in factors.items() if table.outside_fraction(n, v)]
  if not bad:
    return ""
  return (f" **Flagged:** {', '.join(bad)} outside (0, 1]: an efficiency is a fraction of "
          "its measured ceiling, so such a value is no achieved fraction; the fit absorbed a "
          "cost the model does not name (timing noise, a cache, a ceiling measured low).")


def ceiling_rows(c: ceilings.Ceilings) -> list[list[str]]:
  rows = [["sustained bandwidth (BW)", f"{c.bandwidth_Bps / 1e9:,.1f} GB/s"],
          ["read (sum) bandwidth", f"{c.read_bandwidth_Bps / 1e9:,.1f} GB/s"],
          ["copy bandwidth (read + write)", f"{c.copy_bandwidth_Bps / 1e9:,.1f} GB/s"]]
  rows += [[f"matmul {dtype} (F)", f"{rate / 1e9:,.1f} GFLOP/s"]
           for dtype, rate in c.flops_per_s.items()]
  return rows


def _model_list(models: Sequence[Mapping[str, Any]]) -> str:
  return "; ".join(f"`{m['name']}` (width {m['width']}, {m['num_blocks']} blocks, "
                   f"{m['num_kv_heads']} K/V heads)" for m in models)


def _bound_words(fit: Mapping[str, Any]) -> str:
  """The analytic bound's error on the same held-out steps, where recorded."""
  bound = fit.get("bound_heldout_median_rel_error")
  if bound is None:
    return ""
  worse = fit["heldout_median_rel_error"] > bound
  return (f"; the analytic bound's (step floor at the measured ceilings) median on the "
          f"same steps: {bound:.1%}" +
          (" (smaller: the bound is the better estimate here)" if worse else ""))


def _longer_run(command: str | None) -> str:
  """Who measures more points: the caller's command line, else the experiment by name."""
  return f"`{command}`" if command else "the calibrate experiment with a longer budget"


def section_markdown(job: toy_fit.CalibrationRun, longer_command: str | None = None) -> str:
  """The report's Markdown for a job whose plot is `calibration.png`; `longer_command`
  is the caller's command line for a longer run (None: described in words)."""
  prof = job.profile
  fit = prof.fit
  load = fit.get("load") or {}
  load_text = (f" The 1-minute load average during the timings was "
               f"{load['load_avg_1m_min']:.1f}-{load['load_avg_1m_max']:.1f} "
               f"on {load['cpu_count']} cores (this process included); each "
               "point keeps its lower-quartile round and points whose fastest "
               "rounds disagree are measured again."
               if load.get("load_avg_1m_max") is not None else "")
  how = ("efficiency factors fitted to the linear layer (eta_w at M = 1, "
         "eta_f and r_ovl at M >= 2) and decode attention, each timed apart "
         "from the step at the fit models' shapes (on a CPU, inside one jit "
         "over rotated operands, with no dispatch per call), fixed costs to "
         "their batch-1 decode steps"
         if fit.get("method") == "ops" else "every factor fitted to the fit models' decode steps")
  per_model = "; ".join(f"`{name}`: median {e['median_rel_error']:.1%}, max "
                        f"{e['max_rel_error']:.1%} ({e['points']} points)"
                        for name, e in (fit.get("heldout_by_model") or {}).items())
  status = fit.get("status", "unknown")
  verdict = ("It meets its targets (median <= "
             f"{toy_fit.TARGET_MEDIAN:.0%}, max <= "
             f"{toy_fit.TARGET_MAX:.0%} on each held-out model)."
             if status == "ok" else f"**Status: {status}. This calibration did not reach its "
             "accuracy targets; read its factors as rough.** " +
             " ".join(f"{w}." for w in fit.get("warnings", [])))
  return "\n".join([
      "## Calibration on this device (measurement, calibrated prediction)",
      "",
      f"A {job.budget_s:.0f}-second calibration on {prof.device_kind} "
      f"({prof.platform}), backend {prof.backend}, {prof.dtype}, jax "
      f"{prof.jax_version}: {how} ({len(job.operations)} operation points, "
      f"{len(job.rows('train'))} fit steps; {prof.method}).{load_text}",
      "",
      f"Fit models: {_model_list(prof.model.get('fit_models', []))}. Held "
      f"out (never seen by the fit): "
      f"{_model_list(prof.model.get('heldout_models', []))}.",
      "",
      "Device ceilings (*measurement*):",
      "",
      table.markdown_table(("ceiling", "value"), ceiling_rows(job.ceilings)),
      "",
      "Fitted factors of the *calibrated* model "
      f"`step = {calibrated.readable_step()}`" +
      (f" plus `{calibrated.readable_extras(prof.regime_factors)}`" if prof.regime_factors else "")
      + ":",
      "",
      table.markdown_table(("factor", "value", "meaning"),
                           factor_rows(prof.factors, prof.regime_factors)),
      "",
      f"Relative error of the calibrated prediction on "
      f"{fit['heldout_points']} decode steps of the held-out models: median "
      f"{fit['heldout_median_rel_error']:.1%}, max "
      f"{fit['heldout_max_rel_error']:.1%} ({per_model}){_bound_words(fit)}. {verdict}"
      f"{flagged_factors(prof.factors)} "
      f"A longer run ({_longer_run(longer_command)}) measures more points and rounds.",
      "",
      "![measured vs calibrated step time](calibration.png)",
  ])


def report_section(out_dir: str, job: toy_fit.CalibrationRun | None, *, budget_s: float,
                   failure: str | None = None, longer_command: str | None = None) -> str:
  """The report's section for a short calibration its caller ran on this device.

  Writes the job's plot and profile to out_dir and returns the Markdown:
  measured ceilings, fitted factors, held-out errors (on models the fit never
  saw), the run's status and the plot, each labelled measurement or calibrated.
  With no job, says why (`failure`: the job's one-line error). `longer_command`:
  the caller's command line for a longer run (None: described in words).
  """
  if job is None:
    return "\n".join([
        "## Calibration on this device (measurement)", "",
        f"The {budget_s:.0f}-second calibration could not fit a profile on this run: "
        f"{failure} Other processes may have slowed the timings; "
        f"{_longer_run(longer_command)} measures more points."
    ])
  slug = "".join(ch if ch.isalnum() else "_" for ch in job.profile.device_kind.lower())
  write_results(job, json_out=None, profile_out=os.path.join(out_dir, f"profile_{slug}.json"),
                plot_out=os.path.join(out_dir, "calibration.png"))
  return section_markdown(job, longer_command)


def write_results(job: toy_fit.CalibrationRun, *, json_out: str | None, profile_out: str | None,
                  plot_out: str | None) -> None:
  """Writes the job's JSON, profile and plot, each atomically, if asked."""
  if json_out:
    files.write_json(json_out, job.to_json())
  if profile_out:
    profiles.save_profile(job.profile, profile_out)
  if plot_out:
    plot(job.points, plot_out, title(job.profile))
