"""Several chips: the symbolic terms, layouts, the sweep on a layout, the planner.

Published figures come from jax-ml/scaling-book at commit
0819a7d8c55ddc113f5cba0285a5f97380cac1e3 (applied-inference.md, inference.md)
and gpus.md at 1a55377affc9ee8f10b549f689ad57e813623a7e.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import sympy as sp

from jaxroof.errors import InputError
from jaxroof.parallel import layout as layout_lib
from jaxroof.parallel import plan_grid
from jaxroof.parallel import planner
from jaxroof.parallel.layout_sweep import layout_sweep
from jaxroof.parallel.layout import Layout
from jaxroof.specs.accelerators import load_accelerator, parse_slice
from jaxroof.specs.model_sweep import model_sweep
from jaxroof.specs import step_inputs
from jaxroof.specs.models import load_model
from jaxroof.symbolic import collectives
from jaxroof.symbolic.evaluate import lambdified, step_model
from jaxroof.symbolic.symbols import BY_NAME

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _decode(**overrides):
  """The per-chip decode model at Llama-3.1-70B-like values, with overrides."""
  values = dict(B=8.0, T=8192.0, N=70e9, N_x=0.0, q=2.0, k=327680.0, BW=3.35e12, F=989e12,
                N_act=70e9, tp=1.0, pp=1.0, ep=1.0, m_mb=1.0, u_kv=8.0, n_blk=80.0, L_moe=0.0,
                K=1.0, D=8192.0, V=128256.0, a_act=2.0, W_ic=450e9, t_hop=0.6e-6, o_ovl=0.0,
                t_base=6.6e-6, x_os=1.0)
  values.update(overrides)
  values.setdefault("h_tp", np.asarray(values["tp"], dtype=float) - 1)  # Switched fabric.
  return layout_lib.decode_model()(**values)


# Single chip reproduces today.
def test_single_chip_layout_sweep_is_todays_model_sweep():
  spec, device = load_model("llama-3-8b"), load_accelerator("h100-sxm")
  kw = dict(context=4096, batch_sizes=[1, 8, 64, 256], weight_dtype="bf16", kv_dtype="bf16")
  today = model_sweep(spec, device, **kw)
  ours = layout_sweep(spec, device, layout=Layout(), **kw)
  for old, new in zip(today["rows"], ours["rows"]):
    assert {k: new[k] for k in old} == old  # Exactly, every existing column.
    assert new["comm_s"] == 0.0 and new["chips"] == 1
  assert ours["summary"] == today["summary"]


def test_parallel_model_at_one_chip_equals_the_step_model():
  batch = np.array([1.0, 8.0, 64.0, 512.0])
  ours = _decode(B=batch)
  today = step_model("numpy")(B=batch, T=8192.0, N=70e9, q=2.0, k=327680.0, BW=3.35e12, F=989e12)
  for name in ("memory_s", "compute_s", "step_s", "aggregate_tokens_per_s"):
    np.testing.assert_allclose(ours[name], today[name], rtol=1e-13)
  assert np.all(ours["comm_s"] == 0)


def test_layout_sweep_answer_stops_at_the_memory_limit():
  # A generous token gap on 4 chips at a long context: memory binds first,
  # as it does for one chip.
  spec, device = load_model("llama-3.1-70b"), load_accelerator("h100-sxm")
  swept = layout_sweep(spec, device, context=32768, batch_sizes=[1, 8, 64, 512],
                       layout=Layout(tp=4), token_gap_s=10.0)
  summary = swept["summary"]
  limit = summary["max_batch_in_memory"]
  assert 1 <= limit < 512
  assert (summary["answer_batch"], summary["answer_binds"]) == (limit, "memory_capacity")


def test_layout_sweep_agrees_with_the_full_parallel_expression():
  # Two routes: the step model on path inputs + comm, and decode_outputs directly.
  spec, device = load_model("llama-3.1-70b"), load_accelerator("h100-sxm")
  layout = Layout(tp=4, pp=2)
  swept = layout_sweep(spec, device, context=8192, batch_sizes=[1, 16, 128], layout=layout)
  link = layout_lib.links(layout, device)
  for row in swept["rows"]:
    inputs = step_inputs.decode_step_inputs(spec, device, context=8192, batch_sizes=[row["batch"]])
    direct = layout_lib.decode_model()(B=float(row["batch"]), T=8192.0, N=inputs.N[0], N_x=0.0,
                                       q=inputs.q, k=inputs.k, BW=inputs.BW, F=inputs.F,
                                       N_act=inputs.N_act,
                                       **layout_lib.symbol_values(layout, spec, link))
    assert row["step_s"] == pytest.approx(float(direct["step_s"]), rel=1e-12)
    assert row["comm_s"] == pytest.approx(float(direct["comm_s"]), rel=1e-12)
    assert row["chips"] == 8


# Properties.
def test_comm_rises_with_tp_while_per_chip_traffic_falls():
  tps = np.array([1.0, 2.0, 4.0, 8.0])
  out = _decode(tp=tps)
  traffic = out["weight_bytes"] + out["kv_bytes"]
  assert np.all(np.diff(out["comm_s"]) > 0)
  assert np.all(np.diff(traffic) < 0)
  assert np.all(np.diff(out["memory_s"]) < 0)


def test_kv_replicated_beyond_the_kv_heads_and_mla_never_split():
  out = _decode(tp=np.array([8.0, 16.0]), u_kv=8.0)
  assert out["kv_bytes"][0] == out["kv_bytes"][1]  # Replicated past 8 heads.
  mla = _decode(tp=np.array([1.0, 8.0]), u_kv=1.0)
  assert mla["kv_bytes"][0] == mla["kv_bytes"][1]


@pytest.mark.parametrize("latency", [False, True])
def test_comm_bound_degree_satisfies_its_defining_equation(latency):
  degree = collectives.comm_bound_degree(latency)
  comm, memory = collectives.comm_bound_equation(latency)
  values = {
      "N": 70e9, "q": 2, "B": 64, "T": 8192, "k": 327680, "BW": 3.35e12, "D": 8192, "a_act": 2,
      "n_blk": 80, "W_ic": 450e9, "t_hop": 0.6e-6
  }
  subs = {BY_NAME[n].symbol: v for n, v in values.items()}
  t_star = float(degree.subs(subs))
  assert t_star > 1
  at = {**subs, BY_NAME["tp"].symbol: t_star}
  assert float(comm.subs(at)) == pytest.approx(float(memory.subs(at)), rel=1e-9)
  # Beyond it communication binds; below it memory does.
  above = {**subs, BY_NAME["tp"].symbol: 1.5 * t_star}
  below = {**subs, BY_NAME["tp"].symbol: 1 + 0.5 * (t_star - 1)}
  assert float(comm.subs(above)) > float(memory.subs(above))
  assert float(comm.subs(below)) < float(memory.subs(below))


def test_overlap_and_pipeline_bubble():
  step = lambdified({"s": collectives.with_overlap()},
                    [BY_NAME[n].symbol for n in ("t_floor", "t_comm", "o_ovl")])
  assert step(t_floor=3.0, t_comm=1.0, o_ovl=0.0)["s"] == 4.0
  assert step(t_floor=3.0, t_comm=1.0, o_ovl=1.0)["s"] == 3.0
  bubble = lambdified({"b": collectives.bubble_fraction()},
                      [BY_NAME["m_mb"].symbol, BY_NAME["pp"].symbol])
  assert bubble(m_mb=1.0, pp=4.0)["b"] == 0.75 and bubble(m_mb=4.0, pp=4.0)["b"] == 0.0


def test_ring_and_tree_latency_terms():
  n = BY_NAME["n_r"].symbol
  ring = collectives.allreduce_time(algorithm="ring")
  tree = collectives.allreduce_time(algorithm="tree")
  subs = {
      BY_NAME["S_b"].symbol: 0, BY_NAME["W_ic"].symbol: 1, BY_NAME["t_hop"].symbol: 1,
      BY_NAME["t_base"].symbol: 0
  }
  assert ring.subs({**subs, n: 8}) == 14 and sp.simplify(tree.subs({**subs, n: 8})) == 6


def test_allreduce_is_alpha_beta_with_one_shot_for_small_messages():
  """NCCL's model (tuning.cc): base 6.6 us + 2(n-1) x 0.6 us per NVLink ring step, LL;
  8 GPUs: 15.0 us for an empty message (the 'derived_8gpu_allreduce_LL_us' in
  accelerators.json); a one-shot all-reduce beats the ring for a small one and loses
  for a large one."""
  names = ("S_b", "n_r", "W_ic", "t_hop", "t_base", "x_os")
  t = lambdified(
      {"ring": collectives.allreduce_time(algorithm="ring"), "best": collectives.allreduce_time()},
      [BY_NAME[x].symbol for x in names])
  nvlink = dict(W_ic=450e9, t_hop=0.6e-6, t_base=6.6e-6, x_os=1.0)
  assert t(S_b=0.0, n_r=8.0, **nvlink)["ring"] == pytest.approx(15.0e-6, rel=1e-12)
  assert t(S_b=0.0, n_r=2.0, **nvlink)["ring"] == pytest.approx(7.8e-6, rel=1e-12)
  small = t(S_b=16 * 8192 * 2.0, n_r=8.0, **nvlink)  # A decode step's (16, D) bf16.
  assert small["best"] == pytest.approx(6.6e-6 + 0.6e-6 + 7 * 16 * 8192 * 2 / 450e9)
  assert small["best"] < small["ring"]
  large = t(S_b=1e9, n_r=8.0, **nvlink)
  assert large["best"] == large["ring"]
  torus = t(S_b=0.0, n_r=8.0, **{**nvlink, "x_os": 0.0})  # No one-shot on a torus.
  assert torus["best"] == torus["ring"]


def test_torus_rings_per_axis():
  assert layout_lib.ring_steps(8, torus=False) == 7
  assert layout_lib.ring_steps(8, torus=True, axes=2) == 1 + 3  # 2 x 4.
  assert layout_lib.ring_steps(16, torus=True, axes=2) == 3 + 3  # 4 x 4.
  assert layout_lib.ring_steps(64, torus=True, axes=3) == 3 * 3  # 4 x 4 x 4.


# Published worked examples (scaling-book).
def test_scaling_book_llama3_70b_on_v5e_4x2_step_is_17_ms():
  # applied-inference.md: "(KV size + param size) / (8 * HBM bandwidth) = 112e9 / (8 * 8.1e11)
  # = 17ms"; int8 weights (70e9 B), KV 160e3 B/token, 8192 tokens, batch 32, 8 chips; the
  # book leaves communication out, so W_ic is infinite and t_hop zero here.
  out = _decode(B=32.0, T=8192.0, N=70e9, N_act=70e9, q=1.0, k=160e3, BW=8.1e11, F=1.97e14, tp=8.0,
                u_kv=8.0, W_ic=np.inf, t_hop=0.0, t_base=0.0)
  assert float(out["step_s"]) == pytest.approx(112e9 / (8 * 8.1e11), rel=0.02)
  assert float(out["step_s"]) == pytest.approx(17.28e-3, rel=0.01)
  assert 32 / float(out["step_s"]) == pytest.approx(1882, rel=0.02)  # "1882 tokens / sec"


def test_scaling_book_llama3_70b_minimum_v5e_slices():
  # applied-inference.md table: bf16 (140 GB) needs 4x4 = 16 chips, int8 (70 GB) 4x2 = 8
  # (16 GB of HBM each; power-of-two slices).
  weights = lambdified({"w": collectives.per_chip_weights()},
                       [BY_NAME[n].symbol for n in ("N", "N_x", "tp", "pp", "ep")])
  for q, chips in ((2.0, 16), (1.0, 8)):
    fewest = next(t for t in (1, 2, 4, 8, 16, 32)
                  if weights(N=70e9, N_x=0.0, tp=float(t), pp=1.0, ep=1.0)["w"] * q <= 16e9)
    assert fewest == chips


def test_scaling_book_30b_int8_on_16_v5e_is_2_5_ms():
  # inference.md pop quiz: (4 * 819e6 + 30e9) / (16 * 8.1e11) = 2.5 ms (100 kB/token, 8192).
  out = _decode(B=4.0, T=8192.0, N=30e9, N_act=30e9, q=1.0, k=819e6 / 8192, BW=8.1e11, F=1.97e14,
                tp=16.0, u_kv=16.0, W_ic=np.inf, t_hop=0.0, t_base=0.0)
  assert float(out["step_s"]) == pytest.approx(2.5e-3, rel=0.03)


def test_scaling_book_h100_node_allgather_65_us():
  # gpus.md Pop Quiz 1: AllGather(bf16[1024, 16384]) on 8xH100 at 450e9: "more precisely 65us".
  t = lambdified({"t": collectives.allgather_time(algorithm="ring")},
                 [BY_NAME[n].symbol for n in ("S_b", "n_r", "W_ic", "t_hop", "t_base")])
  value = t(S_b=2 * 1024 * 16384, n_r=8.0, W_ic=450e9, t_hop=0.0, t_base=0.0)["t"]
  assert value == pytest.approx(65e-6, rel=0.01)


# Layouts, slices and bad input.
def test_slices_parse():
  assert parse_slice("8xh100-sxm")[0].name == "h100-sxm" and parse_slice("8xh100-sxm")[1] == 8
  assert parse_slice("tpu-v5e-8")[1] == 8 and parse_slice("mi300x")[1] is None
  assert layout_lib.from_slice(Layout(), 8) == Layout(tp=8)
  with pytest.raises(InputError, match=r"^chips=8 does not match") as caught:
    layout_lib.from_slice(Layout(tp=2), 8)
  assert caught.value.field == "chips"


def test_bad_layouts_name_the_field_and_what_is_allowed():
  """Library errors name the field (`tp=3`), never a command-line flag; the experiments
  map fields to flags."""
  spec = load_model("llama-3.1-70b")
  h100 = load_accelerator("h100-sxm")
  with pytest.raises(
      InputError, match=r"^tp=3 does not divide .*64 query heads: allowed tp "
      r"values are \[1, 2, 4, 8, 16, 32, 64\]") as caught:
    layout_lib.validate(Layout(tp=3), spec, h100)
  assert caught.value.field == "tp"
  with pytest.raises(InputError, match="exceeds one PCIe host.*allowed tp\\*pp\\*ep <= 8"):
    layout_lib.validate(Layout(tp=16), spec, load_accelerator("h100-pcie"))
  with pytest.raises(InputError, match=r"^pp=0 is not allowed") as caught:
    Layout(pp=0)
  assert caught.value.field == "pp"
  with pytest.raises(InputError, match=r"^ep=2 needs a mixture-of-experts.*allowed ep=1"):
    layout_lib.validate(Layout(ep=2), spec, h100)
  with pytest.raises(
      InputError, match=r"^ep=3 does not divide .*8 experts: allowed ep "
      r"values are \[1, 2, 4, 8\]") as caught:
    layout_lib.validate(Layout(ep=3), load_model("mixtral-8x7b"), h100)
  assert caught.value.field == "ep"
  with pytest.raises(InputError, match=r"^accelerator='0xh100-sxm' has 0 chips"):
    parse_slice("0xh100-sxm")


def test_busiest_chip_is_an_end_stage_by_hand_count():
  """A 4-block Llama (D 64, MLP 128, 8 heads of 8, 2 K/V heads, vocabulary 100) in bf16:
  a block is q, k, v, o (64*64 + 2*64*16 + 64*64) + gated MLP 3*64*128 + 2 norms of 64;
  the table and the untied head 100*64 each, the final norm 64. With pp = 4 a stage
  holds one block, and an end stage the table (or the head) too."""
  from jaxroof.specs import hf_config, parameters as params

  config = {
      "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
      "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 100
  }
  block = 64 * 64 + 2 * 64 * 16 + 64 * 64 + 3 * 64 * 128 + 2 * 64
  table, final_norm = 100 * 64, 64
  device = load_accelerator("h100-sxm")

  def memory(layout, **overrides):
    spec = hf_config.spec_from_config({**config, **overrides}, name="t", source="t.json")
    return layout_lib.chip_memory(layout, spec, device,
                                  weight_format=params.weight_format(spec, "bf16"),
                                  kv_allocated_bytes_per_sequence=1000.0, workspace_fraction=0.1)

  blocks = 4 * block + final_norm
  one = memory(Layout())
  assert one.resident_weight_bytes == 2 * (blocks + 2 * table)
  four = memory(Layout(pp=4))
  assert four.resident_weight_bytes == 2 * (blocks / 4 + table)  # Not the mean, total / 4.
  assert four.kv_allocated_bytes_per_sequence == 1000.0 / 4
  usable = device.memory_capacity_bytes * 0.9 - 2 * (blocks / 4 + table)
  assert four.max_batch_per_replica == int(usable // 250.0)
  # Tied: stored once on one chip; with pp = 4 the last stage keeps a copy for the logits.
  assert memory(Layout(), tie_word_embeddings=True).resident_weight_bytes == 2 * (blocks + table)
  assert memory(Layout(pp=4),
                tie_word_embeddings=True).resident_weight_bytes == 2 * (blocks / 4 + table)
  assert memory(Layout(tp=2, pp=2)).resident_weight_bytes == 2 * (blocks / 2 + table) / 2


def test_chip_weights_at_one_stage_are_the_mean_over_tp_and_ep():
  """pp = 1: the dense part over tp, routed experts over tp*ep (the old average)."""
  sym = {name: BY_NAME[name].symbol for name in ("W_res", "W_x", "tp", "ep", "pp")}
  one = collectives.chip_weight_bytes().subs(sym["pp"], 1)
  expected = (sym["W_res"] - sym["W_x"]) / sym["tp"] + sym["W_x"] / (sym["tp"] * sym["ep"])
  assert sp.simplify(one - expected) == 0


def test_planner_memory_is_the_busiest_chips():
  """The planner's per-chip bytes at a pp = 4 layout: `chip_memory`'s weights plus the
  batch's K/V share on an ep group's chip."""
  spec, device = load_model("mixtral-8x7b"), load_accelerator("h100-sxm")
  grid = plan_grid.build(spec, [device], context=4096, prompt_tokens=3840, weight_dtypes=["bf16"],
                         kv_dtypes=["bf16"], workspace_fraction=0.1)
  i = int(np.nonzero((grid.pp == 4) & (grid.ep == 2) & (grid.tp == 1))[0][0])
  inputs = step_inputs.decode_step_inputs(spec, device, context=4096, batch_sizes=[1])
  chip = layout_lib.chip_memory(Layout(pp=4,
                                       ep=2), spec, device, weight_format=inputs.weight_format,
                                kv_allocated_bytes_per_sequence=float(grid.memory["s"][i]),
                                workspace_fraction=0.1)
  expected = chip.resident_weight_bytes + 64 / 2 * chip.kv_allocated_bytes_per_sequence
  got = plan_grid.chip_bytes(grid, np.array([i]), np.array([64.0]))
  assert float(np.ravel(got)[0]) == pytest.approx(expected, rel=1e-12)


def test_beyond_the_node_uses_the_scale_out_figure():
  link = layout_lib.links(Layout(tp=16), load_accelerator("h100-sxm"))
  assert link.network == "scale-out" and link.bytes_per_s == 50e9


def test_cli_bad_layout_is_one_line():
  proc = subprocess.run([
      sys.executable, "-m", "experiments.batch_sweep", "--model=llama-3.1-70b",
      "--accelerator=h100-sxm", "--context=8192", "--tp=3"
  ], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and "--tp=3" in lines[0] and "allowed" in lines[0]


# The planner.
def test_planner_searches_every_fitting_configuration_and_ranks_plans_that_meet_targets():
  targets = planner.Targets(token_gap_s=0.05, ttft_s=2.0, aggregate_tokens_per_s=10000.0)
  from jaxroof.specs.accelerators import load_accelerators

  result = planner.plan(load_model("llama-3.1-70b"), load_accelerators("all"), context=8192,
                        targets=targets, weight_dtypes=planner.WEIGHT_DTYPES,
                        kv_dtypes=planner.KV_DTYPES)
  # Layouts x formats x batches that fit memory (every integer batch is then asked of the
  # groups that can make the list).
  assert result["searched"] >= 200_000
  plans = result["plans"]
  assert plans
  by_device = {}
  for p in plans:  # No prices: ranked by chips then headroom within each accelerator.
    by_device.setdefault(p["accelerator"], []).append((p["chips"], -p["headroom"]))
  for keys in by_device.values():
    assert keys == sorted(keys)
  for p in plans:
    # The gap at the operating point (TPOT; `step_s` is the step at max_running).
    assert p["loaded_token_gap_s"] <= 0.05 and p["ttft_s"] <= 2.0
    assert p["aggregate_tokens_per_s"] >= 10000.0
    assert p["chip_memory_bytes"] <= load_accelerator(p["accelerator"]).memory_capacity_bytes
    if p["pools"]["kind"] == "split":  # tp..dp are the decode pool's.
      assert p["chips"] == p["pools"]["prefill_chips"] + p["pools"]["decode_chips"]
      assert p["pools"]["decode_chips"] == p["tp"] * p["pp"] * p["ep"] * p["dp"]
      continue
    assert p["chips"] == p["tp"] * p["pp"] * p["ep"] * p["dp"]
    assert p["binds"] in ("weights", "K/V", "compute", "communication")


def test_prefill_moves_p_times_the_decode_bytes():
  rows = BY_NAME["B"].symbol
  prompt = BY_NAME["P"].symbol
  ratio = collectives.tp_bytes_per_pass(prompt * rows) / collectives.tp_bytes_per_pass(rows)
  assert sp.simplify(ratio - prompt) == 0
  values = {
      BY_NAME["D"].symbol: 7168, BY_NAME["a_act"].symbol: 2, BY_NAME["K"].symbol: 8,
      BY_NAME["ep"].symbol: 1
  }
  assert collectives.alltoall_bytes_per_token().subs(values) == 0  # One group: nothing leaves.


def test_kv_sizing_cli_per_chip_fit(tmp_path):
  out = tmp_path / "kv.json"
  proc = subprocess.run([
      sys.executable, "-m", "experiments.kv_sizing", "--model=llama-3.1-70b", "--context=8192",
      "--batch=32", "--accelerator=tpu-v5e-16", "--kv_dtype=int8", "--weight_dtype=int8",
      f"--json_out={out}"
  ], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  chip = json.loads(out.read_text())["per_chip"]
  assert chip["layout"]["tp"] == 16
  # scaling-book: 70 GB int8 weights over 16 chips; 8 K/V heads replicated past tp = 8.
  assert chip["resident_weight_bytes"] == pytest.approx(70.6e9 / 16, rel=0.01)
  assert chip["kv_bytes_per_chip"] == pytest.approx(32 * 8192 * 163840 / 8, rel=0.01)


def test_plan_cli_json(tmp_path):
  out = tmp_path / "plan.json"
  proc = subprocess.run([
      sys.executable, "-m", "experiments.plan", "--model=llama-3.1-70b", "--context=8192",
      "--token_gap_ms=50", "--ttft_ms=2000", "--aggregate_tokens_per_s=5000",
      "--accelerators=h100-sxm,tpu-v5e", f"--json_out={out}"
  ], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  data = json.loads(out.read_text())
  assert {"plans", "searched", "wall_s"} <= set(data)
  need = {
      "accelerator", "chips", "tp", "pp", "ep", "dp", "batch", "weight_dtype", "kv_dtype", "step_s",
      "aggregate_tokens_per_s", "binds"
  }
  assert data["plans"] and need <= set(data["plans"][0])


def test_compare_accelerators_cli_with_a_layout(tmp_path):
  out = tmp_path / "c.json"
  proc = subprocess.run([
      sys.executable, "-m", "experiments.compare_accelerators", "--model=llama-3.1-70b",
      "--context=8192", "--batch_sizes=1,32", "--tp=16", "--accelerators=h100-sxm,l4",
      f"--json_out={out}"
  ], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  data = json.loads(out.read_text())
  assert [e["name"] for e in data["accelerators"]] == ["h100-sxm"]  # Over its scale-out.
  # L4 has no scale-up fabric: tensor parallel over PCIe within one host, at most 8 cards.
  assert data["refused"] and data["refused"][0].startswith("l4: tp*pp*ep = 16 l4 cards")
  rows = data["accelerators"][0]["rows"]
  assert all(r["chips"] == 16 and r["comm_s"] > 0 for r in rows)
  assert rows[1]["comm_s"] > rows[0]["comm_s"]  # More rows, more bytes per all-reduce.
