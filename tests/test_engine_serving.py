"""`--engine` on serving, simulate and plan: an engine's predictions lead, each never faster
than the bound beside it, labelled with the engine and its held-out error; the engine's
scheduler defaults and memory reservation drive the replica; refusals are one line."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from jaxroof import errors
from jaxroof.engines import engine_rules
from jaxroof.parallel import engine_drive
from jaxroof.parallel import engine_plan
from jaxroof.parallel import planner
from jaxroof.serving import engine_serving
from jaxroof.serving import arrivals
from jaxroof.serving import metrics
from jaxroof.serving import replica
from jaxroof.serving import serving_result
from jaxroof.serving import simulator
from jaxroof.specs import accelerators
from jaxroof.specs import models

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H100 = accelerators.load_accelerator("h100-sxm")
LLAMA = models.load_model("llama-3-8b")
ERRORS = ("median_rel_error", "p90_rel_error", "max_rel_error")


def run(module, *flags):
  return subprocess.run([sys.executable, "-m", f"experiments.{module}", *flags], cwd=ROOT,
                        capture_output=True, text=True, timeout=600)


def _question(**kw):
  return serving_result.Question(prompt_tokens=kw.get("prompt_tokens", 1024), output_tokens=128,
                                 batch_sizes=[1, 8,
                                              64], token_gap_s=0.03, ttft_s=kw.get("ttft_s", 0.5),
                                 aggregate_tokens_per_s=None, arrival_rate_per_s=2.0, window_s=0.0,
                                 prefill_batch=1, scheduler=None, token_budget=None,
                                 model=LLAMA.name, accelerator=H100.name, kv_dtype="bf16")


@pytest.mark.parametrize("engine",
                         [pytest.param("vllm", marks=pytest.mark.e2e), "sglang", "trtllm"])
def test_an_engines_serving_answer_is_never_faster_than_the_bound(engine):
  d = engine_drive.drive(engine, H100)
  asked = _question()
  given = serving_result.model_inputs(LLAMA, H100, prompt_tokens=1024, output_tokens=128,
                                      context=None, what_ifs=[])
  inputs, question = engine_serving.prepare(d, given, asked, LLAMA)
  result = serving_result.result(d.model, inputs, question)
  engine_serving.serving_beside(result, d, asked, given)
  assert result["kind"] == "calibrated" and result["engine"] == engine
  assert set(result["heldout_error"]) == set(ERRORS) and engine in result["engine_label"]
  for row in result["requests"]:
    for key in ("prefill_s", "decode_s", "ttft_s", "mean_token_gap_s"):
      assert row[key] > row[f"bound_{key}"], (engine, row["batch"], key)
    assert row["aggregate_tokens_per_s"] < row["bound_aggregate_tokens_per_s"]
  decision = result["decision"]
  assert decision["max_arrival_rate_per_s"] <= decision["bound_max_arrival_rate_per_s"]
  # The scheduling is the engine's own; TTFT carries its per-request cost, the target as asked.
  assert decision["scheduler"] == d.scheduler
  assert result["inputs"]["ttft_target_s"] == asked.ttft_s
  assert question.ttft_s == pytest.approx(asked.ttft_s - engine_serving.t0_request(d))


def test_an_engines_running_cap_is_its_reservation_by_hand():
  # TensorRT-LLM: kv_cache_free_gpu_memory_fraction of what the weights and a budget-sized
  # workspace leave (x_free = 1), K/V for the whole request; capped by its max batch.
  s = engine_rules.settings("trtllm", H100)
  held = 30e9 + s["m_act"] * s["n_bud"] * 4096 + s["m_graph"]
  kv = s["u_mem"] * (H100.memory_capacity_bytes - held)
  fit = engine_drive.replica_sequences(s, capacity=H100.memory_capacity_bytes, chip_weights=30e9,
                                       chip_kv=1e8, width=4096)
  assert float(fit) == np.floor(kv / 1e8)
  assert engine_drive.kv_bytes(s, capacity=H100.memory_capacity_bytes, chip_weights=30e9,
                               width=4096) == pytest.approx(kv)
  pooled = engine_drive.replica_sequences(s, capacity=H100.memory_capacity_bytes, chip_weights=30e9,
                                          chip_kv=1e6, width=4096, ep=4)
  assert float(pooled) == min(4 * np.floor(kv / 1e6), s["n_max"])
  r = replica.from_model(LLAMA, H100, context=2048, reservation=s)
  plain = replica.from_model(LLAMA, H100, context=2048)
  assert r.total_pages != plain.total_pages


def test_the_simulated_engine_is_never_faster_than_its_bound_replica():
  d = engine_drive.drive("vllm", H100)
  r = replica.from_model(LLAMA, H100, context=2048, step_model=d.model, max_running=64,
                         token_budget=2048, reservation=d.settings)
  w = arrivals.synthetic(arrival="poisson", num_requests=120, arrival_rate=4.0, seed=0,
                         prompt_tokens=512, output_tokens=64)
  run_ = engine_serving.user_run(simulator.simulate(w, r, "chunked"), d)
  bound = simulator.simulate(w, engine_serving.bound_replica(r), "chunked")
  m, b = metrics.run_metrics(run_), metrics.run_metrics(bound)
  for key in ("ttft_s", "tpot_s", "e2el_s"):
    assert m[key]["median"] > b[key]["median"], key
  plain = simulator.simulate(w, r, "chunked")  # Its user waits t0_request more for a token.
  assert m["ttft_s"]["mean"] == pytest.approx(
      metrics.run_metrics(plain)["ttft_s"]["mean"] + engine_serving.t0_request(d))


def test_a_plan_with_an_engine_leads_with_its_prediction_the_bound_beside():
  result = engine_plan.plan(
      LLAMA, [H100], engine="trtllm", context=2048, prompt_tokens=1536, output_tokens=256, top=4,
      pools="shared", targets=planner.Targets(token_gap_s=0.03, ttft_s=1.0,
                                              aggregate_tokens_per_s=20000))
  assert result["kind"] == "calibrated" and result["engine"] == "trtllm"
  assert set(result["heldout_error"]) == set(ERRORS)
  assert result["plans"] and result["bound"]["best"] is not None
  for p in result["plans"]:
    assert p["scheduler"] == "iteration"  # TensorRT-LLM's own: no chunked context.
    if p["bound_tokens_per_s_per_chip"] is not None:
      assert p["step_s"] > p["bound_step_s"] or p["max_running"] != p["bound_max_running"]
      assert p["prefill_s"] > p["bound_prefill_s"]
  assert result["plans"][0]["chips"] >= result["bound"]["best"]["chips"]


def test_an_engine_that_does_not_cover_an_accelerator_is_refused_by_the_planner():
  with pytest.raises(errors.InputError, match="no rule to derive one"):
    engine_drive.drives("trtllm", [accelerators.load_accelerator("mi300x")])


def test_simulate_with_an_engine_labels_its_metrics(tmp_path):
  out = tmp_path / "sim.json"
  done = run("simulate", "--model=llama-3-8b", "--accelerator=h100-sxm", "--context=2048",
             "--num_requests=60", "--arrival_rate=4", "--prompt_tokens=256", "--output_tokens=32",
             "--engine=trtllm", f"--json_out={out}")
  assert done.returncode == 0, done.stderr
  result = json.loads(out.read_text())
  assert (result["kind"], result["engine"]) == ("calibrated", "trtllm")
  assert set(result["heldout_error"]) == set(ERRORS)
  assert result["engine_defaults_applied"]["scheduler"] == "iteration"
  assert result["metrics"]["tpot_s"]["mean"] > result["metrics"]["bound_tpot_s"]["mean"]
  assert "trtllm on h100-sxm" in done.stdout and "held-out" in done.stdout
  assert "analytic iteration bound, beside" in done.stdout


@pytest.mark.parametrize("extra", [("--dp=2",), ("--find_max_rate", "--ttft_ms=500")])
def test_simulate_applies_the_engines_cost_per_request_to_fleets_and_the_max_rate(tmp_path, extra):
  out = tmp_path / "sim.json"
  done = run("simulate", "--model=llama-3-8b", "--accelerator=h100-sxm", "--context=2048",
             "--num_requests=60", "--arrival_rate=4", "--prompt_tokens=256", "--output_tokens=32",
             "--engine=trtllm", *extra, f"--json_out={out}")
  assert done.returncode == 0, done.stderr
  result = json.loads(out.read_text())
  t0 = engine_serving.t0_request(engine_drive.drive("trtllm", H100))
  assert t0 > 0 and result["t0_request_s"] == t0  # The cost the runs' TTFTs were given.
  if "--dp=2" in extra:  # Every TTFT is at least the cost: the median too.
    assert result["metrics"]["ttft_s"]["median"] > t0
  else:  # The simulated answer labelled as such; it starts from the load model's (the bound's).
    assert result["label"].startswith("simulated") and result["analytic_label"].startswith(
        "analytic bound")
    assert result["start_rate_per_s"] == result["analytic_max_rate_per_s"] > 0
    assert result["tried"][0]["rate_per_s"] == result["start_rate_per_s"]
    assert "the load model's max rate" in result["start"] and "bisected from" in done.stdout


@pytest.mark.parametrize("module, flags", [
    ("serving", ("--model=llama-3-8b", "--accelerator=h100-sxm", "--token_gap_ms=30")),
    ("simulate", ("--model=llama-3-8b", "--accelerator=h100-sxm", "--context=2048")),
    ("plan", ("--model=llama-3-8b", "--context=2048", "--token_gap_ms=30", "--ttft_ms=500",
              "--aggregate_tokens_per_s=1000", "--accelerators=h100-sxm")),
])
def test_an_unknown_engine_is_one_line(module, flags):
  done = run(module, *flags, "--engine=trtlm")
  assert done.returncode == 2
  lines = [l for l in done.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and "Did you mean 'trtllm'" in lines[0], done.stderr


def test_the_report_summary_leads_with_an_engines_predictions(tmp_path):
  from jaxroof.report import summary_section
  from jaxroof.serving import answer
  subject = answer.Subject(engine="trtllm", accelerators=("h100-sxm", "tpu-v5e"))
  summary = answer.summarise(subject, str(tmp_path))
  h100, tpu = summary["accelerators"]
  c = h100["calibrated"]
  assert c["engine"] == "trtllm" and set(c["heldout_error"]) == set(ERRORS)
  assert c["aggregate_tokens_per_s"] < h100["bound"]["aggregate_tokens_per_s"]
  assert tpu["calibrated"] is None and "no rule to derive one" in tpu["engine_note"]
  text = summary_section.report_section(summary, str(tmp_path))
  assert "predictions of trtllm" in text
  assert text.index("Predicted by **trtllm**") < text.index("| accelerator |")
  with pytest.raises(errors.InputError, match="Did you mean 'trtllm'"):
    answer.Subject(engine="trtlm").check()


def test_plan_percentiles_are_checked_in_one_line():
  with pytest.raises(errors.InputError, match="itl_percentile=150"):
    planner.Targets(token_gap_s=0.03, ttft_s=1.0, itl_quantile=1.5)
  done = run("plan", "--model=llama-3-8b", "--context=2048", "--token_gap_ms=30", "--ttft_ms=500",
             "--aggregate_tokens_per_s=1000", "--accelerators=h100-sxm", "--itl_percentile=0")
  assert done.returncode == 2 and "give --top_k=0" in done.stderr
  assert len([l for l in done.stderr.splitlines() if l.strip()]) == 1, done.stderr
