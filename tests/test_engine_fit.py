"""Serving-benchmark results fitted through the continuous-batching simulator: the search,
the held-out rows, the screen against the bound and the profile."""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib

import numpy as np
import pytest

from jaxroof import errors
from jaxroof.measure import profiles
from jaxroof.measure import vllm_results
from jaxroof.calibrate import engine_fit
from jaxroof.calibrate import engine_replay
from jaxroof.calibrate import engine_search
from jaxroof.report import table

DATA = pathlib.Path(__file__).parent / "data"
QPS_1 = DATA / "vllm_llama-3.3-70b_8xa100-40gb_tp8_sharegpt_qps_01.json"
SETUP = engine_replay.ServingSetup(model="llama-2-7b", accelerator="h100-sxm", max_running=32,
                                   token_budget=1024)
TRUTH = {"eta_w": 0.55, "eta_f": 0.35, "t0_step": 2e-3}


def _synthetic_run(rate: float, seed: int, n: int = 24) -> vllm_results.BenchRun:
  """A run whose 'measured' medians are the simulator's at TRUTH."""
  rng = np.random.default_rng(seed)
  run = vllm_results.BenchRun(path="synthetic.json", line=seed, engine="vLLM bench serve",
                              request_rate=rate, burstiness=1.0, max_concurrency=None,
                              prompt_tokens=rng.integers(200, 1200, n),
                              output_tokens=rng.integers(16, 64, n), measured={})
  simulated = engine_replay.simulate_run(run, SETUP, TRUTH)
  return dataclasses.replace(run, measured={k: simulated[k] for k in vllm_results.METRICS})


def test_real_vllm_file_is_read_with_its_lengths_and_medians():
  # surajssd/llm-k8s @ 58b61c5, qps 1 (tests/data/SOURCES.md): 200 requests, ShareGPT.
  [run] = vllm_results.read_runs([QPS_1])
  raw = json.loads(QPS_1.read_text())
  assert run.request_rate == 1.0 and run.max_concurrency is None
  assert len(run.prompt_tokens) == 200 and int(run.prompt_tokens.sum()) == 42659
  assert run.measured["median_tpot_s"] == pytest.approx(raw["median_tpot_ms"] / 1e3)
  assert run.measured["median_ttft_s"] == pytest.approx(raw["median_ttft_ms"] / 1e3)
  workload = engine_replay.workload_of(run, seed=0)
  # A Poisson replay at 1 request/s: 200 arrivals over about 200 s.
  assert 150 < workload.arrival_s[-1] < 250


def test_rate_inf_arrives_at_once_and_concurrency_drops_ttft():
  run = vllm_results.parse_run(
      "r.json", 1, {
          "model_id": "m", "request_rate": "inf", "max_concurrency": 4, "completed": 8,
          "total_input_tokens": 800, "total_output_tokens": 160, "median_ttft_ms": 50.0,
          "median_tpot_ms": 10.0
      })
  assert math.isinf(run.request_rate)
  assert not engine_replay.workload_of(run, 0).arrival_s.any()
  assert set(run.measured) == {"median_tpot_s"}  # TTFT is after the client's semaphore.
  assert list(run.prompt_tokens) == [100] * 8 and list(run.output_tokens) == [20] * 8


@pytest.mark.parametrize("change, key", [
    ({"request_rate": -1}, "request_rate"),
    ({"request_rate": float("nan")}, "request_rate"),
    ({"median_tpot_ms": "fast"}, "median_tpot_ms"),
    ({"median_itl_ms": float("nan")}, "median_itl_ms"),
    ({"burstiness": 0}, "burstiness"),
    ({"total_input_tokens": None}, "total_input_tokens"),
])
def test_bad_results_are_refused_naming_the_key(change, key):
  record = {
      "model_id": "m", "request_rate": 2.0, "completed": 4, "total_input_tokens": 400,
      "total_output_tokens": 80, "median_tpot_ms": 10.0, "median_ttft_ms": 30.0
  }
  with pytest.raises(errors.InputError) as info:
    vllm_results.parse_run("r.json", 3, {**record, **change})
  assert f"r.json line 3, key {key!r}" in str(info.value) and "\n" not in str(info.value)


