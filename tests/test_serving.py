"""Whole requests, queueing, the decision and elasticities (library level)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from jaxroof import errors
from jaxroof.serving import decision
from jaxroof.serving import elasticity
from jaxroof.serving import pools
from jaxroof.serving import queueing
from jaxroof.serving import raw_inputs
from jaxroof.serving import requests
from jaxroof.symbolic.step_model import StepModel

# The lesson (seed/weight-reuse-lesson.txt): an 8e9-weight BF16 model, 2 TB/s,
# 0.25 GB of K/V reads per sequence.
LESSON = requests.ServingInputs(N=8e9, N_act=8e9, q=2, k=0.0, BW=2e12, F=None,
                                kv_per_sequence_bytes=0.25e9)
BOUND = StepModel.bound("fused")  # The lesson's model: one roofline over the step.


def _lesson_batch_for(gap_s: float) -> int:
  """The lesson's arithmetic, independently: traffic 16 GB + B*0.25 GB at 2 TB/s."""
  return int(max(b for b in range(1, 1000) if (16e9 + b * 0.25e9) / 2e12 <= gap_s + 1e-15))


@pytest.mark.parametrize("gap_ms,expected", [(12, 32), (9, 8)])
def test_lesson_decision(gap_ms, expected):
  """The lesson: "a 12 ms token gap ... batch 32"; check yourself 1: batch 8 at 9 ms. That
  is the largest batch whose unloaded step meets the gap; the number to run is the one
  with the largest max rate, at or below it (prompts stretch the gap under load)."""
  assert _lesson_batch_for(gap_ms / 1e3) == expected
  d = decision.decide(BOUND, LESSON, prompt_tokens=100, output_tokens=16, token_gap_s=gap_ms / 1e3)
  assert d["status"] == "ok"
  assert d["token_gap_limit_batch"] == expected
  B = d["max_running"]
  assert B == d["batch"] and 1 <= B <= expected
  step = (16e9 + B * 0.25e9) / 2e12  # The lesson's arithmetic at the chosen number.
  assert d["step_s"] == pytest.approx(step)
  assert d["aggregate_tokens_per_s"] == pytest.approx(B / step)
  assert d["per_sequence_tokens_per_s"] == pytest.approx(1 / step)
  # No TTFT target: the max rate is where the chosen slots fill, below the rate the
  # unloaded limit's slots would turn over at the target gap.
  assert d["binds"] == "slots"
  assert d["max_arrival_rate_per_s"] == pytest.approx(d["slot_capacity_per_s"], rel=1e-3)
  assert d["max_arrival_rate_per_s"] <= expected / (15 * gap_ms / 1e3)
  assert d["elasticities"]["F"] == 0.0  # Memory binds: faster arithmetic does not help.


def test_decision_with_memory_binding_and_compute_binding():
  small = requests.ServingInputs(**{**LESSON.__dict__, "max_batch_in_memory": 20})
  d = decision.decide(BOUND, small, prompt_tokens=100, output_tokens=16, token_gap_s=0.012)
  assert (d["batch"], d["binds"]) == (20, "memory")
  # Tiny K/V and a slow FLOP rate: the step is compute-bound at the chosen number.
  compute = requests.ServingInputs(N=8e9, N_act=8e9, q=2, k=0.0, BW=2e12, F=2e13,
                                   kv_per_sequence_bytes=1e6)
  d = decision.decide(BOUND, compute, prompt_tokens=4, output_tokens=16, token_gap_s=0.05)
  assert d["token_gap_limit_batch"] == int(0.05 * 2e13 / (2 * 8e9))  # 2*N*B/F <= gap.
  assert d["batch"] <= d["token_gap_limit_batch"] and d["compute_bound"]
  assert d["elasticities"]["F"] == pytest.approx(-1.0)
  assert d["elasticities"]["BW"] == 0.0


def _step_by_step(inputs, batch, prompt, outputs):
  """Independent: each step's floor at context P + j, in plain Python."""
  total = 0.0
  for j in range(1, outputs):
    memory = (inputs.N * inputs.q + batch * inputs.k * (prompt + j)) / inputs.BW
    compute = 2 * inputs.N_act * batch / inputs.F
    total += max(memory, compute)
  return total


