"""The planner answers the real question: the workload with its prefill load, the formats
and prices a user allows, each replica answered by the load model, the top plans simulated
and sized."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from jaxroof.errors import InputError
from jaxroof.parallel import planner
from jaxroof.serving import plan_check
from jaxroof.specs.accelerators import load_accelerator, load_accelerators
from jaxroof.specs.models import load_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUESTION = dict(
    context=8192, prompt_tokens=7000, output_tokens=1000,
    targets=planner.Targets(token_gap_s=0.05, ttft_s=2.0, aggregate_tokens_per_s=10000.0),
    weight_dtypes=("bf16",), kv_dtypes=("bf16",))
PRICES = {"h100-sxm": 3.0, "h200": 3.8, "mi300x": 2.5}


@pytest.fixture(scope="module")
def question():
  spec = load_model("llama-3.1-70b")
  devices = load_accelerators("h100-sxm,h200,mi300x")
  return planner.plan(spec, devices, prices=PRICES, top=8, **QUESTION)


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True,
                        timeout=timeout)


def test_rows_carry_cost_pools_and_the_load_model(question):
  plans = question["plans"]
  assert plans and question["ranked_by"] == "cost per hour"
  for p in plans:
    assert p["weight_dtype"] == "bf16" and p["kv_dtype"] == "bf16"  # Only what was allowed.
    assert p["cost_per_hour"] == pytest.approx(p["chips"] * PRICES[p["accelerator"]])
    # 10 requests/s x 1000 tokens = 36 M tokens per hour.
    assert p["cost_per_million_tokens"] == pytest.approx(p["cost_per_hour"] / 36.0)
    assert p["tokens_per_s_per_chip"] == pytest.approx(10000.0 / p["chips"])
    assert p["max_running"] == p["batch"] and p["scheduler"] in ("iteration", "chunked")
    assert (p["token_budget"] is None) == (p["scheduler"] == "iteration")
    assert p["simulated"] is None
    if p["pools"]["kind"] == "shared":
      assert p["chips"] == p["tp"] * p["pp"] * p["ep"] * p["dp"]
      assert p["pools"]["prefill_chips"] == p["pools"]["decode_chips"] == p["chips"]
    else:
      assert p["pools"]["kind"] == "split"
      assert p["pools"]["prefill_chips"] + p["pools"]["decode_chips"] == p["chips"]
  costs = [p["cost_per_hour"] for p in plans]
  assert costs == sorted(costs)


def test_each_replica_carries_its_share_within_the_targets(question):
  """A shared plan: its share of the 10 requests/s within the load model's max rate, the
  fewest replicas that do so, and the operating point within every target (mean gap, p90
  TTFT, p99 inter-token gap)."""
  shared = [p for p in question["plans"] if p["pools"]["kind"] == "shared"]
  assert shared
  for p in shared:
    lam = 10.0 / p["dp"]
    assert p["arrival_rate_per_replica_per_s"] == pytest.approx(lam)
    assert lam <= p["max_rate_per_replica_s"] * (1 + 1e-9)
    assert 10.0 / (p["dp"] - 1) > p["max_rate_per_replica_s"] if p["dp"] > 1 else True
    assert p["max_rate_per_replica_s"] <= p["capacity_per_replica_per_s"] * (1 + 1e-9)
    assert p["loaded_token_gap_s"] <= 0.05 * (1 + 1e-6)
    assert p["ttft_p90_s"] <= 2.0 * (1 + 1e-6) and p["ttft_s"] <= p["ttft_p90_s"] * 1.5
    assert p["itl_p99_s"] <= 0.05 * (1 + 1e-6)
    assert p["headroom"] >= 1.0
    assert p["load_binds"] in ("token_gap", "ttft", "itl_p99", "slots")


def test_a_mesh_collective_runs_on_its_peer_links():
  """The shipped data: an MI300X pair shares one 64 GB/s link; a collective over n chips
  of a fully connected mesh runs on its n - 1 peer links; a switch gives every tp the
  whole egress. Every fabric pays a base latency per collective, with its source."""
  from jaxroof.parallel import layout as layout_lib
  from jaxroof.specs.accelerators import known_accelerators

  for name, peer, whole in (("mi300x", 64e9, 448e9), ("gaudi3", 75e9, 525e9)):
    device = load_accelerator(name)
    for tp in (2, 4, 8):
      link = layout_lib.links(layout_lib.Layout(tp=tp), device)
      rate = layout_lib.link_values(link, tp)["W_ic"]
      assert rate == pytest.approx(min((tp - 1) * peer, whole))
  h100 = load_accelerator("h100-sxm")
  for tp in (2, 8):
    link = layout_lib.links(layout_lib.Layout(tp=tp), h100)
    assert layout_lib.link_values(link, tp)["W_ic"] == h100.links.collective_bytes_per_s
  for name in known_accelerators():
    net = load_accelerator(name).links
    if net is not None:
      assert net.base_latency_s > 0 and net.base_latency_basis, name


def test_split_pools_are_one_prefill_queue(question):
  """The split plan's prefill pool: one M/D/c queue over its replicas (as a router keeps
  it), against independent M/D/1 queues of the same replicas: never more replicas."""
  from jaxroof.symbolic import load_pools
  split = [p for p in question["plans"] if p["pools"]["kind"] == "split"]
  assert split
  for p in split:
    pre = p["pools"]["prefill"]
    servers, service = pre["replicas"], pre["prefill_s"]
    pooled = load_pools.pool_wait(10.0, service, servers)
    assert bool(pooled["stable"])
    assert float(pooled["wait_p90_s"]) == pytest.approx(pre["wait_p90_s"])
    apart = load_pools.pool_wait(10.0 / servers, service, 1)  # Each replica its own queue.
    assert float(pooled["wait_s"]) <= float(apart["wait_s"]) + 1e-12


def test_the_planner_asks_the_cost_model_for_its_prefill():
  """The planner's prefill is the cost model's: the MLA form asked, the LM head only at the
  rows that sample."""
  from jaxroof.parallel import plan_grid
  from jaxroof.specs.iteration_model import IterationModel
  spec, device = load_model("deepseek-v3"), load_accelerator("h200")
  for form in ("mha", "absorbed"):
    grid = plan_grid.build(spec, [device], context=32768, prompt_tokens=32000,
                           weight_dtypes=("published",), kv_dtypes=("bf16",),
                           workspace_fraction=0.1, mla_prefill=form)
    g = int(np.nonzero((grid.tp == 8) & (grid.pp == 1) & (grid.ep == 1))[0][0])
    cost = grid.cost(np.array([g]))
    got = float(
        np.asarray(
            cost.evaluate(cost.uniform_mix(prefill_sequences=1.0, prompt_tokens=32000.0),
                          step_only=True)["step_s"]).reshape(-1)[0])
    direct = IterationModel.on_device(spec, device, weight_dtype="published", mla_prefill=form)
    from jaxroof.parallel import layout as layout_lib
    layout = layout_lib.Layout(tp=8)
    link = layout_lib.links(layout, device)
    values = layout_lib.symbol_values(layout, spec, link)
    comm = {n: values[n] for n in layout_lib.COMM_SYMBOLS}
    on = direct.on_layout(**layout_lib.chip_shares(layout, spec),
                          comm=lambda rows: layout_lib.pass_comm(comm, rows))
    want = float(on.prefill(32000.0)["step_s"])
    assert got == pytest.approx(want, rel=1e-9)
  head = IterationModel.on_device(load_model("gemma-3-1b"), load_accelerator("h100-sxm"))
  assert head.constants["N_h"] > 0  # The LM head: costed per sampled row (n_samp), not per token.


def test_a_fixed_fleet_gets_its_best_configurations():
  spec = load_model("llama-3-8b")
  result = planner.plan(spec, load_accelerators("h100-sxm"), context=4096, prompt_tokens=2048,
                        output_tokens=256, chips=8, top=5, pools="shared",
                        targets=planner.Targets(token_gap_s=0.03, ttft_s=1.0))
  plans = result["plans"]
  assert plans and result["chips"] == 8
  rates = [p["tokens_per_s_per_chip"] for p in plans]
  assert rates == sorted(rates, reverse=True)
  for p in plans:
    assert p["chips"] == 8 and p["dp"] * p["tp"] * p["pp"] * p["ep"] == 8
    assert p["tokens_per_s_per_chip"] == pytest.approx(p["dp"] * p["max_rate_per_replica_s"] * 256 /
                                                       8)


@pytest.mark.parametrize("chips,needle", [(0, ">= 1"), (-4, ">= 1"), (1, "beyond the search")])
def test_a_fixed_fleet_refuses_what_it_cannot_be(chips, needle):
  with pytest.raises(InputError, match=needle) as caught:
    planner.plan(load_model("llama-3.1-70b"), load_accelerators("h100-sxm"), context=8192,
                 prompt_tokens=7000, output_tokens=1000, chips=chips,
                 targets=planner.Targets(token_gap_s=0.05, ttft_s=2.0))
  assert caught.value.field == "chips"


@pytest.mark.parametrize("flag,needle", [
    ("--chips=0", "--chips"),
    ("--chips=-2", "--chips"),
    ("--chips=2.5", "--chips"),
    ("--chips=1", "beyond the search"),
    ("--token_budget=1", "--token_budget"),
    ("--scheduler=static", "--scheduler"),
    ("--token_gap_ms=1", "closest plan"),
])
def test_plan_cli_refuses_fleets_schedulings_and_targets_in_one_line(flag, needle):
  proc = _run("experiments.plan", "--model=llama-3.1-70b", "--context=8192", "--prompt_tokens=7000",
              "--output_tokens=1000", "--token_gap_ms=50", "--ttft_ms=2000",
              "--accelerators=h100-sxm", "--top_k=0", "--weight_dtype=bf16",
              *([] if flag.startswith("--chips") else ["--arrival_rate=2"]), flag, timeout=180)
  assert proc.returncode == 2, proc.stdout
  lines = [l for l in proc.stderr.strip().splitlines() if l]
  assert len(lines) == 1 and needle in lines[0], proc.stderr


def test_microbatched_plans_run_as_virtual_engines():
  """A pp = m plan's m virtual engines (`replica.per_microbatch`): one engine's pass of
  B/m rows at the requests' mean context is the planner's token gap at B."""
  from jaxroof.parallel.layout import Layout
  from jaxroof.serving import replica
  from jaxroof.symbolic.step_model import StepModel
  spec = load_model("llama-3.1-70b")
  device = load_accelerator("mi300x")
  plans = planner.plan(spec, [device], top=200, **QUESTION)["plans"]
  row = next(p for p in plans if p["pp"] == 2 and p["microbatches"] == 2)
  r = replica.from_model(spec, device, context=8192, weight_dtype="bf16", kv_dtype="bf16",
                         step_model=StepModel.bound(), max_running=row["batch"],
                         layout=Layout(tp=row["tp"], pp=2, ep=row["ep"], microbatches=2))
  engine = replica.per_microbatch(r, 2)
  assert engine.max_running == row["batch"] // 2
  assert engine.total_pages == r.total_pages // 2
  rows = np.full(row["batch"] // 2, 7000 + 1000 / 2)  # The requests' mean context.
  step = float(
      engine.cost.evaluate(engine.cost.mix(rows), engine.step_model, step_only=True)["step_s"])
  assert step == pytest.approx(row["step_s"], rel=1e-3)


@pytest.mark.e2e
def test_the_question_sized_by_the_simulator(tmp_path):
  """The question with its top 5 simulated and sized: every sized plan meets its targets
  at p90 (TTFT, TPOT) with the p99 inter-token gap within the gap target, in every seed;
  re-ranked by the cost the simulator needed."""
  out = tmp_path / "plan.json"
  proc = _run("experiments.plan", "--model=llama-3.1-70b", "--context=8192", "--prompt_tokens=7000",
              "--output_tokens=1000", "--token_gap_ms=50", "--ttft_ms=2000",
              "--aggregate_tokens_per_s=10000", "--weight_dtype=bf16", "--kv_dtype=bf16",
              "--accelerators=h100-sxm,h200,mi300x",
              "--price_per_hour=h100-sxm=3.0,h200=3.8,mi300x=2.5", f"--json_out={out}",
              timeout=1800)
  assert proc.returncode == 0, proc.stderr
  data = json.loads(out.read_text())
  sized = [p for p in data["plans"] if p["simulated"]]
  assert len(sized) == 5
  for p in sized:
    s = p["simulated"]
    assert s["meets"] and s["replicas_needed"] is not None
    assert s["ttft_p90_s"] <= 2.0 and s["tpot_p90_s"] <= 0.05 and s["itl_p99_s"] <= 0.05
    assert all(r["meets"] for r in s["runs"] if r["replicas"] == s["replicas_needed"])
    assert len({r["seed"] for r in s["runs"] if r["replicas"] == s["replicas_needed"]}) >= 2
    assert min(r["requests"] - r["warmup"] for r in s["runs"]) >= 10 * p["max_running"]
  costs = [p["cost_per_hour"] for p in sized]
  assert costs == sorted(costs)
  assert "sim replicas" in proc.stdout


def test_with_prices_each_accelerator_counts_its_plans_in_cost_order():
  """Shared and split plans alike: the k-th cheapest plan of a kind is its rank k."""
  spec = load_model("llama-3.1-70b")
  devices = load_accelerators("h100-sxm,h200,mi300x")
  plans = planner.plan(spec, devices, prices=PRICES, top=8, **QUESTION)["plans"]
  assert {p["pools"]["kind"] for p in plans} == {"shared", "split"}
  for name in {p["accelerator"] for p in plans}:
    mine = [p for p in plans if p["accelerator"] == name]
    assert [p["rank_within_accelerator"] for p in mine] == list(range(1, len(mine) + 1))
    assert [p["cost_per_hour"] for p in mine] == sorted(p["cost_per_hour"] for p in mine)


def test_split_pools_cost_the_kv_transfer(question):
  split = [p for p in question["plans"] if p["pools"]["kind"] == "split"]
  assert split
  for p in split:
    pools = p["pools"]
    pre, dec = pools["prefill"], pools["decode"]
    assert pools["prefill_chips"] == pre["tp"] * pre["pp"] * pre["ep"] * pre["replicas"]
    assert pools["decode_chips"] == dec["tp"] * dec["pp"] * dec["ep"] * dec["replicas"]
    # Decode never pauses for a prefill: its gap is the step's; each decode replica
    # carries its share within its max rate.
    assert p["loaded_token_gap_s"] <= 0.05 * (1 + 1e-6)
    assert 10.0 / dec["replicas"] <= dec["max_rate_per_replica_s"] * (1 + 1e-9)
    # A 7000-token prompt's K/V (80 layers x 8 heads x 128 x 2 x 2 B = 327,680 B per
    # token) leaves each prefill chip over its scale-out link.
    net = load_accelerator(p["accelerator"]).links
    link = net.scale_out_bytes_per_s or net.collective_bytes_per_s
    by_hand = 7000 * 327680 / (pre["tp"] * pre["pp"] * pre["ep"] * link)
    assert pools["kv_transfer_s"] == pytest.approx(by_hand, rel=0.02)
    assert pools["kv_transfer_s"] < p["ttft_s"] <= p["ttft_p90_s"] <= 2.0 * (1 + 1e-6)


def test_identical_bytes_are_merged():
  spec = load_model("llama-3-8b")
  result = planner.plan(
      spec, load_accelerators("h100-sxm"), context=4096, prompt_tokens=2048, output_tokens=256,
      targets=planner.Targets(token_gap_s=0.05, ttft_s=1.0, arrival_rate_per_s=2.0),
      weight_dtypes=("bf16",), kv_dtypes=("fp8", "int8"), top=5)
  plans = result["plans"]
  assert plans
  # fp8 and int8 K/V: one byte per element each, the same step and memory: one row
  # (a split row of each bytes class, too).
  assert all(p["kv_dtype"] == "fp8" for p in plans)
  assert all(p["merged"] == [{"weight_dtype": "bf16", "kv_dtype": "int8"}] for p in plans)
  assert result["ranked_by"].startswith("chips within each accelerator")


def test_without_prices_kinds_are_not_compared():
  result = planner.plan(
      load_model("llama-3-8b"), load_accelerators("h100-sxm,tpu-v5e"), context=4096,
      prompt_tokens=2048, output_tokens=256,
      targets=planner.Targets(token_gap_s=0.05, ttft_s=1.0, arrival_rate_per_s=20.0), top=6)
  plans = result["plans"]
  assert all(p["cost_per_hour"] is None and p["cost_per_million_tokens"] is None for p in plans)
  # Rank 1 of each accelerator, then rank 2: chips compared only within a kind.
  assert [p["rank_within_accelerator"] for p in plans
         ] == sorted(p["rank_within_accelerator"] for p in plans)
  for name in ("h100-sxm", "tpu-v5e"):
    mine = [p["chips"] for p in plans if p["accelerator"] == name]
    assert mine == sorted(mine)


def test_max_chips_and_default_formats():
  result = planner.plan(
      load_model("llama-3-8b"), load_accelerators("h100-sxm"), context=4096, prompt_tokens=2048,
      output_tokens=256, max_chips=3, targets=planner.Targets(token_gap_s=0.05, ttft_s=1.0,
                                                              arrival_rate_per_s=20.0))
  assert result["plans"] and all(p["chips"] <= 3 for p in result["plans"])
  assert {p["weight_dtype"] for p in result["plans"]} == {"bf16 (published)"}
  assert {p["kv_dtype"] for p in result["plans"]} == {"bf16"}


def test_prices_parse_and_refuse():
  known = ("h100-sxm", "h200")
  assert planner.parse_prices("h100-sxm=3.0, h200=3.8", known) == {"h100-sxm": 3.0, "h200": 3.8}
  for bad in ("b300=3", "h100-sxm=0", "h100-sxm=-1", "h100-sxm", "h100-sxm=x", "h100-sxm=inf",
              "h100-sxm=1,h100-sxm=2"):
    with pytest.raises(InputError):
      planner.parse_prices(bad, known)


def test_a_format_without_a_datapath_says_its_fallback():
  notes = planner.format_notes(load_model("llama-3-8b"), [load_accelerator("a100-80gb")], ("fp8",))
  assert len(notes) == 1 and "fallback" in notes[0] and "bf16" in notes[0]


@pytest.mark.parametrize("flag,needle", [
    ("--price_per_hour=h100-sxm=3.0,b999=2", "b999"),
    ("--price_per_hour=h100-sxm=0", "> 0"),
    ("--price_per_hour=h100-sxm=-3", "> 0"),
    ("--weight_dtype=bf16,int3", "weight_dtype"),
    ("--output_distribution=lognormal --output_spread=1e308", "--output_spread=1e+308"),
    ("--output_distribution=uniform --output_spread=2", "(0, 1]"),
    ("--output_distribution=lognormal", "--output_spread=0.0"),
])
def test_plan_cli_bad_input_one_line(flag, needle):
  proc = _run("experiments.plan", "--model=llama-3-8b", "--context=4096", "--token_gap_ms=50",
              "--ttft_ms=1000", "--arrival_rate=2", "--accelerators=h100-sxm", "--top_k=0",
              *flag.split(), timeout=120)
  assert proc.returncode != 0
  lines = [l for l in proc.stderr.strip().splitlines() if l]
  assert len(lines) == 1 and needle in lines[0], proc.stderr


def test_plan_cli_fallback_note(tmp_path):
  out = tmp_path / "p.json"
  proc = _run("experiments.plan", "--model=llama-3-8b", "--context=4096", "--token_gap_ms=50",
              "--ttft_ms=1000", "--arrival_rate=2", "--accelerators=a100-80gb",
              "--weight_dtype=fp8", "--top_k=0", f"--json_out={out}", timeout=120)
  assert proc.returncode == 0, proc.stderr
  notes = [l for l in proc.stderr.splitlines() if l.startswith("note:")]
  assert len(notes) == 1 and "fallback" in notes[0]
  assert json.loads(out.read_text())["notes"]


def test_serving_pools_in_gpus_with_kv_transfer_and_fleet_aggregate(tmp_path):
  out = tmp_path / "serving.json"
  proc = _run("experiments.serving", "--model=llama-3.1-70b", "--accelerator=h100-sxm",
              "--context=8192", "--prompt_tokens=7000", "--output_tokens=1000", "--token_gap_ms=50",
              "--ttft_ms=2000", "--arrival_rate=10", "--tp=8", "--dp=4", "--weight_dtype=bf16",
              "--batch_sizes=1", "--aggregate_tokens_per_s=10000", f"--json_out={out}")
  assert proc.returncode == 0, proc.stderr
  data = json.loads(out.read_text())
  # The fleet's 10,000 tokens/s over 4 replicas: each replica's share is 2,500.
  assert data["inputs"]["aggregate_target_per_replica_tokens_per_s"] == pytest.approx(2500)
  assert data["decision"]["meets_aggregate_target"]
  pools = data["pools"]
  assert pools["arrival_rate_per_s"] == 10  # The fleet's rate, not one replica's.
  assert pools["chips_per_replica"] == 8
  split, shared = pools["split"], pools["shared"]
  assert split["gpus"] == 8 * (split["prefill_chips"] + split["decode_chips"])
  assert shared["gpus"] == 8 * shared["chips"]
  # One chip's K/V share of a 7000-token prompt (80 layers x 8 K/V heads x 128 x 2 x 2 B
  # per token, over tp = 8) crosses H100's 50 GB/s scale-out link.
  assert split["kv_transfer_s"] == pytest.approx(7000 * 327680 / 8 / 50e9, rel=0.02)
  assert "GPUs" in proc.stdout and f"shared {shared['gpus']} GPUs" in proc.stdout


def test_tensor_parallel_over_pcie_is_labelled(tmp_path):
  from jaxroof.parallel import layout as layout_lib

  l4 = load_accelerator("l4")
  link = layout_lib.links(layout_lib.Layout(tp=2), l4)
  assert link.network == "pcie" and "PCIe" in link.note
  assert link.bytes_per_s == l4.links.collective_bytes_per_s  # The recorded 31 GB/s.
  out = tmp_path / "s.json"
  proc = _run("experiments.serving", "--model=llama-3-8b", "--accelerator=l4", "--context=2048",
              "--tp=2", "--token_gap_ms=100", "--batch_sizes=1,8", "--prompt_tokens=512",
              "--output_tokens=64", f"--json_out={out}", timeout=120)
  assert proc.returncode == 0, proc.stderr
  data = json.loads(out.read_text())
  assert data["decision"]["comm_s"] > 0
  assert "pcie" in json.dumps(data).lower()


def test_microbatches_run_in_simulate_and_are_refused_by_serving(tmp_path):
  common = [
      "--model=llama-3.1-70b", "--accelerator=mi300x", "--tp=4", "--pp=2", "--microbatches=2",
      "--context=8192", "--prompt_tokens=7000", "--output_tokens=1000"
  ]
  proc = _run("experiments.serving", *common, "--arrival_rate=10", "--token_gap_ms=50",
              "--ttft_ms=2000")
  assert proc.returncode == 2 and "--microbatches=2 is not allowed" in proc.stderr
  out = tmp_path / "sim.json"
  proc = _run("experiments.simulate", *common, "--max_running=128", "--arrival_rate=2.5",
              "--num_requests=60", f"--json_out={out}")
  assert proc.returncode == 0, proc.stderr
  result = json.loads(out.read_text())
  assert len(result["replicas"]) == 2  # One virtual engine per microbatch.
  assert result["metrics"]["completed"] == 60


def test_sizing_side_by_side_is_sizing_in_order():
  """Plans sized over two worker processes: the same sizes and figures as one by one."""
  spec, devices = load_model("llama-3-8b"), load_accelerators("h100-sxm")
  question = dict(
      context=2048, prompt_tokens=1024, output_tokens=64, weight_dtypes=("bf16",),
      kv_dtypes=("bf16",), targets=planner.Targets(token_gap_s=0.03, ttft_s=1.0,
                                                   aggregate_tokens_per_s=3000.0))
  runs = [
      plan_check.check_top(planner.plan(spec, devices, **question), spec, devices, k=2,
                           workers=workers) for workers in (1, 2)
  ]
  one, two = ([(p["simulated"]["replicas_needed"], p["simulated"]["ttft_p90_s"]) for p in r["plans"]
               if p.get("simulated")] for r in runs)
  assert one and one == two


def test_sized_plans_are_ranked_again_within_each_accelerator():
  """Sizing in simulation can change a plan's chips: the sized plans are ordered again as the
  search orders them (without prices, chips within each accelerator, rank 1 of each kind
  first), and each accelerator's plans count 1, 2, ... down the list."""

  def row(accelerator: str, chips: int, headroom: float) -> dict:
    return {
        "accelerator": accelerator, "chips": chips, "headroom": headroom, "rank": 0,
        "rank_within_accelerator": 0
    }

  # A split h200 plan sized to the same chips as the shared one, with more headroom.
  sized = [
      row("mi300x", 17, 0.1),
      row("h200", 24, 0.1),
      row("h200", 24, 0.3),
      row("h100-sxm", 28, 0.2),
      row("h100-sxm", 30, 0.2)
  ]
  rest = [row("mi300x", 24, 0.1), row("h100-sxm", 32, 0.1)]
  devices = load_accelerators("mi300x,h200,h100-sxm")  # The search's order of kinds.
  out = plan_check.reranked(sized, rest, devices, fixed=False, priced=False)
  assert [p["rank"] for p in out] == list(range(1, len(out) + 1))
  for name in ("mi300x", "h200", "h100-sxm"):
    mine = [p for p in out if p["accelerator"] == name]
    assert [p["rank_within_accelerator"] for p in mine] == list(range(1, len(mine) + 1))
  # Rank 1 of each kind first (kinds in the search's order), then rank 2.
  assert [(p["accelerator"], p["rank_within_accelerator"]) for p in out[:3]] == [("mi300x", 1),
                                                                                 ("h200", 1),
                                                                                 ("h100-sxm", 1)]
  assert out[1]["headroom"] == 0.3  # The tie at 24 chips: more headroom first.
  assert out[-2:] == rest
