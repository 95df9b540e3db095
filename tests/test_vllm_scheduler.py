"""vLLM V1's scheduler in the simulator (`--scheduler=vllm`, issue 25)."""

from __future__ import annotations

import numpy as np
import pytest

from jaxroof.serving import arrivals, replica, simulator, vllm_scheduler
from jaxroof.symbolic.step_model import StepModel

MODEL = dict(N=1e9, q=2.0, k=1e5, BW=1e12, F=1e14, L=16, H=16, d=64)
PAGE = 16


def _replica(pages=4000, **kw):
  return replica.from_numbers(**MODEL, kv_memory_bytes=pages * PAGE * MODEL["k"],
                              page_bytes=PAGE * MODEL["k"], page_tokens=PAGE,
                              step_model=StepModel.bound(), **kw)


def _workload(n=200, rate=500.0, seed=0, prompt=200, output=50, spread=0.6):
  return arrivals.synthetic(arrival="poisson", num_requests=n, arrival_rate=rate, seed=seed,
                            prompt_tokens=prompt, output_tokens=output,
                            prompt_distribution="lognormal", output_distribution="lognormal",
                            prompt_spread=spread, output_spread=spread)


class _Recorder:
  """Wraps `plan` to keep every step's plan and the state it saw."""

  def __init__(self, monkeypatch):
    self.steps = []
    original = vllm_scheduler.plan

    def recording(sim):
      waiting_before = list(sim.waiting)
      dec, chunks = original(sim)
      self.steps.append({
          "dec": dec.tolist(), "chunks": list(chunks), "waiting_before": waiting_before,
          "running": list(sim.running), "free": sim.free, "preemptions": sim.preemptions
      })
      return dec, chunks

    monkeypatch.setattr(vllm_scheduler, "plan", recording)


def test_one_request_alone_matches_chunked():
  w = arrivals.Workload(np.array([0.5]), np.array([300]), np.array([7]), {})
  r = _replica(token_budget=128)
  vllm = simulator.simulate(w, r, "vllm")
  chunked = simulator.simulate(w, r, "chunked")
  np.testing.assert_allclose(vllm.first_token_s, chunked.first_token_s, rtol=1e-12)
  np.testing.assert_allclose(vllm.finish_s, chunked.finish_s, rtol=1e-12)
  assert vllm.iterations == 3 + 6  # Three prefill chunks (128, 128, 44), six decodes.


def test_budget_seqs_and_blocks_hold_in_every_step(monkeypatch):
  rec = _Recorder(monkeypatch)
  w = _workload()
  r = _replica(pages=150, max_running=24, token_budget=256)
  run = simulator.simulate(w, r, "vllm")
  assert run.preemptions > 0  # The test needs memory pressure.
  for step in rec.steps:
    tokens = len(step["dec"]) + sum(c for _, _, c in step["chunks"])
    assert tokens <= 256
    assert len(step["running"]) <= 24
    assert step["free"] >= 0
  np.testing.assert_array_equal(run.emitted, w.output_tokens)
  assert len(run.itl_s) == int(np.sum(w.output_tokens - 1))
  assert run.pages_in_use.max() <= r.total_pages


def test_no_admission_in_a_step_that_preempted(monkeypatch):
  rec = _Recorder(monkeypatch)
  simulator.simulate(_workload(), _replica(pages=150, max_running=24, token_budget=256), "vllm")
  before = 0
  saw = False
  for step in rec.steps:
    if step["preemptions"] > before:
      saw = True
      admitted = [i for i, o, c in step["chunks"] if o == 0 and i in step["waiting_before"]]
      assert not admitted, "a waiting request was admitted in a step that preempted"
    before = step["preemptions"]
  assert saw


def test_blocks_follow_the_scheduled_chunk_not_the_whole_prompt(monkeypatch):
  # A 1,000-token prompt in 16-token blocks with a 128-token budget: the first
  # step holds 8 blocks (128 tokens), not 63 (the whole prompt).
  w = arrivals.Workload(np.array([0.0]), np.array([1000]), np.array([2]), {})
  rec = _Recorder(monkeypatch)
  r = _replica(pages=100, token_budget=128)
  simulator.simulate(w, r, "vllm")
  assert rec.steps[0]["chunks"] == [(0, 0, 128)]
  assert rec.steps[0]["free"] == 100 - 8


def test_preemption_takes_the_last_running_and_requeues_it_first(monkeypatch):
  # Two requests of 40 + 40 tokens in 5 blocks of 16: both admitted (3 blocks each
  # would need 6), so the later one is preempted when the earlier one grows.
  w = arrivals.Workload(np.array([0.0, 0.0]), np.array([30, 30]), np.array([40, 40]), {})
  rec = _Recorder(monkeypatch)
  run = simulator.simulate(w, _replica(pages=5, token_budget=512), "vllm")
  first = next(s for s in rec.steps if s["preemptions"])
  assert first["running"] == [0] and first["dec"] == [0]
  assert run.preemptions >= 1 and run.finish_s[1] > run.finish_s[0]
  assert run.prefill_tokens > 60  # Request 1's prompt and emitted tokens recomputed.
  np.testing.assert_array_equal(run.emitted, [40, 40])


def test_without_chunked_prefill_a_prompt_over_the_budget_waits(monkeypatch):
  w = arrivals.Workload(np.array([0.0, 0.0]), np.array([100, 100]), np.array([3, 3]), {})
  r = _replica(token_budget=150)
  r = type(r)(**{**r.__dict__, "description": {**r.description, "chunked_prefill": False}})
  rec = _Recorder(monkeypatch)
  simulator.simulate(w, r, "vllm")
  assert rec.steps[0]["chunks"] == [(0, 0, 100)]  # The second does not fit the 50 left.


@pytest.mark.parametrize("seed", [0, 1])
def test_deterministic(seed):
  w = _workload(seed=seed)
  r = _replica(pages=150, max_running=24, token_budget=256)
  a, b = simulator.simulate(w, r, "vllm"), simulator.simulate(w, r, "vllm")
  np.testing.assert_array_equal(a.finish_s, b.finish_s)