@pytest.mark.parametrize("flops", [6e14, 2e14, 3e13, 1e12])
def test_closed_form_request_time_equals_step_by_step_sum(flops):
  """Memory-bound, compute-bound, and a switch from compute to memory mid-request."""
  inputs = requests.ServingInputs(N=8e9, N_act=8e9, q=2, k=131072.0, BW=2e12, F=flops)
  batches = np.array([1.0, 16, 64, 256, 1024])
  closed = requests.decode_time(BOUND, inputs, batches, 1000, 300)
  for b, value in zip(batches, closed):
    assert value == pytest.approx(_step_by_step(inputs, b, 1000, 300), rel=1e-12)
  if flops == 2e14:  # Batch 1024 switches from compute- to memory-bound mid-request.
    compute = 2 * 8e9 * 1024 / flops
    assert (16e9 + 1024 * 131072 * 1001) / 2e12 < compute < (16e9 + 1024 * 131072 * 1299) / 2e12


def test_request_rows_are_consistent():
  inputs = requests.ServingInputs(N=8e9, N_act=8e9, q=2, k=131072.0, BW=2e12, F=6e14,
                                  pair_flops=4 * 32 * 32 * 128)
  rows = requests.rows(BOUND, inputs, [1, 8], prompt_tokens=512, output_tokens=64, arrival_rate=0.0,
                       window_s=0.01)
  for row in rows:
    assert row["e2e_s"] == pytest.approx(row["ttft_s"] + 63 * row["mean_token_gap_s"])
    assert row["static_batch_tokens_per_s"] == pytest.approx(row["batch"] * 64 /
                                                             (row["prefill_s"] + row["decode_s"]))
    # One definition per field: the continuous-batching aggregate is B x per-sequence.
    assert row["aggregate_tokens_per_s"] == pytest.approx(row["batch"] *
                                                          row["per_sequence_tokens_per_s"])
  # Zero load: TTFT is the window plus one prompt's prefill.
  single = requests.rows(BOUND, inputs, [1], prompt_tokens=512, output_tokens=64)[0]["prefill_s"]
  assert rows[0]["ttft_s"] == pytest.approx(0.01 + single)


def test_queue_at_zero_load_gives_the_service_time():
  result = queueing.ttft(0.0, 0.05, 0.0)
  assert result.stable and result.wait_s == 0 and result.ttft_s == pytest.approx(0.05)


def test_queue_diverges_towards_capacity_and_is_unstable_past_it():
  service = 0.05
  waits = [queueing.ttft(rate, service).wait_s for rate in (19.0, 19.9, 19.99, 19.999)]
  assert all(b > 5 * a for a, b in zip(waits[1:], waits[2:]))
  assert waits[-1] > 100
  for rate in (20.0, 25.0):
    result = queueing.ttft(rate, service)
    assert not result.stable and result.ttft_s is None and result.status == "unstable"


def test_max_arrival_rate_meets_the_target_exactly():
  service, window, target = 0.04, 0.01, 0.2
  rate = queueing.max_arrival_rate(target, service, window)
  assert 0 < rate < 1 / service
  assert queueing.ttft(rate, service, window).ttft_s == pytest.approx(target)
  assert queueing.ttft(rate * 1.01, service, window).ttft_s > target
  assert queueing.max_arrival_rate(0.04, service, window) == 0.0  # Missed even when idle.


def test_unstable_load_is_an_explicit_result_without_nan():
  d = decision.decide(BOUND, LESSON, prompt_tokens=100, output_tokens=16, token_gap_s=0.012,
                      arrival_rate=1e4)
  assert d["status"] == "unstable" and d["ttft_s"] is None and d["loaded_token_gap_s"] is None
  assert 1e4 > d["slot_capacity_per_s"] >= d["max_arrival_rate_per_s"] > 0
  rows = requests.rows(BOUND, LESSON, [1, 32], prompt_tokens=100, output_tokens=16,
                       arrival_rate=1e4)
  assert all(r["status"] == "unstable" and r["ttft_s"] is None for r in rows)
  for value in list(d.values()) + [v for r in rows for v in r.values()]:
    assert not (isinstance(value, float) and math.isnan(value))


