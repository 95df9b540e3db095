"""The toy server against its simulated twin, at three loads.

1. probe: every request at once (measured saturation throughput);
2. calibration: a bursty (gamma) run at 0.6 of that, with its own seed; the
   calibrated iteration's factors are fitted to the probe's and this run's
   iterations (`twin.fit_iteration_factors`); the twin's saturation rate
   X_sat is its simulated throughput on the probe's workload;
3. three loads, light, near the knee and overloaded (0.3, 0.85, 1.5 X_sat,
   new seeds): each workload is served for real and simulated by the twin
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
  return metrics.serving_metrics(s.arrival_s, s.first_token_s, s.finish_s, s.output_tokens,
                                 s.itl_s)


def _rel(sim, real):
  return None if sim is None or real in (None, 0) else float(sim / real - 1)


def _simulate(w, twin_replica) -> tuple[simulator.Run, dict]:
  run = simulator.simulate(w, twin_replica, "iteration")
  return run, metrics.serving_metrics(run.arrival_s, run.first_token_s, run.finish_s,
                                      run.output_tokens, run.itl_s)


def _errors(sim_m: dict, real_m: dict) -> dict:
  return {
      "throughput": _rel(sim_m["request_throughput_per_s"], real_m["request_throughput_per_s"]),
      "median_ttft": _rel(sim_m["ttft_s"]["median"], real_m["ttft_s"]["median"]),
      "p90_ttft": _rel(sim_m["ttft_s"]["p90"], real_m["ttft_s"]["p90"]),
      "median_itl": _rel(sim_m["itl_s"]["median"], real_m["itl_s"]["median"]),
      "p90_itl": _rel(sim_m["itl_s"]["p90"], real_m["itl_s"]["p90"]),
  }


def _iteration_errors(served, values, factors) -> dict:
  """Predicted over measured iteration time, split by kind: which term misses."""
  step = iteration.step_time_function("calibrated", values, factors)
  predicted = np.asarray(step(*(served.computed_mix[k] for k in toy_server.MIX_NAMES)))
  prefill = served.mix["n_pre"] > 0
  out = {}
  for name, sel in (("decode_only", ~prefill), ("with_prefill", prefill)):
    if sel.any():
      out[name] = {"measured_median_s": float(np.median(served.iteration_s[sel])),
                   "predicted_median_s": float(np.median(predicted[sel])),
                   "count": int(sel.sum())}
  return out


def _fit(served_runs, values):
  mix = {k: np.concatenate([s.computed_mix[k] for s in served_runs])
         for k in toy_server.MIX_NAMES}
  measured = np.concatenate([s.iteration_s for s in served_runs])
  factors = twin.fit_iteration_factors(mix, measured, values)
  step = iteration.step_time_function("calibrated", values, factors)
  err = np.abs(np.asarray(step(*(mix[k] for k in toy_server.MIX_NAMES))) / measured - 1)
  return factors, {"median_abs_rel_error": float(np.median(err)),
                   "p90_abs_rel_error": float(np.percentile(err, 90)),
                   "iterations": int(len(measured))}


def _twin_saturation(w_all_at_once, twin_replica) -> float:
  _, m = _simulate(w_all_at_once, twin_replica)
  return m["request_throughput_per_s"]


def compare_toy(params, *, slots: int, num_requests: int, prompt_tokens: int,
                prompt_spread: float, output_tokens: int, output_spread: float, seed: int,
                progress=print) -> dict:
  """Runs calibration, probe and the three loads; returns the comparison (JSON-ready)."""
  shape = dict(prompt=prompt_tokens, prompt_spread=prompt_spread, output=output_tokens,
               output_spread=output_spread)
  hi = lambda mean, spread: int(round(mean * (1 + spread)))  # noqa: E731 (uniform's top)
  max_len = hi(prompt_tokens, prompt_spread) + hi(output_tokens, output_spread)
  server = toy_server.ToyServer(params, slots=slots, max_len=max_len,
                                prompt_lengths=np.arange(
                                    max(1, round(prompt_tokens * (1 - prompt_spread))),
                                    hi(prompt_tokens, prompt_spread) + 1))
  vocab = params.config.vocab_size
  values = twin.toy_model_values(params)
  load_before = os.getloadavg()
  probe_w = _workload(1e6, num_requests // 2, seed + 1000, **shape)
  probe = server.serve(probe_w, toy_server.prompts_for(probe_w, vocab, seed + 1000))
  probe_x = _served_metrics(probe)["request_throughput_per_s"]
  calib_w = _workload(0.6 * probe_x, num_requests, seed + 2000, arrival="gamma",
                      burstiness=0.25, **shape)
  calib = server.serve(calib_w, toy_server.prompts_for(calib_w, vocab, seed + 2000))
  factors, fit = _fit([probe, calib], values)
  held_out = twin.twin_replica(params, factors, slots=slots, max_len=max_len,
                               provenance={"fitted_to": "probe + calibration iterations"})
  x_sat = _twin_saturation(probe_w, held_out)
  progress(f"saturation: measured probe {probe_x:.2f}/s, twin {x_sat:.2f}/s; fit median "
           f"|error| {fit['median_abs_rel_error']:.1%} over {fit['iterations']} iterations")
  loads = {}
  for i, (name, fraction) in enumerate(LOADS.items()):
    w = _workload(fraction * x_sat, num_requests, seed + i, **shape)
    load_at_start = os.getloadavg()
    served = server.serve(w, toy_server.prompts_for(w, vocab, seed + i))
    real_m = _served_metrics(served)
    sim_run, sim_m = _simulate(w, held_out)
    own_factors, own_fit = _fit([served], values)
    own_run, own_m = _simulate(w, twin.twin_replica(
        params, own_factors, slots=slots, max_len=max_len,
        provenance={"fitted_to": "this run's own iterations"}))
    errors, own_errors = _errors(sim_m, real_m), _errors(own_m, real_m)
    loads[name] = {
        "arrival_rate_per_s": fraction * x_sat, "fraction_of_saturation": fraction,
        "load_average_1_5_15": list(load_at_start),
        "measured": real_m, "simulated": sim_m, "relative_error": errors,
        "within_target": {k: errors[k] is not None and abs(errors[k]) <= v
                          for k, v in TARGETS.items()},
        "iteration_time": _iteration_errors(served, values, factors),
        "simulated_own_fit": own_m, "relative_error_own_fit": own_errors,
        "own_fit": {"factors": own_factors, **own_fit},
        "within_target_own_fit": {k: own_errors[k] is not None and abs(own_errors[k]) <= v
                                  for k, v in TARGETS.items()},
        "cdf": {"measured_ttft_s": _thin(served.first_token_s - served.arrival_s),
                "simulated_ttft_s": _thin(sim_run.first_token_s - sim_run.arrival_s),
                "simulated_own_fit_ttft_s": _thin(own_run.first_token_s - own_run.arrival_s),
                "measured_itl_s": _thin(served.itl_s), "simulated_itl_s": _thin(sim_run.itl_s),
                "simulated_own_fit_itl_s": _thin(own_run.itl_s)},
        "wall_s": served.wall_s,
    }
    progress(f"{name}: rate {fraction * x_sat:.2f}/s, held-out twin errors "
             + ", ".join(f"{k} {v:+.1%}" for k, v in errors.items() if v is not None)
             + "; own-fit twin " + ", ".join(f"{k} {v:+.1%}" for k, v in own_errors.items()
                                            if v is not None))
  return {
      "label": "measurement (toy server, wall clock) vs calibrated prediction (simulated twin)",
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "device": toy_server.device_description(),
      "load_average_1_5_15": {"before": list(load_before), "after": list(os.getloadavg())},
      "cpu_count": os.cpu_count(),
      "toy": {"config": dataclasses.asdict(params.config), "dtype": str(params.embed.dtype),
              "slots": slots, "max_len": max_len},
      "workload": {"num_requests": num_requests, "seed": seed, **shape,
                   "lengths": "uniform in mean*(1 +- spread)", "arrival": "poisson"},
      "timing": ("wall clock (time.perf_counter) per event; every shape compiled and run "
                 "twice before the clock starts; each iteration blocks until its tokens "
                 "are on the host"),
      "saturation_requests_per_s": {"twin": x_sat, "measured_probe": probe_x},
      "twin": {"how": ("calibrated iteration model (jaxroof.symbolic.iteration) fitted to the "
                       "server's own iterations: 'simulated' uses a probe (all at once) and a "
                       "bursty calibration run with seeds apart from the compared runs "
                       "(held out); 'simulated_own_fit' refits on each compared run's own "
                       "iterations, isolating the scheduling and queueing model from drift "
                       "in the machine's speed"),
               "factors": factors, "nominal_ceilings": {"BW": values["BW"], "F": values["F"]},
               **fit},
      "targets": TARGETS,
      "loads": loads,
  }


def _thin(values: np.ndarray, keep: int = 2000) -> list[float]:
  """Sorted values, evenly thinned to at most `keep` (for the CDF plot)."""
  values = np.sort(np.asarray(values))
  if len(values) > keep:
    values = values[np.linspace(0, len(values) - 1, keep).astype(int)]
  return values.tolist()
