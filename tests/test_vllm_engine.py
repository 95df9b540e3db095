"""The real-engine path without an engine (issue 25): model folder, server hygiene,
result validation, the replay of detailed results and held-out prediction.

The whole path with a real vLLM runs in `test_whole_path_with_a_real_engine`
(slow tier), only where $JAXROOF_VLLM_ENV names the engine's venv.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import pathlib
import re
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from jaxroof import errors
from jaxroof.measure import vllm_engine, vllm_model, vllm_results
from jaxroof.calibrate import engine_fit
from jaxroof.specs import models, what_if

DATA = pathlib.Path(__file__).parent / "data"
FIXTURE = DATA / "vllm_cpu_detailed_fixture.json"
CEILINGS = {
    "torch": "2.13.0+cpu", "threads": 1, "cpus": [1], "isa": "AVX512", "matmul_n": 2048,
    "bf16_matmul_s": [2 * 2048**3 / 4e11, 0.1], "fp32_matmul_s": [2 * 2048**3 / 1e11],
    "read_s": [512 * 2**20 / 2.5e10, 1.0], "read_mb": 512, "bf16_flops_per_s": 4e11,
    "fp32_flops_per_s": 1e11, "read_bytes_per_s": 2.5e10
}
REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(name="model_dir")
def _model_dir(tmp_path):
  return vllm_model.write_model_folder(str(tmp_path / "model"), "tiny-llama")["model_dir"]


@pytest.fixture(name="device_file")
def _device_file(tmp_path):
  path = tmp_path / "accelerator.json"
  entry = vllm_engine.accelerator_entry(CEILINGS, vllm_engine.ServerConfig())
  path.write_text(json.dumps({"accelerators": {"cpu-vllm-engine": entry}}))
  return str(path)


# The model folder.
def test_preset_folder_has_config_and_exact_word_level_tokenizer(model_dir):
  config = json.loads(pathlib.Path(model_dir, "config.json").read_text())
  assert config["architectures"] == ["LlamaForCausalLM"]
  assert (config["hidden_size"], config["num_hidden_layers"], config["head_dim"]) == (512, 4, 64)
  tok = json.loads(pathlib.Path(model_dir, "tokenizer.json").read_text())
  vocab = tok["model"]["vocab"]
  assert tok["model"]["type"] == "WordLevel" and len(vocab) == config["vocab_size"]
  # Decoding joins words with spaces (no decoder); the pre-tokenizer splits on spaces:
  # any id sequence survives decode -> encode unchanged, so prompt lengths are exact.
  ids = np.random.default_rng(0).integers(3, config["vocab_size"], 300)
  inverse = {i: w for w, i in vocab.items()}
  text = " ".join(inverse[int(i)] for i in ids)
  assert [vocab[w] for w in text.split()] == ids.tolist()
  assert tok["pre_tokenizer"] == {"type": "WhitespaceSplit"} and tok["decoder"] is None
  tok_config = json.loads(pathlib.Path(model_dir, "tokenizer_config.json").read_text())
  assert tok_config["eos_token"] == "w2" and config["eos_token_id"] == 2


def test_linear_shapes_of_one_block():
  small = vllm_model.PRESETS["small-llama"]  # 16 heads of 64, 4 K/V heads, MLP 2816.
  assert vllm_engine.linear_shapes(small) == [(1024, (16 + 8) * 64), (1024, 1024), (1024, 2 * 2816),
                                              (2816, 1024)]


def test_shipped_config_scaled_down_by_flags(tmp_path):
  out = vllm_model.write_model_folder(str(tmp_path / "m"), "llama-3-8b", {
      "num_layers": 2, "hidden_size": 256, "num_heads": 4, "num_kv_heads": 2,
      "intermediate_size": 512
  })
  c = out["config"]
  assert (c["num_hidden_layers"], c["hidden_size"], c["num_attention_heads"],
          c["num_key_value_heads"], c["intermediate_size"], c["head_dim"]) == (2, 256, 4, 2, 512,
                                                                               64)
  assert "_jaxroof_source" not in c and c["torch_dtype"] == "bfloat16"


@pytest.mark.parametrize("model, sizes, match", [
    ("tiny-llama", {"num_kv_heads": 3}, "num_kv_heads=3 does not divide"),
    ("tiny-llama", {"hidden_size": 500}, "does not divide hidden_size=500"),
    ("no-such-model", {}, "no-such-model"),
])
def test_bad_model_sizes_are_one_line_errors(model, sizes, match):
  with pytest.raises(errors.InputError, match=match) as info:
    vllm_model.scaled_config(model, sizes)
  assert "\n" not in str(info.value)


# The engine's environment and server hygiene.
def test_missing_engine_env_says_how_to_make_it(tmp_path):
  with pytest.raises(errors.InputError, match="vllm_setup.sh"):
    vllm_engine.engine_python(str(tmp_path / "none"))
  with pytest.raises(errors.InputError, match="vllm_setup.sh"):
    vllm_engine.engine_python("")


def test_port_in_use_is_refused():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    port = s.getsockname()[1]
    with pytest.raises(errors.InputError, match=f"port={port} is in use"):
      vllm_engine.require_free_port(port)
  assert vllm_engine.require_free_port(0) > 0


def test_commands_are_loopback_dummy_and_state_the_scheduler(tmp_path):
  config = vllm_engine.ServerConfig(max_num_seqs=8, max_num_batched_tokens=512)
  serve = vllm_engine.server_command("/env", "/m", config, 8123)
  for flag, value in (("--host", "127.0.0.1"), ("--load-format", "dummy"), ("--max-num-seqs", "8"),
                      ("--max-num-batched-tokens", "512"), ("--block-size", "128")):
    assert serve[serve.index(flag) + 1] == value
  assert "--enable-chunked-prefill" in serve
  spec = vllm_engine.BenchSpec(rate=2.0, prompt_tokens=128, output_tokens=32, num_prompts=10)
  bench = vllm_engine.bench_command("/env", "/m", 8123, spec, "/out", "r.json")
  assert bench[bench.index("--base-url") + 1] == "http://127.0.0.1:8123"
  assert "--save-detailed" in bench and "--ignore-eos" in bench
  env = vllm_engine.engine_environment(str(tmp_path), config)
  assert env["HF_HUB_OFFLINE"] == "1" and env["TMPDIR"].startswith(str(tmp_path))
  assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"


def test_server_log_gives_kv_capacity():
  log = ("INFO [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: "
         "enable_chunked_prefill=True, enable_prefix_caching=False\n"
         "(EngineCore pid=1) INFO [kv_cache_utils.py:2328] CPU KV cache size: 65,536 tokens, "
         "Maximum concurrency for 2,048 tokens per request: 32.00x\n")
  facts = vllm_engine.parse_server_log(log, block_size=128)
  assert facts == {"kv_cache_tokens": 65536, "kv_blocks": 512, "chunked_prefill_logged": True}
  assert vllm_engine.parse_server_log("", 128)["kv_blocks"] is None


_STUBBORN = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    print("TMPDIR=" + os.environ.get("TMPDIR", ""), flush=True)
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(600)"])
    print("stubborn server up", flush=True)
    time.sleep(600)
""")


