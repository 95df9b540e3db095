"""The symbolic model: closed forms, solved quantities and the lesson's numbers.

Expected values are the lesson's printed figures or closed forms written out
here independently; nothing is copied from the code's output.
"""

import pytest
import sympy as sp

from jaxroof.symbolic import formulas
from jaxroof.symbolic import solved
from jaxroof.symbolic.symbols import B, BW, F, H_kv, L, N, N_act, P, R, T, b, d, g, k, q

GB = 1e9


def _equal(a, b_):
  return sp.simplify(a - b_) == 0


def test_closed_forms_match_the_lesson():
  assert _equal(formulas.weight_traffic(), N * q)
  assert _equal(formulas.linear_flops(), 2 * N * B)
  assert _equal(formulas.weight_only_intensity(), 2 * B / q)
  assert _equal(formulas.ridge_point(), F / BW)
  assert _equal(formulas.kv_bytes_per_position(), 2 * L * H_kv * d * b)
  assert _equal(formulas.positions_with_kv(), P + g - 1)
  assert _equal(formulas.retained_kv_bytes(), B * T * k)
  assert _equal(formulas.step_traffic(), N * q + B * T * k)
  assert _equal(formulas.memory_time(), (N * q + B * T * k) / BW)
  assert _equal(formulas.compute_time(), 2 * N * B / F)


def test_solved_quantities_equal_their_closed_forms():
  assert _equal(solved.ridge_batch(), R * q / 2)
  assert _equal(solved.weight_kv_crossover_batch(), N * q / (T * k))
  assert _equal(solved.memory_limit_rate(), BW / (T * k))
  assert _equal(solved.compute_crossover_batch(), N * q * F / (2 * N_act * BW - T * k * F))
  dense = solved.compute_crossover_batch(N=N)  # N given alone: N_act = N.
  assert _equal(dense, N * q * F / (2 * N * BW - T * k * F))


def test_solved_crossovers_satisfy_their_defining_equations():
  crossover = solved.weight_kv_crossover_batch()
  kv = formulas.retained_kv_bytes(B=crossover)
  assert _equal(kv, formulas.weight_traffic())
  at = solved.compute_crossover_batch()
  assert _equal(formulas.memory_time(formulas.step_traffic(B=at)),
                formulas.compute_time(B=at, N=N_act))


def test_compute_crossover_reduces_to_ridge_batch_without_kv():
  no_kv = sp.limit(solved.compute_crossover_batch(N=N), k, 0)
  assert _equal(no_kv, solved.ridge_batch().subs(R, F / BW))


def test_unequal_contexts_sum_and_reduce_to_equal_case():
  T1, T2, T3 = sp.symbols("T1 T2 T3", positive=True)
  assert _equal(formulas.retained_kv_bytes_unequal([T1, T2, T3]), k * (T1 + T2 + T3))
  assert _equal(formulas.retained_kv_bytes_unequal([T] * 3), formulas.retained_kv_bytes(3, T, k))


def test_numbers_give_numbers():
  assert float(formulas.weight_traffic(8e9, 2)) == 16 * GB
  assert float(solved.weight_kv_crossover_batch(N=8e9, q=2, T=1, k=0.25 * GB)) == pytest.approx(64)


def test_unknown_symbol_name_is_rejected():
  with pytest.raises(TypeError, match="unknown symbol"):
    solved.ridge_batch(Q=3)


# The lesson, number by number (seed/weight-reuse-lesson.txt).
TOY = dict(L=2, H_kv=2, d=2, b=2)


def _step(batch, kv_per_seq=0.25 * GB, flops=None):
  t = formulas.step_floor(B=batch, N=8e9, q=2, T=1, k=kv_per_seq, BW=2e12, N_act=8e9,
                          F=sp.oo if flops is None else flops)
  return float(t)


def test_toy_kv_bytes():
  assert formulas.kv_bytes_per_position(**TOY) == 32
  doubled = formulas.kv_bytes_per_position(**dict(TOY, L=4))
  assert doubled == 64
  # After prefill and two decode steps (three outputs, the last without K/V).
  assert doubled * formulas.positions_with_kv(3, 3) == 320


