"""Lambdified forms agree with sympy's exact evaluation, and move the right way."""

import math

import hypothesis.strategies as st
import jax
import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings

from jaxroof.symbolic import formulas
from jaxroof.symbolic import solved
from jaxroof.symbolic.evaluate import OUTPUT_NAMES, step_model, summary_model

positive = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False)


def _exact(B, T, N, q, k, BW, F):
  """The step model's outputs from sympy, with exact rationals."""
  r = {name: sp.Rational(v) for name, v in dict(B=B, T=T, N=N, q=q, k=k, BW=BW, F=F).items()}
  traffic = formulas.step_traffic(r["B"], r["N"], r["q"], r["T"], r["k"])
  step = formulas.step_floor(r["B"], r["N"], r["q"], r["T"], r["k"], r["BW"], r["F"], r["N"])
  return {
      "traffic_bytes": traffic,
      "memory_s": formulas.memory_time(traffic, r["BW"]),
      "compute_s": formulas.compute_time(r["B"], r["N"], r["F"]),
      "step_s": step,
      "aggregate_tokens_per_s": r["B"] / step,
      "per_sequence_tokens_per_s": 1 / step,
  }


@settings(max_examples=40, deadline=None)
@given(B=positive, T=positive, N=positive, q=positive, k=positive, BW=positive, F=positive)
def test_numpy_matches_exact_sympy(B, T, N, q, k, BW, F):
  ours = step_model("numpy", "fused")(B=B, T=T, N=N, q=q, k=k, BW=BW, F=F)
  for name, value in _exact(B, T, N, q, k, BW, F).items():
    assert float(ours[name]) == pytest.approx(float(value), rel=1e-12)


@settings(max_examples=15, deadline=None)
@given(B=positive, T=positive, N=positive, q=positive, k=positive, BW=positive, F=positive)
def test_jax_matches_exact_sympy(B, T, N, q, k, BW, F):
  with jax.enable_x64(True):
    ours = step_model("jax", "fused")(B=B, T=T, N=N, q=q, k=k, BW=BW, F=F)
    for name, value in _exact(B, T, N, q, k, BW, F).items():
      assert float(ours[name]) == pytest.approx(float(value), rel=1e-9)


def test_jax_form_is_differentiable():
  model = step_model("jax")
  # d(step)/d(BW) at a memory-bound point is -traffic/BW**2.
  grad = jax.grad(lambda bw: model(B=32.0, T=1.0, N=8e9, q=2.0, k=2.5e8, BW=bw, F=6e14)["step_s"])(
      2e12)
  assert float(grad) == pytest.approx(-24e9 / 2e12**2, rel=1e-4)


def test_outputs_are_complete_and_broadcast():
  batch = np.array([1.0, 8.0, 32.0])[:, None]
  context = np.array([128.0, 1024.0])[None, :]
  out = step_model("numpy")(B=batch, T=context, N=8e9, q=2.0, k=131072.0, BW=2e12, F=6e14)
  assert set(out) == set(OUTPUT_NAMES)
  assert np.shape(out["step_s"]) == (3, 2)


def test_monotonic_in_batch_and_bandwidth():
  batch = np.arange(1, 2049, dtype=float)
  out = step_model("numpy", "fused")(B=batch, T=4096.0, N=8e9, q=2.0, k=131072.0, BW=2e12, F=6e14)
  assert np.all(np.diff(out["step_s"]) > 0)
  assert np.all(np.diff(out["aggregate_tokens_per_s"]) > 0)
  assert np.all(np.diff(out["per_sequence_tokens_per_s"]) < 0)
  slow = step_model("numpy")(B=batch, T=4096.0, N=8e9, q=2.0, k=131072.0, BW=1e12, F=6e14)["step_s"]
  assert np.all(slow >= out["step_s"])


def test_memory_only_model_with_infinite_flop_rate():
  out = step_model("numpy")(B=32.0, T=1.0, N=8e9, q=2.0, k=2.5e8, BW=2e12, F=math.inf)
  assert out["compute_s"] == 0 and out["step_s"] == pytest.approx(0.012)


def test_moe_active_weights_only_change_compute():
  dense = step_model("numpy")(B=256.0, T=1.0, N=8e9, q=2.0, k=1e6, BW=2e12, F=1e14)
  moe = step_model("numpy")(B=256.0, T=1.0, N=8e9, q=2.0, k=1e6, BW=2e12, F=1e14, N_act=2e9)
  assert moe["traffic_bytes"] == dense["traffic_bytes"]
  assert moe["compute_s"] == pytest.approx(dense["compute_s"] / 4)


@settings(max_examples=30, deadline=None)
@given(N=positive, q=positive, T=positive, k=positive, BW=positive, F=positive)
def test_summary_model_matches_solved(N, q, T, k, BW, F):
  ours = summary_model("numpy", "fused")(N=N, q=q, T=T, k=k, BW=BW, F=F)
  values = dict(N=N, q=q, T=T, k=k, BW=BW, F=F)
  assert ours["weight_kv_crossover_batch"] == pytest.approx(
      float(solved.weight_kv_crossover_batch(**values)), rel=1e-9)
  assert ours["memory_limit_tokens_per_s"] == pytest.approx(
      float(solved.memory_limit_rate(**values)), rel=1e-9)
  assert ours["compute_crossover_batch"] == pytest.approx(
      float(solved.compute_crossover_batch(**values)), rel=1e-9)


def test_summary_compute_crossover_uses_active_weights():
  # MoE-like: 8e9 weights read, 1e9 multiplied per token. Independent solve of
  # (N*q + B*T*k)/BW = 2*N_act*B/F for B.
  N, q, T, k, BW, F, N_act = 8e9, 2.0, 1.0, 1e6, 2e12, 6e14, 1e9
  expected = (N * q / BW) / (2 * N_act / F - T * k / BW)
  ours = summary_model("numpy", "fused")(N=N, q=q, T=T, k=k, BW=BW, F=F, N_act=N_act)
  assert ours["compute_crossover_batch"] == pytest.approx(expected, rel=1e-9)


def test_unknown_backend_is_rejected():
  with pytest.raises(ValueError, match="backend"):
    step_model("torch")


def test_per_op_decode_is_the_sum_of_the_linear_and_attention_rooflines():
  """Independent: Max(N*q/BW, 2*N_act*B/F) + Max(B*T*k/BW, B*T*A_t/F)."""
  B, T, N, q, k, BW, F, A = 512.0, 8192.0, 8e9, 2.0, 131072.0, 3.35e12, 9.89e14, 524288.0
  ours = step_model("numpy")(B=B, T=T, N=N, q=q, k=k, BW=BW, F=F, A_t=A)
  expected = max(N * q / BW, 2 * N * B / F) + max(B * T * k / BW, B * T * A / F)
  assert float(ours["step_s"]) == pytest.approx(expected, rel=1e-12)
  fused = step_model("numpy", "fused")(B=B, T=T, N=N, q=q, k=k, BW=BW, F=F, A_t=A)
  assert float(fused["step_s"]) <= float(ours["step_s"])  # The fused bound is optimistic.
  assert float(fused["step_s"]) == pytest.approx(
      max((N * q + B * T * k) / BW, (2 * N * B + B * T * A) / F), rel=1e-12)


def test_per_op_summary_compute_crossover_is_the_linear_layers():
  ours = summary_model("numpy")(N=8e9, q=2.0, T=1.0, k=0.25e9, BW=2e12, F=6e14)
  assert ours["compute_crossover_batch"] == pytest.approx(6e14 * 2.0 / (2 * 2e12), rel=1e-12)
