"""The toy server against its simulated twin, at three loads.

1. probe: every request at once; the measured request throughput is the
   server's saturation rate X_sat (measurement).
2. calibration: a bursty (gamma) run at 0.7 X_sat with its own seed; the
   calibrated iteration's factors are fitted to the probe's and this run's
   iterations (`twin.fit_iteration_factors`).
3. three loads, light, near the knee and overloaded (fractions of X_sat, new
   seeds): each workload is served for real and simulated by the twin
   (scheduler "iteration", the server's own policy), and the vLLM metrics of
   both are compared.
"""

from __future__ import annotations

import dataclasses
import datetime
import os

import numpy as np

from jaxroof.serving import arrivals, metrics, simulator, toy_server, twin

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


def compare_toy(params, *, slots: int, num_requests: int, prompt_tokens: int,
                prompt_spread: float, output_tokens: int, output_spread: float, seed: int,
                progress=print) -> dict:
  """Runs probe, calibration and the three loads; returns the comparison (JSON-ready)."""
  shape = dict(prompt=prompt_tokens, prompt_spread=prompt_spread, output=output_tokens,
               output_spread=output_spread)
  hi = lambda mean, spread: int(round(mean * (1 + spread)))  # noqa: E731 (uniform's top)
  max_len = hi(prompt_tokens, prompt_spread) + hi(output_tokens, output_spread)
  probe_w = _workload(1e6, num_requests // 2, seed + 1000, **shape)
  server = toy_server.ToyServer(params, slots=slots, max_len=max_len,
                                prompt_lengths=np.arange(
                                    max(1, round(prompt_tokens * (1 - prompt_spread))),
                                    hi(prompt_tokens, prompt_spread) + 1))
  vocab = params.config.vocab_size
  load_before = os.getloadavg()
  probe = server.serve(probe_w, toy_server.prompts_for(probe_w, vocab, seed + 1000))
  x_sat = _served_metrics(probe)["request_throughput_per_s"]
  progress(f"probe: saturation {x_sat:.2f} requests/s (measured)")
  calib_w = _workload(0.7 * x_sat, num_requests, seed + 2000, arrival="gamma", burstiness=0.25,
                      **shape)
  calib = server.serve(calib_w, toy_server.prompts_for(calib_w, vocab, seed + 2000))
  mix = {k: np.concatenate([probe.mix[k], calib.mix[k]]) for k in probe.mix}
  measured = np.concatenate([probe.iteration_s, calib.iteration_s])
  values = twin.toy_model_values(params)
  factors = twin.fit_iteration_factors(mix, measured, values)
  from jaxroof.symbolic import iteration  # The fitted iteration, for its error.
  step = iteration.step_time_function("calibrated", values, factors)
  fit_err = np.abs(np.asarray(step(*(mix[k] for k in toy_server.MIX_NAMES))) / measured - 1)
  progress(f"fit: median |error| {np.median(fit_err):.1%} over {len(measured)} iterations")
  twin_replica = twin.twin_replica(params, factors, slots=slots, max_len=max_len,
                                   provenance={"fitted_to": "probe + calibration iterations"})
  loads = {}
  for i, (name, fraction) in enumerate(LOADS.items()):
    w = _workload(fraction * x_sat, num_requests, seed + i, **shape)
    served = server.serve(w, toy_server.prompts_for(w, vocab, seed + i))
    simulated = simulator.simulate(w, twin_replica, "iteration")
    real_m, sim_m = _served_metrics(served), metrics.serving_metrics(
        simulated.arrival_s, simulated.first_token_s, simulated.finish_s,
        simulated.output_tokens, simulated.itl_s)
    errors = {
        "throughput": _rel(sim_m["request_throughput_per_s"], real_m["request_throughput_per_s"]),
        "median_ttft": _rel(sim_m["ttft_s"]["median"], real_m["ttft_s"]["median"]),
        "p90_ttft": _rel(sim_m["ttft_s"]["p90"], real_m["ttft_s"]["p90"]),
        "median_itl": _rel(sim_m["itl_s"]["median"], real_m["itl_s"]["median"]),
        "p90_itl": _rel(sim_m["itl_s"]["p90"], real_m["itl_s"]["p90"]),
    }
    within = {k: errors[k] is not None and abs(errors[k]) <= v for k, v in TARGETS.items()}
    loads[name] = {
        "arrival_rate_per_s": fraction * x_sat, "fraction_of_saturation": fraction,
        "measured": real_m, "simulated": sim_m, "relative_error": errors, "within_target": within,
        "measured_iteration_s": {"median": float(np.median(served.iteration_s)),
                                 "p90": float(np.percentile(served.iteration_s, 90)),
                                 "count": int(len(served.iteration_s))},
        "cdf": {"measured_ttft_s": np.sort(served.first_token_s - served.arrival_s).tolist(),
                "simulated_ttft_s": np.sort(simulated.first_token_s
                                            - simulated.arrival_s).tolist(),
                "measured_itl_s": _thin(served.itl_s), "simulated_itl_s": _thin(simulated.itl_s)},
        "wall_s": served.wall_s,
    }
    progress(f"{name}: rate {fraction * x_sat:.2f}/s, errors "
             + ", ".join(f"{k} {v:+.1%}" for k, v in errors.items() if v is not None))
  return {
      "label": "measurement (toy server, wall clock) vs calibrated prediction (simulated twin)",
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "device": toy_server.device_description(),
      "load_average_1_5_15": {"before": list(load_before), "after": list(os.getloadavg())},
      "cpu_count": os.cpu_count(),
      "toy": {"config": dataclasses.asdict(params.config), "dtype": str(params.embed.dtype), "slots": slots,
              "max_len": max_len},
      "workload": {"num_requests": num_requests, "seed": seed, **shape,
                   "lengths": "uniform in mean*(1 +- spread)", "arrival": "poisson"},
      "timing": ("wall clock (time.perf_counter) per event; every shape compiled and run "
                 "twice before the clock starts; each iteration blocks until its tokens "
                 "are on the host"),
      "saturation_requests_per_s": x_sat,
      "twin": {"how": ("calibrated iteration model fitted to the server's own iterations "
                       "(probe + bursty calibration run, seeds apart from the compared runs)"),
               "factors": factors, "nominal_ceilings": {"BW": values["BW"], "F": values["F"]},
               "fit_median_abs_rel_error": float(np.median(fit_err)),
               "fit_p90_abs_rel_error": float(np.percentile(fit_err, 90)),
               "fit_iterations": int(len(measured))},
      "targets": TARGETS,
      "loads": loads,
  }


def _thin(values: np.ndarray, keep: int = 2000) -> list[float]:
  """Sorted values, evenly thinned to at most `keep` (for the CDF plot)."""
  values = np.sort(np.asarray(values))
  if len(values) > keep:
    values = values[np.linspace(0, len(values) - 1, keep).astype(int)]
  return values.tolist()
