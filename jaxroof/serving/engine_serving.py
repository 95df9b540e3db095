"""`serving` and `simulate` with an engine: its predictions lead, the bound beside.

An engine (`parallel.engine_drive.Drive`) changes what the load model and the simulator
are given, not how they work: the calibrated step (its `StepModel`), the scheduling and
running cap its defaults set where the user set none, the running sequences its memory
reservation holds, and its fixed cost per request (`t0_request`, paid before the engine
sees a prompt: added to every TTFT and taken out of a TTFT target). The same question
asked of the analytic bound is put beside each headline figure as `bound_<key>`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from jaxroof.parallel import engine_drive
from jaxroof.serving import requests
from jaxroof.serving import serving_result
from jaxroof.serving import simulation_result
from jaxroof.serving import simulator
from jaxroof.specs.model_spec import ModelSpec
from jaxroof.symbolic.step_model import StepModel

# The decision's figures shown beside as the bound's (`bound_<key>`).
DECISION_KEYS: tuple[str, ...] = ("batch", "step_s", "loaded_token_gap_s", "ttft_s", "ttft_p90_s",
                                  "itl_p99_s", "prefill_service_s", "max_arrival_rate_per_s",
                                  "aggregate_tokens_per_s", "per_sequence_tokens_per_s",
                                  "fleet_aggregate_tokens_per_s", "fleet_max_arrival_rate_per_s")
ROW_KEYS: tuple[str, ...] = ("prefill_s", "decode_s", "ttft_s", "mean_token_gap_s", "e2e_s",
                             "aggregate_tokens_per_s", "per_sequence_tokens_per_s")
METRIC_KEYS: tuple[str, ...] = ("ttft_s", "tpot_s", "itl_s", "e2el_s")


def t0_request(d: engine_drive.Drive) -> float:
  """The engine's fixed cost per request, s (0 where its profile has none)."""
  return float(d.entry.terms.get("t0_request", 0.0))


def inputs(d: engine_drive.Drive, given: requests.ServingInputs,
           spec: ModelSpec) -> requests.ServingInputs:
  """`given` with the running sequences the engine's reservation and cap allow in
  place of the workspace fraction's (`engine_drive.replica_sequences`)."""
  mem = dict(given.memory)
  per_chip = "resident_weight_bytes_per_chip" in mem
  weights = mem["resident_weight_bytes_per_chip" if per_chip else "resident_weight_bytes"]
  kv = mem[
      "kv_allocated_bytes_per_sequence_per_chip" if per_chip else "kv_allocated_bytes_per_sequence"]
  capacity, width = float(mem["memory_capacity_bytes"]), float(spec.hidden_size)
  fit = engine_drive.replica_sequences(d.settings, capacity=capacity, chip_weights=weights,
                                       chip_kv=kv, width=width,
                                       ep=float(mem.get("layout", {}).get("ep", 1)))
  mem.update(
      engine_kv_bytes_per_chip=engine_drive.kv_bytes(d.settings, capacity=capacity,
                                                     chip_weights=weights, width=width),
      memory_rule=engine_drive.memory_note(d))
  return dataclasses.replace(given, max_batch_in_memory=int(fit), memory=mem)


def question(d: engine_drive.Drive, given: Any) -> Any:
  """The serving question with the engine's scheduling where the user fixed none, and
  its per-request cost out of the TTFT target."""
  out = given
  if given.scheduler is None and given.token_budget is None:
    out = dataclasses.replace(out, scheduler=d.scheduler, token_budget=d.token_budget)
  if given.ttft_s is not None:
    out = dataclasses.replace(out, ttft_s=max(given.ttft_s - t0_request(d), 1e-9))
  return out


def prepare(d: engine_drive.Drive | None, given: requests.ServingInputs, asked: Any,
            spec: ModelSpec | None) -> tuple[requests.ServingInputs, Any]:
  """(inputs, question) an engine's serving answer takes (`inputs`, `question`); as
  given for the bound."""
  if d is None:
    return given, asked
  return inputs(d, given, spec), question(d, asked)


def _add_t0(row: dict[str, Any], t0: float) -> None:
  for key in ("ttft_s", "ttft_p90_s"):
    if isinstance(row.get(key), float):
      row[key] += t0


def serving_beside(result: dict[str, Any], d: engine_drive.Drive, asked: Any,
                   bound_inputs: requests.ServingInputs) -> None:
  """An engine's serving result, in place: its TTFTs with the per-request cost, the
  targets as asked, its label and held-out error, and the bound's answer to the same
  question (`bound_inputs`, `asked`) beside each figure (`bound_*`; `bound_decision`)."""
  bound = serving_result.result(StepModel.bound(), bound_inputs, asked)
  t0 = t0_request(d)
  decision = result["decision"]
  for row in [decision, decision.get("operating_point") or {}] + result["requests"]:
    _add_t0(row, t0)
  bound_rows = {r["batch"]: r for r in bound["requests"]}
  for row in result["requests"]:
    b = bound_rows.get(row["batch"], {})
    row.update({f"bound_{k}": b.get(k) for k in ROW_KEYS})
  decision.update({f"bound_{k}": bound["decision"].get(k) for k in DECISION_KEYS})
  result["bound_decision"] = dict(bound["decision"])
  result["inputs"]["ttft_target_s"] = asked.ttft_s
  result.update(d.label_fields())
  result["t0_request_s"] = t0
  result["assumptions"] = list(result.get("assumptions", [])) + [
      engine_drive.memory_note(d),
      f"TTFT includes the engine's fixed cost per request, t0_request = {t0 * 1e3:.3g} ms "
      "(its profile's), taken out of the TTFT target"
  ]


def user_run(run: simulator.Run, d: engine_drive.Drive | None) -> simulator.Run:
  """A simulated run as its users time it: each request reaches the engine its fixed
  cost per request after it arrived (TTFT and latency longer by `t0_request`)."""
  return run if d is None else simulation_result.as_users_time(run, t0_request(d))


def bound_replica(r: simulator.Replica, form: str = "per_op") -> simulator.Replica:
  """The same replica (scheduling, running cap, K/V pages) with the analytic bound's step:
  what the engine's run is never faster than."""
  return dataclasses.replace(r, step_model=StepModel.bound(form),
                             description={**r.description, "step_model": "bound"})


def metrics_beside(result: dict[str, Any], bound_metrics: Mapping[str, Any] | None,
                   d: engine_drive.Drive | None) -> None:
  """A simulated run's JSON, in place: the bound's run of the same workload on the same
  replica beside its metrics (`bound_metrics`; an engine's: `metrics.bound_*` too, and
  its per-request cost `t0_request_s`)."""
  if bound_metrics is None:
    return
  result["bound_metrics"] = dict(bound_metrics)
  if d is None:
    return
  for key in METRIC_KEYS:
    if key in result["metrics"] and key in bound_metrics:
      result["metrics"][f"bound_{key}"] = bound_metrics[key]
  result["t0_request_s"] = t0_request(d)
