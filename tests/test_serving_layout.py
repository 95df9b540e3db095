"""Serving and the simulator on a parallel layout (issue 12 section 5).

One chip must reproduce today's numbers exactly; several chips take one
chip's traffic along a token's path plus the communication of each pass,
and fit the busiest chip's memory. Expectations come from the layout
sweep (an independent wiring of the same symbolic terms), from the
Megatron collective count written out by hand, or from properties.
"""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from jaxroof.errors import InputError
from jaxroof.parallel import layout as layout_lib
from jaxroof.parallel.layout import Layout
from jaxroof.parallel.layout_sweep import layout_sweep
from jaxroof.serving import decision, multichip, replica, requests
from jaxroof.specs.accelerators import load_accelerator
from jaxroof.specs.models import load_model
from jaxroof.specs.parameters import parameter_counts
from jaxroof.symbolic.step_model import StepModel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC, DEVICE = load_model("llama-3-8b"), load_accelerator("h100-sxm")
P, G = 1024, 64


def _inputs(layout):
  return multichip.model_inputs(SPEC, DEVICE, layout=layout, prompt_tokens=P, output_tokens=G)


def test_one_chip_is_todays_serving_inputs_and_rows():
  today = requests.model_inputs(SPEC, DEVICE, prompt_tokens=P, output_tokens=G)
  one = _inputs(Layout())
  assert one == today
  model = StepModel.bound()
  for a, b in zip(requests.rows(model, one, [1, 16, 64], prompt_tokens=P, output_tokens=G),
                  requests.rows(model, today, [1, 16, 64], prompt_tokens=P, output_tokens=G)):
    assert a == b
    assert a["comm_s"] == 0.0 and a["chips"] == 1


def test_decode_steps_on_tp2_equal_the_layout_sweep():
  """Each decode step at context P + j is the layout sweep's step at that context (at the
  batch that fits, where serving reads its weights: the embedding rows grow with B)."""
  inputs = _inputs(Layout(tp=2))
  fit = inputs.max_batch_in_memory
  steps = requests.decode_steps(StepModel.bound(), inputs, [fit], P, G)
  for j in (1, G - 1):
    sweep = layout_sweep(SPEC, DEVICE, context=P + j, batch_sizes=[fit], layout=Layout(tp=2),
                         max_new_tokens=G)
    expected = [row["step_s"] for row in sweep["rows"]]
    np.testing.assert_allclose(steps[:, j - 1], expected, rtol=1e-12)
  at_prompt = layout_sweep(SPEC, DEVICE, context=P, batch_sizes=[fit], layout=Layout(tp=2),
                           max_new_tokens=G)  # Both reserve P + G tokens per sequence.
  assert at_prompt["summary"]["max_batch_in_memory"] == fit


def test_comm_is_megatrons_all_reduces_and_logits_gather():
  """2 all-reduces per block + 1 for the embedding, bf16 (B, D); logits all-gathered; each
  collective NCCL's base latency plus the cheaper of ring and one-shot (NVSwitch)."""
  tp, batch = 4, 16.0
  inputs = _inputs(Layout(tp=tp))
  link = layout_lib.links(Layout(tp=tp), DEVICE)
  w, hop, base = link.bytes_per_s, link.hop_latency_s, link.base_latency_s
  assert base == pytest.approx(6.6e-6)  # NCCL tuning.cc baseLat, ring LL.
  d, v, blocks = SPEC.hidden_size, SPEC.vocab_size, SPEC.num_layers
  size = batch * d * 2
  allreduce = base + min(2 * (tp - 1) / tp * size / w + 2 * (tp - 1) * hop,
                         (tp - 1) * size / w + hop)
  gather = base + (tp - 1) / tp * batch * v * 2 / w + hop  # Direct: one step.
  expected = (2 * blocks + 1) * allreduce + gather
  assert float(requests.comm_s(inputs, batch)) == pytest.approx(expected, rel=1e-12)
  prefill = requests.prefill(inputs, P, 1.0)
  assert float(prefill["comm_s"]) == pytest.approx(float(requests.comm_s(inputs, float(P))),
                                                   rel=1e-12)