def test_not_a_result_and_bad_layout_are_refused(tmp_path):
  path = tmp_path / "x.json"
  path.write_text(json.dumps({"hello": 1}))
  with pytest.raises(errors.InputError, match="not a vLLM"):
    vllm_results.read_runs([str(path)])
  run = _synthetic_run(4.0, seed=1, n=4)
  with pytest.raises(errors.InputError, match="tp=3 does not divide"):
    engine_replay.simulate_run(run, dataclasses.replace(SETUP, tp=3), TRUTH)


def test_heldout_runs_never_enter_the_search(monkeypatch):
  runs = [_synthetic_run(rate, seed) for seed, rate in enumerate((math.inf, 8.0, 2.0))]
  searched = []

  def fake_search(train, setup, **kw):
    searched.append({r.line for r in train})
    assert kw.get("start") is None  # A fold never starts from the fit that saw its run.
    return dict(TRUTH), 0.0, 1

  monkeypatch.setattr(engine_search, "search", fake_search)
  result = engine_fit.fit_runs(runs, SETUP)
  assert searched == [{0, 1, 2}, {1, 2}, {0, 2}, {0, 1}]
  assert [f["heldout_run"] for f in result["folds"]] == [r.label for r in runs]
  # At the true factors the simulator reproduces its own medians exactly.
  assert result["heldout_max_rel_error"] == pytest.approx(0.0, abs=1e-12)
  assert result["bound"]["median_rel_error"] > 0.2


@pytest.mark.slow
def test_search_recovers_factors_of_simulated_runs():
  runs = [_synthetic_run(rate, seed) for seed, rate in enumerate((math.inf, 8.0, 2.0))]
  factors, loss, _ = engine_search.search(runs, SETUP, max_simulations=120)
  assert loss < 1e-3  # Medians within ~3% rms.
  assert factors["eta_f"] == pytest.approx(TRUTH["eta_f"], rel=0.10)
  assert factors["eta_w"] == pytest.approx(TRUTH["eta_w"], rel=0.15)
  held = _synthetic_run(4.0, seed=7)
  predicted = engine_replay.simulate_run(held, SETUP, factors)
  for name, measured in held.measured.items():
    assert predicted[name] == pytest.approx(measured, rel=0.10), name


def test_search_ends_when_the_best_factors_sit_on_their_bounds():
  """Medians 100x slower than any factor in range reaches: every step is clipped back to
  the bounds, and the search must still end within its budget (it once looped forever)."""
  run = _synthetic_run(8.0, seed=3, n=8)
  slow = dataclasses.replace(run, measured={k: 100 * v for k, v in run.measured.items()})
  factors, loss, evaluations = engine_search.search([slow], SETUP, max_simulations=30)
  assert evaluations <= 30 and loss > 0
  assert factors["eta_w"] == pytest.approx(engine_search.BOUNDS["eta_w"][0], rel=0.05)


def _two_minima(runs, setup, values, cache):
  """A loss with a local minimum at t0_step = 1 ms (the usual start) and a lower one at
  20 us: the shape of a fit whose fixed costs trade against each other."""
  u = math.log(values["t0_step"])
  local, lower, middle = math.log(1e-3), math.log(2e-5), math.log(1.5e-4)
  cache[tuple(values.values())] = None
  return np.array([
      math.log(values["eta_w"] / 0.5),
      math.log(values["eta_f"] / 0.5), (u - local) * (u - lower) / 10,
      0.3 / (1 + math.exp(-(u - middle)))
  ])


def test_a_second_start_finds_the_lower_of_two_minima(monkeypatch):
  monkeypatch.setattr(engine_search, "_residuals", _two_minima)
  one, loss_one, _ = engine_search.search([], SETUP, max_simulations=60)
  two, loss_two, _ = engine_search.search([], SETUP, max_simulations=60, starts=2)
  assert one["t0_step"] == pytest.approx(1e-3, rel=0.3)  # Stuck at the start's minimum.
  assert two["t0_step"] == pytest.approx(2e-5, rel=0.3)
  assert loss_two < loss_one / 10
  assert two["eta_w"] == pytest.approx(0.5, rel=0.02)