def _fake_env(tmp_path) -> str:
  env = tmp_path / "env"
  (env / "bin").mkdir(parents=True)
  (env / "bin" / "python").symlink_to(sys.executable)
  vllm = env / "bin" / "vllm"
  vllm.write_text(f"#!{sys.executable}\n{_STUBBORN}")
  vllm.chmod(0o755)
  return str(env)


def test_unhealthy_server_is_stopped_with_its_children_and_the_log_shown(tmp_path):
  env = _fake_env(tmp_path)
  work = tmp_path / "work"
  work.mkdir()
  config = vllm_engine.ServerConfig()
  with pytest.raises(errors.InputError) as info:
    with vllm_engine.serving(env, str(tmp_path), config, vllm_engine.require_free_port(0),
                             str(work), start_timeout_s=3):
      pass
  message = str(info.value)
  assert "not healthy within 3 s" in message and "stubborn server up" in message
  assert "\n" not in message
  # The engine's IPC sockets live in TMPDIR: short enough for a Unix socket path, and
  # removed with the server when it is not inside the working folder.
  tmp = re.search(r"TMPDIR=(\S+)", message).group(1)
  assert len(tmp) <= vllm_engine.MAX_TMP_CHARS and not os.path.exists(tmp)
  leftover = subprocess.run(["pgrep", "-f", str(env)], capture_output=True, text=True)
  assert leftover.stdout.strip() == ""


def test_stop_kills_what_ignores_sigint(tmp_path):
  env = _fake_env(tmp_path)
  log = tmp_path / "log"
  with open(log, "w") as f:
    process = subprocess.Popen([os.path.join(env, "bin", "vllm")], stdout=f, start_new_session=True)
  server = vllm_engine.Server(process, 1, str(log))
  for _ in range(100):
    if "up" in log.read_text():
      break
    time.sleep(0.05)
  stopped = server.stop(grace_s=0.5)
  assert stopped["children"] >= 1 and stopped["left"] == []
  assert process.pid in stopped["killed_after_grace"]


def test_accelerator_file_is_in_the_shipped_schema(device_file):
  device = what_if.load_accelerator_file(device_file)
  assert device.memory_bandwidth_bytes_per_s == pytest.approx(2.5e10)
  assert device.flops_per_s["bf16"] == pytest.approx(4e11)


def test_bf16_slower_than_fp32_is_named():
  """Without AVX512-BF16 or AMX, vLLM's bf16 GEMMs fall back to torch at a few GFLOP/s:
  the run says so, with both rates; where bf16 is the faster, nothing is said."""
  note = vllm_engine.bf16_note({"bf16_flops_per_s": 2e8, "fp32_flops_per_s": 6e10})
  assert "0.2 GFLOP/s" in note and "60.0" in note and "AVX512-BF16" in note
  assert vllm_engine.bf16_note({"bf16_flops_per_s": 4e11, "fp32_flops_per_s": 1e11}) is None


def test_ceilings_are_the_fastest_repeat_within_and_the_median_over_measurements():
  """A measurement's fastest repeat is its ceiling (a repeat is only slowed down); over
  invocations the median, so that one fast invocation does not set the machine."""

  def at(bf16: float, read: float) -> dict:
    return {
        **CEILINGS, "bf16_matmul_s": [2 * 2048**3 / bf16, 2 * 2048**3 / (bf16 / 2)],
        "read_s": [512 * 2**20 / (read / 3), 512 * 2**20 / read]
    }

  measured = [at(4e11, 1.2e10), at(3e11, 1.6e10), at(5e11, 1.3e10)]
  rates = vllm_engine.ceiling_rates(measured)
  assert rates["bf16_flops_per_s"] == pytest.approx(4e11)  # Fastest repeats 4, 3, 5.
  assert rates["read_bytes_per_s"] == pytest.approx(1.3e10)  # Not the one fast 1.6e10.
  assert vllm_engine.ceiling_rates(measured[:1])["read_bytes_per_s"] == pytest.approx(1.2e10)
  entry = vllm_engine.accelerator_entry(measured, vllm_engine.ServerConfig())
  assert entry["memory_bandwidth_tb_s"] == pytest.approx(0.013)
  assert len(entry["measured"]) == 3
  assert "median over 3 measurement(s)" in entry["sources"]["memory_bandwidth_tb_s"]


def test_a_shrunk_matmul_is_rated_at_its_own_size():
  """Where one bf16 call at n = 2048 is slow (AVX2 only: 9 GFLOP/s), the ceiling times a
  smaller n on the engine's fastest path and records both: the rate is 2 n^3 over that n's
  time, and the accelerator file names the path and size."""
  shrunk = {
      **CEILINGS, "bf16_matmul_n": 1024, "bf16_matmul_s": [2 * 1024**3 / 9e9],
      "bf16_matmul_path": "F.linear", "fp32_matmul_n": 2048, "fp32_matmul_path": "torch.mm"
  }
  assert vllm_engine.ceiling_rates([shrunk])["bf16_flops_per_s"] == pytest.approx(9e9)
  source = vllm_engine.accelerator_entry(shrunk, vllm_engine.ServerConfig())["sources"]
  assert "bf16 by F.linear at n = 1024" in source["dense_tflops"]


# Result validation.
def test_detailed_fixture_is_accepted_and_bad_ones_refused(tmp_path):
  run = json.loads(FIXTURE.read_text())
  vllm_engine.check_detailed(run, "fixture")
  no_detail = {k: v for k, v in run.items() if k != "start_times"}
  with pytest.raises(errors.InputError, match="no per-request detail .*start_times"):
    vllm_engine.check_detailed(no_detail, "r.json")
  other = {**run, vllm_engine.RUN_KEY: {"vllm_version": "0.11.0"}}
  with pytest.raises(errors.InputError, match="written by vLLM 0.11.0"):
    vllm_engine.check_detailed(other, "r.json")
  ragged = {**run, "ttfts": run["ttfts"][:-1]}
  with pytest.raises(errors.InputError, match="differ in length"):
    vllm_engine.check_detailed(ragged, "r.json")


