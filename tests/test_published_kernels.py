"""Kernel-level terms fitted on AIConfigurator's kernel rows: each row is the one cost
model's iteration by hand; the fit recovers known terms from rows the model made; a fitted
GEMM's efficiency is a share of F that rises with its rows; a profile holds them."""

import dataclasses

import numpy as np
import pytest

from jaxroof.calibrate import published_fit as fit_lib
from jaxroof.calibrate import published_kernels as kernels
from jaxroof.calibrate import published_profile as profile_lib
from jaxroof.calibrate import published_setups as setups_lib
from jaxroof.engines import engine_profiles as profiles
from jaxroof.parallel import planner
from jaxroof.specs import comparison
from jaxroof.specs.accelerators import load_accelerator
from jaxroof.specs.models import load_model

KNOWN = dict(eta_w=0.85, eta_f=0.6, r_ovl=2.0, eta_moe=0.7, m_moe=60.0, eta_kv=0.75, eta_attn=0.45,
             eta_comm=0.8)
LAUNCH = {"gemm": 6e-6, "moe": 2e-5, "attention": 1e-5, "comm": 3e-6}


def _rows(backend="trtllm", accelerator="h200"):
  return [
      r for r in kernels.read_rows()
      if r.backend == backend and r.accelerator == accelerator and r.split == "train"
  ]


def _one(row, values):
  v = kernels.inputs(row)
  return float(kernels.predict({n: np.asarray([x]) for n, x in v.items()}, values)[0])


def test_a_gemm_row_is_its_weight_reads_and_flops_by_hand():
  row = next(r for r in _rows() if r.op == "gemm" and r.fields["dtype"] == "bf16")
  device = load_accelerator("h200")
  m, n, k = (row.number(x) for x in ("m", "n", "k"))
  read = n * k * 2 / (0.8 * device.memory_bandwidth_bytes_per_s)
  flops = 2 * m * n * k / (0.5 * device.flops("bf16"))
  p = 1 + 3.0
  want = (read**p + flops**p)**(1 / p)
  assert _one(row, dict(eta_w=0.8, eta_f=0.5, r_ovl=3.0)) == pytest.approx(want, rel=1e-9)


def test_a_decode_attention_row_is_its_kv_bytes_and_flops_by_hand():
  row = next(r for r in _rows() if r.op == "attention_generation" and r.number("batch") > 1)
  device = load_accelerator("h200")
  b, t = row.number("batch"), row.number("seq_len")
  kv = b * t * 2 * row.number("kv_heads") * row.number("head_dim") * (1 if row.fields["kv_dtype"]
                                                                      == "fp8" else 2)
  flops = b * t * 4 * row.number("heads") * row.number("head_dim")
  want = kv / (0.7 * device.memory_bandwidth_bytes_per_s) + flops / (0.4 * device.flops("bf16"))
  assert _one(row, dict(eta_kv=0.7, eta_attn=0.4)) == pytest.approx(want, rel=1e-6)


def test_eta_comm_divides_an_all_reduce_and_its_base_latency_counts():
  row = next(r for r in _rows() if r.op == "all_reduce")
  at_one = _one(row, dict(eta_comm=1.0))
  assert _one(row, dict(eta_comm=0.5)) == pytest.approx(2 * at_one, rel=1e-9)
  base = load_accelerator("h200").links.base_latency_s
  assert at_one > base > 0


def test_the_kernel_fit_recovers_known_terms_from_rows_the_model_made():
  # The shipped rows' shapes, their times made by the cost model at known terms with a
  # launch latency per family: the family-by-family fit gets every term back, so no term
  # is counted twice (eta_f against eta_moe, eta_kv against eta_attn, launches against
  # efficiencies).
  made = []
  for family, (ops, _) in kernels.FAMILIES.items():
    for row in (r for r in _rows() if r.op in ops):
      t = _one(row, {**KNOWN, "t0_step": LAUNCH[family]})
      made.append(dataclasses.replace(row, latency_s=t))
  got = kernels.fit_backend(made)
  for name, value in KNOWN.items():
    assert got["terms"][name] == pytest.approx(value, rel=0.03), name
  for family, report in got["families"].items():
    assert report["launch_s"] == pytest.approx(LAUNCH[family], rel=0.05), family
    assert report["max_rel_error"] < 0.01


@pytest.mark.parametrize(
    "backend,accelerator",
    [("trtllm", a) for a in ("a100-80gb", "h100-sxm", "h200", "b200", "l40s")] +
    [("vllm", "h100-sxm")])
