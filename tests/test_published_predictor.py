"""The published-point predictor: the cost terms it adds, by hand; the one cost model it
drives (the same step `iteration` computes); its drives' properties; the bound never
faster than a measurement; and a fit that recovers known terms from rows the model made."""

import dataclasses
import math

import numpy as np
import pytest
import sympy as sp

from jaxroof.calibrate import published_fit as fit_lib
from jaxroof.calibrate import published_points as points_lib
from jaxroof.calibrate import published_profile as profile_lib
from jaxroof.calibrate import published_referee
from jaxroof.calibrate import published_setups as setups_lib
from jaxroof.engines import engine_profiles as profiles
from jaxroof.engines import published
from jaxroof.specs.accelerators import load_accelerator
from jaxroof.specs.iteration_model import IterationModel
from jaxroof.specs.models import load_model
from jaxroof.symbolic import architecture
from jaxroof.symbolic import reservation
from jaxroof.symbolic import terms
from jaxroof.symbolic.step_model import StepModel

KNOWN = dict(eta_w=0.8, eta_kv=0.6, eta_f=0.55, r_ovl=1.5, t0_step=4e-4, t0_layer=2e-5, t0_seq=5e-6,
             t0_request=8e-3, eta_moe=0.7, m_moe=40.0, eta_comm=0.6)
SIX = ("eta_w", "eta_kv", "eta_f", "t0_step", "t0_layer", "r_ovl")


def _step_model(values):
  return StepModel.calibrated({n: values[n] for n in SIX},
                              terms={n: v for n, v in values.items() if n not in SIX})


def test_the_expert_terms_are_their_closed_forms_by_hand():
  mixtral = IterationModel.on_device(load_model("mixtral-8x7b"), load_accelerator("h100-sxm"),
                                     weight_dtype="bf16")
  mix = mixtral.uniform_mix(decode_rows=64.0, context=512.0)
  plain = dict(KNOWN, eta_moe=1.0, m_moe=0.0)
  base = mixtral.evaluate(mix, _step_model(plain))["compute_s"]
  moe = mixtral.evaluate(mix, _step_model(KNOWN))["compute_s"]
  c = mixtral.constants
  touched = c["E"] * (1 - (1 - c["K"] / c["E"])**64)  # Uniform routing, 64 tokens.
  by_hand = 2 * (c["N_xb"] * 64 * (1 / 0.7 - 1) + c["N_xb"] / c["K"] * touched * 40 / 0.7)
  assert float(moe - base) == pytest.approx(by_hand / (0.55 * c["F"]), rel=1e-9)
  dense = IterationModel.on_device(load_model("llama-3-8b"), load_accelerator("h100-sxm"))
  dmix = dense.uniform_mix(decode_rows=64.0, context=512.0)
  assert dense.constants["N_xb"] == 0  # A dense model: the expert terms change nothing.
  assert dense.evaluate(dmix, _step_model(KNOWN))["step_s"] == pytest.approx(
      dense.evaluate(dmix, _step_model(plain))["step_s"], rel=1e-12)


def test_eta_comm_divides_the_collectives_and_nothing_else():
  from jaxroof.symbolic import cost_model
  t = cost_model.calibrated_terms()
  assert sp.simplify(t["comm_s"] - sp.Symbol("t_comm", positive=True) / terms.eta_comm) == 0
  assert terms.eta_comm not in sp.sympify(t["floor_s"]).free_symbols


def test_the_reservation_is_each_engines_rule():
  C, W, D, n = sp.symbols("C W_res D n_bud", positive=True)
  kv = reservation.kv_memory()
  held = W + terms.m_act * n * D + terms.m_graph
  vllm = kv.subs(terms.x_free, 0)  # gpu_memory_utilization x C less what it holds.
  trt = kv.subs(terms.x_free, 1)  # A fraction of what the weights and workspace leave.
  assert sp.simplify(vllm - (terms.u_mem * C - held)) == 0
  assert sp.simplify(trt - terms.u_mem * (C - held)) == 0


def _points(*ids):
  by_id = {p.point_id: p for p in published.read_points()}
  return [by_id[i] for i in ids]


def test_a_points_step_is_what_the_cost_model_gives_the_user_for_that_iteration():
  [point] = _points("trtllm-0.9.0-dli/013")  # llama-2-70b fp8 on 2 x H100, batch 16.
  assert points_lib.mode_of(point) == "step"
  stacked = setups_lib.stack([point])
  entry = profiles.entry("trtllm", point.accelerator)
  values = {**fit_lib.terms_per_point(stacked, lambda i: entry.terms), **fit_lib.held(stacked)}
  predicted = points_lib.predict(stacked, values)["value"][0]
  cost = setups_lib.setup_of(point).cost  # The replica `iteration` builds.
  mix = cost.uniform_mix(decode_rows=16.0, context=point.prompt_tokens + point.output_tokens / 2)
  assert predicted == pytest.approx(float(cost.evaluate(mix, profiles.step_model(entry))["step_s"]),
                                    rel=1e-9)