# The replay.
def test_detailed_run_replays_its_own_arrivals_lengths_and_percentiles():
  raw = json.loads(FIXTURE.read_text())
  [run] = vllm_results.read_runs([FIXTURE])
  np.testing.assert_allclose(run.arrival_s, np.asarray(raw["start_times"]) - 1000.0)
  workload = engine_fit.workload_of(run, seed=123)
  np.testing.assert_allclose(workload.arrival_s, run.arrival_s)
  assert workload.prompt_tokens.tolist() == raw["input_lens"]
  for metric in ("ttft", "tpot", "itl"):
    for q, key in ((50, f"median_{metric}_ms"), (90, f"p90_{metric}_ms")):
      assert vllm_results.measured_percentile(run, metric, q) == pytest.approx(raw[key] / 1e3)


def _run_with_server(kv_blocks=40, block=32, seqs=4):
  [run] = vllm_results.read_runs([FIXTURE])
  server = {
      "config": {
          "max_num_seqs": seqs, "max_num_batched_tokens": 256, "block_size": block,
          "chunked_prefill": True
      }, "kv_blocks": kv_blocks
  }
  return dataclasses.replace(run, server=server)


def test_replica_takes_the_servers_blocks_and_limits(model_dir, device_file):
  setup = engine_fit.ServingSetup(model=model_dir, accelerator="", scheduler="vllm",
                                  accelerator_file=device_file)
  replica = engine_fit.replica_of(_run_with_server(), setup, engine_fit.START)
  assert (replica.total_pages, replica.page_tokens, replica.max_running,
          replica.token_budget) == (40, 32, 4, 256)


def test_request_cost_adds_to_ttft_only(model_dir, device_file):
  setup = engine_fit.ServingSetup(model=model_dir, accelerator="", scheduler="vllm",
                                  accelerator_file=device_file)
  run = _run_with_server(kv_blocks=1000)
  base = engine_fit.simulate_run(run, setup, {**engine_fit.START, "t0_request": 0.0})
  cost = engine_fit.simulate_run(run, setup, {**engine_fit.START, "t0_request": 0.05})
  # Requests arrive ~0.5 s apart and finish in ~0.1 s: none overlaps, so the shift is exact.
  assert cost["median_ttft_s"] - base["median_ttft_s"] == pytest.approx(0.05, rel=1e-9)
  assert cost["median_tpot_s"] == pytest.approx(base["median_tpot_s"], rel=1e-12)
  assert cost["median_itl_s"] == pytest.approx(base["median_itl_s"], rel=1e-12)


def test_sequence_cost_lengthens_every_step_by_its_sequences(model_dir, device_file):
  """t0_seq adds to each iteration once per sequence in it: with requests that never
  overlap (one sequence a step) every token gap grows by t0_seq exactly; it is searched
  only with `sequence_cost`, and zero at the bound."""
  setup = engine_fit.ServingSetup(model=model_dir, accelerator="", scheduler="vllm",
                                  accelerator_file=device_file)
  run = _run_with_server(kv_blocks=1000)
  base = engine_fit.simulate_run(run, setup, {**engine_fit.START, "t0_seq": 0.0})
  cost = engine_fit.simulate_run(run, setup, {**engine_fit.START, "t0_seq": 2e-3})
  assert cost["median_tpot_s"] - base["median_tpot_s"] == pytest.approx(2e-3, rel=1e-6)
  assert cost["median_ttft_s"] - base["median_ttft_s"] == pytest.approx(2e-3, rel=1e-6)
  assert "t0_seq" not in setup.searched
  assert dataclasses.replace(setup, sequence_cost=True).searched[-1] == "t0_seq"
  assert engine_fit.BOUND_FACTORS["t0_seq"] == 0.0


def test_wake_cost_reaches_the_replica_and_is_paid_by_requests_that_find_it_idle(
    model_dir, device_file):
  """t_wake goes to the run's replica (`Replica.wake_s`): with requests that never overlap
  (each finds the engine idle) every TTFT grows by t_wake exactly and no decode gap moves;
  it is searched only with `wake_cost`, zero at the bound; a measured per-request cost is
  held (`request_seconds`), and holding and fitting it at once is refused."""
  setup = engine_fit.ServingSetup(model=model_dir, accelerator="", scheduler="vllm",
                                  accelerator_file=device_file)
  run = _run_with_server(kv_blocks=1000)
  base = engine_fit.simulate_run(run, setup, {**engine_fit.START, "t_wake": 0.0})
  cost = engine_fit.simulate_run(run, setup, {**engine_fit.START, "t_wake": 3e-3})
  assert engine_fit.replica_of(run, setup, {**engine_fit.START, "t_wake": 3e-3}).wake_s == 3e-3
  assert cost["median_ttft_s"] - base["median_ttft_s"] == pytest.approx(3e-3, rel=1e-6)
  for name in ("median_tpot_s", "median_itl_s", "p90_itl_s"):
    assert cost[name] == pytest.approx(base[name], rel=1e-12), name
  assert "t_wake" not in setup.searched
  assert dataclasses.replace(setup, wake_cost=True).searched[-1] == "t_wake"
  assert engine_fit.BOUND_FACTORS["t_wake"] == 0.0
  held = dataclasses.replace(setup, request_seconds=3.5e-3, wake_cost=True)
  assert held.held()["t0_request"] == 3.5e-3 and "t0_request" not in held.searched
  with pytest.raises(errors.InputError, match="request_seconds=0.0035 with request_cost"):
    dataclasses.replace(held, request_cost=True)
  with pytest.raises(errors.InputError, match="request_seconds=-1"):
    dataclasses.replace(setup, request_seconds=-1)
  still = dataclasses.replace(setup, wake_seconds=1.5e-3)
  assert engine_fit.replica_of(run, still, {**engine_fit.START, **still.held()}).wake_s == 1.5e-3
  with pytest.raises(errors.InputError, match="wake_seconds=0.0015 with wake_cost"):
    dataclasses.replace(still, wake_cost=True)


@pytest.mark.parametrize("fitted, held", [("--request_cost", "--engine_request_ms=3.5"),
                                          ("--wake_cost", "--engine_wake_ms=2.3")])
def test_a_fixed_cost_held_and_fitted_at_once_is_one_clean_error(model_dir, device_file, fitted,
                                                                 held):
  done = subprocess.run([
      sys.executable, "-m", "experiments.calibrate", "--source=vllm", f"--from_vllm={FIXTURE}",
      f"--model={model_dir}", f"--accelerator_file={device_file}", fitted, held
  ], capture_output=True, text=True, cwd=REPO, timeout=300)
  assert done.returncode != 0
  assert f"{held} with {fitted}" in done.stderr, done.stderr[-500:]
  assert "Traceback" not in done.stderr


