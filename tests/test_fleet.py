"""A fleet behind a router, the largest rate meeting the SLOs, long samples (issue 24)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from jaxroof.errors import InputError
from jaxroof.serving import arrivals, fleet, load, metrics, replica, requests, simulator
from jaxroof.serving import simulation_result as sim_result
from jaxroof.symbolic import prefill as prefill_formulas
from jaxroof.symbolic.step_model import StepModel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The lesson's 8B model in raw numbers: 16 GB of bf16 weights, 128 KiB of K/V per token,
# 2 TB/s, 600 TFLOP/s, 32 blocks of 32 heads of 128.
RAW = dict(N=8e9, q=2.0, k=131072.0, BW=2e12, F=600e12, L=32, H=32, d=128)
RAW_FLAGS = ("--params_b=8", "--bytes_per_weight=2", "--kv_bytes_per_token=131072",
             "--bandwidth_tbps=2", "--tflops=600", "--layers=32", "--heads=32", "--head_dim=128",
             "--kv_memory_gb=40")


def _replica(max_running: int = 32) -> simulator.Replica:
  return replica.from_numbers(**RAW, kv_memory_bytes=40e9, page_bytes=16 * RAW["k"], page_tokens=16,
                              step_model=StepModel.bound(), max_running=max_running,
                              max_context=4096)


def _workload(rate: float, n: int = 400, seed: int = 0) -> arrivals.Workload:
  return arrivals.synthetic(arrival="poisson", num_requests=n, arrival_rate=rate, seed=seed,
                            prompt_tokens=1000, output_tokens=200, prompt_distribution="uniform",
                            prompt_spread=0.5)


@pytest.mark.parametrize("scheduler", fleet.CONTINUOUS)
def test_round_robin_with_one_replica_is_the_single_replica_simulator(scheduler):
  w, r = _workload(10.0), _replica()
  single = simulator.simulate(w, r, scheduler)
  one = fleet.simulate_fleet(w, r, 1, scheduler=scheduler, router="round_robin").fleet
  for name in ("first_token_s", "finish_s", "itl_s", "emitted"):
    np.testing.assert_array_equal(getattr(one, name), getattr(single, name))
  assert one.iterations == single.iterations and one.preemptions == single.preemptions


def test_routers_send_every_request_once():
  w, r = _workload(30.0, n=300), _replica()
  for router in fleet.ROUTERS:
    run = fleet.simulate_fleet(w, r, 3, router=router, seed=1)
    counts = np.bincount(run.assignment, minlength=3)
    assert counts.sum() == 300 and np.all(np.isfinite(run.fleet.finish_s))
    per = fleet.replica_metrics(run)
    assert [p["requests"] for p in per] == counts.tolist()
    assert sum(p["metrics"]["completed"] for p in per) == 300
    if router == "round_robin":
      assert counts.max() - counts.min() <= 1
  again = fleet.simulate_fleet(w, r, 3, router="power_of_two", seed=1)
  np.testing.assert_array_equal(
      again.assignment,
      fleet.simulate_fleet(w, r, 3, router="power_of_two", seed=1).assignment)


def test_least_outstanding_routes_to_the_idle_replica():
  # Two requests at once, then a third after the first two are long done: least
  # outstanding sends the second to replica 1 (replica 0 holds one), the third to 0.
  w = arrivals.Workload(np.array([0.0, 0.0, 100.0]), np.array([100, 100, 100]),
                        np.array([10, 10, 10]), {})
  run = fleet.simulate_fleet(w, _replica(), 2, router="least_outstanding")
  assert run.assignment.tolist() == [0, 1, 0]


def test_find_max_rate_matches_the_analytic_capacity_within_the_spread(tmp_path):
  """`simulate --find_max_rate --ttft_ms=3000` holds p90 TTFT <= 3 s (its --slo_percentile's
  default), with no gap target, under simulate's default scheduler (iteration, whole
  prompts) at --max_running=32: the load model asked the same question is within the
  issue's 10% of the seeds' answers (the seeds themselves spread: each bisects one draw)."""
  inputs = requests.ServingInputs(
      N=RAW["N"], N_act=RAW["N"], q=RAW["q"], k=RAW["k"], BW=RAW["BW"], F=RAW["F"], layers=RAW["L"],
      pair_flops=RAW["L"] * float(prefill_formulas.full_attention_pair_flops(32, 128)))
  analytic = load.answer(StepModel.bound(), inputs, prompt_tokens=1000, output_tokens=200,
                         token_gap_s=math.inf, ttft_s=3.0, scheduler="iteration", max_running=32,
                         ttft_quantile=0.9, itl_quantile=None)
  assert analytic.max_running == 32 and analytic.scheduling.scheduler == "iteration"
  found = []
  for seed in (0, 1, 2):
    out = tmp_path / f"max{seed}.json"
    proc = subprocess.run([
        sys.executable, "-m", "experiments.simulate", *RAW_FLAGS, "--prompt_tokens=1000",
        "--output_tokens=200", "--max_running=32", "--num_requests=1000", "--find_max_rate",
        "--ttft_ms=3000", f"--seed={seed}", "--arrival_rate=5", f"--json_out={out}"
    ], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["scheduler"] == "iteration" and data["slo_percentile"] == 90
    assert data["targets"] == {"ttft_s": 3.0, "tpot_s": None, "itl_s": None}
    assert data["max_rate_per_chip"] == pytest.approx(data["max_rate_per_s"])  # One chip.
    # Raw numbers give the load model no spec: the bisection starts at --arrival_rate.
    assert data["start_rate_per_s"] == data["tried"][0]["rate_per_s"] == 5.0
    assert data["start"] == "the arrival rate given" and data["label"].startswith("simulated")
    found.append(data["max_rate_per_s"])
  # The issue's target (10%) around the seeds' spread.
  assert 0.9 * min(found) <= analytic.max_rate <= 1.1 * max(found), (analytic.max_rate, found)


def test_an_engines_cost_per_request_is_in_every_fleet_and_max_rate_ttft():
  # Each request reaches the engine t0 after it arrives: every TTFT (and latency) of a
  # fleet's run, of each replica's and of each rate the bisection tries is longer by t0,
  # and TPOT does not move.
  w, r, t0 = _workload(20.0, n=200), _replica(), 0.05
  base, late = (sim_result.fleet_run(w, r, 2, scheduler="chunked", router="round_robin", seed=0,
                                     targets={}, t0_request_s=x) for x in (0.0, t0))

  def per(run):
    return metrics.per_request(run.arrival_s, run.first_token_s, run.finish_s, run.output_tokens)

  for a, b in [(base["run"].fleet, late["run"].fleet),
               *zip(base["run"].replicas, late["run"].replicas)]:
    np.testing.assert_allclose(per(b)["ttft_s"] - per(a)["ttft_s"], t0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(per(b)["tpot_s"], per(a)["tpot_s"], rtol=0, atol=1e-12)
  assert late["metrics"]["ttft_s"]["mean"] == pytest.approx(base["metrics"]["ttft_s"]["mean"] + t0)
  kw = dict(replicas=2, chips=2, scheduler="chunked", router="round_robin", seed=0,
            num_requests=200, start_rate=20.0, percentile=90.0,
            targets={"ttft_s": 1.0, "tpot_s": None, "itl_s": None})
  found = [
      sim_result.max_rate(lambda rate, n: _workload(rate, n), r, t0_request_s=x, **kw)
      for x in (0.0, t0)
  ]
  first = [f["tried"][0] for f in found]
  assert first[0]["rate_per_s"] == first[1]["rate_per_s"] == 20.0
  assert first[1]["ttft_s"] == pytest.approx(first[0]["ttft_s"] + t0)
  assert found[1]["max_rate_per_s"] <= found[0]["max_rate_per_s"]


def test_simulate_fleet_cli_json(tmp_path):
  out = tmp_path / "fleet.json"
  proc = subprocess.run([
      sys.executable, "-m", "experiments.simulate", *RAW_FLAGS, "--prompt_tokens=500",
      "--output_tokens=50", "--num_requests=200", "--arrival_rate=30", "--dp=3",
      "--router=power_of_two", f"--json_out={out}"
  ], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  assert "fleet of 3 replicas" in proc.stdout
  data = json.loads(out.read_text())
  assert data["metrics"]["completed"] == 200
  assert len(data["replicas"]) == 3
  assert sum(r["requests"] for r in data["replicas"]) == 200


def test_long_samples_resampled_or_clipped_and_counted():
  w = arrivals.synthetic(arrival="poisson", num_requests=2000, arrival_rate=1.0, seed=0,
                         prompt_tokens=1500, output_tokens=200, prompt_distribution="lognormal",
                         prompt_spread=1.5, max_total=2048)
  beyond = w.description["beyond_context"]
  assert beyond["requests_beyond"] > 0 and beyond["policy"] == "resample"
  assert np.all(w.prompt_tokens + w.output_tokens <= 2048)
  clip = arrivals.synthetic(arrival="poisson", num_requests=2000, arrival_rate=1.0, seed=0,
                            prompt_tokens=1500, output_tokens=200, prompt_distribution="lognormal",
                            prompt_spread=1.5, max_total=2048, long_samples="clip")
  # Same seed, same first draws: clipping touches exactly the requests that were beyond.
  assert clip.description["beyond_context"]["clipped"] == beyond["requests_beyond"]
  assert np.all(clip.prompt_tokens + clip.output_tokens <= 2048)
  assert np.sum(clip.prompt_tokens + clip.output_tokens == 2048) >= beyond["requests_beyond"]


@pytest.mark.parametrize("args,needle", [
    (("--dp=0",), "--dp=0"),
    (("--dp=2", "--scheduler=static"), "--scheduler=static"),
    (("--find_max_rate",), "--ttft_ms"),
])
def test_simulate_bad_input_one_line(args, needle):
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.simulate", *RAW_FLAGS, "--num_requests=10", *args],
      cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert proc.returncode != 0
  lines = [l for l in proc.stderr.strip().splitlines() if l]
  assert len(lines) == 1 and needle in lines[0], proc.stderr


def test_fleet_refuses_static_and_zero_replicas():
  with pytest.raises(InputError):
    fleet.simulate_fleet(_workload(1.0, n=5), _replica(), 2, scheduler="static")
  with pytest.raises(InputError):
    fleet.simulate_fleet(_workload(1.0, n=5), _replica(), 0)
