"""The toy server against its simulated twin, at three loads.

1. probe: every request at once (measured saturation throughput);
2. calibration: a bursty (gamma) run at 0.6 of that, with its own seed; the
   calibrated iteration's factors are fitted to the probe's and this run's
   iterations (`twin.fit_iteration_factors`); the twin's saturation rate
   X_sat is its simulated throughput on the probe's workload;
3. three loads, light, near the knee and overloaded (0.3, 0.85, 1.5 X_sat,
   new seeds), each after a fresh bursty calibration run whose fit is the
   held-out twin (a shared CPU's speed drifts within minutes): each workload is served for real and simulated by the twin
   (scheduler "iteration", the server's own policy), and the vLLM metrics of
   both are compared. Each run is also simulated by a twin refitted to that
   run's own iterations, which separates the scheduling model from the drift
   of a shared CPU's speed between runs.
"""

from __future__ import annotations

import dataclasses
import datetime
import os

import numpy as np

from jaxroof.serving import arrivals, metrics, simulator, toy_server, twin
from jaxroof.symbolic import iteration

LOADS: dict[str, float] = {"light": 0.3, "knee": 0.85, "overloaded": 1.5}
TARGETS: dict[str, float] = {"throughput": 0.10, "median_ttft": 0.20, "median_itl": 0.20}


def _workload(rate, n, seed, prompt, prompt_spread, output, output_spread, arrival="poisson",
              burstiness=1.0):
  return arrivals.synthetic(arrival=arrival, num_requests=n, arrival_rate=rate, seed=seed,
                            prompt_tokens=prompt, output_tokens=output,
                            prompt_distribution="uniform" if prompt_spread else "fixed",
                            output_distribution="uniform" if output_spread else "fixed",
                            prompt_spread=prompt_spread, output_spread=output_spread,
                            burstiness=burstiness)


def _served_metrics(s) -> dict:
  return metrics.run_metrics(s)


def _rel(sim, real):
  return None if sim is None or real in (None, 0) else float(sim / real - 1)


def _simulate(w, twin_replica) -> tuple[simulator.Run, dict]:
  run = simulator.simulate(w, twin_replica, "iteration")
  return run, metrics.run_metrics(run)


def _errors(sim_m: dict, real_m: dict) -> dict:
  return {
      "throughput": _rel(sim_m["request_throughput_per_s"], real_m["request_throughput_per_s"]),
      "median_ttft": _rel(sim_m["ttft_s"]["median"], real_m["ttft_s"]["median"]),
      "p90_ttft": _rel(sim_m["ttft_s"]["p90"], real_m["ttft_s"]["p90"]),
      "median_itl": _rel(sim_m["itl_s"]["median"], real_m["itl_s"]["median"]),
      "p90_itl": _rel(sim_m["itl_s"]["p90"], real_m["itl_s"]["p90"]),
  }


MIXES: dict[str, str] = {"tokens": "mix", "computed": "computed_mix"}


def _iteration_errors(served, values, factors, costing) -> dict:
  """Predicted against measured iteration time, split by kind: which term misses."""
  step = iteration.step_time_function("calibrated", values, factors)
  mix = getattr(served, MIXES[costing])
  predicted = np.asarray(step(*(mix[k] for k in toy_server.MIX_NAMES)))
  prefill = served.mix["n_pre"] > 0
  out = {}
  for name, sel in (("decode_only", ~prefill), ("with_prefill", prefill)):
    if sel.any():
      out[name] = {
          "measured_median_s": float(np.median(served.iteration_s[sel])),
          "predicted_median_s": float(np.median(predicted[sel])), "count": int(sel.sum())
      }
  return out