def test_isolated_requests_are_simulated_one_sequence_a_step(model_dir, device_file):
  """A shipped isolated-request file (results/vllm_cpu/isolated_runs.py: rate inf, at most
  one request in flight) is a fit run of one sequence per step: its simulated TPOT is that
  of the same requests sent 30 s apart, and below that of all of them at once."""
  shipped = json.loads((DATA / "vllm_cpu/w512L4.json").read_text())
  [run] = vllm_results.read_runs([str(DATA / "vllm_cpu/w512L4.json")])
  assert run.max_concurrency == 1 and set(run.measured) == {"median_tpot_s"}
  assert run.measured["median_tpot_s"] == pytest.approx(shipped["median_tpot_ms"] / 1e3)
  setup = engine_fit.ServingSetup(model=model_dir, accelerator="", scheduler="vllm",
                                  accelerator_file=device_file, max_running=32)
  isolated = engine_fit.simulate_run(run, setup, engine_fit.START)["median_tpot_s"]
  apart = dataclasses.replace(run, max_concurrency=None, request_rate=1.0,
                              arrival_s=30.0 * np.arange(len(run.prompt_tokens)))
  assert isolated == pytest.approx(
      engine_fit.simulate_run(apart, setup, engine_fit.START)["median_tpot_s"], rel=1e-9)
  together = dataclasses.replace(run, max_concurrency=None)
  assert engine_fit.simulate_run(together, setup, engine_fit.START)["median_tpot_s"] > isolated


def test_heldout_rows_and_refusal(tmp_path, monkeypatch, model_dir, device_file):
  factors = {"eta_w": 0.5, "eta_f": 0.3, "t0_step": 2e-3, "t0_request": 0.01}
  monkeypatch.setattr(engine_fit, "search", lambda runs, setup, **_: (dict(factors), 0.0, 1))
  setup = engine_fit.ServingSetup(model=model_dir, accelerator="", scheduler="vllm",
                                  accelerator_file=device_file, request_cost=True)
  result = engine_fit.calibrate_engine([FIXTURE], setup, heldout_paths=[FIXTURE],
                                       heldout_model=model_dir)
  rows = result["heldout"]
  assert {(r["metric"], r["percentile"]) for r in rows
         } == {(m, q) for m in ("ttft", "tpot", "itl") for q in (50, 90)}
  for r in rows:
    assert r["rel_error"] == pytest.approx(
        abs(r["predicted_s"] - r["measured_s"]) / r["measured_s"])
    assert 0 < r["bound_s"] <= r["predicted_s"] * (1 + 1e-9) or r["metric"] == "itl"
  assert result["heldout_median_rel_error"] == pytest.approx(
      float(np.median([r["rel_error"] for r in rows])))
  assert result["factors"]["t0_request"] == pytest.approx(0.01)
  assert result["heldout_throughput"][0]["metric"] == "request_throughput"
  assert result["cdfs"][0]["measured"]["ttft"] == sorted(result["cdfs"][0]["measured"]["ttft"])
  bare = tmp_path / "bare.json"
  raw = json.loads(FIXTURE.read_text())
  bare.write_text(json.dumps({k: v for k, v in raw.items() if k != "itls"}))
  with pytest.raises(errors.InputError, match="no per-request detail"):
    engine_fit.calibrate_engine([FIXTURE], setup, heldout_paths=[str(bare)])


def test_layer_cost_is_searched_only_when_asked(model_dir, device_file):
  """t0_layer stays at engine_fit.FIXED unless `layer_cost`; searched, it lengthens every
  step by layers x t0_layer (the tiny preset has 4 layers)."""
  setup = engine_fit.ServingSetup(model=model_dir, accelerator="", scheduler="vllm",
                                  accelerator_file=device_file)
  assert "t0_layer" not in setup.searched
  layered = dataclasses.replace(setup, layer_cost=True)
  assert layered.searched[-1] == "t0_layer"
  run = _run_with_server(kv_blocks=1000)
  base = engine_fit.simulate_run(run, layered, {**engine_fit.START, "t0_layer": 1e-9})
  cost = engine_fit.simulate_run(run, layered, {**engine_fit.START, "t0_layer": 5e-4})
  assert cost["median_tpot_s"] - base["median_tpot_s"] == pytest.approx(4 * 5e-4, rel=1e-5)


def test_each_fit_run_is_simulated_on_its_own_model(tmp_path, monkeypatch, model_dir, device_file):
  """`fit_model` names each fitted file's model: the search sees runs of two sizes, and a
  larger model's run is slower under the same factors."""
  wider = vllm_model.write_model_folder(str(tmp_path / "wide"), "tiny-llama",
                                        {"hidden_size": 1024, "num_layers": 8})["model_dir"]
  seen = {}

  def fake_search(runs, setup, **_):
    seen.setdefault("models", [r.model for r in runs])  # The full fit (folds come after).
    return dict(engine_fit.START), 0.0, 1

  monkeypatch.setattr(engine_fit, "search", fake_search)
  setup = engine_fit.ServingSetup(model=model_dir, accelerator="", scheduler="vllm",
                                  accelerator_file=device_file)
  result = engine_fit.calibrate_engine([FIXTURE, FIXTURE], setup, fit_model=[model_dir, wider])
  assert seen["models"] == [model_dir, wider]
  assert result["source"]["fit_models"] == [model_dir, wider]
  small, large = (r["calibrated"]["median_tpot_s"]["simulated_s"] for r in result["runs"])
  assert large > 1.5 * small
  with pytest.raises(errors.InputError, match="fit_model names 3 models for 2 files"):
    engine_fit.calibrate_engine([FIXTURE, FIXTURE], setup, fit_model=[model_dir] * 3)
  for field in ("fit_model", "heldout_model"):
    with pytest.raises(errors.InputError, match="no such file") as raised:
      engine_fit.calibrate_engine([FIXTURE], setup, heldout_paths=[FIXTURE],
                                  **{field: str(tmp_path / "absent")})
    assert raised.value.field == field


