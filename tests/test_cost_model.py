"""The one cost model: its consumers agree, and it reproduces hand computations.

Hand checks are written from the models' config.json figures and the
accelerators' datasheet figures, not from the code's output; agreement tests
hold the decode sweep, serving's prefill, the decision and the simulator to
the same iteration.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib

import numpy as np
import pytest
import sympy as sp

from jaxroof import errors
from jaxroof.parallel.layout import Layout
from jaxroof.serving import load
from jaxroof.serving import arrivals, decision, metrics, multichip, replica, requests, simulator
from jaxroof.specs import parameters
from jaxroof.specs.accelerators import load_accelerator
from jaxroof.specs.iteration_model import IterationModel
from jaxroof.specs.model_sweep import model_sweep
from jaxroof.specs.models import load_model
from jaxroof.symbolic import calibrated, cost_model, evaluate, iteration
from jaxroof.symbolic import collectives
from jaxroof.symbolic import symbols as S
from jaxroof.symbolic.step_model import StepModel

BOUND = StepModel.bound()
H100, H200 = load_accelerator("h100-sxm"), load_accelerator("h200")


def _cost(name: str, device, **kw) -> IterationModel:
  return IterationModel.on_device(load_model(name), device, **kw)


# One model: every step expression is the cost model's.
@pytest.mark.parametrize("form", cost_model.BOUNDS)
def test_decode_step_expression_is_the_cost_models_iteration(form):
  subs = {
      **cost_model.decode_specialisation(S.B, S.T, S.N * S.q, S.N_act, S.k, S.A_t), S.t_comm: 0,
      S.o_ovl: 0
  }
  ours = evaluate.step_outputs(form)["step_s"]
  assert sp.simplify(ours - cost_model.bound_terms(form)["floor_s"].subs(subs)) == 0
  if form == "fused":  # With no attention FLOPs, the lesson's floor exactly.
    from jaxroof.symbolic import formulas
    assert sp.simplify(ours.subs(S.A_t, 0) - formulas.step_floor()) == 0


@pytest.mark.parametrize("engines", [(), ("xla_cpu",),
                                     pytest.param(("vllm_cpu",), marks=pytest.mark.e2e),
                                     pytest.param(("vllm_cpu", "xla_cpu"), marks=pytest.mark.e2e)])
def test_calibrated_decode_step_is_the_cost_models_calibrated_iteration(engines):
  """The calibrated decode step (`calibrated.decode_model`, what StepModel, sweeps and the
  fits evaluate) equals the cost model's calibrated iteration with B decode rows at one
  context, engine terms held, at random points: the iteration model's decode of raw
  numbers (one full group, weights in the linear layers) is the same step."""
  rng = np.random.default_rng(7)
  decode = calibrated.decode_model("numpy", engines)
  for _ in range(12):
    N, q = rng.uniform(1e8, 3e10), rng.choice([1.0, 2.0])
    raw = dict(N=N, q=q, k=rng.uniform(1e3, 3e5), BW=rng.uniform(1e11,
                                                                 4e12), F=rng.uniform(1e12, 2e15),
               N_act=N * rng.uniform(0.3, 1.0), L=float(rng.integers(2, 80)))
    pair = rng.uniform(1e3, 1e6)
    terms = {
        "eta_w": rng.uniform(0.2, 1), "eta_kv": rng.uniform(0.1, 1), "eta_f": rng.uniform(0.05, 1),
        "t0_step": rng.uniform(1e-6,
                               1e-3), "t0_layer": rng.uniform(1e-8,
                                                              1e-5), "r_ovl": rng.uniform(0, 4),
        "t0_seq": rng.uniform(0, 1e-4), "eta_attn": rng.choice([0.0, rng.uniform(0.1, 1)])
    }
    if "vllm_cpu" in engines:
      terms.update(c_llc=rng.uniform(0, 2 * N * q), bw_llc=rng.uniform(1e10, 1e13),
                   s_lru=rng.choice([0.0, 1.0]), m_pass=rng.choice([0.0, 64.0]),
                   t_act=rng.uniform(0, 2e-9))
    if "xla_cpu" in engines:
      terms.update(r_pack=rng.uniform(0, 2))
    model = StepModel.calibrated(
        terms, terms={n: v for n, v in terms.items() if n not in calibrated.FACTOR_NAMES})
    assert model.extensions == engines
    cost = IterationModel.from_numbers(N=N, q=q, k=raw["k"], BW=raw["BW"], F=raw["F"],
                                       N_act=raw["N_act"], L=raw["L"], pair_flops=pair)
    cost = dataclasses.replace(cost, constants={**cost.constants, "A_w": 5e4})
    for batch, context in ((1.0, 300.0), (7.0, 900.0), (130.0, 4000.0)):
      step = decode(B=batch, T=context, A_t=pair, A_w=5e4, **raw, **terms)["step_s"]
      iteration = cost.decode(batch, context, model)["step_s"]
      assert float(step) == pytest.approx(float(iteration), rel=1e-9)
      assert float(model.evaluate(B=batch, T=context, A_t=pair, A_w=5e4,
                                  **raw)["step_s"]) == (pytest.approx(float(iteration), rel=1e-9))


def test_the_calibrated_step_is_the_iterations_expression_at_the_decode_specialisation():
  subs = {
      **cost_model.decode_specialisation(S.B, S.T, S.N * S.q, S.N_act, S.k, S.A_t), S.t_comm: 0,
      S.o_ovl: 0
  }
  ours = cost_model.calibrated_terms()["floor_s"].xreplace(subs)
  assert sp.simplify(ours - cost_model.calibrated_decode_outputs()["step_s"]) == 0
  # A_t = 0 and the other core terms absent: the six factors' form the profiles print.
  plain = ours.xreplace({S.A_t: 0, S.t0_seq: 0, S.eta_attn: 0})
  assert sp.simplify(plain - calibrated.calibrated_step()) == 0


def test_an_engines_sequence_cost_is_one_per_sequence_in_every_consumer():
  """t0_seq (a real engine's per-request work each step) adds t0_seq per sequence: B in a
  decode step, decode rows plus chunks in an iteration; the decode step of StepModel and
  the iteration model's decode agree with it as without it."""
  subs = {
      **cost_model.decode_specialisation(S.B, S.T, S.N * S.q, S.N_act, S.k, 0), S.t_comm: 0,
      S.o_ovl: 0
  }
  step = cost_model.calibrated_terms()["floor_s"]
  assert sp.simplify(sp.diff(step, S.t0_seq) - S.n_seq) == 0
  assert sp.simplify(sp.diff(step.xreplace(subs), S.t0_seq) - S.B) == 0
  factors = {
      "eta_w": 0.7, "eta_kv": 0.6, "eta_f": 0.5, "t0_step": 1e-4, "t0_layer": 1e-6, "r_ovl": 1.3
  }
  plain = StepModel.calibrated(factors)
  engine = StepModel.calibrated(factors, terms={"t0_seq": 3e-4})
  cost = _cost("llama-3-8b", H100)
  for batch in (1.0, 8.0, 64.0):
    with_cost = float(cost.decode(batch, 900.0, engine)["step_s"])
    assert with_cost - float(cost.decode(batch, 900.0, plain)["step_s"]) == pytest.approx(
        3e-4 * batch, rel=1e-9)
  values = dict(T=900.0, N=3e9, q=2.0, k=4e4, BW=2e12, F=3e14, L=30.0)
  one, many = (engine.evaluate(B=np.array([b]), **values) for b in (1.0, 8.0))
  base = plain.evaluate(B=np.array([8.0]), **values)
  assert many["step_s"][0] - base["step_s"][0] == pytest.approx(8 * 3e-4, rel=1e-9)
  assert many["aggregate_tokens_per_s"][0] == pytest.approx(8 / many["step_s"][0], rel=1e-12)
  assert one["step_s"][0] > plain.evaluate(B=np.array([1.0]), **values)["step_s"][0]
  with pytest.raises(errors.InputError, match="t0_nope.*not a cost term"):
    StepModel.calibrated(factors, terms={"t0_nope": 1.0})


def test_an_engines_attention_kernel_times_its_flops_apart_from_the_linear_layers():
  """vLLM CPU's attention kernel ran prompts at about 120 GFLOP/s where its GEMMs ran 450
  (`jaxroof/engines/data/vllm_cpu.json`). With eta_attn held, an iteration's
  attention FLOPs (by hand: 4*H*d per (query, key) pair per layer, a prompt's causal pairs
  and each decode row's context) take FLOPs / (eta_attn*F) on top, and leave the linear
  layers' compute term; eta_attn = 0 is the model without the term."""
  factors = {
      "eta_w": 0.7, "eta_kv": 0.6, "eta_f": 0.5, "t0_step": 1e-4, "t0_layer": 1e-6, "r_ovl": 1.3
  }
  apart = StepModel.calibrated(factors, terms={"eta_attn": 0.25})
  off = StepModel.calibrated(factors, terms={"eta_attn": 0.0})
  plain = StepModel.calibrated(factors)
  cost = _cost("llama-3-8b", H100)  # 32 layers, 32 query heads of 128.
  peak = cost.constants["F"]
  for prompt, contexts in ((512, []), (0, [900.0] * 4), (256, [300.0, 700.0])):
    mix = cost.mix(decode_context=contexts, chunk_offset=[0.0] * bool(prompt),
                   chunk_tokens=[float(prompt)] * bool(prompt))
    flops = 32 * 4 * 32 * 128 * (prompt * (prompt + 1) / 2 + sum(contexts))
    on, no, base = (cost.evaluate(mix, m) for m in (apart, off, plain))
    assert float(on["attention_s"]) == pytest.approx(flops / (0.25 * peak), rel=1e-9)
    assert float(no["attention_s"]) == 0.0
    assert float(no["compute_s"]) - float(on["compute_s"]) == pytest.approx(
        flops / (0.5 * peak), rel=1e-9)
    assert float(no["step_s"]) == pytest.approx(float(base["step_s"]), rel=1e-12)
    assert float(on["step_s"]) > float(no["step_s"])


def test_layout_decode_at_one_chip_is_the_decode_step():
  one = dict(tp=1, pp=1, ep=1, m_mb=1, u_kv=8, n_blk=32, L_moe=0, K=1, D=4096, V=32000, a_act=2,
             W_ic=1e11, t_hop=1e-6, t_base=6.6e-6, h_tp=0, x_os=1, o_ovl=0, N_x=0)
  values = dict(B=64.0, T=4096.0, N=8e9, q=2.0, k=131072.0, BW=3.35e12, F=9.89e14, N_act=8e9,
                A_t=524288.0)
  names = [
      str(s) for s in (S.B, S.T, S.N, S.N_x, S.q, S.k, S.BW, S.F, S.N_act, S.tp, S.pp, S.ep, S.m_mb,
                       S.u_kv, S.n_blk, S.L_moe, S.K, S.D, S.V, S.a_act, S.o_ovl, S.A_t,
                       *collectives.LINK_SYMBOLS)
  ]
  layout = evaluate.lambdified(collectives.decode_outputs(), [S.BY_NAME[n].symbol for n in names])
  ours = layout(**{**one, **values})["step_s"]
  assert float(ours) == pytest.approx(float(evaluate.step_model()(**values)["step_s"]), rel=1e-12)


def test_chunk_pairs_are_the_causal_sum_and_windows_cap_them():
  """Independent: query i of a chunk attends to o + i keys (at most W in a window)."""
  o, c, i = sp.symbols("o c i", positive=True, integer=True)
  summed = sp.summation(o + i, (i, 1, c))
  assert sp.simplify(cost_model.chunk_pairs("full", o, c) - summed) == 0
  pairs = cost_model.span_evaluator("sliding")
  for done, chunk, window in ((0, 10, 4), (3, 5, 100), (50, 7, 16)):
    by_hand = sum(min(done + q, window) for q in range(1, chunk + 1))
    assert float(pairs(T=1.0, o_chunk=float(done), c_chunk=float(chunk),
                       W=float(window))["pairs"]) == by_hand


def test_only_the_symbolic_layer_builds_a_roofline():
  """No module outside jaxroof/symbolic and the engines' extensions of it writes a
  roofline Max; inside, only these."""
  root = pathlib.Path(__file__).resolve().parents[1]
  allowed = {
      "cost_model.py", "formulas.py", "prefill.py", "request_formulas.py", "collectives.py",
      "xla_cpu.py", "vllm_cpu.py"
  }
  for path in list((root / "jaxroof").rglob("*.py")) + list((root / "experiments").glob("*.py")):
    if "sp.Max(" in path.read_text():
      assert path.parent.name in ("symbolic", "engines") and path.name in allowed, path


# Agreement between consumers.
@pytest.mark.parametrize("name, device, context, batches", [
    ("llama-3-8b", H100, 8192, [1, 64, 512]),
    ("mixtral-8x7b", H200, 2048, [1, 64]),
    ("gemma-3-1b", H100, 32768, [1, 16]),
])
def test_a_decode_iteration_is_batch_sweeps_step(name, device, context, batches):
  sweep = model_sweep(load_model(name), device, context=context, batch_sizes=batches)
  cost = _cost(name, device)
  for row in sweep["rows"]:
    ours = float(cost.decode(float(row["batch"]), float(context))["step_s"])
    assert ours == pytest.approx(row["step_s"], rel=1e-9)


def test_a_prefill_iteration_is_servings_prefill_and_the_simulated_ttft():
  spec, P = load_model("gemma-3-1b"), 32768 - 2
  inputs = requests.model_inputs(spec, H100, prompt_tokens=P, output_tokens=2)
  serving_prefill = float(requests.prefill(inputs, P, 1.0)["prefill_s"])
  assert serving_prefill == pytest.approx(float(_cost("gemma-3-1b", H100).prefill(P)["step_s"]),
                                          rel=1e-12)
  r = replica.from_model(spec, H100, context=P + 2)
  w = arrivals.Workload(arrival_s=np.zeros(1), prompt_tokens=np.array([P]),
                        output_tokens=np.array([2]), description={})
  run = simulator.simulate(w, r, "iteration")
  assert run.first_token_s[0] == pytest.approx(serving_prefill, rel=1e-12)


# Hand computations from the configs.
def test_mixtral_decode_at_batch_64_by_hand():
  """Mixtral-8x7B on an H200, 64 rows at 2048: memory-bound, so bytes / BW.

  Per block: attention 4096 x (4096 + 2 x 1024) + 4096 x 4096, router 4096 x 8, two
  norms; 8 experts of 3 x 4096 x 14336, of which 64 tokens touch 8 x (1 - 0.75**64);
  the LM head 32000 x 4096 and 64 embedding rows; K/V 2 x 8 x 128 x 2 B per block.
  """
  attention = 4096 * (4096 + 2 * 1024) + 4096 * 4096
  per_block = attention + 4096 * 8 + 2 * 4096
  experts = 32 * 8 * 3 * 4096 * 14336 * (1 - 0.75**64)
  weights = (32 * per_block + 4096 + 32000 * 4096 + 64 * 4096 + experts) * 2
  kv = 64 * 2048 * 32 * 2 * 8 * 128 * 2
  expected = (weights + kv) / H200.memory_bandwidth_bytes_per_s
  ours = float(_cost("mixtral-8x7b", H200).decode(64.0, 2048.0)["step_s"])
  assert ours == pytest.approx(expected, rel=1e-6)
  assert ours > 19e-3  # More than the 93 GB of weights alone: not a batch-1 step.


def test_gemma3_1b_prefill_of_32k_by_hand():
  """Gemma-3-1B, one 32,768-token prompt on an H100: 4 full and 22 sliding (512) blocks,
  4 heads of 256; linear layers compute-bound, attention compute-bound, LM head (tied,
  262,144 x 1,152) read once for the one sampled row."""
  spec, P, W = load_model("gemma-3-1b"), 32768, 512
  counts = parameters.parameter_counts(spec)
  F, BW = H100.flops("bf16"), H100.memory_bandwidth_bytes_per_s
  head = 262144 * 1152
  linear = max((counts.total - head) * 2 / BW, 2 * (counts.active_matmul - head) * P / F)
  full_pairs = P * (P + 1) / 2
  window_pairs = W * (W + 1) / 2 + (P - W) * W
  flops = 4 * 4 * 256 * (4 * full_pairs + 22 * window_pairs)
  kv_bytes = (4 * P + 22 * W) * 2 * 1 * 256 * 2  # Written, read back (no prefix).
  attention = max(kv_bytes / BW, flops / F)
  expected = linear + attention + max(head * 2 / BW, 2 * head / F)
  ours = float(_cost("gemma-3-1b", H100).prefill(float(P))["step_s"])
  assert ours == pytest.approx(expected, rel=1e-3)
  all_full = 4 * 4 * 256 * 26 * full_pairs / F
  assert ours < linear + all_full  # The windows, not all-full attention.


def test_deepseek_v3_prefill_mha_and_decode_absorbed_by_hand():
  """DeepSeek-V3 (61 MLA blocks, 128 heads, r_kv 512, rope 64, nope 128, v 128), fp8:
  prefill pairs at 2 x 128 x (192 + 128) FLOPs (MHA), decode at 2 x 128 x (2 x 512 + 64)
  per cached position (absorbed), latent 576 B per position per block in fp8... bf16 K/V."""
  spec = load_model("deepseek-v3")
  cost = _cost("deepseek-v3", H200, weight_dtype="published")
  c = cost.constants
  assert c["ap_mla"] == 61 * 2 * 128 * (192 + 128)
  assert c["a_mla"] == 61 * 2 * 128 * (2 * 512 + 64)
  assert c["k_mla"] == 61 * (512 + 64) * 2
  P = 32768
  F = H200.flops("bf16")  # Attention's kernels compute in bf16, fp8 weights or not.
  pairs = P * (P + 1) / 2
  attention_s = float(cost.prefill(float(P))["attention_s"])
  assert attention_s == pytest.approx(61 * 2 * 128 * 320 * pairs / F, rel=1e-3)
  absorbed = _cost("deepseek-v3", H200, weight_dtype="published", mla_prefill="absorbed")
  assert float(absorbed.prefill(float(P))["attention_s"]) == pytest.approx(
      attention_s * (2 * 512 + 64) / 320, rel=1e-3)
  # Decode: 32 rows at 4096, attention FLOPs (absorbed) against their latent reads.
  d = cost.decode(32.0, 4096.0)
  assert float(d["attention_flops"]) == pytest.approx(32 * 4096 * 61 * 2 * 128 * 1088)
  assert float(d["attention_bytes"]) == pytest.approx(32 * 4096 * 61 * 576 * 2)
  # On 8 H200s (tp8) a 32k prompt takes 0.56-0.72 s by hand (the range).
  inputs = multichip.model_inputs(spec, H200, layout=Layout(tp=8), prompt_tokens=P - 1,
                                  output_tokens=2, weight_dtype="published")
  assert 0.5 < float(requests.prefill(inputs, P - 1, 1.0)["prefill_s"]) < 0.75


# The simulator against the decision.
FAMILIES = [  # (model, device, layout, prompt, output): dense, MoE, sliding, MLA, hybrid.
    ("llama-3-8b", H100, Layout(), 1024, 128),
    ("mixtral-8x7b", H200, Layout(), 1024, 128),
    ("gemma-3-1b", H100, Layout(), 4096, 128),
    ("deepseek-v3", H200, Layout(tp=8), 1024, 128),
    ("nemotron-3-nano-30b-a3b", H200, Layout(), 1024, 128),
]


def _workload(rate: float, P: int, G: int, n: int = 1500, spread: float = 0.0):
  return arrivals.synthetic(arrival="poisson", num_requests=n, arrival_rate=rate, seed=0,
                            prompt_tokens=P, output_tokens=G,
                            output_distribution="uniform" if spread else "fixed",
                            output_spread=spread)


def _answer(inputs, P: int, G: int, slots: int):
  """The load model for `slots` sequences under the iteration scheduler, no targets."""
  return load.answer(BOUND, inputs, prompt_tokens=P, output_tokens=G, token_gap_s=math.inf,
                     ttft_s=None, scheduler="iteration", max_running=slots, itl_quantile=None)


@pytest.mark.parametrize("name, device, layout, P, G", FAMILIES)
def test_simulated_tpot_is_the_load_models_gap(name, device, layout, P, G):
  spec = load_model(name)
  inputs = multichip.model_inputs(spec, device, layout=layout, prompt_tokens=P, output_tokens=G,
                                  weight_dtype="published")
  r = replica.from_model(spec, device, context=P + G, layout=layout, max_running=256,
                         weight_dtype="published")
  n_max = min(256, inputs.max_batch_in_memory)
  a = _answer(inputs, P, G, n_max)
  r = dataclasses.replace(r, max_running=n_max)
  capacity = a.slot_fill_rate()
  for share in (0.15, 0.6):  # 1,500 requests: the warm-up and the drain weigh little.
    rate = share * capacity
    run = simulator.simulate(_workload(rate, P, G), r, "iteration")
    m = metrics.serving_metrics(run.arrival_s, run.first_token_s, run.finish_s, run.output_tokens,
                                run.itl_s)
    assert m["tpot_s"]["mean"] == pytest.approx(a.at(rate)["token_gap_s"], rel=0.05), (name, share)


@pytest.mark.parametrize("name, device, n", [("llama-3-8b", H100, 32), ("mixtral-8x7b", H200, 64)])
def test_saturated_throughput_is_the_slots_fill_rate(name, device, n):
  spec, P, G = load_model(name), 1024, 128
  inputs = multichip.model_inputs(spec, device, prompt_tokens=P, output_tokens=G)
  capacity = _answer(inputs, P, G, n).slot_fill_rate()
  r = replica.from_model(spec, device, context=P + 2 * G, max_running=n)
  # Three times the capacity: a backlog throughout; output lengths spread (uniform, +-50%)
  # so that admissions do not march in lockstep waves.
  run = simulator.simulate(_workload(3 * capacity, P, G, spread=0.5), r, "iteration")
  done = np.sort(run.finish_s)
  steady = 400 / (done[499] - done[99])
  assert steady == pytest.approx(capacity, rel=0.05)


def test_operating_point_is_littles_law_and_below_the_fill_rate():
  spec, P, G = load_model("llama-3-8b"), 2048, 256
  inputs = requests.model_inputs(spec, H100, prompt_tokens=P, output_tokens=G)
  a = _answer(inputs, P, G, 146)
  point = load.point(a, 5.0)
  assert point["stable"]
  # Tokens leave as requests do: the running sequences over the gap is the rate's tokens.
  assert point["running_batch"] == pytest.approx(5.0 * (G - 1) * point["token_gap_s"], rel=0.02)
  assert point["running_batch"] < 146 / 4  # A light load: far from the capacity's batch.
  over = load.point(a, 1e4)
  assert over["running_batch"] is None and "unstable" in over["reason"]


def test_per_op_is_never_below_fused_and_sums_the_operations():
  cost = _cost("llama-3-8b", H100)
  mix = cost.mix([2048.0] * 100, [0.0], [512.0])
  per_op = cost.evaluate(mix, StepModel.bound("per_op"))
  fused = cost.evaluate(mix, StepModel.bound("fused"))
  assert float(per_op["step_s"]) >= float(fused["step_s"])
  assert float(per_op["step_s"]) == pytest.approx(
      sum(float(per_op[f"{op}_s"]) for op in cost_model.OPERATIONS), rel=1e-12)
  # A 512-token chunk beside 100 decodes: linear compute-bound, attention memory-bound,
  # so the sum exceeds the single roofline by a third or more.
  assert float(per_op["step_s"]) > 1.3 * float(fused["step_s"])


def test_comm_overlap_hides_communication_up_to_the_floor():
  spec = load_model("llama-3.1-70b")
  serial = replica.from_model(spec, H100, context=4096, layout=Layout(tp=4)).cost
  hidden = serial.with_overlap(1.0)
  mix = serial.mix([4096.0] * 8)
  a, b = serial.evaluate(mix), hidden.evaluate(mix)
  assert float(a["step_s"]) == pytest.approx(float(a["floor_s"] + a["comm_s"]), rel=1e-12)
  assert float(b["step_s"]) == pytest.approx(max(float(b["floor_s"]), float(b["comm_s"])))


def test_raw_iteration_is_the_cost_model_with_one_full_group():
  raw = iteration.step_expression("bound")
  values = {
      S.n_dec: 3, S.S_dec: 3 * 500, S.n_pre: 100, S.S_pre_att: 5050, S.S_pre_kv: 100, S.N: 1e9,
      S.q: 2, S.k: 1e4, S.BW: 1e12, S.F: 1e14, S.N_act: 1e9, S.L: 4, S.H: 8, S.d: 64
  }
  linear = max(2e9 / 1e12, 2e9 * 103 / 1e14)
  attention = max(1e4 * (1500 + 100) / 1e12, 4 * 4 * 8 * 64 * (1500 + 5050) / 1e14)
  assert float(raw.subs(values)) == pytest.approx(linear + attention, rel=1e-12)