def test_per_chip_memory_fit_and_traffic():
  today = _inputs(Layout())
  tp2 = _inputs(Layout(tp=2))
  m = today.memory
  usable = m["memory_capacity_bytes"] * (1 - m["workspace_fraction"])
  expected = math.floor(
      (usable - m["resident_weight_bytes"] / 2) / (m["kv_allocated_bytes_per_sequence"] / 2))
  assert tp2.max_batch_in_memory == expected > today.max_batch_in_memory
  # N is read at each fit batch (the embedding rows grow with B): equal to 1e-3.
  assert tp2.N == pytest.approx(today.N / 2, rel=1e-3) and tp2.k == pytest.approx(today.k / 2)
  assert tp2.N_act == pytest.approx(today.N_act / 2)


def test_fleet_rates_are_dp_times_a_replica():
  model = StepModel.bound()
  one, fleet = _inputs(Layout(tp=2)), _inputs(Layout(tp=2, dp=3))
  for a, b in zip(requests.rows(model, one, [8], prompt_tokens=P, output_tokens=G),
                  requests.rows(model, fleet, [8], prompt_tokens=P, output_tokens=G)):
    assert b["aggregate_tokens_per_s"] == a["aggregate_tokens_per_s"]
    assert b["fleet_tokens_per_s"] == pytest.approx(3 * a["aggregate_tokens_per_s"])
    assert b["chips"] == 6
  d = decision.decide(model, fleet, prompt_tokens=P, output_tokens=G, token_gap_s=0.02)
  assert d["fleet_aggregate_tokens_per_s"] == pytest.approx(3 * d["aggregate_tokens_per_s"])


def test_decision_says_when_communication_binds():
  """A slow link (1 ms per hop) makes the collectives outweigh a tiny model's floor: the
  gap target binds (at p99: iterations carrying a prompt reach it) and the decision says
  communication makes the step. (At a 200 ms target the slots fill first.)"""
  comm = dict(tp=8.0, pp=1.0, ep=1.0, n_blk=32.0, L_moe=0.0, K=1.0, D=4096.0, V=32000.0, a_act=2.0,
              W_ic=1e11, t_hop=1e-3, t_base=0.0, h_tp=7.0, x_os=1.0)
  inputs = requests.ServingInputs(N=1e9, N_act=1e9, q=2.0, k=1e4, BW=2e12, F=1e15, comm=comm,
                                  chips_per_replica=8)
  d = decision.decide(StepModel.bound(), inputs, prompt_tokens=128, output_tokens=16,
                      token_gap_s=0.1, with_elasticities=False)
  assert d["binds"] == "communication"
  assert d["comm_s"] > d["step_s"] / 2


def test_a_tp_that_does_not_divide_the_heads_is_refused():
  with pytest.raises(InputError, match="^tp=3 does not divide") as caught:
    _inputs(Layout(tp=3))
  assert caught.value.field == "tp"


