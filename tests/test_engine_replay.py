"""A serving-benchmark run replayed by the continuous-batching simulator: its own arrivals
and server, the optional costs, and each held term (core or the vLLM CPU engine's) by its
registry name.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from jaxroof import errors
from jaxroof.calibrate import engine_fit
from jaxroof.calibrate import engine_replay
from jaxroof.calibrate import engine_search
from jaxroof.engines import vllm_cpu
from jaxroof.measure import vllm_results
from jaxroof.specs import models
from tests._vllm_helpers import FIXTURE, run_with_server
from tests._vllm_helpers import device_file_fixture, model_dir_fixture  # noqa: F401


# The replay.
def test_detailed_run_replays_its_own_arrivals_lengths_and_percentiles():
  raw = json.loads(FIXTURE.read_text())
  [run] = vllm_results.read_runs([FIXTURE])
  np.testing.assert_allclose(run.arrival_s, np.asarray(raw["start_times"]) - 1000.0)
  workload = engine_replay.workload_of(run, seed=123)
  np.testing.assert_allclose(workload.arrival_s, run.arrival_s)
  assert workload.prompt_tokens.tolist() == raw["input_lens"]
  for metric in ("ttft", "tpot", "itl"):
    for q, key in ((50, f"median_{metric}_ms"), (90, f"p90_{metric}_ms")):
      assert vllm_results.measured_percentile(run, metric, q) == pytest.approx(raw[key] / 1e3)


def test_replica_takes_the_servers_blocks_and_limits(model_dir, device_file):
  setup = engine_replay.ServingSetup(model=model_dir, accelerator="", scheduler="vllm",
                                     accelerator_file=device_file)
  replica = engine_replay.replica_of(run_with_server(), setup, engine_search.START)
  assert (replica.total_pages, replica.page_tokens, replica.max_running,
          replica.token_budget) == (40, 32, 4, 256)


def test_request_cost_adds_to_ttft_only(model_dir, device_file):
  setup = engine_replay.ServingSetup(model=model_dir, accelerator="", scheduler="vllm",
                                     accelerator_file=device_file)
  run = run_with_server(kv_blocks=1000)
  base = engine_replay.simulate_run(run, setup, {**engine_search.START, "t0_request": 0.0})
  cost = engine_replay.simulate_run(run, setup, {**engine_search.START, "t0_request": 0.05})
  # Requests arrive ~0.5 s apart and finish in ~0.1 s: none overlaps, so the shift is exact.
  assert cost["median_ttft_s"] - base["median_ttft_s"] == pytest.approx(0.05, rel=1e-9)
  assert cost["median_tpot_s"] == pytest.approx(base["median_tpot_s"], rel=1e-12)
  assert cost["median_itl_s"] == pytest.approx(base["median_itl_s"], rel=1e-12)


def test_sequence_cost_lengthens_every_step_by_its_sequences(model_dir, device_file):
  """t0_seq adds to each iteration once per sequence in it: with requests that never
  overlap (one sequence a step) every token gap grows by t0_seq exactly; it is searched
  only where asked (`search`), and zero at the bound."""
  setup = engine_replay.ServingSetup(model=model_dir, accelerator="", scheduler="vllm",
                                     accelerator_file=device_file)
  run = run_with_server(kv_blocks=1000)
  base = engine_replay.simulate_run(run, setup, {**engine_search.START, "t0_seq": 0.0})
  cost = engine_replay.simulate_run(run, setup, {**engine_search.START, "t0_seq": 2e-3})
  assert cost["median_tpot_s"] - base["median_tpot_s"] == pytest.approx(2e-3, rel=1e-6)
  assert cost["median_ttft_s"] - base["median_ttft_s"] == pytest.approx(2e-3, rel=1e-6)
  assert "t0_seq" not in setup.searched
  assert dataclasses.replace(setup, search=("t0_seq",)).searched[-1] == "t0_seq"
  assert setup.bound()["t0_seq"] == 0.0


def test_wake_cost_reaches_the_replica_and_is_paid_by_requests_that_find_it_idle(
    model_dir, device_file):
  """t_wake goes to the run's replica (`Replica.wake_s`): with requests that never overlap
  (each finds the engine idle) every TTFT grows by t_wake exactly and no decode gap moves;
  it is searched only where asked (`search`), zero at the bound; a measured per-request cost
  is held (`held`), and holding and searching it at once is refused."""
  setup = engine_replay.ServingSetup(model=model_dir, accelerator="", scheduler="vllm",
                                     accelerator_file=device_file)
  run = run_with_server(kv_blocks=1000)
  base = engine_replay.simulate_run(run, setup, {**engine_search.START, "t_wake": 0.0})
  cost = engine_replay.simulate_run(run, setup, {**engine_search.START, "t_wake": 3e-3})
  assert engine_replay.replica_of(run, setup,
                                  {**engine_search.START, "t_wake": 3e-3}).wake_s == 3e-3
  assert cost["median_ttft_s"] - base["median_ttft_s"] == pytest.approx(3e-3, rel=1e-6)
  for name in ("median_tpot_s", "median_itl_s", "p90_itl_s"):
    assert cost[name] == pytest.approx(base[name], rel=1e-12), name
  assert "t_wake" not in setup.searched
  assert dataclasses.replace(setup, search=("t_wake",)).searched[-1] == "t_wake"
  assert setup.bound()["t_wake"] == 0.0
  held = dataclasses.replace(setup, held={"t0_request": 3.5e-3}, search=("t_wake",))
  assert held.held_terms()["t0_request"] == 3.5e-3 and "t0_request" not in held.searched
  with pytest.raises(errors.InputError, match="t0_request is both held and searched"):
    dataclasses.replace(held, search=("t0_request", "t_wake"))
  with pytest.raises(errors.InputError, match=r"t0_request=-1 is outside its bounds \[0, 100\]"):
    dataclasses.replace(setup, held={"t0_request": -1})
  still = dataclasses.replace(setup, held={"t_wake": 1.5e-3})
  start = {**engine_search.START, **still.held_terms()}
  assert engine_replay.replica_of(run, still, start).wake_s == 1.5e-3
  with pytest.raises(errors.InputError, match="t_wake is both held and searched"):
    dataclasses.replace(still, search=("t_wake",))


def test_isolated_requests_are_simulated_one_sequence_a_step(model_dir, device_file):
  """An isolated-request file (rate inf, at most one request in flight, as the CPU engine's
  isolated probes write) is a fit run of one sequence per step: its simulated TPOT is that
  of the same requests sent 30 s apart, and below that of all of them at once."""
  [run] = vllm_results.read_runs([FIXTURE])
  run = dataclasses.replace(run, request_rate=math.inf, max_concurrency=1, arrival_s=None,
                            measured={"median_tpot_s": run.measured["median_tpot_s"]})
  setup = engine_replay.ServingSetup(model=model_dir, accelerator="", scheduler="vllm",
                                     accelerator_file=device_file, max_running=32)
  isolated = engine_replay.simulate_run(run, setup, engine_search.START)["median_tpot_s"]
  apart = dataclasses.replace(run, max_concurrency=None, request_rate=1.0,
                              arrival_s=30.0 * np.arange(len(run.prompt_tokens)))
  assert isolated == pytest.approx(
      engine_replay.simulate_run(apart, setup, engine_search.START)["median_tpot_s"], rel=1e-9)
  together = dataclasses.replace(run, max_concurrency=None)
  assert engine_replay.simulate_run(together, setup,
                                    engine_search.START)["median_tpot_s"] > isolated


def test_layer_cost_is_searched_only_when_asked(model_dir, device_file):
  """t0_layer stays at engine_replay.FIXED unless searched; then it lengthens every step by
  layers x t0_layer (the tiny preset has 4 layers)."""
  setup = engine_replay.ServingSetup(model=model_dir, accelerator="", scheduler="vllm",
                                     accelerator_file=device_file)
  assert "t0_layer" not in setup.searched
  layered = dataclasses.replace(setup, search=("t0_layer",))
  assert layered.searched[-1] == "t0_layer"
  run = run_with_server(kv_blocks=1000)
  base = engine_replay.simulate_run(run, layered, {**engine_search.START, "t0_layer": 1e-9})
  cost = engine_replay.simulate_run(run, layered, {**engine_search.START, "t0_layer": 5e-4})
  assert cost["median_tpot_s"] - base["median_tpot_s"] == pytest.approx(4 * 5e-4, rel=1e-5)


def test_a_held_cache_speeds_only_the_steps_whose_weights_it_holds(tmp_path, model_dir,
                                                                   device_file):
  """c_llc bytes of a step's weights read at bw_llc: a cache larger than the model's weights
  at ten times the read ceiling shortens every simulated token gap of the fixture, a cache of
  one byte leaves them (within a part in a million), and the factors carry the cache."""
  setup = engine_replay.ServingSetup(model=model_dir, accelerator="", scheduler="vllm",
                                     accelerator_file=device_file)
  factors = {"eta_w": 0.5, "eta_f": 0.3, "t0_step": 2e-4, "t0_request": 0.0}
  rate = 10 * 2.5e10  # The fixture device's read ceiling: 25 GB/s.
  gaps = {}
  for name, cached in (("none", 0.0), ("byte", 1.0), ("all", 1e12)):
    held = dataclasses.replace(setup, held={"c_llc": cached, "bw_llc": rate if cached else 0.0})
    result = engine_fit.predict_runs([FIXTURE], held, {**held.held_terms(), **factors})
    gaps[name] = {(r["metric"], r["percentile"]): r["predicted_s"] for r in result["heldout"]}
    assert result["factors"].get("c_llc", 0.0) == cached
  for key, gap in gaps["none"].items():
    if key[0] == "tpot":
      assert gaps["all"][key] < gap
      assert gaps["byte"][key] == pytest.approx(gap, rel=1e-6)


def test_an_lru_cache_held_in_the_fit_keeps_less_of_weights_that_outgrow_it(model_dir, device_file):
  """s_lru = 1 held with a cache of three quarters of the fixture model's step weights:
  the replica's decode reads 2 c_llc - W of them at bw_llc (by hand from the model's
  constants) where the plain cache reads c_llc; a cache larger than the weights is whole
  either way; the factors carry s_lru; a share outside [0, 1] or without a cache is
  refused."""
  setup = engine_replay.ServingSetup(model=model_dir, accelerator="", scheduler="vllm",
                                     accelerator_file=device_file)
  factors = {**engine_search.START, "eta_w": 0.5}
  run = run_with_server(kv_blocks=1000)
  plain = engine_replay.replica_of(run, setup, {**factors, **setup.held_terms()})
  weights = plain.cost.constants["W_b"] + plain.cost.constants["W_h"] + plain.cost.constants["r_e"]
  dram, rate = 0.5 * 2.5e10, 4 * 0.5 * 2.5e10  # eta_w x the fixture device's read ceiling.
  for cached, lru_hit in ((0.75 * weights, 0.5 * weights), (2 * weights, weights)):
    cache = dataclasses.replace(setup, held={"c_llc": cached, "bw_llc": rate})
    lru = dataclasses.replace(cache, held={**cache.held, "s_lru": 1.0})
    assert lru.held_terms()["s_lru"] == 1.0 and "s_lru" not in cache.held_terms()
    read = {}
    for name, held in (("cache", cache), ("lru", lru)):
      replica = engine_replay.replica_of(run, held, {**factors, **held.held_terms()})
      read[name] = float(replica.cost.decode(1.0, 100.0, replica.step_model)["weight_s"])
    assert read["lru"] == pytest.approx(lru_hit / rate + (weights - lru_hit) / dram, rel=1e-9)
    hit = min(cached, weights)
    assert read["cache"] == pytest.approx(hit / rate + (weights - hit) / dram, rel=1e-9)
  for bad in ({"s_lru": 1.5, "c_llc": 1e6, "bw_llc": rate}, {"s_lru": 1.0}):
    with pytest.raises(errors.InputError, match="s_lru=") as raised:
      dataclasses.replace(setup, held=bad)
    assert raised.value.field == "hold" and "\n" not in str(raised.value)


def test_an_idle_engine_reads_its_evicted_cached_weights_from_memory(model_dir, device_file):
  """With the cache and a cold share held, the replica's wake is t_wake plus that share of
  the step's cached weight bytes read at eta_w * BW instead of bw_llc, by hand from the
  model's constants; without the share (the default, and every fit made before it) it is
  t_wake alone; with no t_wake it is the cold cost alone; a share outside [0, 1], or without
  a cache, is refused."""
  setup = engine_replay.ServingSetup(model=model_dir, accelerator="", scheduler="vllm",
                                     accelerator_file=device_file, held={"t_wake": 2e-3})
  factors = {**engine_search.START, "eta_w": 0.5}
  run = run_with_server(kv_blocks=1000)
  plain = engine_replay.replica_of(run, setup, {**factors, **setup.held_terms()})
  weights = plain.cost.constants["W_b"] + plain.cost.constants["W_h"] + plain.cost.constants["r_e"]
  dram = 0.5 * 2.5e10  # eta_w x the fixture device's read ceiling.
  assert plain.wake_s == 2e-3
  with pytest.raises(errors.InputError, match="s_cold=1 without a cache"):
    dataclasses.replace(setup, held={**setup.held, "s_cold": 1.0})
  for cached in (weights / 2, 4 * weights):
    cache = dataclasses.replace(setup, held={**setup.held, "c_llc": cached, "bw_llc": 4 * dram})
    assert engine_replay.replica_of(run, cache, {**factors, **cache.held_terms()}).wake_s == 2e-3
    hit = min(cached, weights)
    cold = hit / dram - hit / (4 * dram)
    for share in (0.5, 1.0):
      held = dataclasses.replace(cache, held={**cache.held, "s_cold": share})
      assert held.held_terms()["s_cold"] == share
      replica = engine_replay.replica_of(run, held, {**factors, **held.held_terms()})
      assert replica.wake_s == pytest.approx(2e-3 + share * cold, rel=1e-9)
      assert "read from memory" in replica.description["wake"]
    awake = dataclasses.replace(
        cache, held={**{n: v for n, v in cache.held.items() if n != "t_wake"}, "s_cold": 1.0})
    replica = engine_replay.replica_of(run, awake, {**factors, **awake.held_terms(), "t_wake": 0.0})
    assert replica.wake_s == pytest.approx(cold, rel=1e-9)
  with pytest.raises(errors.InputError, match=r"s_cold=1.5 is outside its bounds \[0, 1\]"):
    dataclasses.replace(setup, held={"s_cold": 1.5})


def test_held_elementwise_kernels_slow_prefills_and_carry_in_the_factors(model_dir, device_file):
  """t_act held: each simulated iteration pays t_act x tokens x A_w, so no predicted median
  shrinks and the p50 TTFT (a whole prompt's tokens) grows; the factors carry it, and 0 is
  the plain prediction."""
  setup = engine_replay.ServingSetup(model=model_dir, accelerator="", scheduler="vllm",
                                     accelerator_file=device_file)
  factors = {"eta_w": 0.5, "eta_f": 0.3, "t0_step": 2e-4, "t0_request": 0.0}
  rows = {}
  for name, seconds in (("none", 0.0), ("held", 1e-8)):
    held = dataclasses.replace(setup, held={"t_act": seconds})
    result = engine_fit.predict_runs([FIXTURE], held, {**held.held_terms(), **factors})
    assert result["factors"].get("t_act", 0.0) == seconds
    rows[name] = {(r["metric"], r["percentile"]): r["predicted_s"] for r in result["heldout"]}
  for key, plain in rows["none"].items():
    assert rows["held"][key] >= plain - 1e-12, key
  assert rows["held"][("ttft", 50)] > rows["none"][("ttft", 50)]
  with pytest.raises(errors.InputError, match="t_act=-1.0 is outside its bounds"):
    dataclasses.replace(setup, held={"t_act": -1.0})


def test_kernel_builds_reach_the_replica_per_layer_and_token_and_only_slow_the_run(
    model_dir, device_file):
  """A held t_build puts a kernel cache of `KERNEL_CACHE_ROWS` counts at L x t_build per
  token on the run's replica; simulated, no median shrinks, and a run whose steps all fit
  the warm cache it starts from matches the plain simulation."""
  setup = engine_replay.ServingSetup(model=model_dir, accelerator="", scheduler="vllm",
                                     accelerator_file=device_file)
  factors = {"eta_w": 0.5, "eta_f": 0.3, "t0_step": 2e-4, "t0_request": 0.0}
  run = vllm_results.read_runs([FIXTURE])[0]
  layers = models.load_model(model_dir).num_layers
  held = dataclasses.replace(setup, held={"t_build": 1e-5})
  assert held.held_terms()["t_build"] == 1e-5
  cache = engine_replay.replica_of(run, held, {**factors, **held.held_terms()}).kernel_cache
  assert cache.capacity == vllm_cpu.KERNEL_CACHE_ROWS
  assert cache.seconds_per_row == pytest.approx(layers * 1e-5, rel=1e-12)
  assert engine_replay.replica_of(run, setup, factors).kernel_cache is None
  plain = engine_replay.simulate_run(run, setup, factors)
  built = engine_replay.simulate_run(run, held, factors)
  for name in ("median_ttft_s", "median_tpot_s", "p90_ttft_s", "p90_tpot_s"):
    assert built[name] >= plain[name] - 1e-12, name


def test_the_engines_measured_gemm_overlap_is_held_and_reported(monkeypatch, model_dir,
                                                                device_file):
  """A held r_ovl is the one every simulated step uses (0: weight reads and FLOPs add up,
  so a step doing both is slower than at the default 1); the bound keeps r_ovl = 1, and the
  result states the overlap it held."""
  setup = engine_replay.ServingSetup(model=model_dir, accelerator="", scheduler="vllm",
                                     accelerator_file=device_file)
  summed = dataclasses.replace(setup, held={"r_ovl": 0.0})
  run = run_with_server(kv_blocks=1000)
  assert (engine_replay.simulate_run(run, summed, engine_search.START)["median_ttft_s"]
          > engine_replay.simulate_run(run, setup, engine_search.START)["median_ttft_s"])
  assert (engine_replay.simulate_run(run, summed, summed.bound()) == engine_replay.simulate_run(
      run, setup, setup.bound()))
  monkeypatch.setattr(engine_search, "search", lambda runs, s, **_:
                      (dict(engine_search.START), 0.0, 1))
  result = engine_fit.calibrate_engine([FIXTURE], summed)
  assert result["factors"]["r_ovl"] == result["fixed"]["r_ovl"] == 0.0
