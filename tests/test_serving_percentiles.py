"""Percentiles at the serving decision: the simulator at the decision's load."""

from __future__ import annotations

from jaxroof.serving import percentiles, replica
from jaxroof.symbolic.step_model import StepModel

# A 1B-weight model on a 1 TB/s, 100 TFLOP/s device (round numbers, not a product).
MODEL = dict(N=1e9, q=2.0, k=1e5, BW=1e12, F=1e14, L=16, H=16, d=64)


def _replica(max_running=32):
  return replica.from_numbers(**MODEL, kv_memory_bytes=4000 * 16 * MODEL["k"],
                              page_bytes=16 * MODEL["k"], page_tokens=16,
                              step_model=StepModel.bound(), max_running=max_running)


def test_light_load_percentiles_meet_what_the_means_meet():
  """At a light load every request is served alone: TTFT is the prefill, every
  gap one decode step, so a target just above them holds at p99 too."""
  alone = percentiles.simulated_percentiles(_replica(), arrival_rate=0.01, prompt_tokens=200,
                                            output_tokens=20, ttft_s=None, token_gap_s=None,
                                            num_requests=20)
  ttft = alone["metrics"]["ttft_s"]["p99"]
  gap = alone["metrics"]["itl_s"]["p99"]
  checked = percentiles.simulated_percentiles(_replica(), arrival_rate=0.01, prompt_tokens=200,
                                              output_tokens=20, ttft_s=ttft * 1.01,
                                              token_gap_s=gap * 1.01, num_requests=20)
  assert checked["targets"]["ttft"]["p99_meets"] and checked["targets"]["token_gap"]["p99_meets"]
  # The weights alone take 2 ms to read: no gap can be shorter.
  assert alone["metrics"]["itl_s"]["median"] >= 2e-3


def test_heavy_load_tails_exceed_the_median():
  out = percentiles.simulated_percentiles(_replica(max_running=8), arrival_rate=200.0,
                                          prompt_tokens=200, output_tokens=20, ttft_s=0.05,
                                          token_gap_s=0.01, num_requests=300)
  ttft = out["metrics"]["ttft_s"]
  assert ttft["p99"] > ttft["median"]
  assert out["targets"]["ttft"]["p99_meets"] is False
  assert out["kind"] == "simulated"
