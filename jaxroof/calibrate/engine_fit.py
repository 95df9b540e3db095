"""Fitting the cost terms to serving-benchmark results through the simulator.

Each run is replayed by the continuous-batching simulator (`engine_replay`:
scheduler "chunked" by default, as vLLM's V1 engine, on a replica of the model with
the run's layout), and the terms are searched (`engine_search`) whose simulated
medians reproduce the measured ones: the mean squared log error over every run's
TTFT, TPOT and ITL.

Three terms are searched, the ones request medians can tell apart: eta_w (weight and
K/V bandwidth; eta_kv tied to it), eta_f (FLOP efficiency: prefill in TTFT, large
batches) and t0_step (fixed cost per iteration); t0_layer and r_ovl stay at
`engine_replay.FIXED`. Optional, by name (`ServingSetup.search`): a fixed cost per
request before the engine sees it (t0_request), per sequence per iteration (t0_seq:
the engine's Python and sampling work grows with the running sequences), per layer
per iteration (t0_layer: it needs fit runs of two depths) and on an iteration that
begins on an idle engine (t_wake: paid by the requests that find it idle, where
t0_request is paid by every request; hold t0_request at its measured value and the
load tells the two apart). Any registered term may be held as measured instead
(`ServingSetup.held`, by its registry name): a held searched factor is not searched,
and an engine's terms bring its extension (e.g. `jaxroof.engines.vllm_cpu`: the CPU's
cache, its GEMM's passes, elementwise kernels, wake and kernel builds).

Held-out error is leave-one-run-out: each run's metrics predicted by terms fitted on
the other runs. A held-out run paced by its client (`engine_replay.client_bound`)
shows its rows outside the medians.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxroof import errors
from jaxroof.calibrate import engine_replay
from jaxroof.calibrate import engine_search
from jaxroof.calibrate import fitting
from jaxroof.calibrate.engine_replay import ServingSetup
from jaxroof.engines import vllm_cpu
from jaxroof.measure import engine_terms_schema
from jaxroof.measure import profiles
from jaxroof.measure import vllm_results
from jaxroof.specs import accelerators
from jaxroof.specs import models
from jaxroof.specs import what_if
from jaxroof.symbolic import calibrated
from jaxroof.symbolic import terms

# Held-out percentiles (vLLM's np.percentile) of each metric.
PERCENTILES = (50, 90)
MIN_RUNS = 1
# A measured median under this share of the bound's simulated one cannot be
# reproduced by factors in range: it is left out of the fit and flagged.
BELOW_BOUND = 0.9
ASSUMPTIONS = (
    "each run replayed by the continuous-batching simulator: with per-request detail "
    "(--save-detailed) its own arrivals (start_times) and lengths; else per-request lengths "
    "from the file where present, else mean lengths, and arrivals all at 0 for rate inf, "
    "else a seeded Poisson/gamma draw at the rate",
    "a run with a jaxroof_engine_run block (experiments.vllm_bench) is simulated with its "
    "server's max_num_seqs, token budget, chunked prefill, block size and K/V blocks (read "
    "from the server's log)",
    "eta_kv tied to eta_w unless held; r_ovl held (1, or the engine's measured GEMM overlap) "
    "and t0_layer at 1 ns unless searched; every other held term as given (an engine's "
    "terms: see its assumptions); the bound at r_ovl = 1; on a layout, communication as the "
    "simulator's (analytic, serial, no eta_comm)",
    "loss: mean squared log error of the simulated vs measured median TTFT, TPOT and ITL "
    "(TTFT left out for runs with max_concurrency)",
)


def _errors(run: vllm_results.BenchRun, simulated: Mapping[str, float | None]) -> dict[str, Any]:
  out = {}
  for name, measured in run.measured.items():
    value = simulated[name]
    out[name] = {
        "measured_s": measured, "simulated_s": value,
        "rel_error": None if value is None else abs(value - measured) / measured
    }
  return out


def screen(runs: Sequence[vllm_results.BenchRun],
           setup: ServingSetup) -> tuple[list[vllm_results.BenchRun], list[str]]:
  """The runs with only the metrics the bound does not undercut; a flag per dropped one.

  A median measured below `BELOW_BOUND` of the one simulated at the bound
  (datasheet speed, no fixed cost) is faster than any factor in range allows:
  the setup or the benchmark's timing differs from the model, so it would
  only drag the factors to their limits. A held cache (`vllm_cpu.BOUND_KEEPS`)
  is a measured rate above the datasheet's, so the bound keeps it. A client-bound
  run (`engine_replay.client_bound`) is kept and flagged: its medians may still be the
  engine's, its tails are not.
  """
  floor_factors = setup.bound(floor=True)
  held = (", the held cache" if any(n in setup.held for n in vllm_cpu.BOUND_KEEPS) else "")
  kept_runs, flags = [], []
  for run in runs:
    if engine_replay.client_bound(run):
      flags.append(
          f"{run.label}: {engine_replay.coalesced_share(run):.0%} of its token gaps are coalesced (over "
          f"{engine_replay.CLIENT_BOUND_SHARE:.0%}): the client and API server paced it, not the engine, "
          "so its latencies hold a term the simulator lacks; fitted as given")
    bound = engine_replay.simulate_run(run, setup, floor_factors)
    kept = {}
    for name, measured in run.measured.items():
      floor = bound[name]
      if floor is not None and measured < BELOW_BOUND * floor:
        flags.append(
            f"{run.label} {name.removesuffix('_s')} = {measured * 1e3:.1f} ms is below the "
            f"bound's {floor * 1e3:.1f} ms (simulated at datasheet speed{held}, no fixed "
            "cost): no factor in range reproduces it, so it is left out of the fit; check the setup "
            "(model, device, tp, dtypes, scheduler) or how the benchmark timed it")
      else:
        kept[name] = measured
    if kept:
      kept_runs.append(dataclasses.replace(run, measured=kept))
  return kept_runs, flags


def fit_runs(runs: Sequence[vllm_results.BenchRun], setup: ServingSetup,
             **search_kw) -> dict[str, Any]:
  """Factors from every run, leave-one-run-out held-out errors, the bound beside them.

  Metrics below the bound are left out first (`screen`, flagged).

  Raises:
    InputError: no runs, or no metric the bound does not undercut.
  """
  if len(runs) < MIN_RUNS:
    raise errors.InputError(f"runs={len(runs)} is too few: give at least {MIN_RUNS} "
                            "benchmark run.")
  if not setup.searched:
    raise errors.InputError(
        f"every searched term ({', '.join(engine_replay.SEARCHED)}) is held and no optional "
        "cost is searched: nothing to fit; predict the runs with these terms instead.",
        field="hold")
  all_runs = list(runs)
  runs, flags = screen(all_runs, setup)
  if not runs:
    raise errors.InputError(
        f"from_vllm: every measured median is below the bound for model={setup.model!r} on "
        f"{setup.tp} x {setup.accelerator!r}: {flags[0]}.")
  values, loss, sims = engine_search.search(runs, setup, **search_kw)
  # Each fold searches afresh from `START` (not from the full fit, which saw the
  # held-out run), with the same settings.
  fold_kw = {k: v for k, v in search_kw.items() if k != "start"}
  folds, held = [], []
  if len(runs) >= 2:
    for i, run in enumerate(runs):
      train = [r for j, r in enumerate(runs) if j != i]
      fold_values, _, _ = engine_search.search(train, setup, **fold_kw)
      errs = _errors(run, engine_replay.simulate_run(run, setup, fold_values))
      held += [e["rel_error"] for e in errs.values() if e["rel_error"] is not None]
      folds.append({
          "heldout_run": run.label, "trained_on": [r.label for r in train],
          "factors": engine_replay.factors_of({**fold_values,
                                               **setup.held_terms()}), "metrics": errs
      })
  per_run, bound_errs, train_errs = [], [], []
  fitted = {r.label: set(r.measured) for r in runs}
  for run in all_runs:
    cal = _errors(run, engine_replay.simulate_run(run, setup, values))
    bound = _errors(run, engine_replay.simulate_run(run, setup, setup.bound()))
    for name in cal:
      cal[name]["in_fit"] = name in fitted.get(run.label, set())
    train_errs += [
        e["rel_error"] for e in cal.values() if e["rel_error"] is not None and e["in_fit"]
    ]
    bound_errs += [
        bound[n]["rel_error"] for n, e in cal.items()
        if bound[n]["rel_error"] is not None and e["in_fit"]
    ]
    per_run.append({
        "run": run.label, "engine": run.engine,
        "request_rate": None if math.isinf(run.request_rate) else run.request_rate,
        "max_concurrency": run.max_concurrency, "requests": len(run.prompt_tokens),
        "mean_prompt_tokens": float(run.prompt_tokens.mean()),
        "mean_output_tokens": float(run.output_tokens.mean()), "calibrated": cal, "bound": bound
    })
  held_summary = fitting.error_summary(held)
  return {
      "factors": engine_replay.factors_of({**values, **setup.held_terms()}),
      "searched": list(setup.searched),
      "fixed": {
          n: v for n, v in {**engine_replay.FIXED, **setup.held_terms()}.items()
          if n not in setup.searched
      },
      "tied": {} if "eta_kv" in setup.held else {"eta_kv": "eta_w"},
      "loss": loss,
      "statistic": "mean squared log error",
      "simulations": sims,
      "starts": search_kw.get("starts", 1),
      "setup": dataclasses.asdict(setup),
      "heldout_median_rel_error": held_summary["median_rel_error"],
      "heldout_max_rel_error": held_summary["max_rel_error"],
      "heldout_points": held_summary["points"],
      "heldout_method": ("leave-one-run-out: each run's medians simulated with factors "
                         "searched on the other runs" if folds else
                         "none: one run (give two or more runs for a held-out error)"),
      "train": fitting.error_summary(train_errs),
      "bound": {
          **fitting.error_summary(bound_errs),
          "what": "simulated with eta = 1 and no fixed cost (the analytic bound "
                  "iteration), on the metrics in the fit"
      },
      "folds": folds,
      "runs": per_run,
      "rows_used": len(runs),
      "metrics_used": sum(len(r.measured) for r in runs),
      "flags": flags,
      "assumptions": list(ASSUMPTIONS),
  }


def _thin(values: np.ndarray, keep: int = 101) -> list[float]:
  """Sorted values, or `keep` evenly spaced quantiles of them (for CDF plots)."""
  values = np.sort(np.asarray(values, float))
  if len(values) <= keep:
    return values.tolist()
  return np.quantile(values, np.linspace(0, 1, keep)).tolist()


def predict_heldout(runs: Sequence[vllm_results.BenchRun], setup: ServingSetup,
                    factors: Mapping[str, float]) -> dict[str, Any]:
  """Held-out runs predicted with fitted factors: `heldout[]` rows and CDF samples.

  Each row: `run`, `metric` (ttft, tpot, itl), `percentile`, `measured_s`,
  `predicted_s` (calibrated), `bound_s` (eta = 1, no fixed costs) and
  `rel_error` (|predicted - measured| / measured). A coalesced measurement has
  no relative error; a client-bound run's rows (`client_bound`) keep theirs but
  stay out of the medians and the maximum, counted apart.
  """
  rows, throughput, cdfs, terms = [], [], [], []
  for run in runs:
    predicted = engine_replay.simulate_run(run, setup, factors, detail=True)
    bound = engine_replay.simulate_run(run, setup, setup.bound())
    share, paced = engine_replay.coalesced_share(run), engine_replay.client_bound(run)
    for metric in ("ttft", "tpot", "itl"):
      for q in PERCENTILES:
        measured = vllm_results.measured_percentile(run, metric, q)
        key = f"median_{metric}_s" if q == 50 else f"p{q}_{metric}_s"
        value = predicted.get(key)
        if measured is None or value is None:
          continue
        coalesced = measured < engine_replay.COALESCED_S  # Tokens that arrived together: no step to match.
        note = {}
        if coalesced:
          note = {
              "note":
                  f"measured {measured * 1e3:.3g} ms: under {engine_replay.COALESCED_S * 1e3:g} ms the "
                  "client received these tokens together (coalesced_itl_share), so no "
                  "relative error is defined; left out of the medians"
          }
        elif paced:
          note = {
              "client_bound": True, "note":
                  f"{share:.0%} of this run's token gaps are coalesced (over "
                  f"{engine_replay.CLIENT_BOUND_SHARE:.0%}): its client and API server paced it, not the "
                  "engine; the error is shown and left out of the medians and the maximum"
          }
        rows.append({
            "run": run.label, "model": run.model or setup.model, "metric": metric, "percentile": q,
            "measured_s": measured, "predicted_s": value, "bound_s": bound.get(key),
            "rel_error": None if coalesced else abs(value - measured) / measured, **note
        })
    measured_rate = run.measured_throughput
    if measured_rate and predicted.get("request_throughput_per_s"):
      throughput.append({
          "run": run.label, "metric": "request_throughput", "measured_per_s": measured_rate,
          "predicted_per_s": predicted["request_throughput_per_s"],
          "rel_error": abs(predicted["request_throughput_per_s"] - measured_rate) / measured_rate
      })
    if share is not None:
      terms.append({
          "run": run.label, "term": "coalesced_itl_share", "value": share, "client_bound": paced,
          "what": f"share of measured token gaps under {engine_replay.COALESCED_S * 1e3:g} ms: "
                  "tokens the client received together (the client, API server "
                  "and engine share the CPU), not engine steps; the simulator has "
                  "no such term"
      })
    if run.detail is not None:
      cdfs.append({
          "run": run.label, "measured": {m: _thin(run.detail[f"{m}_s"]) for m in ("ttft", "itl")},
          "predicted": {m: _thin(predicted["detail"][f"{m}_s"]) for m in ("ttft", "itl")}
      })
  scored = [r for r in rows if r["rel_error"] is not None and not r.get("client_bound")]
  errors_ = [r["rel_error"] for r in scored]
  paced_points = sum(bool(r.get("client_bound")) for r in rows)
  return {
      "heldout": rows, "heldout_throughput": throughput, "cdfs": cdfs, "heldout_terms": terms,
      "heldout_median_rel_error": float(np.median(errors_)) if errors_ else None,
      "heldout_median_rel_error_by_metric": {
          f"p{q} {m}": float(
              np.median(
                  [r["rel_error"] for r in scored if r["metric"] == m and r["percentile"] == q]))
          for m in ("ttft", "tpot", "itl") for q in PERCENTILES
          if any(r["metric"] == m and r["percentile"] == q for r in scored)
      }, "heldout_max_rel_error": float(np.max(errors_)) if errors_ else None,
      "heldout_points": len(errors_),
      "heldout_points_coalesced": sum(r["rel_error"] is None for r in rows
                                     ), "heldout_points_client_bound": paced_points,
      "client_bound_share": engine_replay.CLIENT_BOUND_SHARE
  }


def _per_file(chosen: str | Sequence[str] | None, paths: Sequence[str],
              field: str) -> list[str | None]:
  """One model (or None: the setup's) per file: one for all, or one per file."""
  per_file = [chosen] if isinstance(chosen, str) or chosen is None else list(chosen)
  if len(per_file) == 1:
    per_file = per_file * len(paths)
  if paths and len(per_file) != len(paths):
    raise errors.InputError(
        f"{field} names {len(per_file)} models for {len(paths)} files: give one, or one "
        "per file.", field=field)
  for name in set(per_file) - {None, ""}:
    try:
      models.load_model(name)
    except errors.InputError as error:  # Named as the per-file list, not the setup's model.
      raise errors.InputError(str(error), field=field) from None
  return per_file


def _heldout_runs(paths: Sequence[str],
                  per_file: Sequence[str | None]) -> list[vllm_results.BenchRun]:
  """The held-out files' runs, each on its model; every one must carry per-request detail."""
  held = []
  for path, model in zip(paths, per_file):
    held += [
        dataclasses.replace(r, model=model or None)
        for r in vllm_results.read_runs([path], field="heldout_vllm")
    ]
  for run in held:
    if run.detail is None:
      raise errors.InputError(
          f"heldout_vllm={run.path!r} has no per-request detail "
          "(start_times, input_lens, output_lens, ttfts, itls): rerun vllm "
          "bench serve with --save-result --save-detailed.", field="heldout_vllm")
  return held


def _engine_run_block(runs: Sequence[vllm_results.BenchRun]) -> dict[str, Any]:
  """`engine_run`: the version, device, dates and load of runs made by experiments.vllm_bench."""
  blocks = [r.engine_run for r in runs if r.engine_run]
  if not blocks:
    return {}
  loads = [b["load"]["before"][0] for b in blocks if isinstance(b.get("load"), dict)]
  return {
      "engine_run": {
          "vllm_version": blocks[0].get("vllm_version"), "device": blocks[0].get("device"),
          "date": f"{min(b.get('date', '') for b in blocks)} to "
                  f"{max(b.get('date', '') for b in blocks)}",
          "load": f"{min(loads):.2f}-{max(loads):.2f}" if loads else None,
          "what": "measurement: vLLM bench serve on loopback (jaxroof_engine_run blocks)"
      }
  }


def calibrate_engine(paths: Sequence[str], setup: ServingSetup, *,
                     heldout_paths: Sequence[str] = (),
                     heldout_model: str | Sequence[str] | None = None,
                     fit_model: str | Sequence[str] | None = None, **search_kw) -> dict[str, Any]:
  """Reads result files and fits them (`fit_runs`); predicts held-out files; the JSON.

  Held-out files must carry per-request detail (`--save-detailed`); each is
  replayed with its own arrivals and lengths, on `heldout_model` if given:
  one model for every held-out file, or one per file (in order). `fit_model`
  does the same for the fitted files (default the setup's model): runs of two
  model sizes let the fit tell the weights' rate from the fixed costs, which
  one size cannot.

  Raises:
    InputError: a bad file or key, an unknown model or device, a layout the
      model or device refuses, a held-out file without per-request detail.
  """
  models.load_model(setup.model)
  engine_replay.load_device(setup)
  per_file = _per_file(heldout_model, heldout_paths, "heldout_model")
  fit_per_file = _per_file(fit_model, paths, "fit_model")
  runs = []
  for path, model in zip(paths, fit_per_file):
    runs += [dataclasses.replace(r, model=model or None) for r in vllm_results.read_runs([path])]
  held = _heldout_runs(heldout_paths, per_file)
  result = fit_runs(runs, setup, **search_kw)
  if held:
    result["loo"] = {
        k: result[k] for k in ("heldout_median_rel_error", "heldout_max_rel_error", "heldout_points",
                              "heldout_method")
    }
    result.update(predict_heldout(held, setup, result["factors"]))
    result["heldout_method"] = (
        "held-out files: each run replayed with its own arrivals and lengths and predicted "
        "with the factors fitted on the from_vllm runs; rows: p50 and p90 of TTFT, TPOT, ITL")
  result.update(_engine_run_block([*runs, *held]))
  return {
      "kind": "engine_calibration",
      "what": "calibrated factors chosen so that the continuous-batching simulator "
              "reproduces measured serving-benchmark medians (TTFT, TPOT, ITL)", "labels": {
                  "measured": "measurement (the result files)",
                  "predicted": "calibrated prediction (simulator + fitted factors)",
                  "bound": "analytic bound (simulator, eta = 1, no fixed costs)"
              }, "source": {
                  "files": [os.fspath(p) for p in paths
                           ], "heldout_files": [os.fspath(p) for p in heldout_paths],
                  "heldout_models": per_file if heldout_paths else [],
                  "fit_models": [m or setup.model for m in fit_per_file],
                  "engines": sorted({r.engine for r in runs}), "model": setup.model,
                  "accelerator": setup.device_name, "tp": setup.tp
              }, **result, "units": {
                  "measured_s": "s", "simulated_s": "s", "predicted_s": "s", "bound_s": "s",
                  "rel_error": "1", "t0_request": "s", "t0_step": "s"
              }
  }


def read_terms(path: str | os.PathLike[str], field: str = "engine_terms") -> dict[str, float]:
  """Cost terms to hold, by registry name, from a JSON file: an object NAME: VALUE, the
  same under "terms", or an earlier engine calibration (the result JSON of
  `calibrate_engine`: its factors and the terms it held), what `predict_runs` predicts
  with on another device or day. Each value is checked against its term's bounds.

  Raises:
    InputError: not such a file, an unknown name, or a value outside its bounds.
  """
  where = f"{os.fspath(path)}: "
  data = engine_terms_schema.load(field, path)  # Size, nesting and every term checked.
  if isinstance(data, dict) and data.get("kind") == "engine_calibration":
    values = dict(data.get("factors") or {})
    fixed = data.get("fixed")
    if isinstance(fixed, dict):  # What it held beside its factors.
      values.update({n: v for n, v in fixed.items() if n not in values})
  elif isinstance(data, dict) and isinstance(data.get("terms"), dict):
    values = dict(data["terms"])
  elif isinstance(data, dict) and data and "hosts" not in data and "kind" not in data:
    values = dict(data)
  else:
    raise errors.InputError(
        f"{where}is not a set of cost terms: give an object NAME: VALUE (or under \"terms\"), "
        "or the result JSON of a vLLM-run fit (kind engine_calibration); an engine's data file "
        "of several hosts holds one set per host.", field=field)
  return terms.checked(values, field, where)


def predict_runs(heldout_paths: Sequence[str], setup: ServingSetup, factors: Mapping[str, float], *,
                 heldout_model: str | Sequence[str] | None = None,
                 factors_from: str | None = None) -> dict[str, Any]:
  """Runs predicted with given factors and no fit: the JSON (`kind` engine_prediction).

  The terms of one calibration (`read_terms`) on the setup's device: the
  efficiency factors and fixed costs fitted on one device or day, the ceilings
  of another. Rows as `predict_heldout`'s; each run replayed with its own
  arrivals and lengths.

  Raises:
    InputError: as `calibrate_engine`'s for the held-out files, model and device.
  """
  models.load_model(setup.model)
  engine_replay.load_device(setup)
  if not heldout_paths:
    raise errors.InputError("heldout_vllm is empty: give the runs to predict.",
                            field="heldout_vllm")
  missing = [n for n in engine_replay.SEARCHED if n not in factors]
  if missing:
    raise errors.InputError(
        f"{', '.join(missing)} not given: a prediction fits nothing, so give every searched "
        "term (an earlier vLLM-run fit's result holds them).", field="engine_terms")
  per_file = _per_file(heldout_model, heldout_paths, "heldout_model")
  held = _heldout_runs(heldout_paths, per_file)
  values = {**setup.held_terms(), **factors}
  result = predict_heldout(held, setup, values)
  return {
      "kind": "engine_prediction",
      "what": "serving-benchmark runs predicted by the continuous-batching simulator with "
              "factors fitted elsewhere (no fit on these runs)", "labels": {
                  "measured": "measurement (the result files)",
                  "predicted": "calibrated prediction (simulator + the given factors, on this "
                               "device's ceilings)",
                  "bound": "analytic bound (simulator, eta = 1, no fixed costs)"
              }, "factors": engine_replay.factors_of(values),
      "factors_from": None if factors_from is None else os.fspath(factors_from), "source": {
          "heldout_files": [os.fspath(p) for p in heldout_paths], "heldout_models": per_file,
          "model": setup.model, "accelerator": setup.device_name, "tp": setup.tp
      }, "setup": dataclasses.asdict(setup), **result,
      "heldout_method": "each run replayed with its own arrivals and lengths and predicted "
                        "with the given factors, none fitted on it; rows: p50 and p90 of "
                        "TTFT, TPOT, ITL", **_engine_run_block(held), "units": {
          "measured_s": "s", "predicted_s": "s", "bound_s": "s", "rel_error": "1",
          "t0_request": "s", "t0_step": "s"
      }
  }


def engine_profile(result: dict[str, Any]) -> profiles.Profile:
  """The fitted factors as a profile of the device (a `Profile` the experiments read)."""
  setup, source = result["setup"], result["source"]
  device = (what_if.load_accelerator_file(setup["accelerator_file"]) if
            setup.get("accelerator_file") else accelerators.load_accelerator(setup["accelerator"]))
  created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
  fit_block = {
      key: result[key]
      for key in ("heldout_median_rel_error", "heldout_max_rel_error", "heldout_points",
                  "heldout_method", "loss", "statistic", "searched", "fixed", "tied")
  }
  return profiles.Profile(
      device_kind=device.full_name, platform="", backend=", ".join(source["engines"]),
      dtype=setup["weight_dtype"], jax_version=importlib.metadata.version("jax"), created=created,
      ceilings={}, factors={n: float(result["factors"][n]) for n in calibrated.FACTOR_NAMES
                           }, fit=fit_block, model={"setup": setup},
      method="serving-benchmark medians (TTFT, TPOT, ITL) reproduced by the "
      "continuous-batching simulator (jaxroof.calibrate.engine_fit)", accelerator=device.name,
      source={
          **source, "date": created, "rows_used": result["rows_used"],
          "what": "request-level metrics of the user's serving benchmark"
      })