def test_infeasible_targets_say_why():
  d = decision.decide(BOUND, LESSON, prompt_tokens=100, output_tokens=16, token_gap_s=0.008)
  assert d["status"] == "infeasible" and d["binds"] == "token_gap" and d["batch"] is None
  d = decision.decide(BOUND, LESSON, prompt_tokens=100, output_tokens=16, token_gap_s=0.012,
                      ttft_s=0.001)
  assert d["status"] == "infeasible" and d["binds"] == "ttft"


@pytest.mark.parametrize("kwargs,name", [
    ({"token_gap_s": 0.0}, "token_gap"),
    ({"token_gap_s": -1.0}, "token_gap"),
    ({"token_gap_s": 0.01, "ttft_s": 0.0}, "ttft"),
    ({"token_gap_s": 0.01, "prompt_tokens": 0}, "prompt_tokens"),
    ({"token_gap_s": 0.01, "output_tokens": 1}, "output_tokens"),
    ({"token_gap_s": 0.01, "arrival_rate": -1.0}, "arrival_rate"),
])
def test_bad_input_is_one_line_naming_the_parameter(kwargs, name):
  call = {"prompt_tokens": 100, "output_tokens": 16, **kwargs}
  with pytest.raises(errors.InputError, match=name) as info:
    decision.decide(BOUND, LESSON, **call)
  assert "\n" not in str(info.value)


def test_lengths_beyond_the_models_context_are_refused():
  from jaxroof.specs.accelerators import load_accelerator
  from jaxroof.specs.models import load_model

  with pytest.raises(errors.InputError, match="max_position_embeddings = 4096"):
    requests.model_inputs(load_model("llama-2-7b"), load_accelerator("a100-40gb"),
                          prompt_tokens=4000, output_tokens=128)


def _finite_difference(evaluate, name, point, h=1e-6):

  def log_step(scale):
    values = {**point, name: point[name] * scale}
    return math.log(float(evaluate(**values)["step_s"]))

  return (log_step(1 + h) - log_step(1 - h)) / (math.log(1 + h) - math.log(1 - h))


CALIBRATED = StepModel.calibrated(
    {"eta_w": 0.8, "eta_kv": 0.6, "eta_f": 0.5, "t0_step": 2e-4, "t0_layer": 1e-5, "r_ovl": 3.0})


@pytest.mark.parametrize("model", [BOUND, CALIBRATED], ids=["bound", "calibrated"])
@pytest.mark.parametrize("batch", [1, 48, 700])
def test_elasticities_match_finite_differences(model, batch):
  point = dict(B=float(batch), T=1024.0, N=8e9, q=2.0, k=131072.0, BW=2e12, F=3e14)
  got = elasticity.row_elasticities(model, [batch], **{n: v for n, v in point.items() if n != "B"},
                                    L=32)[0]
  for name in elasticity.INPUT_NAMES:
    fd = _finite_difference(lambda **v: model.evaluate(**v, L=32), name, point)
    assert got[name] == pytest.approx(fd, abs=1e-5), name


def test_f_elasticity_is_exactly_zero_where_memory_binds():
  """The lesson's 0.5 GB case: memory binds at every batch, so faster arithmetic does nothing."""
  rows = elasticity.row_elasticities(BOUND, [1, 8, 32, 64, 4096], N=8e9, q=2, T=1, k=0.5e9, BW=2e12,
                                     F=6e14)
  assert all(r["F"] == 0.0 and r["BW"] == pytest.approx(-1.0) for r in rows)
  # The weight and K/V shares add up to the whole step.
  assert all(r["N"] + r["k"] == pytest.approx(1.0) for r in rows)
  assert rows[2]["k"] == pytest.approx(0.5)  # Batch 32: K/V equals the weights.