def _fit(served_runs, values, costing):
  mix = {
      k: np.concatenate([getattr(s, MIXES[costing])[k] for s in served_runs])
      for k in toy_server.MIX_NAMES
  }
  measured = np.concatenate([s.iteration_s for s in served_runs])
  factors = twin.fit_iteration_factors(mix, measured, values)
  step = iteration.step_time_function("calibrated", values, factors)
  err = np.abs(np.asarray(step(*(mix[k] for k in toy_server.MIX_NAMES))) / measured - 1)
  return factors, {
      "median_abs_rel_error": float(np.median(err)),
      "p90_abs_rel_error": float(np.percentile(err, 90)), "iterations": int(len(measured))
  }


def _twin_saturation(w_all_at_once, twin_replica) -> float:
  _, m = _simulate(w_all_at_once, twin_replica)
  return m["request_throughput_per_s"]


def compare_toy(params, *, slots: int, num_requests: int, prompt_tokens: int, prompt_spread: float,
                output_tokens: int, output_spread: float, seed: int, progress=print) -> dict:
  """Runs calibration, probe and the three loads; returns the comparison (JSON-ready)."""
  shape = dict(prompt=prompt_tokens, prompt_spread=prompt_spread, output=output_tokens,
               output_spread=output_spread)
  hi = lambda mean, spread: int(round(mean * (1 + spread)))  # noqa: E731 (uniform's top)
  max_len = hi(prompt_tokens, prompt_spread) + hi(output_tokens, output_spread)
  server = toy_server.ToyServer(
      params, slots=slots, max_len=max_len,
      prompt_lengths=np.arange(max(1, round(prompt_tokens * (1 - prompt_spread))),
                               hi(prompt_tokens, prompt_spread) + 1))
  vocab = params.config.vocab_size
  values = twin.toy_model_values(params)
  load_before = os.getloadavg()
  probe_w = _workload(1e6, num_requests // 2, seed + 1000, **shape)
  probe = server.serve(probe_w, toy_server.prompts_for(probe_w, vocab, seed + 1000))
  probe_x = _served_metrics(probe)["request_throughput_per_s"]
  calib_w = _workload(0.6 * probe_x, num_requests, seed + 2000, arrival="gamma", burstiness=0.25,
                      **shape)
  calib = server.serve(calib_w, toy_server.prompts_for(calib_w, vocab, seed + 2000))
  twins, fits = {}, {}
  for costing in MIXES:
    factors, fits[costing] = _fit([probe, calib], values, costing)
    fits[costing]["factors"] = factors
    twins[costing] = twin.twin_replica(params, factors, slots=slots, max_len=max_len,
                                       costing=costing,
                                       provenance={"fitted_to": "probe + calibration iterations"})
  x_sat = _twin_saturation(probe_w, twins["tokens"])
  progress(f"saturation: measured probe {probe_x:.2f}/s, twin {x_sat:.2f}/s; fit median " +
           ", ".join(f"{c} {f['median_abs_rel_error']:.1%}" for c, f in fits.items()))
  loads = {}
  for i, (name, fraction) in enumerate(LOADS.items()):
    # A fresh held-out calibration just before the run: a shared CPU's speed drifts.
    cal_w = _workload(0.6 * x_sat, max(4, num_requests // 2), seed + 3000 + i, arrival="gamma",
                      burstiness=0.25, **shape)
    cal = server.serve(cal_w, toy_server.prompts_for(cal_w, vocab, seed + 3000 + i))
    fresh = {}
    for costing in MIXES:
      cal_factors, cal_fit = _fit([cal], values, costing)
      fresh[costing] = (twin.twin_replica(params, cal_factors, slots=slots, max_len=max_len,
                                          costing=costing,
                                          provenance={"fitted_to": "calibration run before"}),
                        cal_factors, cal_fit)
    w = _workload(fraction * x_sat, num_requests, seed + i, **shape)
    load_at_start = os.getloadavg()
    served = server.serve(w, toy_server.prompts_for(w, vocab, seed + i))
    real_m = _served_metrics(served)
    entry = {
        "arrival_rate_per_s": fraction * x_sat, "fraction_of_saturation": fraction,
        "load_average_1_5_15": list(load_at_start), "measured": real_m, "measured_iteration_s": {
            "count": int(len(served.iteration_s)),
            **{f"p{q}": float(np.percentile(served.iteration_s, q)) for q in (10, 50, 90)}
        }, "twins": {}, "cdf": {
            "measured_ttft_s": _thin(served.first_token_s - served.arrival_s),
            "measured_itl_s": _thin(served.itl_s)
        }, "wall_s": served.wall_s
    }
    for costing in MIXES:
      own_factors, own_fit = _fit([served], values, costing)
      own = twin.twin_replica(params, own_factors, slots=slots, max_len=max_len, costing=costing,
                              provenance={"fitted_to": "this run"})
      for fit_name, replica_, factors in (("held_out", fresh[costing][0], fresh[costing][1]),
                                          ("first_calibration", twins[costing],
                                           fits[costing]["factors"]), ("own_fit", own,
                                                                       own_factors)):
        sim_run, sim_m = _simulate(w, replica_)
        errors = _errors(sim_m, real_m)
        key = f"{costing}_{fit_name}"
        entry["twins"][key] = {
            "simulated": sim_m, "relative_error": errors, "within_target": {
                k: errors[k] is not None and abs(errors[k]) <= v for k, v in TARGETS.items()
            }, "iteration_time": _iteration_errors(served, values, factors, costing),
            **({"fit": {"factors": own_factors, **own_fit}} if fit_name == "own_fit" else {}),
            **({"fit": {"factors": fresh[costing][1], **fresh[costing][2]}}
               if fit_name == "held_out" else {})
        }
        entry["cdf"][f"{key}_ttft_s"] = _thin(sim_run.first_token_s - sim_run.arrival_s)
        entry["cdf"][f"{key}_itl_s"] = _thin(sim_run.itl_s)
        progress(f"{name} ({fraction * x_sat:.2f}/s), twin {key}: " +
                 ", ".join(f"{k} {v:+.1%}" for k, v in errors.items() if v is not None))
    loads[name] = entry
  return {
      "label": "measurement (toy server, wall clock) vs calibrated prediction (simulated twin)",
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "device": toy_server.device_description(),
      "load_average_1_5_15": {"before": list(load_before), "after": list(os.getloadavg())},
      "cpu_count": os.cpu_count(),
      "toy": {
          "config": dataclasses.asdict(params.config), "dtype": str(params.embed.dtype),
          "slots": slots, "max_len": max_len
      },
      "workload": {
          "num_requests": num_requests, "seed": seed, **shape,
          "lengths": "uniform in mean*(1 +- spread)", "arrival": "poisson"
      },
      "timing": ("wall clock (time.perf_counter) per event; every shape compiled and run "
                 "twice before the clock starts; each iteration blocks until its tokens "
                 "are on the host"),
      "saturation_requests_per_s": {"twin": x_sat, "measured_probe": probe_x},
      "twin": {
          "how": (
              "calibrated iteration model (jaxroof.symbolic.iteration) fitted to the "
              "server's own iterations: 'held_out' is fitted to a bursty calibration "
              "run (its own seed) served just before each compared run; "
              "'first_calibration' to the probe and first calibration run at the "
              "start (exposed to the shared CPU's drift); 'own_fit' refits on each compared run's own "
              "iterations, isolating the scheduling and queueing model from drift "
              "in the machine's speed"), "costings": {
                  "tokens": "iterations costed by their logical tokens (the "
                            "simulator's rule)",
                  "computed": "costed as the fixed-shape server computes: all rows, "
                              "prompts padded to powers of two, every slot"
              }, "held_out_fits": fits, "nominal_ceilings": {"BW": values["BW"], "F": values["F"]}
      },
      "targets": TARGETS,
      "loads": loads,
  }


def _thin(values: np.ndarray, keep: int = 2000) -> list[float]:
  """Sorted values, evenly thinned to at most `keep` (for the CDF plot)."""
  values = np.sort(np.asarray(values))
  if len(values) > keep:
    values = values[np.linspace(0, len(values) - 1, keep).astype(int)]
  return values.tolist()