def test_a_kernel_fitted_gemm_efficiency_is_a_share_of_f_rising_with_m(backend, accelerator):
  terms = kernels.fitted(backend)[accelerator]["terms"]
  for name in ("eta_w", "eta_f", "eta_kv"):
    assert 0 < terms[name] <= 1, name
  ms = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536]
  eff = [kernels.gemm_efficiency(terms, accelerator, m, 8192, 8192) for m in ms]
  assert all(0 < e <= 1 for e in eff)
  assert all(b >= a * (1 - 1e-12) for a, b in zip(eff, eff[1:]))  # Never falls,
  assert eff[0] < eff[-1] / 10  # and rises from a weight-bound M = 1.
  assert eff[-1] == pytest.approx(terms["eta_f"], rel=0.05)  # It saturates at eta_f.


def test_the_referee_kernel_rows_are_never_fitted():
  assert "h100-sxm" not in kernels.held_terms("sglang", tuple(kernels.FAMILIES))
  assert all(r.split == "referee" for r in kernels.read_rows() if r.backend == "sglang")


def test_a_profile_fit_holds_the_kernel_terms_where_they_exist():
  design = dataclasses.replace(fit_lib.DESIGN, kernels=tuple(kernels.FAMILIES))
  held = kernels.held_terms("vllm", design.kernels)
  assert set(held) == {"h100-sxm"}
  mine = [p for p in profile_lib.training_points() if p.engine == "vllm"]
  stacked = setups_lib.stack(mine)
  fitted = fit_lib.fit(stacked, fit_lib.held(stacked), design, kernel_terms=held)
  on_h100 = fitted.for_accelerator("h100-sxm")
  for name, value in held["h100-sxm"].items():
    assert on_h100[name] == value
  # Elsewhere the engine's own fitted terms (today's rule), not the kernel ones.
  assert fitted.for_accelerator("a100-80gb")["eta_w"] == fitted.terms["eta_w"]
  assert "eta_attn" not in fitted.for_accelerator("a100-80gb")


def test_a_design_without_kernel_families_holds_nothing_and_says_nothing():
  assert kernels.held_terms("vllm", ()) == {} and kernels.provenance("vllm", ()) == {}
  assert set(kernels.provenance("trtllm", tuple(kernels.FAMILIES))) == set(
      kernels.held_terms("trtllm", tuple(kernels.FAMILIES)))


def test_a_comparison_gives_each_accelerator_its_own_entry():
  model = load_model("llama-3-8b")
  devices = [load_accelerator(a) for a in ("h100-sxm", "h200")]
  steps = {d.name: profiles.step_model(profiles.entry("trtllm", d.name)) for d in devices}
  assert steps["h100-sxm"].factors != steps["h200"].factors  # Each its kernel-fitted terms.
  both = comparison.compare(model, devices, context=1024, batch_sizes=[1, 32], step_model=steps)
  for d, got in zip(devices, both["accelerators"]):
    alone = comparison.compare(model, [d], context=1024, batch_sizes=[1, 32],
                               step_model=steps[d.name])
    assert [r["step_s"] for r in got["rows"]
           ] == [r["step_s"] for r in alone["accelerators"][0]["rows"]]


@pytest.mark.e2e
def test_a_plan_over_accelerators_whose_entries_differ_ranks_each_alone_together():
  spec = load_model("llama-3-8b")
  devices = [load_accelerator(a) for a in ("h100-sxm", "h200")]
  question = dict(context=2048, prompt_tokens=1536, output_tokens=512, chips=4, top=6,
                  targets=planner.Targets(token_gap_s=0.03,
                                          ttft_s=1.0), engine="trtllm", pools="shared")
  both = planner.plan(spec, devices, **question)
  alone = {d.name: planner.plan(spec, [d], **question)["plans"] for d in devices}

  def key(p):
    return tuple(p[k]
                 for k in ("accelerator", "tp", "pp", "ep", "dp", "microbatches", "max_running",
                           "scheduler", "token_budget", "weight_dtype", "kv_dtype"))

  rates = {key(p): p["tokens_per_s_per_chip"] for rows in alone.values() for p in rows}
  assert {p["accelerator"] for p in both["plans"]} == {"h100-sxm", "h200"}
  for p in both["plans"]:
    assert p["tokens_per_s_per_chip"] == rates[key(p)]
  best = max(rates.values())
  assert both["plans"][0]["tokens_per_s_per_chip"] == best