def test_decision_with_a_calibrated_model():
  d = decision.decide(CALIBRATED, LESSON, prompt_tokens=100, output_tokens=16, token_gap_s=0.03)
  assert d["status"] == "ok" and 1 <= d["batch"] <= d["token_gap_limit_batch"]
  limit = d["token_gap_limit_batch"]
  step = CALIBRATED.evaluate(B=float(limit), T=1.0, N=8e9, q=2, k=0.25e9, BW=2e12,
                             F=math.inf)["step_s"]
  over = CALIBRATED.evaluate(B=float(limit + 1), T=1.0, N=8e9, q=2, k=0.25e9, BW=2e12,
                             F=math.inf)["step_s"]
  assert float(step) <= 0.03 < float(over)
  chosen = CALIBRATED.evaluate(B=float(d["batch"]), T=1.0, N=8e9, q=2, k=0.25e9, BW=2e12,
                               F=math.inf)["step_s"]
  assert d["step_s"] == pytest.approx(float(chosen))


def test_pools_count_chips_for_both_layouts():
  inputs = requests.ServingInputs(N=8e9, N_act=8e9, q=2, k=131072.0, BW=3.35e12, F=9.89e14,
                                  pair_flops=4 * 32 * 32 * 128, max_batch_in_memory=300)
  out = pools.compare(BOUND, inputs, prompt_tokens=2048, output_tokens=256, arrival_rate=30.0,
                      ttft_s=0.5, token_gap_s=0.02)
  split, shared = out["split"], out["shared"]
  assert split["feasible"] and shared["feasible"]
  assert split["goodput_per_chip"] == pytest.approx(30.0 / split["chips"])
  # The shared pool's chips carry the rate: one fewer would not.
  fewer = decision.decide(BOUND, inputs, prompt_tokens=2048, output_tokens=256,
                          token_gap_s=0.02, ttft_s=0.5, arrival_rate=30.0 / (shared["chips"] - 1)) \
      if shared["chips"] > 1 else {"status": "n/a"}
  assert fewer["status"] != "ok"
  cross = pools.crossovers(BOUND, inputs, prompt_tokens=2048, output_tokens=256)
  assert cross["prefill_tokens_per_step_linear"] == pytest.approx(9.89e14 / 3.35e12 * 2 / 2)


def test_batched_prefill_queues_batches():
  """Batches of b prompts arrive at lam/b: b = 1 is the one-prompt server, and the
  capacity is b/D."""
  one = queueing.ttft(10.0, 0.05, 0.0, batch=1)
  assert one.utilisation == pytest.approx(0.5)
  four = queueing.ttft(10.0, 0.12, 0.0, batch=4)  # 4 prompts in 0.12 s: 0.03 s each.
  assert four.utilisation == pytest.approx(10.0 / 4 * 0.12)
  assert four.wait_s == pytest.approx(queueing.ttft(2.5, 0.12).wait_s)
  assert queueing.capacity(0.12, 4) == pytest.approx(4 / 0.12)
  rate = queueing.max_arrival_rate(0.5, 0.12, 0.0, batch=4)
  assert queueing.ttft(rate, 0.12, 0.0, batch=4).ttft_s == pytest.approx(0.5)


def test_batched_prefill_ttft_includes_the_time_to_gather_the_batch():
  """8 prompts at 1 request/s: the batch takes (8 - 1)/(2 x 1) = 3.5 s to gather on average."""
  from jaxroof.serving import queueing

  alone = queueing.ttft(1.0, 0.05, 0.0, 1)
  batched = queueing.ttft(1.0, 0.05, 0.0, 8)
  assert batched.gather_s == pytest.approx(3.5)
  assert batched.ttft_s == pytest.approx(3.5 + batched.wait_s + 0.05)
  assert alone.gather_s == 0.0 and alone.ttft_s < 0.06


def test_prefill_crossovers_are_the_closed_forms():
  """Linear only: `P = R*q/2`; attention overtakes the linear FLOPs at `4*N_act/A_f - 1`."""
  pair = 4 * 32 * 32 * 128
  inputs = requests.ServingInputs(N=8e9, N_act=7e9, q=2, k=131072.0, BW=3.35e12, F=9.89e14,
                                  pair_flops=pair)
  cross = pools.crossovers(BOUND, inputs, prompt_tokens=2048, output_tokens=256)
  assert cross["prefill_tokens_per_step_linear"] == pytest.approx(9.89e14 / 3.35e12)
  assert cross["attention_overtakes_linear_at_prompt"] == pytest.approx(4 * 7e9 / pair - 1)
  # With attention: the weights and the prompt's K/V written take as long as the linear and
  # causal attention FLOPs (P*(P+1)/2 pairs).
  p = cross["prefill_tokens_per_step_with_attention"]
  memory_s = (8e9 * 2 + p * 131072.0) / 3.35e12
  compute_s = (2 * 7e9 * p + pair * p * (p + 1) / 2) / 9.89e14
  assert memory_s == pytest.approx(compute_s, rel=1e-9)


