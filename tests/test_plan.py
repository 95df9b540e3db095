"""The planner answers the real question (issue 24): the workload with its prefill load,
the formats and prices a user allows, each top plan simulated."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from jaxroof.errors import InputError
from jaxroof.parallel import planner
from jaxroof.serving import arrivals, plan_check, split_simulation
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
  result = planner.plan(spec, devices, prices=PRICES, top=8, **QUESTION)
  plan_check.check_top(result, spec, devices, k=2, num_requests=300)
  return result


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True,
                        timeout=timeout)


def test_rows_carry_cost_pools_and_simulation(question):
  plans = question["plans"]
  assert plans and question["ranked_by"] == "cost per hour"
  for p in plans:
    assert p["weight_dtype"] == "bf16" and p["kv_dtype"] == "bf16"  # Only what was allowed.
    assert p["cost_per_hour"] == pytest.approx(p["chips"] * PRICES[p["accelerator"]])
    # 10 requests/s x 1000 tokens = 36 M tokens per hour.
    assert p["cost_per_million_tokens"] == pytest.approx(p["cost_per_hour"] / 36.0)
    if p["pools"]["kind"] == "shared":
      assert p["chips"] == p["tp"] * p["pp"] * p["ep"] * p["dp"]
      assert p["pools"]["prefill_chips"] == p["pools"]["decode_chips"] == p["chips"]
    else:
      assert p["pools"]["kind"] == "split"
      assert p["pools"]["prefill_chips"] + p["pools"]["decode_chips"] == p["chips"]
  simulated = [p for p in plans if p["simulated"] is not None]
  assert len(simulated) == 2
  for p in simulated:
    assert {"ttft_p90_s", "itl_p90_s", "tpot_p90_s", "meets"} <= set(p["simulated"])
  # Meeting plans first, missing plans last; cost order within each group.
  group = [
      0 if p["simulated"] and p["simulated"]["meets"] else 2 if p["simulated"] else 1 for p in plans
  ]
  assert group == sorted(group)


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


def test_prefill_load_is_in_the_feasibility(question):
  shared = [p for p in question["plans"] if p["pools"]["kind"] == "shared"]
  for p in shared:
    lam = 10.0 / p["dp"]
    assert p["arrival_rate_per_replica_per_s"] == pytest.approx(lam)
    # Independently: the prefill server's utilisation lam * (prefill + step) stays below 1,
    # and the requests fit the slots: lam <= 1 / (D + (G - 1) t / B).
    assert lam * (p["prefill_s"] + p["step_s"]) == pytest.approx(p["utilisation"])
    assert p["utilisation"] < 1
    assert lam <= 1 / (p["prefill_s"] + 999 * p["step_s"] / p["batch"]) * (1 + 1e-9)
    assert p["loaded_token_gap_s"] == pytest.approx(p["step_s"] / (1 - lam * p["prefill_s"]))
    assert p["loaded_token_gap_s"] <= 0.05 * (1 + 1e-9) and p["ttft_s"] <= 2.0 * (1 + 1e-9)
  fewest = {}
  for p in shared:
    fewest[p["accelerator"]] = min(fewest.get(p["accelerator"], 10**9), p["chips"])
  # The table, from serving: H100 32, H200 24, MI300X 20 (not 16, 8, 8).
  assert fewest.get("mi300x") == 20
  assert fewest.get("h200", 24) >= 24 and fewest.get("h100-sxm", 32) >= 32


def test_the_old_first_plan_is_unstable_and_no_longer_offered(question):
  spec = load_model("llama-3.1-70b")
  devices = load_accelerators("h100-sxm")
  batches = np.asarray(planner.BATCHES, dtype=float)
  grid = planner.build_grid(spec, devices, 8192, ("bf16",), ("bf16",), batches, 0.1)
  out = planner.evaluate_grid(grid, 8192)  # The old search: a full-context prompt, alone.
  ok = ((out["chip_bytes"] <= grid["capacity"]) & (out["step_s"] <= 0.05) &
        (out["prefill_s"] <= 2.0) & (np.mod(grid["B"], grid["microbatches"]) == 0))
  dp = np.ceil(10000.0 / out["aggregate_tokens_per_s"])
  chips = np.where(ok, dp * grid["tp"] * grid["pp"], np.inf)
  first = int(np.argmin(chips))
  old = dict(tp=int(grid["tp"][first]), pp=int(grid["pp"][first]), dp=int(dp[first]))
  assert chips[first] == 16  # The "plan's best" on H100.
  proc = _run("experiments.serving", "--model=llama-3.1-70b", "--accelerator=h100-sxm",
              "--context=8192", "--prompt_tokens=7000", "--output_tokens=1000", "--token_gap_ms=50",
              "--ttft_ms=2000", "--arrival_rate=10", "--weight_dtype=bf16", f"--tp={old['tp']}",
              f"--pp={old['pp']}", f"--dp={old['dp']}", "--batch_sizes=1")
  assert proc.returncode == 0, proc.stderr
  assert "unstable" in proc.stdout
  new = planner.plan(spec, devices, top=50, **QUESTION)["plans"]
  assert new and min(p["chips"] for p in new) > 16
  # No shared plan of that layout and dp (a split plan may decode on tp8 x 2 beside its
  # prefill pool: more chips in all).
  assert not any((p["tp"], p["pp"], p["dp"]) == (old["tp"], old["pp"], old["dp"])
                 for p in new if p["pools"]["kind"] == "shared")


@pytest.mark.slow
def test_top_plan_through_serving_and_simulate(question, tmp_path):
  top = question["plans"][0]
  assert top["simulated"]["meets"]
  layout = [
      f"--accelerator={top['accelerator']}", f"--tp={top['tp']}", f"--pp={top['pp']}",
      f"--dp={top['dp']}", "--context=8192", "--prompt_tokens=7000", "--output_tokens=1000",
      "--weight_dtype=bf16", "--kv_dtype=bf16", "--model=llama-3.1-70b", "--arrival_rate=10"
  ]
  serving = tmp_path / "serving.json"
  proc = _run("experiments.serving", *layout, "--token_gap_ms=50", "--ttft_ms=2000",
              "--batch_sizes=1", f"--json_out={serving}")
  assert proc.returncode == 0, proc.stderr
  decision = json.loads(serving.read_text())["decision"]
  assert decision["status"] == "ok"
  assert decision["operating_point"]["stable"]
  assert decision["operating_point"]["token_gap_s"] <= 0.05
  assert decision["operating_point"]["ttft_s"] <= 2.0
  sim = tmp_path / "sim.json"
  proc = _run("experiments.simulate", *layout, f"--max_running={top['batch']}",
              "--num_requests=300", "--ttft_ms=2000", "--tpot_ms=50", f"--json_out={sim}")
  assert proc.returncode == 0, proc.stderr
  m = json.loads(sim.read_text())["metrics"]
  assert m["completed"] == 300
  assert m["ttft_s"]["p90"] <= 2.0 and m["tpot_s"]["p90"] <= 0.05


def test_split_pools_cost_the_kv_transfer(question):
  split = [p for p in question["plans"] if p["pools"]["kind"] == "split"]
  assert split
  for p in split:
    pools = p["pools"]
    pre, dec = pools["prefill"], pools["decode"]
    assert pools["prefill_chips"] == pre["tp"] * pre["pp"] * pre["ep"] * pre["replicas"]
    assert pools["decode_chips"] == dec["tp"] * dec["pp"] * dec["ep"] * dec["replicas"]
    # Decode never pauses for a prefill: its step is the gap; the requests fit its slots.
    assert p["step_s"] <= 0.05
    assert 10.0 / dec["replicas"] <= dec["batch"] / (999 * p["step_s"]) * (1 + 1e-9)
    # A 7000-token prompt's K/V (80 layers x 8 heads x 128 x 2 x 2 B = 327,680 B per
    # token) leaves each prefill chip over its scale-out link.
    net = load_accelerator(p["accelerator"]).links
    link = net.scale_out_bytes_per_s or net.collective_bytes_per_s
    by_hand = 7000 * 327680 / (pre["tp"] * pre["pp"] * pre["ep"] * link)
    assert pools["kv_transfer_s"] == pytest.approx(by_hand, rel=0.02)
    assert pools["kv_transfer_s"] < p["ttft_s"] <= 2.0


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


def test_the_question_runs_as_typed(tmp_path):
  out = tmp_path / "plan.json"
  proc = _run("experiments.plan", "--model=llama-3.1-70b", "--context=8192", "--prompt_tokens=7000",
              "--output_tokens=1000", "--token_gap_ms=50", "--ttft_ms=2000",
              "--aggregate_tokens_per_s=10000", "--weight_dtype=bf16", "--kv_dtype=bf16",
              "--accelerators=h100-sxm,h200,mi300x",
              "--price_per_hour=h100-sxm=3.0,h200=3.8,mi300x=2.5", f"--json_out={out}", "--top_k=1",
              "--sim_requests=100")
  assert proc.returncode == 0, proc.stderr
  data = json.loads(out.read_text())
  assert data["plans"] and data["ranked_by"] == "cost per hour"
  for p in data["plans"]:
    assert {"cost_per_hour", "cost_per_million_tokens", "pools", "simulated"} <= set(p)
    assert {"kind", "prefill_chips", "decode_chips"} <= set(p["pools"])
  simulated = [p["simulated"] for p in data["plans"] if p["simulated"]]
  assert len(simulated) == 1
  assert {"ttft_p90_s", "itl_p90_s", "tpot_p90_s", "meets"} <= set(simulated[0])


def test_split_plans_are_simulated_whole(question):
  """The question's cheapest split plan, through both pools: prefill queue, transfer, then
  a decode slot; its first token comes after its prefill and transfer."""
  split = next(p for p in question["plans"] if p["pools"]["kind"] == "split")
  spec = load_model("llama-3.1-70b")
  sim = plan_check.simulate_plan(spec, load_accelerator(split["accelerator"]), split, context=8192,
                                 prompt_tokens=7000, output_tokens=1000, fleet_rate=10.0,
                                 token_gap_s=0.05, ttft_s=2.0, num_requests=300, seeds=1)
  assert sim["simulated"].startswith("the whole split plan")
  assert sim["completed"] == 300 and sim["meets"]
  assert sim["tpot_p90_s"] <= 0.05
  w = arrivals.synthetic(arrival="poisson", num_requests=200, arrival_rate=10.0, seed=3,
                         prompt_tokens=7000, output_tokens=1000)
  run = split_simulation.simulate_split(spec, load_accelerator(split["accelerator"]), split, w,
                                        context=8192)
  # Every request: its prefill alone and its transfer before its first token; its tokens
  # all emitted; the decode pool takes it only after the transfer.
  # (The simulator's prefill is one chunk's iteration, within 3% of the planner's prefill.)
  floor = split["prefill_s"] + split["pools"]["kv_transfer_s"]
  assert np.all(run.first_token_s - run.arrival_s >= floor * 0.97)
  assert np.all(run.first_token_s >= run.decode_arrival_s)
  assert np.all(run.decode_arrival_s >= run.prefill_done_s)
  assert np.all(np.isfinite(run.finish_s)) and np.all(run.finish_s > run.first_token_s)


def test_microbatched_plans_run_as_virtual_engines():
  """A pp = m plan's m virtual engines (`replica.per_microbatch`): one engine's pass of
  B/m rows is exactly the planner's pipelined step `Max(m, pp) x stage(B/m)`."""
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
  rows = np.full(row["batch"] // 2, 8192.0)  # The planner's rows hold the full context.
  step = float(
      engine.cost.evaluate(engine.cost.mix(rows), engine.step_model, step_only=True)["step_s"])
  assert step == pytest.approx(row["step_s"], rel=1e-4)  # Hand-off latencies aside.


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