def test_one_request_alone_is_its_prefill_and_its_steps():
  [point] = _points("gptfast-readme/002")
  stacked = setups_lib.stack([point])
  values = {**fit_lib.terms_per_point(stacked, lambda i: KNOWN), **fit_lib.held(stacked)}
  out = points_lib.predict(stacked, values)
  g = point.output_tokens
  prefill = setups_lib.iteration(stacked, values, 0.0, 1.0)["step_s"]
  step = setups_lib.iteration(stacked, values, 1.0, 0.0)["step_s"]
  by_hand = g / (np.ravel(prefill)[0] + (g - 1) * np.ravel(step)[0])
  assert out["value"][0] == pytest.approx(by_hand, rel=1e-12)


def test_clients_beyond_what_the_engine_runs_wait_and_add_no_throughput():
  [base] = _points("nim-dli-genai-perf/010")  # 250 clients of 7000-token prompts, A100.
  points = [
      dataclasses.replace(base, concurrency=c, metric=m, point_id=f"x/{c}{m}")
      for c in (10, 250, 500) for m in ("ttft_s", "output_tokens_per_s")
  ]
  stacked = setups_lib.stack(points)
  values = {**fit_lib.terms_per_point(stacked, lambda i: KNOWN), **fit_lib.held(stacked)}
  out = points_lib.predict(stacked, values)
  cap = out["cap"][0]
  assert 10 < cap < 250  # K/V memory holds fewer than 250 of these requests.
  ttft, rate = out["value"][0::2], out["value"][1::2]
  assert ttft[0] < ttft[1] < ttft[2]
  assert rate[1] == pytest.approx(rate[2], rel=1e-9)  # Past the cap: queueing only.


def test_a_closed_loop_in_steady_state_queues_less_than_its_first_wave():
  # A closed loop's requests turn over one by one once its first wave has passed: a
  # prompt waits for the prefills ahead of it at the replica's rate, never for half of
  # the other clients' prefills as the first wave (all sent together) does.
  [base] = _points("nim-dli-genai-perf/094")  # 25 clients of 7000-token prompts, A100.
  points = [
      dataclasses.replace(base, concurrency=c, source=s, point_id=f"x/{c}{s}")
      for s in ("steady", "nim-dli-genai-perf") for c in (1, 25)
  ]
  stacked = setups_lib.stack(points)
  settings = fit_lib.held(stacked)
  assert list(settings["first_wave"]) == [0, 0, 1, 1]  # The source's protocol.
  out = points_lib.predict(stacked,
                           {**fit_lib.terms_per_point(stacked, lambda i: KNOWN), **settings})
  one, steady, _, first = out["value"]
  lockstep = (25 - 1) / 2 * out["prefill_share_s"][3]
  assert first == pytest.approx(out["ttft_s"][3]) and first - one > 0.9 * lockstep
  assert one < steady < one + 0.5 * lockstep


def test_the_bound_is_never_faster_than_a_measurement():
  checked = published_referee.bounds()
  assert checked["points"] > 650 and checked["violations"] == []
  assert checked["min_ratio"] >= 1.0


def test_a_fit_recovers_known_terms_from_points_the_model_made():
  # Rows made by the predictor with known terms, TP layouts and MoE included: a fit of
  # every candidate term (the shipped design's and t0_step) gets them back, so no term is
  # counted twice (eta_comm against the collectives, the expert terms against the dense
  # rate, t0_layer against t0_step).
  design = fit_lib.Design(tuple(KNOWN), ())
  assert set(fit_lib.DESIGN.fitted) <= set(design.fitted)
  train = [p for p in profile_lib.training_points() if p.engine in ("trtllm", "nim")][::4]
  assert sum(p.tp > 1 for p in train) > 20 and any(p.model == "mixtral-8x7b" for p in train)
  stacked = setups_lib.stack(train)
  settings = fit_lib.held(stacked)
  made = fit_lib.predict_with(stacked, fit_lib.EngineFit(KNOWN, {}, 0, design), settings)
  synthetic = [
      dataclasses.replace(p, value=float(v)) for p, v in zip(stacked.points, made)
      if math.isfinite(v)
  ]
  again = setups_lib.stack(synthetic)
  fitted = fit_lib.fit(again, fit_lib.held(again), design)
  for name, value in KNOWN.items():
    if name != "t0_seq":  # Too small beside the rest to show in these rows.
      assert fitted.terms[name] == pytest.approx(value, rel=0.05), name