def test_calibrate_engine_cli_with_accelerator_file(tmp_path, model_dir, device_file):
  out = tmp_path / "cal.json"
  done = subprocess.run([
      sys.executable, "-m", "experiments.calibrate_engine", f"--from_vllm={FIXTURE}",
      f"--heldout_vllm={FIXTURE}", f"--model={model_dir}", f"--accelerator_file={device_file}",
      "--scheduler=vllm", "--request_cost", "--max_simulations=12", "--engine_overlap=0.06",
      "--engine_m_pass=256", "--engine_eta_kv=0.23", "--engine_eta_attn=0.26",
      "--engine_cache_mb=50", "--engine_cache_gbps=22", "--engine_build_us=9",
      "--engine_act_ns=1.5", "--engine_cold_share=1", "--engine_cache_lru=1", f"--json_out={out}"
  ], capture_output=True, text=True, cwd=REPO, timeout=600)
  assert done.returncode == 0, done.stderr[-2000:]
  result = json.loads(out.read_text())
  assert result["heldout"] and math.isfinite(result["heldout_median_rel_error"])
  assert set(result["factors"]) >= {"eta_w", "eta_f", "t0_step", "t0_request"}
  assert all(0 < result["factors"][n] <= 1 for n in ("eta_w", "eta_f"))
  # Every held engine term reaches the fit, as measured.
  assert result["fixed"] == {
      "t0_layer": 1e-9, "r_ovl": 0.06, "eta_kv": 0.23, "eta_attn": 0.26, "m_pass": 256,
      "c_llc": 5e7, "bw_llc": 2.2e10, "s_lru": 1.0, "t_build": 9e-6, "t_act": 1.5e-9, "s_cold": 1.0
  }
  assert result["factors"]["t_act"] == 1.5e-9 and result["factors"]["s_cold"] == 1.0
  assert result["factors"]["eta_kv"] == 0.23 and result["factors"]["eta_attn"] == 0.26
  assert result["factors"]["c_llc"] == 5e7 and result["factors"]["bw_llc"] == 2.2e10
  half = subprocess.run([
      sys.executable, "-m", "experiments.calibrate", "--source=vllm", f"--from_vllm={FIXTURE}",
      f"--model={model_dir}", f"--accelerator_file={device_file}", "--engine_cache_mb=50"
  ], capture_output=True, text=True, cwd=REPO, timeout=600)
  assert half.returncode != 0 and "--engine_cache_mb and --engine_cache_gbps go together" in (
      half.stderr)
  lru_alone = subprocess.run([
      sys.executable, "-m", "experiments.calibrate", "--source=vllm", f"--from_vllm={FIXTURE}",
      f"--model={model_dir}", f"--accelerator_file={device_file}", "--engine_cache_lru=1"
  ], capture_output=True, text=True, cwd=REPO, timeout=600)
  assert lru_alone.returncode != 0 and "--engine_cache_lru needs a cache" in lru_alone.stderr


def test_a_held_cache_speeds_only_the_steps_whose_weights_it_holds(tmp_path, model_dir,
                                                                   device_file):
  """c_llc bytes of a step's weights read at bw_llc: a cache larger than the model's weights
  at ten times the read ceiling shortens every simulated token gap of the fixture, a cache of
  one byte leaves them (within a part in a million), and the factors carry the cache."""
  setup = engine_fit.ServingSetup(model=model_dir, accelerator="", scheduler="vllm",
                                  accelerator_file=device_file)
  factors = {"eta_w": 0.5, "eta_f": 0.3, "t0_step": 2e-4, "t0_request": 0.0}
  rate = 10 * 2.5e10  # The fixture device's read ceiling: 25 GB/s.
  gaps = {}
  for name, cached in (("none", 0.0), ("byte", 1.0), ("all", 1e12)):
    held = dataclasses.replace(setup, cache_bytes=cached, cache_rate=rate if cached else 0.0)
    result = engine_fit.predict_runs([FIXTURE], held, {**held.held(), **factors})
    gaps[name] = {(r["metric"], r["percentile"]): r["predicted_s"] for r in result["heldout"]}
    assert result["factors"].get("c_llc", 0.0) == cached
  for key, gap in gaps["none"].items():
    if key[0] == "tpot":
      assert gaps["all"][key] < gap
      assert gaps["byte"][key] == pytest.approx(gap, rel=1e-6)


def test_an_lru_cache_held_in_the_fit_keeps_less_of_weights_that_outgrow_it(model_dir, device_file):
  """cache_lru = 1 held with a cache of three quarters of the fixture model's step weights:
  the replica's decode reads 2 c_llc - W of them at bw_llc (by hand from the model's
  constants) where the plain cache reads c_llc; a cache larger than the weights is whole
  either way; the factors carry s_lru; a share outside [0, 1] or without a cache is
  refused."""
  setup = engine_fit.ServingSetup(model=model_dir, accelerator="", scheduler="vllm",
                                  accelerator_file=device_file)
  factors = {**engine_fit.START, "eta_w": 0.5}
  run = _run_with_server(kv_blocks=1000)
  plain = engine_fit.replica_of(run, setup, {**factors, **setup.held()})
  weights = plain.cost.constants["W_b"] + plain.cost.constants["W_h"] + plain.cost.constants["r_e"]
  dram, rate = 0.5 * 2.5e10, 4 * 0.5 * 2.5e10  # eta_w x the fixture device's read ceiling.
  for cached, lru_hit in ((0.75 * weights, 0.5 * weights), (2 * weights, weights)):
    cache = dataclasses.replace(setup, cache_bytes=cached, cache_rate=rate)
    lru = dataclasses.replace(cache, cache_lru=1.0)
    assert lru.held()["s_lru"] == 1.0 and "s_lru" not in cache.held()
    read = {}
    for name, held in (("cache", cache), ("lru", lru)):
      replica = engine_fit.replica_of(run, held, {**factors, **held.held()})
      read[name] = float(replica.cost.decode(1.0, 100.0, replica.step_model)["weight_s"])
    assert read["lru"] == pytest.approx(lru_hit / rate + (weights - lru_hit) / dram, rel=1e-9)
    hit = min(cached, weights)
    assert read["cache"] == pytest.approx(hit / rate + (weights - hit) / dram, rel=1e-9)
  for bad in ({"cache_lru": 1.5, "cache_bytes": 1e6, "cache_rate": rate}, {"cache_lru": 1.0}):
    with pytest.raises(errors.InputError, match="cache_lru=") as raised:
      dataclasses.replace(setup, **bad)
    assert raised.value.field == "cache_lru"


