"""The answers computed for the report: the serving study and the scheduler comparison."""

from __future__ import annotations

from jaxroof.serving import arrivals
from jaxroof.serving import decision_study
from jaxroof.serving import scheduler_comparison
from jaxroof.specs.accelerators import load_accelerator
from jaxroof.specs.models import load_model


def test_the_lessons_decisions_are_its_worked_batches():
  # 16 GB of weights + B x 0.25 GB of K/V streamed at 2 TB/s within the gap:
  # B <= (0.012 * 2e12 - 16e9) / 0.25e9 = 32, and (0.009 * 2e12 - 16e9) / 0.25e9 = 8.
  # The number to run is the one with the largest max rate at or below that limit
  # (prompts stretch the gap under load); with no TTFT target the slots bind.
  found = {d["token_gap_s"]: d for d in decision_study.lesson_decisions()}
  assert {gap: d["token_gap_limit_batch"] for gap, d in found.items()} == {0.012: 32, 0.009: 8}
  for d in found.values():
    assert 1 <= d["max_running"] == d["batch"] <= d["token_gap_limit_batch"]
    assert d["binds"] == "slots" and d["status"] == "ok"


def test_the_lessons_elasticities_say_bandwidth_moves_the_step():
  rows = decision_study.lesson_elasticities()
  assert [r["batch"] for r in rows] == list(decision_study.ELASTICITY_BATCHES)
  for r in rows:  # Memory binds at every batch: -1 for bandwidth, 0 for the FLOP rate.
    assert abs(r["elasticities"]["BW"] + 1) < 1e-6 and abs(r["elasticities"]["F"]) < 1e-9
    assert r["moved_by"].startswith("BW")


def test_the_study_frontier_holds_the_decision_and_the_memory_limit():
  study = decision_study.study("llama-3-8b", "h100-sxm", prompt=2048, outputs=256, token_gap_s=0.02,
                               ttft_s=0.5, arrival_rate=5.0)
  batches = list(study["frontier"]["batch"])
  assert study["decision"]["batch"] in batches and study["max_batch_in_memory"] in batches
  assert set(decision_study.BATCHES) <= set(batches)
  assert [r["batch"] for r in study["rows"]] == list(decision_study.BATCHES)
  assert study["pools"]["arrival_rate_per_s"] == decision_study.POOL_ARRIVAL_RATE


def test_every_scheduler_finishes_every_request():
  n = 40
  workload = arrivals.synthetic(arrival="poisson", num_requests=n, arrival_rate=5.0, seed=1,
                                prompt_tokens=200, output_tokens=20)
  runs = scheduler_comparison.compare(load_model("llama-3-8b"), load_accelerator("h100-sxm"),
                                      workload, context=400, batch_window_s=0.05, token_budget=256,
                                      ttft_target_s=0.5, tpot_target_s=0.05)
  assert list(runs) == list(scheduler_comparison.SCHEDULERS)
  for run in runs.values():
    assert run["metrics"]["completed"] == n
    assert len(run["series"]["ttft_s"]) == n and (run["series"]["ttft_s"] > 0).all()
