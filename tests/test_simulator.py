"""The continuous-batching simulator: exact single requests, conservation, memory,
limits in load, scheduler ordering, determinism, bad input."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
import sympy as sp

from jaxroof.errors import InputError
from jaxroof.serving import arrivals, metrics, replica, simulator
from jaxroof.symbolic import calibrated, iteration
from jaxroof.symbolic.step_model import StepModel

# A 1B-weight model on a 1 TB/s, 100 TFLOP/s device (round numbers, not a product).
MODEL = dict(N=1e9, q=2.0, k=1e5, BW=1e12, F=1e14, L=16, H=16, d=64)
FACTORS = dict(eta_w=0.7, eta_kv=0.5, eta_f=0.4, t0_step=2e-4, t0_layer=1e-5, r_ovl=1.5)
PAGE = 16


def _replica(pages=4000, kind="bound", **kw):
  model = StepModel.bound() if kind == "bound" else StepModel.calibrated(FACTORS)
  return replica.from_numbers(**MODEL, kv_memory_bytes=pages * PAGE * MODEL["k"],
                              page_bytes=PAGE * MODEL["k"], page_tokens=PAGE, step_model=model,
                              **kw)


def _workload(n=300, rate=5.0, seed=0, prompt=200, output=50, spread=0.0):
  dist = "lognormal" if spread else "fixed"
  return arrivals.synthetic(arrival="poisson", num_requests=n, arrival_rate=rate, seed=seed,
                            prompt_tokens=prompt, output_tokens=output, prompt_distribution=dist,
                            output_distribution=dist, prompt_spread=spread, output_spread=spread)


@functools.cache
def _model_expression(kind):
  """The iteration's expression with `MODEL` substituted (once: the full one is large)."""
  expr = iteration.iteration_expression(kind, FACTORS if kind != "bound" else None)
  values = dict(MODEL, N_act=MODEL["N"])
  return expr.xreplace({sp.Symbol(k, positive=True): sp.Float(v) for k, v in values.items()})


def _sympy_time(kind, n_dec=0, S_dec=0, n_pre=0, S_pre_att=0, S_pre_kv=0):
  """The iteration's time by sympy substitution (not the lambdified path)."""
  values = dict(n_dec=n_dec, S_dec=S_dec, n_pre=n_pre, S_pre_att=S_pre_att, S_pre_kv=S_pre_kv)
  return float(
      _model_expression(kind).xreplace(
          {sp.Symbol(k, positive=True): sp.Float(v) for k, v in values.items()}))


@pytest.mark.parametrize("kind", ["bound", "calibrated"])
@pytest.mark.parametrize("scheduler", ["static", "iteration", "chunked"])
def test_one_request_alone_is_prefill_plus_decode_steps(kind, scheduler):
  P, O = 300, 7
  w = arrivals.Workload(np.array([1.5]), np.array([P]), np.array([O]), {})
  run = simulator.simulate(w, _replica(kind=kind, token_budget=1024), scheduler)
  prefill = _sympy_time(kind, n_pre=P, S_pre_att=iteration.chunk_attended_pairs(0, P), S_pre_kv=P)
  decodes = sum(_sympy_time(kind, n_dec=1, S_dec=P + g) for g in range(1, O))
  assert run.first_token_s[0] - 1.5 == pytest.approx(prefill, rel=1e-12)
  assert run.finish_s[0] - 1.5 == pytest.approx(prefill + decodes, rel=1e-12)
  assert run.iterations == O


def test_chunked_prefill_splits_the_prompt_in_budgeted_chunks():
  P = 300
  w = arrivals.Workload(np.array([0.0]), np.array([P]), np.array([2]), {})
  run = simulator.simulate(w, _replica(token_budget=128), "chunked")
  expected = sum(
      _sympy_time("bound", n_pre=c, S_pre_att=iteration.chunk_attended_pairs(o, c), S_pre_kv=o + c)
      for o, c in ((0, 128), (128, 128), (256, 44)))
  assert run.first_token_s[0] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("scheduler", ["static", "iteration", "chunked"])