def test_an_idle_engine_reads_its_evicted_cached_weights_from_memory(model_dir, device_file):
  """With the cache and a cold share held, the replica's wake is t_wake plus that share of
  the step's cached weight bytes read at eta_w * BW instead of bw_llc, by hand from the
  model's constants; without the share (the default, and every fit made before it) or
  without a cache it is t_wake alone; with no t_wake it is the cold cost alone; a share
  outside [0, 1] is refused."""
  setup = engine_fit.ServingSetup(model=model_dir, accelerator="", scheduler="vllm",
                                  accelerator_file=device_file, wake_seconds=2e-3)
  factors = {**engine_fit.START, "eta_w": 0.5}
  run = _run_with_server(kv_blocks=1000)
  plain = engine_fit.replica_of(run, setup, {**factors, **setup.held()})
  weights = plain.cost.constants["W_b"] + plain.cost.constants["W_h"] + plain.cost.constants["r_e"]
  dram = 0.5 * 2.5e10  # eta_w x the fixture device's read ceiling.
  assert plain.wake_s == 2e-3
  no_cache = dataclasses.replace(setup, cold_share=1.0)
  assert engine_fit.replica_of(run, no_cache, {**factors, **no_cache.held()}).wake_s == 2e-3
  for cached in (weights / 2, 4 * weights):
    cache = dataclasses.replace(setup, cache_bytes=cached, cache_rate=4 * dram)
    assert engine_fit.replica_of(run, cache, {**factors, **cache.held()}).wake_s == 2e-3
    hit = min(cached, weights)
    cold = hit / dram - hit / (4 * dram)
    for share in (0.5, 1.0):
      held = dataclasses.replace(cache, cold_share=share)
      assert held.held()["s_cold"] == share
      replica = engine_fit.replica_of(run, held, {**factors, **held.held()})
      assert replica.wake_s == pytest.approx(2e-3 + share * cold, rel=1e-9)
      assert "read from memory" in replica.description["wake"]
    awake = dataclasses.replace(cache, cold_share=1.0, wake_seconds=None)
    replica = engine_fit.replica_of(run, awake, {**factors, **awake.held(), "t_wake": 0.0})
    assert replica.wake_s == pytest.approx(cold, rel=1e-9)
  with pytest.raises(errors.InputError, match="cold_share=1.5"):
    dataclasses.replace(setup, cold_share=1.5)


def test_held_elementwise_kernels_slow_prefills_and_carry_in_the_factors(model_dir, device_file):
  """t_act held: each simulated iteration pays t_act x tokens x A_w, so no predicted median
  shrinks and the p50 TTFT (a whole prompt's tokens) grows; the factors carry it, and 0 is
  the plain prediction."""
  setup = engine_fit.ServingSetup(model=model_dir, accelerator="", scheduler="vllm",
                                  accelerator_file=device_file)
  factors = {"eta_w": 0.5, "eta_f": 0.3, "t0_step": 2e-4, "t0_request": 0.0}
  rows = {}
  for name, seconds in (("none", 0.0), ("held", 1e-8)):
    held = dataclasses.replace(setup, elementwise_seconds=seconds)
    result = engine_fit.predict_runs([FIXTURE], held, {**held.held(), **factors})
    assert result["factors"].get("t_act", 0.0) == seconds
    rows[name] = {(r["metric"], r["percentile"]): r["predicted_s"] for r in result["heldout"]}
  for key, plain in rows["none"].items():
    assert rows["held"][key] >= plain - 1e-12, key
  assert rows["held"][("ttft", 50)] > rows["none"][("ttft", 50)]
  with pytest.raises(errors.InputError, match="elementwise_seconds"):
    dataclasses.replace(setup, elementwise_seconds=-1.0)


def test_kernel_builds_reach_the_replica_per_layer_and_token_and_only_slow_the_run(
    model_dir, device_file):
  """A held t_build puts a kernel cache of `KERNEL_CACHE_ROWS` counts at L x t_build per
  token on the run's replica; simulated, no median shrinks, and a run whose steps all fit
  the warm cache it starts from matches the plain simulation."""
  setup = engine_fit.ServingSetup(model=model_dir, accelerator="", scheduler="vllm",
                                  accelerator_file=device_file)
  factors = {"eta_w": 0.5, "eta_f": 0.3, "t0_step": 2e-4, "t0_request": 0.0}
  run = vllm_results.read_runs([FIXTURE])[0]
  layers = models.load_model(model_dir).num_layers
  held = dataclasses.replace(setup, kernel_build=1e-5)
  assert held.held()["t_build"] == 1e-5
  cache = engine_fit.replica_of(run, held, {**factors, **held.held()}).kernel_cache
  assert cache.capacity == engine_fit.KERNEL_CACHE_ROWS
  assert cache.seconds_per_row == pytest.approx(layers * 1e-5, rel=1e-12)
  assert engine_fit.replica_of(run, setup, factors).kernel_cache is None
  plain = engine_fit.simulate_run(run, setup, factors)
  built = engine_fit.simulate_run(run, held, factors)
  for name in ("median_ttft_s", "median_tpot_s", "p90_ttft_s", "p90_tpot_s"):
    assert built[name] >= plain[name] - 1e-12, name


def test_a_fit_carried_to_another_device_predicts_without_fitting(tmp_path, monkeypatch, model_dir,
                                                                  device_file):
  """`read_factors` + `predict_runs`: one calibration's factors on another device's ceilings,
  nothing searched. On the fit's own device the rows are the fit's held-out rows; on a device
  reading memory twice as fast the decode gaps shrink; the JSON says where the factors came
  from; a file that is not an engine calibration is refused by name."""
  factors = {"eta_w": 0.5, "eta_f": 0.3, "t0_step": 2e-3, "t0_request": 0.01}
  monkeypatch.setattr(engine_fit, "search", lambda runs, setup, **_: (dict(factors), 0.0, 1))
  setup = engine_fit.ServingSetup(model=model_dir, accelerator="", scheduler="vllm",
                                  accelerator_file=device_file, request_cost=True, m_pass=256,
                                  overlap=0.06)
  fit = engine_fit.calibrate_engine([FIXTURE], setup, heldout_paths=[FIXTURE])
  fit_path = tmp_path / "fit.json"
  fit_path.write_text(json.dumps(fit))
  monkeypatch.setattr(engine_fit, "search", None)  # Nothing below may search.
  carried = engine_fit.read_factors(fit_path)
  assert carried["m_pass"] == 256 and carried["r_ovl"] == 0.06 and carried["eta_w"] == 0.5
  same = engine_fit.predict_runs([FIXTURE], setup, carried, factors_from=str(fit_path))
  assert same["kind"] == "engine_prediction" and same["factors_from"] == str(fit_path)
  assert [r["predicted_s"] for r in same["heldout"]] == [r["predicted_s"] for r in fit["heldout"]]
  faster = json.loads(pathlib.Path(device_file).read_text())
  entry = faster["accelerators"]["cpu-vllm-engine"]
  entry["memory_bandwidth_tb_s"] *= 2
  other = tmp_path / "faster.json"
  other.write_text(json.dumps(faster))
  moved = engine_fit.predict_runs([FIXTURE],
                                  dataclasses.replace(setup, accelerator_file=str(other)), carried)
  gap = {(r["metric"], r["percentile"]): r["predicted_s"] for r in moved["heldout"]}
  assert gap[("tpot", 50)] < next(
      r["predicted_s"] for r in same["heldout"] if (r["metric"], r["percentile"]) == ("tpot", 50))
  for bad in ({"kind": "simulation"}, {**fit, "factors": {**fit["factors"], "eta_w": -1}},
              {**fit, "factors": {"eta_f": 0.3, "t0_step": 1e-3}}):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(errors.InputError, match="engine_factors=") as raised:
      engine_fit.read_factors(path)
    assert raised.value.field == "engine_factors"