def test_a_third_start_is_refused():
  with pytest.raises(errors.InputError, match="starts=3"):
    engine_search.search([], SETUP, starts=3)


def test_a_held_eta_w_is_not_searched_and_reads_the_weights_at_its_rate():
  held = dataclasses.replace(SETUP, held={"eta_w": TRUTH["eta_w"]})
  assert held.searched == ("eta_f", "t0_step")
  assert held.held_terms()["eta_w"] == TRUTH["eta_w"]
  run = _synthetic_run(8.0, seed=3, n=8)
  rest = {k: v for k, v in TRUTH.items() if k != "eta_w"}
  assert engine_replay.simulate_run(run, held,
                                    rest) == engine_replay.simulate_run(run, SETUP, TRUTH)
  slower = engine_replay.simulate_run(run, dataclasses.replace(held, held={"eta_w": 0.2}), rest)
  assert slower["median_tpot_s"] > run.measured["median_tpot_s"]


@pytest.mark.parametrize("value", [0.0, 1.5, -0.3])
def test_a_held_eta_w_outside_0_1_is_refused(value):
  with pytest.raises(errors.InputError,
                     match=rf"eta_w={value!r} is outside its bounds \(0, 1\]") as raised:
    dataclasses.replace(SETUP, held={"eta_w": value})
  assert raised.value.field == "hold" and "\n" not in str(raised.value)


def test_a_term_held_and_searched_at_once_is_refused():
  with pytest.raises(errors.InputError, match="t0_request is both held and searched"):
    dataclasses.replace(SETUP, held={"t0_request": 3e-3}, search=("t0_request",))
  with pytest.raises(errors.InputError, match="Did you mean 't0_seq'"):
    dataclasses.replace(SETUP, search=("t0_sq",))


def test_engine_profile_round_trips(tmp_path, monkeypatch):
  monkeypatch.setattr(engine_search, "search", lambda runs, setup, **_: (dict(TRUTH), 0.0, 1))
  path = tmp_path / "r.json"
  path.write_text(
      json.dumps({
          "model_id": "m", "request_rate": 4.0, "completed": 6, "total_input_tokens": 1200,
          "total_output_tokens": 120, "median_tpot_ms": 9.0, "median_ttft_ms": 40.0
      }))
  result = engine_fit.calibrate_engine([str(path)], SETUP)
  assert result["rows_used"] == 1 and result["heldout_median_rel_error"] is None
  saved = tmp_path / "profile.json"
  profiles.save_profile(engine_fit.engine_profile(result), saved)
  loaded = profiles.load_profile(saved)
  assert loaded.accelerator == "h100-sxm"
  assert loaded.factors["eta_w"] == pytest.approx(TRUTH["eta_w"])
  assert loaded.factors["eta_kv"] == pytest.approx(TRUTH["eta_w"])  # Tied.


def test_medians_faster_than_the_bound_are_flagged_and_left_out(monkeypatch):
  run = _synthetic_run(4.0, seed=3, n=8)
  bound = engine_replay.simulate_run(run, SETUP, SETUP.bound())
  too_fast = dataclasses.replace(
      run, measured={**run.measured, "median_tpot_s": bound["median_tpot_s"] / 3})
  kept, flags = engine_fit.screen([too_fast], SETUP)
  assert set(kept[0].measured) == {"median_ttft_s", "median_itl_s"}
  assert len(flags) == 1 and "below the bound" in flags[0]
  impossible = dataclasses.replace(run, measured={"median_tpot_s": bound["median_tpot_s"] / 3})
  with pytest.raises(errors.InputError, match="every measured median is below the bound"):
    engine_fit.fit_runs([impossible], SETUP)