def test_simulator_one_chip_unchanged_and_tp2_per_chip():
  today = replica.from_model(SPEC, DEVICE, context=2048)
  one = replica.from_model(SPEC, DEVICE, context=2048, layout=Layout())
  assert one.total_pages == today.total_pages
  assert one.description["cost_constants"] == today.description["cost_constants"]
  mix = today.cost.mix([2048.0] * 3, [5000.0], [100.0])
  assert (one.cost.evaluate(mix, one.step_model)["step_s"] == today.cost.evaluate(
      mix, today.step_model)["step_s"])
  tp2 = replica.from_model(SPEC, DEVICE, context=2048, layout=Layout(tp=2))
  # Pages: the busiest chip's memory over one chip's half page (8 K/V heads split by 2).
  page = today.description["page_bytes"]
  usable = DEVICE.memory_capacity_bytes * 0.9 - parameter_counts(SPEC).total * 2 / 2
  assert tp2.total_pages == pytest.approx(usable // (page / 2), abs=1)
  # A one-sequence decode is memory-bound: half the weights and K/V, plus one pass's comm.
  memory = float(today.cost.decode(1.0, 2048.0)["memory_s"]) / 2
  comm = float(requests.comm_s(_inputs(Layout(tp=2)), 1.0))
  assert float(tp2.cost.decode(1.0, 2048.0)["step_s"]) == pytest.approx(memory + comm, rel=1e-9)


def _run(module, *flags):
  return subprocess.run([sys.executable, "-m", f"experiments.{module}", *flags], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_serving_cli_with_a_layout(tmp_path):
  out = tmp_path / "s.json"
  proc = _run("serving", "--model=llama-3-8b", "--accelerator=h100-sxm", "--token_gap_ms=20",
              "--batch_sizes=1,8", "--output_tokens=16", "--tp=2", "--dp=2", "--arrival_rate=4",
              f"--json_out={out}")
  assert proc.returncode == 0, proc.stderr
  data = json.loads(out.read_text())
  assert data["inputs"]["layout"]["chips"] == 4
  assert data["inputs"]["arrival_rate_per_replica_s"] == 2.0
  assert all(row["comm_s"] > 0 and row["chips"] == 4 for row in data["requests"])
  assert data["decision"]["fleet_aggregate_tokens_per_s"] == pytest.approx(
      2 * data["decision"]["aggregate_tokens_per_s"])
  bad = _run("serving", "--token_gap_ms=20", "--tp=2")
  assert bad.returncode == 2 and "--tp" in bad.stderr and "Traceback" not in bad.stderr
  bad = _run("serving", "--model=llama-3-8b", "--accelerator=h100-sxm", "--token_gap_ms=20",
             "--tp=3")
  assert bad.returncode == 2 and "--tp=3" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.slow
def test_simulate_cli_with_a_layout(tmp_path):
  out = tmp_path / "sim.json"
  proc = _run("simulate", "--model=llama-3-8b", "--accelerator=h100-sxm", "--context=2048",
              "--num_requests=50", "--arrival_rate=4", "--tp=2", "--dp=2", f"--json_out={out}")
  assert proc.returncode == 0, proc.stderr
  data = json.loads(out.read_text())
  assert data["replica"]["layout"]["tp"] == 2
  assert data["fleet"]["replicas"] == 2 and len(data["replicas"]) == 2
  # Two replicas behind a round-robin router: the fleet serves what they serve between them,
  # each about half of it.
  per_replica = [r["metrics"]["request_throughput_per_s"] for r in data["replicas"]]
  assert data["fleet"]["request_throughput_per_s"] == pytest.approx(
      data["metrics"]["request_throughput_per_s"])
  assert all(x == pytest.approx(data["fleet"]["request_throughput_per_s"] / 2, rel=0.2)
             for x in per_replica)


@pytest.mark.parametrize("module, flags, needle", [
    ("serving", ("--token_gap_ms=20", "--model=llama-3-8b", "--accelerator=h100-sxm",
                 "--weight_dtype=fp7"), "--weight_dtype"),
    ("serving", ("--token_gap_ms=20", "--block_size=32"), "--block_size"),
    ("simulate", ("--model=llama-3-8b", "--accelerator=h100-sxm", "--context=64", "--block_size=0"),
     "--block_size"),
])
def test_shared_model_flags_refuse_bad_values_in_one_line(module, flags, needle):
  proc = _run(module, *flags)
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], proc.stderr


@pytest.mark.slow
def test_serving_what_if_with_a_model_is_labelled(tmp_path):
  """--bandwidth_tbps with --model: twice the datasheet's 3.35 TB/s halves memory-bound steps."""
  base, fast = tmp_path / "b.json", tmp_path / "f.json"
  args = ("--model=llama-3-8b", "--accelerator=h100-sxm", "--token_gap_ms=20", "--batch_sizes=1,8",
          "--output_tokens=16")
  assert _run("serving", *args, f"--json_out={base}").returncode == 0
  proc = _run("serving", *args, "--bandwidth_tbps=6.7", f"--json_out={fast}")
  assert proc.returncode == 0, proc.stderr
  assert "what-if" in proc.stdout
  a, b = json.loads(base.read_text()), json.loads(fast.read_text())
  assert len(b["inputs"]["memory"]["what_if"]) == 1 and not a["inputs"]["memory"]["what_if"]
  for ra, rb in zip(a["requests"], b["requests"]):
    assert rb["decode_s"] == pytest.approx(ra["decode_s"] / 2, rel=1e-9)