def test_engine_factors_cli_predicts_a_committed_pass_as_its_fit_did(tmp_path):
  """`calibrate --engine_factors`: pass 5's fit, on pass 5's ceilings, predicts a pass-6 run
  exactly as the cross-pass fit file (made by fitting) did; with --from_vllm it is refused."""
  fit = DATA / "vllm_cpu/calibration_pass5_predicts_pass6_engine_kernels.json"
  run_file = "tests/data/vllm_cpu/tiny_vllm_rate4_in128_out32.json"
  out = tmp_path / "pred.json"
  flags = [
      f"--engine_factors={fit}", f"--heldout_vllm={run_file}",
      "--model=tests/data/vllm_cpu/models/tiny-llama",
      "--accelerator_file=tests/data/vllm_cpu/accelerator_pass5.json", "--scheduler=vllm"
  ]
  done = subprocess.run(
      [sys.executable, "-m", "experiments.calibrate", *flags, f"--json_out={out}"],
      capture_output=True, text=True, cwd=REPO, timeout=600)
  assert done.returncode == 0, done.stderr[-2000:]
  assert "no fit" in done.stdout
  predicted = json.loads(out.read_text())
  expected = [
      r for r in json.loads(fit.read_text())["heldout"]
      if r["run"].startswith(pathlib.Path(run_file).name)
  ]
  assert expected and [r["predicted_s"] for r in predicted["heldout"]] == pytest.approx(
      [r["predicted_s"] for r in expected], rel=1e-9)
  held = json.loads(fit.read_text())["factors"]["eta_w"]
  slower = tmp_path / "slower.json"
  done = subprocess.run([
      sys.executable, "-m", "experiments.calibrate", *flags, f"--engine_eta_w={held / 2}",
      f"--json_out={slower}"
  ], capture_output=True, text=True, cwd=REPO, timeout=600)
  assert done.returncode == 0, done.stderr[-2000:]

  def p50_tpot(path: pathlib.Path) -> float:
    rows = json.loads(path.read_text())["heldout"]
    return next(r["predicted_s"] for r in rows if (r["metric"], r["percentile"]) == ("tpot", 50))

  assert p50_tpot(slower) > p50_tpot(out)  # Half the weights' rate: slower decode steps.
  for extra in (f"--from_vllm={run_file}", "--request_cost", "--fit_starts=2"):
    refused = subprocess.run([sys.executable, "-m", "experiments.calibrate", *flags, extra],
                             capture_output=True, text=True, cwd=REPO, timeout=300)
    last = refused.stderr.strip().splitlines()[-1]
    assert refused.returncode == 2 and last.startswith("error:") and extra.split("=")[0] in last
    assert "--engine_factors" in last


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("JAXROOF_VLLM_ENV"), reason="set JAXROOF_VLLM_ENV to the vLLM engine's venv "
    "(bash experiments/vllm_setup.sh DIR)")
def test_whole_path_with_a_real_engine(tmp_path):
  env = os.environ["JAXROOF_VLLM_ENV"]
  out = tmp_path / "run"
  done = subprocess.run([
      sys.executable, "-m", "experiments.vllm_bench", f"--engine_env={env}", "--model=tiny-llama",
      "--rates=4", "--prompt_tokens=64", "--output_tokens=8", "--num_prompts=8", f"--out_dir={out}"
  ], capture_output=True, text=True, cwd=REPO, timeout=900)
  assert done.returncode == 0, done.stderr[-3000:]
  summary = json.loads((out / "summary.json").read_text())
  [run] = summary["runs"]
  result = json.loads(pathlib.Path(run["result_path"]).read_text())
  vllm_engine.check_detailed(result, run["result_path"])
  assert result["completed"] == 8 and set(result["input_lens"]) == {64}
  assert result[vllm_engine.RUN_KEY]["server"]["kv_blocks"] > 0
  assert summary["accelerator_file"] == str(out / "accelerator.json")
  what_if.load_accelerator_file(summary["accelerator_file"])
  leftover = subprocess.run(["pgrep", "-f", "vllm serve"], capture_output=True, text=True)
  assert str(out) not in leftover.stdout
  cal = tmp_path / "cal.json"
  done = subprocess.run([
      sys.executable, "-m", "experiments.calibrate_engine", f"--from_vllm={run['result_path']}",
      f"--heldout_vllm={run['result_path']}", f"--model={run['model_dir']}",
      f"--accelerator_file={summary['accelerator_file']}", "--scheduler=vllm", "--request_cost",
      "--max_simulations=20", f"--json_out={cal}"
  ], capture_output=True, text=True, cwd=REPO, timeout=600)
  assert done.returncode == 0, done.stderr[-2000:]
  assert json.loads(cal.read_text())["heldout"]


def test_report_section_renders_committed_results_or_says_how(tmp_path):
  from jaxroof.report import real_engine
  empty = real_engine.report_section(str(tmp_path / "none"), str(tmp_path))
  assert "## Checked against a real engine" in empty and "vllm_setup.sh" in empty
  assert "/work" not in empty  # Names no path of this machine.
  folder = tmp_path / "results" / real_engine.FOLDER
  folder.mkdir(parents=True)
  row = {
      "run": "vllm_rate4_in128_out32.json:1 (rate 4)", "metric": "ttft", "percentile": 50,
      "measured_s": 0.020, "predicted_s": 0.022, "bound_s": 0.004, "rel_error": 0.1
  }
  result = {
      "heldout": [row], "heldout_median_rel_error": 0.1, "heldout_max_rel_error": 0.1,
      "heldout_points": 1, "factors": {"eta_w": 0.5, "t0_request": 0.01},
      "fixed": {"t0_layer": 1e-9, "r_ovl": 0.06, "eta_kv": 0.23, "eta_attn": 0.26,
                "m_pass": 256}, "source": {"files": ["a/vllm_rate2_in128_out32.json"]}, "cdfs": [{
                    "run": row["run"], "measured": {"ttft": [0.02, 0.03], "itl": [0.004]},
                    "predicted": {"ttft": [0.021, 0.029], "itl": [0.005]}
                }]
  }
  (folder / "calibration.json").write_text(json.dumps(result))
  text = real_engine.report_section(str(tmp_path / "results"), str(tmp_path))
  assert "| vllm_rate4_in128_out32 | p50 TTFT | 20.00 | 22.00 | 10.0% | 4.00 |" in text
  assert "Held: r_ovl = 0.06, eta_kv = 0.23, eta_attn = 0.26, m_pass = 256 (" in text
  assert (tmp_path / "real_engine_cdfs.png").stat().st_size > 0