def test_five_positions_after_three_outputs():
  assert formulas.positions_with_kv(3, 3) == 5


def test_weight_only_intensity_is_batch_in_bf16():
  assert _equal(formulas.weight_only_intensity(q=2), B)
  assert formulas.weight_only_intensity(1, 2) == 1
  assert solved.ridge_batch(R=300, q=2) == 300


def test_lesson_step_times_and_rates():
  assert float(formulas.weight_traffic(8e9, 2)) / GB == pytest.approx(16)
  assert _step(1) == pytest.approx(8.125e-3)
  assert 1 / _step(1) == pytest.approx(123, abs=0.5)
  assert _step(8) == pytest.approx(9e-3)
  assert 1 / _step(8) == pytest.approx(111, abs=0.5)
  assert formulas.step_traffic(32, 8e9, 2, 1, 0.25 * GB) / GB == pytest.approx(24)
  assert _step(32) == pytest.approx(12e-3)
  assert 32 / _step(32) == pytest.approx(2667, abs=0.5)
  assert 1 / _step(32) == pytest.approx(83, abs=0.5)
  assert float(solved.memory_limit_rate(BW=2e12, T=1, k=0.25 * GB)) == pytest.approx(8000)


def test_lesson_with_half_a_gigabyte_per_sequence():
  assert formulas.step_traffic(32, 8e9, 2, 1, 0.5 * GB) / GB == pytest.approx(32)
  assert _step(32, 0.5 * GB) == pytest.approx(16e-3)
  assert 32 / _step(32, 0.5 * GB) == pytest.approx(2000)
  assert float(solved.weight_kv_crossover_batch(N=8e9, q=2, T=1, k=0.5 * GB)) == pytest.approx(32)
  # Faster arithmetic alone does not move a memory-bound step.
  assert _step(32, 0.5 * GB, 6e14) == _step(32, 0.5 * GB, 1.2e15)


def test_throughput_plateaus_while_memory_binds():
  memory = [
      float(formulas.memory_time(formulas.step_traffic(b_, 8e9, 2, 1, 0.25 * GB), 2e12))
      for b_ in (1024, 2048, 4096)
  ]
  compute = [float(formulas.compute_time(b_, 8e9, 6e14)) for b_ in (1024, 2048, 4096)]
  assert all(m > c for m, c in zip(memory, compute))
  rates = [b_ / m for b_, m in zip((1024, 2048, 4096), memory)]
  assert rates[2] / rates[1] < 1.05 and rates[2] < 8000


def test_max_batch_for_token_gap():
  from jaxroof.symbolic.symbols import t_gap
  expected = sp.Min((t_gap * BW - N * q) / (T * k), t_gap * F / (2 * N_act))
  assert _equal(solved.max_batch_for_token_gap(), expected)
  # The lesson: a 12 ms token gap admits batch 32 (and its step takes exactly 12 ms).
  batch = float(
      solved.max_batch_for_token_gap(t_gap=0.012, N=8e9, q=2, T=1, k=0.25 * GB, BW=2e12, F=6e14))
  assert batch == pytest.approx(32)
  assert _step(batch) == pytest.approx(0.012)
  assert _step(batch + 1) > 0.012


def test_prefill_and_time_to_first_token():
  from jaxroof.symbolic.symbols import t_queue, t_window
  assert _equal(formulas.prefill_time(), sp.Max(N * q / BW, 2 * N * P / F))
  assert _equal(formulas.time_to_first_token(),
                t_queue + t_window + sp.Max(N * q / BW, 2 * N * P / F))
  # A 1000-token prompt of the 8B model at 600 TFLOP/s is compute-bound: 26.7 ms.
  prefill = float(formulas.prefill_time(1000, 8e9, 2, 2e12, 6e14))
  assert prefill == pytest.approx(2 * 8e9 * 1000 / 6e14)