def test_conservation_and_memory_under_preemption(scheduler):
  w = _workload(n=200, rate=500.0, spread=0.6)
  r = _replica(pages=150, max_running=64, token_budget=256)
  run = simulator.simulate(w, r, scheduler)
  assert np.all(np.isfinite(run.finish_s))
  np.testing.assert_array_equal(run.emitted, w.output_tokens)
  assert len(run.itl_s) == int(np.sum(w.output_tokens - 1))
  assert np.all(run.itl_s > 0)
  recomputed = run.prefill_tokens - int(np.sum(w.prompt_tokens))
  assert recomputed >= 0 and (recomputed > 0) == (run.preemptions > 0)
  assert run.pages_in_use.max() <= r.total_pages
  assert np.all(run.first_token_s >= run.arrival_s)
  assert np.all(run.finish_s >= run.first_token_s)
  if scheduler != "static":
    assert run.preemptions > 0  # The memory is tight enough to force some.


def test_vanishing_load_ttft_is_the_prefill_time():
  w = _workload(n=30, rate=1e-3, prompt=500, output=5)
  run = simulator.simulate(w, _replica(), "iteration")
  prefill = _sympy_time("bound", n_pre=500, S_pre_att=iteration.chunk_attended_pairs(0, 500),
                        S_pre_kv=500)
  # Arrivals lie thousands of seconds out: differences keep ~1e-12 s of float64.
  np.testing.assert_allclose(run.first_token_s - run.arrival_s, prefill, rtol=1e-8)


def test_past_saturation_the_queue_grows_without_bound():
  # Each request needs output-1 decode iterations, each at least the weight read
  # N*q/BW, and at most max_running share one: that caps the request rate.
  max_running, output = 16, 50
  cap = max_running / ((output - 1) * MODEL["N"] * MODEL["q"] / MODEL["BW"])
  queues = []
  for n in (200, 400):
    w = _workload(n=n, rate=2 * cap, output=output)
    run = simulator.simulate(w, _replica(max_running=max_running), "iteration")
    queues.append(run.queue_length.max())
  assert queues[1] > 1.8 * queues[0]
  below = simulator.simulate(_workload(n=400, rate=0.2 * cap, output=output),
                             _replica(max_running=max_running), "iteration")
  assert below.queue_length.max() < 0.05 * 400