def test_mean_context_is_the_mean_over_the_decode_steps():
  """Step j attends P + j for j = 1 .. G - 1: the mean of those contexts."""
  import sympy as sp

  from jaxroof.symbolic import request_formulas
  from jaxroof.symbolic.symbols import P, j, n_out

  mean = sp.summation(P + j, (j, 1, n_out - 1)) / (n_out - 1)
  assert sp.simplify(mean - request_formulas.mean_context()) == 0
  grows = requests.ServingInputs(N=1, N_act=1, q=1, k=1, BW=1, F=None)
  assert decision.mean_context(grows, 1000, 64) == np.mean(1000 + np.arange(1, 64))
  assert decision.mean_context(LESSON, 1000, 64) == 1.0  # Fixed K/V per sequence.


def test_raw_inputs_fit_the_lesson_in_memory():
  """80 GB with 10% kept free, 16 GB of weights: 56 GB of K/V, 0.25 GB per sequence."""
  raw = dict(weight_bytes=16e9, bytes_per_weight=2, bandwidth_bytes_per_s=2e12, flops_per_s=None)
  fixed = raw_inputs.serving_inputs(**raw, kv_per_sequence_bytes=0.25e9, memory_capacity_bytes=80e9,
                                    prompt_tokens=1000, output_tokens=24)
  assert fixed.N == fixed.N_act == 8e9 and not fixed.grows
  assert fixed.max_batch_in_memory == 224
  assert fixed.memory["usable_memory_bytes"] == pytest.approx(56e9)
  lesson = raw_inputs.serving_inputs(**raw, memory_capacity_bytes=80e9, prompt_tokens=1000,
                                     output_tokens=24)  # Neither K/V figure: the lesson's.
  assert lesson.kv_per_sequence_bytes == 0.25e9 and lesson.max_batch_in_memory == 224
  per_token = raw_inputs.serving_inputs(**raw, kv_bytes_per_token=131072.0,
                                        memory_capacity_bytes=80e9, prompt_tokens=1000,
                                        output_tokens=24)
  assert per_token.grows and per_token.max_batch_in_memory == int(56e9 // (131072.0 * 1024))
  unknown = raw_inputs.serving_inputs(**raw, kv_bytes_per_token=1.0, prompt_tokens=1,
                                      output_tokens=1)
  assert unknown.max_batch_in_memory is None
  with pytest.raises(errors.InputError, match="not both") as caught:
    raw_inputs.serving_inputs(**raw, kv_bytes_per_token=1.0, kv_per_sequence_bytes=1.0,
                              prompt_tokens=1, output_tokens=1)
  assert caught.value.field == "kv_per_sequence_bytes"


def test_run_metrics_reads_a_run_and_counts_the_masked_requests():
  """Three requests, the last unfinished: TTFTs 0.5 and 1.0 s; the mask keeps the first."""
  from types import SimpleNamespace

  from jaxroof.serving import metrics

  run = SimpleNamespace(arrival_s=np.array([0.0, 1.0,
                                            2.0]), first_token_s=np.array([0.5, 2.0, np.inf]),
                        finish_s=np.array([1.5, 3.0, np.inf]), output_tokens=np.array([3, 2, 4]),
                        itl_s=np.array([0.5, 0.5, 1.0]))
  m = metrics.run_metrics(run, ttft_target_s=0.75)
  assert m["completed"] == 2 and m["ttft_s"]["mean"] == pytest.approx(0.75)
  assert m["goodput_per_s"] == pytest.approx(1 / 3.0)  # One meets 0.75 s over 3 s.
  first = metrics.run_metrics(run, requests=np.array([True, False, False]))
  assert first["completed"] == 1 and first["ttft_s"]["mean"] == pytest.approx(0.5)
  assert first["itl_s"]["mean"] == pytest.approx(2 / 3)  # The run's gaps, whole.