def test_a_held_cache_lowers_the_floor_a_median_is_screened_against():
  """Weights read from a measured cache beat the datasheet's DRAM rate: a step that only
  the cache explains stays in the fit, and the flag's floor names the cache."""
  run = _synthetic_run(4.0, seed=3, n=8)
  bound = engine_replay.simulate_run(run, SETUP, SETUP.bound())
  fast = dataclasses.replace(run, measured={"median_tpot_s": bound["median_tpot_s"] / 3})
  assert not engine_fit.screen([fast], SETUP)[0]
  device = engine_replay.load_device(SETUP)
  cached = dataclasses.replace(
      SETUP, held={"c_llc": 1e12, "bw_llc": 20 * device.memory_bandwidth_bytes_per_s})
  kept, flags = engine_fit.screen([fast], cached)
  assert kept and not flags
  slower = dataclasses.replace(run, measured={"median_tpot_s": bound["median_tpot_s"] / 1e3})
  assert "the held cache" in engine_fit.screen([slower], cached)[1][0]


def _with_detail(run: vllm_results.BenchRun, coalesced: float,
                 ttft_scale: float = 1.0) -> vllm_results.BenchRun:
  """The run with the simulator's own per-request detail at TRUTH as its measurement, a
  `coalesced` share of its token gaps set to 0 (the client read them together)."""
  detail = engine_replay.simulate_run(run, SETUP, TRUTH, detail=True)["detail"]
  itl = np.sort(np.asarray(detail["itl_s"], float))[::-1].copy()
  itl[:int(round(coalesced * len(itl)))] = 0.0
  return dataclasses.replace(
      run, detail={
          "ttft_s": np.asarray(detail["ttft_s"]) * ttft_scale,
          "tpot_s": np.asarray(detail["tpot_s"]), "itl_s": itl
      })


def test_a_client_bound_run_shows_its_errors_outside_the_medians():
  """nano-llama's client starved a second stream (23-49% of its gaps coalesced, whole
  requests in one chunk: TTFT = their duration). Such a run's rows keep their error, marked,
  out of the medians and the maximum; a run at 10% (as quiet tiny-llama runs) is scored."""
  base = _synthetic_run(4.0, 3)
  paced = _with_detail(base, 0.4, ttft_scale=10.0)
  quiet = _with_detail(_synthetic_run(4.0, 5), 0.1)
  assert engine_replay.client_bound(paced) and not engine_replay.client_bound(quiet)
  out = engine_fit.predict_heldout([paced, quiet], SETUP, TRUTH)
  marked = [r for r in out["heldout"] if r.get("client_bound")]
  assert {r["run"] for r in marked} == {paced.label}
  assert out["heldout_points_client_bound"] == len(marked) == 6
  ttft = next(r for r in marked if (r["metric"], r["percentile"]) == ("ttft", 50))
  assert ttft["rel_error"] == pytest.approx(0.9, rel=0.01)  # Shown: 1/10 of the measured.
  assert table.heldout_error(ttft) == "(90.0%, client-bound)"
  assert out["heldout_points"] == len(out["heldout"]) - 6
  assert out["heldout_max_rel_error"] < 0.5  # The quiet run's (its ITL p90 lost 10%).
  [term] = [t for t in out["heldout_terms"] if t["run"] == paced.label]
  assert term["client_bound"] and term["value"] == pytest.approx(0.4, abs=0.01)
  _, flags = engine_fit.screen([paced, quiet], SETUP)
  assert len(flags) == 1 and "paced" in flags[0] and paced.label in flags[0]


def test_a_coalesced_measurement_has_no_relative_error(monkeypatch):
  """vLLM's CPU server streamed tokens together: a measured ITL p50 of 0 ms is the client's
  clock, not a step. Its row says so and stays out of the medians (it read 113,000%)."""
  run = _synthetic_run(4.0, 3)
  real = vllm_results.measured_percentile
  monkeypatch.setattr(
      vllm_results, "measured_percentile", lambda r, metric, q: 0.0
      if (metric, q) == ("itl", 50) else real(r, metric, q))
  out = engine_fit.predict_heldout([run], SETUP, TRUTH)
  coalesced = [r for r in out["heldout"] if r["rel_error"] is None]
  assert [(r["metric"], r["percentile"]) for r in coalesced] == [("itl", 50)]
  assert "together" in coalesced[0]["note"]
  assert out["heldout_points_coalesced"] == 1
  assert out["heldout_points"] == len(out["heldout"]) - 1
  assert "p50 itl" not in out["heldout_median_rel_error_by_metric"]
  assert math.isfinite(out["heldout_max_rel_error"])