@pytest.mark.parametrize("rate", [2.0, 20.0, 80.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_iteration_level_mean_ttft_is_never_worse_than_static(rate, seed):
  w = _workload(n=150, rate=rate, seed=seed, spread=0.5)
  ttft = {}
  for scheduler in ("static", "iteration"):
    run = simulator.simulate(w, _replica(max_running=32, batch_window_s=0.01), scheduler)
    ttft[scheduler] = np.mean(run.first_token_s - run.arrival_s)
  assert ttft["iteration"] <= ttft["static"]


def test_same_seed_same_results_other_seed_differs():
  runs = [
      simulator.simulate(_workload(seed=s, spread=0.5), _replica(), "chunked") for s in (3, 3, 4)
  ]
  np.testing.assert_array_equal(runs[0].finish_s, runs[1].finish_s)
  np.testing.assert_array_equal(runs[0].itl_s, runs[1].itl_s)
  assert not np.array_equal(runs[0].finish_s, runs[2].finish_s)


def test_fixed_lengths_are_exact_and_metrics_follow_vllm():
  w = _workload(n=50, prompt=123, output=17)
  assert set(w.prompt_tokens) == {123} and set(w.output_tokens) == {17}
  run = simulator.simulate(w, _replica(), "iteration")
  m = metrics.serving_metrics(run.arrival_s, run.first_token_s, run.finish_s, run.output_tokens,
                              run.itl_s, ttft_target_s=1e9)
  e2el, ttft = run.finish_s - run.arrival_s, run.first_token_s - run.arrival_s
  assert m["tpot_s"]["mean"] == pytest.approx(np.mean((e2el - ttft) / 16))
  assert m["completed"] == 50 and m["goodput_per_s"] == m["request_throughput_per_s"]
  duration = run.finish_s.max() - run.arrival_s.min()
  assert m["output_throughput_tokens_per_s"] == pytest.approx(50 * 17 / duration)


def test_calibrated_iteration_reduces_to_the_calibrated_decode_step():
  # No prefill, B equal contexts, no attention FLOPs (H -> 0): the calibrated step.
  B_, T_ = sp.Integer(8), sp.Integer(900)
  it = iteration.step_expression("calibrated").subs({
      iteration.n_dec: B_, iteration.S_dec: B_ * T_, iteration.n_pre: 0, iteration.S_pre_att: 0,
      iteration.S_pre_kv: 0,
      sp.Symbol("H", positive=True): 0
  })
  step = calibrated.calibrated_step().subs(
      {sp.Symbol("B", positive=True): B_,
       sp.Symbol("T", positive=True): T_})
  values = {sp.Symbol(k, positive=True): v for k, v in {**MODEL, **FACTORS, "N_act": 1e9}.items()}
  assert float(it.subs(values)) == pytest.approx(float(step.subs(values)), rel=1e-12)


@pytest.mark.parametrize("kw, match", [
    (dict(arrival_rate=0.0), "arrival_rate"),
    (dict(arrival_rate=-1.0), "arrival_rate"),
    (dict(prompt_tokens=0), "prompt_tokens"),
    (dict(output_tokens=-5), "output_tokens"),
    (dict(num_requests=0), "num_requests"),
])
def test_bad_workload_is_one_line(kw, match):
  args = dict(arrival="poisson", num_requests=10, arrival_rate=1.0, seed=0, prompt_tokens=10,
              output_tokens=10)
  with pytest.raises(InputError, match=match) as e:
    arrivals.synthetic(**{**args, **kw})
  assert "\n" not in str(e.value)


def test_prompt_longer_than_context_and_never_fitting_request_are_one_line():
  w = arrivals.Workload(np.array([0.0]), np.array([5000]), np.array([10]), {})
  with pytest.raises(InputError, match="context"):
    simulator.simulate(w, _replica(max_context=4096), "iteration")
  with pytest.raises(InputError, match="never fit"):
    simulator.simulate(w, _replica(pages=100), "iteration")


@pytest.mark.parametrize("text, match", [
    ("arrival_s,prompt_tokens\n0,5\n", "line 1.*output_tokens"),
    ("arrival_s,prompt_tokens,output_tokens\n0,5,5\n2,5,5\n1,5,5\n", "line 4.*arrival_s"),
    ("arrival_s,prompt_tokens,output_tokens\n0,5,5\n1,-3,5\n", "line 3.*prompt_tokens"),
    ("arrival_s,prompt_tokens,output_tokens\n0,5,abc\n", "line 2.*output_tokens.*not a number"),
])
def test_bad_csv_trace_names_the_line(tmp_path, text, match):
  path = tmp_path / "trace.csv"
  path.write_text(text)
  with pytest.raises(InputError, match=match):
    arrivals.load_trace(path)


def test_jsonl_trace_round_trip_and_missing_column(tmp_path):
  good = tmp_path / "t.jsonl"
  good.write_text('{"arrival_s": 0, "prompt_tokens": 4, "output_tokens": 2}\n'
                  '{"arrival_s": 0.5, "prompt_tokens": 8, "output_tokens": 3}\n')
  w = arrivals.load_trace(good)
  np.testing.assert_array_equal(w.prompt_tokens, [4, 8])
  bad = tmp_path / "b.jsonl"
  bad.write_text('{"arrival_s": 0, "prompt_tokens": 4}\n')
  with pytest.raises(InputError, match="line 1.*output_tokens"):
    arrivals.load_trace(bad)


def _cli(*args):
  import os
  import subprocess
  import sys
  env = {**os.environ, "PYTHONPATH": os.getcwd()}
  return subprocess.run([sys.executable, "-m", "experiments.simulate", *args], capture_output=True,
                        text=True, env=env, timeout=120)


def test_cli_writes_the_issue_keys(tmp_path):
  out = tmp_path / "sim.json"
  done = _cli("--params_b=1", "--kv_bytes_per_token=100000", "--bandwidth_tbps=1", "--tflops=100",
              "--layers=16", "--heads=16", "--head_dim=64", "--kv_memory_gb=1", "--num_requests=50",
              "--arrival_rate=5", "--prompt_tokens=100", "--output_tokens=20",
              "--scheduler=chunked", "--ttft_ms=100", "--tpot_ms=10", f"--json_out={out}")
  assert done.returncode == 0, done.stderr
  import json
  result = json.loads(out.read_text())
  m = result["metrics"]
  for key in ("ttft_s", "tpot_s", "itl_s", "e2el_s"):
    assert set(m[key]) == {"mean", "median", "p90", "p99"}
  for key in ("request_throughput_per_s", "output_throughput_tokens_per_s", "goodput_per_s",
              "completed"):
    assert key in m
  assert m["completed"] == 50
  assert {"iterations", "wall_s"} <= set(result["simulation"])


@pytest.mark.parametrize("args, name", [
    (("--arrival_rate=0",), "arrival_rate"),
    (("--arrival=trace",), "trace"),
    (("--model=llama-3-8b",), "accelerator"),
])
def test_cli_bad_input_is_one_line(args, name):
  done = _cli("--num_requests=5", *args)
  assert done.returncode == 2
  lines = done.stderr.strip().splitlines()
  assert len(lines) == 1 and name in lines[0]


def test_padded_costing_charges_every_row_and_slot():
  # A fixed-shape server computes all rows over all slots: the decode cost is
  # the same with one running sequence as with max_running of them.
  r = _replica(max_running=4, max_context=64, padded_to=lambda c: 32)
  one = simulator.simulate(arrivals.Workload(np.array([0.0]), np.array([10]), np.array([3]), {}), r,
                           "iteration")
  padded_decode = _sympy_time("bound", n_dec=4, S_dec=4 * 64)
  padded_prefill = _sympy_time("bound", n_pre=32, S_pre_att=32 * 64, S_pre_kv=64)
  assert one.finish_s[0] == pytest.approx(padded_prefill + 2 * padded_decode, rel=1e-12)


def test_a_prefilled_request_streams_its_first_token_at_admission():
  """A decode pool's replica (`Replica.prefilled`): no prefill, the first token at
  admission, then output - 1 decode iterations; a plain replica prefills first."""
  import dataclasses as dc
  w = arrivals.Workload(arrival_s=np.array([0.5]), prompt_tokens=np.array([300]),
                        output_tokens=np.array([4]), description={})
  plain = _replica(pages=400, max_running=4)
  decode = dc.replace(plain, prefilled=True)
  run = simulator.simulate(w, decode, "iteration")
  assert run.first_token_s[0] == 0.5 and run.prefill_tokens == 0
  assert run.iterations == 3 and run.emitted[0] == 4
  base = simulator.simulate(w, plain, "iteration")
  assert base.first_token_s[0] > 0.5 and base.prefill_tokens == 300
  with pytest.raises(InputError, match="decode pool"):
    simulator.simulate(w, decode, "static")


@pytest.mark.parametrize("capacity", [2, 4, 64])
def test_an_engine_builds_kernels_at_row_counts_it_has_not_kept(capacity):
  """With every request waiting at time 0 the iterations do not depend on their lengths, so
  a kernel cache changes each step by seconds_per_row x its rows exactly where an independent
  least-recently-used cache of `capacity` row counts misses, and nowhere else."""
  lengths = np.random.default_rng(1)
  w = arrivals.Workload(np.zeros(12), lengths.integers(20, 200, 12), lengths.integers(2, 30, 12),
                        {})
  plain = simulator.simulate(w, _replica(token_budget=256), "vllm")
  cache = simulator.KernelCache(capacity=capacity, seconds_per_row=7e-5)
  built = simulator.simulate(w, dataclasses.replace(_replica(token_budget=256), kernel_cache=cache),
                             "vllm")
  np.testing.assert_array_equal(built.rows, plain.rows)
  kept, misses = [], []
  for rows in plain.rows.tolist():
    misses.append(rows not in kept)
    if rows in kept:
      kept.remove(rows)
    kept.append(rows)
    kept = kept[-capacity:]
  np.testing.assert_allclose(built.step_s - plain.step_s, 7e-5 * plain.rows * np.asarray(misses),
                             atol=1e-12)
  assert built.kernel_builds == sum(misses) >= len(set(plain.rows.tolist()))


def test_a_warm_kernel_cache_builds_only_the_counts_it_lacks():
  """Warm with every row count the run uses (and room for them all) nothing is built and the
  run is the plain one; warm with all but the most recent count, only that count's steps
  are charged, once."""
  lengths = np.random.default_rng(2)
  w = arrivals.Workload(np.zeros(10), lengths.integers(20, 200, 10), lengths.integers(2, 30, 10),
                        {})
  plain = simulator.simulate(w, _replica(token_budget=256), "vllm")
  counts = list(dict.fromkeys(plain.rows.tolist()))
  full = simulator.KernelCache(capacity=len(counts), seconds_per_row=1e-4, warm=tuple(counts))
  warm = simulator.simulate(w, dataclasses.replace(_replica(token_budget=256), kernel_cache=full),
                            "vllm")
  assert warm.kernel_builds == 0
  np.testing.assert_allclose(warm.step_s, plain.step_s, rtol=0, atol=0)
  missing = counts[-1]
  short = dataclasses.replace(full, warm=tuple(counts[:-1]))
  once = simulator.simulate(w, dataclasses.replace(_replica(token_budget=256), kernel_cache=short),
                            "vllm")
  first = plain.rows.tolist().index(missing)
  expected = np.zeros(len(plain.rows))
  expected[first] = 1e-4 * missing
  np.testing.assert_allclose(once.step_s - plain.step_s, expected, atol=1e-12)
  assert once.kernel_builds == 1


@pytest.mark.parametrize("scheduler", ["vllm", "chunked", "iteration"])
def test_only_an_iteration_on_an_idle_replica_pays_its_wake(scheduler):
  """`Replica.wake_s` lengthens the first iteration after the replica had nothing to do:
  requests all at once pay it once; requests far apart (each served before the next) each
  pay it in their first iteration, so every TTFT grows by it and no token gap moves."""
  lengths = np.random.default_rng(3)
  prompts, outputs = lengths.integers(20, 200, 6), lengths.integers(2, 30, 6)
  woken = dataclasses.replace(_replica(token_budget=256), wake_s=3e-3)
  together = arrivals.Workload(np.zeros(6), prompts, outputs, {})
  plain = simulator.simulate(together, _replica(token_budget=256), scheduler)
  once = simulator.simulate(together, woken, scheduler)
  expected = np.zeros(len(plain.step_s))
  expected[0] = 3e-3
  np.testing.assert_allclose(once.step_s - plain.step_s, expected, atol=1e-12)
  assert once.wakes == 1 and plain.wakes == 0
  apart = arrivals.Workload(100.0 * np.arange(6), prompts, outputs, {})
  plain = simulator.simulate(apart, _replica(token_budget=256), scheduler)
  each = simulator.simulate(apart, woken, scheduler)
  assert each.wakes == 6
  np.testing.assert_allclose(
      (each.first_token_s - each.arrival_s) - (plain.first_token_s - plain.arrival_s), 3e-3,
      rtol=1e-9)
  np.testing.assert_allclose(each.itl_s, plain.itl_s, rtol=1e-12)