def test_frontend_is_pinned_off_the_engines_core():
  """The API server and the client run where `frontend_cpus` says (the engine re-binds its
  own worker to `engine_cpus`); unpinned by default in the library, a bad core refused."""
  assert vllm_engine.pinned_to("") is None
  child = subprocess.run(
      [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
      capture_output=True, text=True, check=True, preexec_fn=vllm_engine.pinned_to("0"))
  assert child.stdout.strip() == "[0]"
  with pytest.raises(errors.InputError, match=r"frontend_cpus='99'") as info:
    vllm_engine.pinned_to("99")
  assert info.value.field == "frontend_cpus"
  assert dataclasses.asdict(vllm_engine.ServerConfig())["frontend_cpus"] == ""


def test_the_engines_measured_gemm_overlap_is_held_and_reported(monkeypatch, model_dir,
                                                                device_file):
  """`overlap` is the r_ovl every simulated step uses (0: weight reads and FLOPs add up,
  so a step doing both is slower than at the default 1); the bound keeps r_ovl = 1, and the
  result states the overlap it held."""
  setup = engine_fit.ServingSetup(model=model_dir, accelerator="", scheduler="vllm",
                                  accelerator_file=device_file)
  summed = dataclasses.replace(setup, overlap=0.0)
  run = _run_with_server(kv_blocks=1000)
  assert (engine_fit.simulate_run(run, summed, engine_fit.START)["median_ttft_s"]
          > engine_fit.simulate_run(run, setup, engine_fit.START)["median_ttft_s"])
  assert (engine_fit.simulate_run(run, summed, engine_fit.BOUND_FACTORS) == engine_fit.simulate_run(
      run, setup, engine_fit.BOUND_FACTORS))
  monkeypatch.setattr(engine_fit, "search", lambda runs, s, **_: (dict(engine_fit.START), 0.0, 1))
  result = engine_fit.calibrate_engine([FIXTURE], summed)
  assert result["factors"]["r_ovl"] == result["fixed"]["r_ovl"] == 0.0


def test_the_device_names_the_cpu_flags_that_choose_the_engines_kernels(tmp_path):
  info = tmp_path / "cpuinfo"
  info.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu avx2 avx512f "
                  "avx512fp16 amx_bf16 amx_tile\n")
  assert vllm_engine.cpu_model(str(info)) == "Some CPU (amx_bf16, avx512f, avx2)"
  info.write_text("model name\t: Old CPU\nflags\t\t: fpu sse2\n")
  assert vllm_engine.cpu_model(str(info)) == "Old CPU"
  assert vllm_engine.cpu_model(str(tmp_path / "absent"))  # Falls back to the platform's name.


@pytest.fixture
def engine_core_stand_in():
  """A process below a shell that names itself VLLM::EngineCore, with a second thread: the
  server's pid (the shell's) and the stand-in's."""
  script = ("import threading, time; open('/proc/self/comm', 'w').write('VLLM::EngineCore'); "
            "threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); "
            "print('ready', flush=True); time.sleep(30)")
  parent = subprocess.Popen(["sh", "-c", f'"{sys.executable}" -c "{script}"'],
                            stdout=subprocess.PIPE, text=True)
  try:
    assert parent.stdout.readline().strip() == "ready"
    yield parent.pid
  finally:
    for pid in vllm_engine._descendants(parent.pid):
      with contextlib.suppress(ProcessLookupError):
        os.kill(pid, 9)
    parent.kill()
    parent.wait()


def test_the_engine_core_is_moved_with_every_thread_and_a_missing_one_is_named(
    engine_core_stand_in):
  """`pin_engine_core` finds the process vLLM names VLLM::EngineCore below the server and
  moves each of its threads."""
  moved = vllm_engine.pin_engine_core(engine_core_stand_in, "0")
  assert len(moved) == 1
  tasks = os.listdir(f"/proc/{moved[0]}/task")
  assert len(tasks) >= 2 and all(os.sched_getaffinity(int(t)) == {0} for t in tasks)
  with pytest.raises(errors.InputError, match="engine_core_cpus='0': no VLLM::EngineCor"):
    vllm_engine.pin_engine_core(moved[0], "0")
  with pytest.raises(errors.InputError, match="engine_core_cpus='99'"):
    vllm_engine.pin_engine_core(engine_core_stand_in, "99")


def test_the_engine_core_is_reniced_with_every_thread(engine_core_stand_in):
  """`renice_engine_core` sets each thread's niceness (per thread on Linux); a niceness out
  of range and a server without an engine core are named."""
  before = {int(t): os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")}
  set_ = vllm_engine.renice_engine_core(engine_core_stand_in, 19)
  assert len(set_) == 1
  tasks = [int(t) for t in os.listdir(f"/proc/{set_[0]}/task")]
  assert len(tasks) >= 2 and all(os.getpriority(os.PRIO_PROCESS, t) == 19 for t in tasks)
  assert {t: os.getpriority(os.PRIO_PROCESS, t) for t in before} == before  # Ours untouched.
  for bad in (20, -21, 1.5, True):
    with pytest.raises(errors.InputError, match="engine_core_nice=.* is not allowed"):
      vllm_engine.renice_engine_core(engine_core_stand_in, bad)
  with pytest.raises(errors.InputError, match="engine_core_nice=19: no VLLM::EngineCor"):
    vllm_engine.renice_engine_core(set_[0], 19)


def test_a_niceness_the_user_may_not_set_is_one_clean_error(engine_core_stand_in, monkeypatch):
  """Lowering a niceness needs privileges: the PermissionError becomes one InputError line."""

  def refuse(*args):
    raise PermissionError(1, "Operation not permitted")

  monkeypatch.setattr(os, "setpriority", refuse)
  with pytest.raises(errors.InputError, match="engine_core_nice=-5: this user may not set it"):
    vllm_engine.renice_engine_core(engine_core_stand_in, -5)