def test_a_held_eta_kv_charges_attention_at_the_engines_kernel_rate(monkeypatch):
  """vLLM's CPU attention read K/V at 7-12 GB/s where its GEMMs read weights at 24-39
  (`jaxroof/engines/data/vllm_cpu.json`): a held eta_kv puts it there. A decode
  step's K/V time is then its K/V bytes over eta_kv x BW, the runs slow down, the result says
  what was held, and the bound stays at eta = 1."""
  held = dataclasses.replace(SETUP, held={"eta_kv": 0.1})
  run = _synthetic_run(8.0, seed=4)
  replica = engine_replay.replica_of(run, held, {**held.held_terms(), **TRUTH})
  batch, context = 4.0, 1000.0
  step = replica.cost.decode(batch, context, replica.step_model)
  # llama-2-7b: 32 layers, K and V of 32 heads x 128 in bf16 per position.
  kv_bytes = batch * context * 32 * 2 * 32 * 128 * 2
  assert float(step["kv_s"]) == pytest.approx(kv_bytes / (0.1 * replica.cost.constants["BW"]),
                                              rel=1e-6)
  tied = engine_replay.replica_of(run, SETUP, TRUTH)
  tied_step = tied.cost.decode(batch, context, tied.step_model)
  assert float(tied_step["kv_s"]) == pytest.approx(float(step["kv_s"]) * 0.1 / TRUTH["eta_w"])
  slow = engine_replay.simulate_run(run, held, TRUTH)["median_tpot_s"]
  assert slow > engine_replay.simulate_run(run, SETUP, TRUTH)["median_tpot_s"]
  assert (engine_replay.simulate_run(run, held, held.bound()) == engine_replay.simulate_run(
      run, SETUP, SETUP.bound()))
  monkeypatch.setattr(engine_search, "search", lambda runs, setup, **_: (dict(TRUTH), 0.0, 1))
  result = engine_fit.fit_runs([run], held)
  assert result["factors"]["eta_kv"] == 0.1 and result["fixed"]["eta_kv"] == 0.1
  assert result["tied"] == {}
  assert engine_fit.fit_runs([run], SETUP)["tied"] == {"eta_kv": "eta_w"}


def test_a_held_eta_attn_times_the_kernels_flops_and_leaves_the_bound(monkeypatch):
  """The kernel's prompts ran at about 120 GFLOP/s, its GEMMs at 450: with eta_attn held,
  every simulated step pays attention FLOPs at eta_attn x F (TTFT of
  1000-token prompts grows), the result carries it, and the bound stays as it was."""
  kernel = dataclasses.replace(SETUP, held={"eta_attn": 0.05})
  run = _synthetic_run(2.0, seed=6)
  slow, plain = (engine_replay.simulate_run(run, s, TRUTH) for s in (kernel, SETUP))
  assert slow["median_ttft_s"] > plain["median_ttft_s"]
  assert (engine_replay.simulate_run(run, kernel, kernel.bound()) == engine_replay.simulate_run(
      run, SETUP, SETUP.bound()))
  replica = engine_replay.replica_of(run, kernel, {**kernel.held_terms(), **TRUTH})
  assert replica.step_model.terms["eta_attn"] == 0.05
  monkeypatch.setattr(engine_search, "search", lambda runs, setup, **_: (dict(TRUTH), 0.0, 1))
  result = engine_fit.fit_runs([run], kernel)
  assert result["factors"]["eta_attn"] == 0.05 and result["fixed"]["eta_attn"] == 0.05
  assert "eta_attn" not in engine_fit.fit_runs([run], SETUP)["factors"]
