"""The real-engine runner without an engine: the model folder, server hygiene, the
ceilings as the engine computes them, result validation, core pinning.

The whole path with a real vLLM runs in `test_whole_path_with_a_real_engine`
(slow tier), only where $JAXROOF_VLLM_ENV names the engine's venv.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
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
from jaxroof.engines import vllm_ceilings, vllm_engine, vllm_model, vllm_server
from jaxroof.specs import what_if
from tests._vllm_helpers import CEILINGS, FIXTURE, REPO  # noqa: F401
from tests._vllm_helpers import device_file_fixture, model_dir_fixture  # noqa: F401


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
  assert vllm_ceilings.linear_shapes(small) == [(1024, (16 + 8) * 64), (1024, 1024),
                                                (1024, 2 * 2816), (2816, 1024)]


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
    vllm_server.engine_python(str(tmp_path / "none"))
  with pytest.raises(errors.InputError, match="vllm_setup.sh"):
    vllm_server.engine_python("")


def test_port_in_use_is_refused():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    port = s.getsockname()[1]
    with pytest.raises(errors.InputError, match=f"port={port} is in use"):
      vllm_server.require_free_port(port)
  assert vllm_server.require_free_port(0) > 0


def test_commands_are_loopback_dummy_and_state_the_scheduler(tmp_path):
  config = vllm_server.ServerConfig(max_num_seqs=8, max_num_batched_tokens=512)
  serve = vllm_server.server_command("/env", "/m", config, 8123)
  for flag, value in (("--host", "127.0.0.1"), ("--load-format", "dummy"), ("--max-num-seqs", "8"),
                      ("--max-num-batched-tokens", "512"), ("--block-size", "128")):
    assert serve[serve.index(flag) + 1] == value
  assert "--enable-chunked-prefill" in serve
  spec = vllm_server.BenchSpec(rate=2.0, prompt_tokens=128, output_tokens=32, num_prompts=10)
  bench = vllm_server.bench_command("/env", "/m", 8123, spec, "/out", "r.json")
  assert bench[bench.index("--base-url") + 1] == "http://127.0.0.1:8123"
  assert "--save-detailed" in bench and "--ignore-eos" in bench
  env = vllm_server.engine_environment(str(tmp_path), config)
  assert env["HF_HUB_OFFLINE"] == "1" and env["TMPDIR"].startswith(str(tmp_path))
  assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"


def test_server_log_gives_kv_capacity():
  log = ("INFO [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: "
         "enable_chunked_prefill=True, enable_prefix_caching=False\n"
         "(EngineCore pid=1) INFO [kv_cache_utils.py:2328] CPU KV cache size: 65,536 tokens, "
         "Maximum concurrency for 2,048 tokens per request: 32.00x\n")
  facts = vllm_server.parse_server_log(log, block_size=128)
  assert facts == {"kv_cache_tokens": 65536, "kv_blocks": 512, "chunked_prefill_logged": True}
  assert vllm_server.parse_server_log("", 128)["kv_blocks"] is None


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
  config = vllm_server.ServerConfig()
  with pytest.raises(errors.InputError) as info:
    with vllm_server.serving(env, str(tmp_path), config, vllm_server.require_free_port(0),
                             str(work), start_timeout_s=3):
      pass
  message = str(info.value)
  assert "not healthy within 3 s" in message and "stubborn server up" in message
  assert "\n" not in message
  # The engine's IPC sockets live in TMPDIR: short enough for a Unix socket path, and
  # removed with the server when it is not inside the working folder.
  tmp = re.search(r"TMPDIR=(\S+)", message).group(1)
  assert len(tmp) <= vllm_server.MAX_TMP_CHARS and not os.path.exists(tmp)
  leftover = subprocess.run(["pgrep", "-f", str(env)], capture_output=True, text=True)
  assert leftover.stdout.strip() == ""


def test_stop_kills_what_ignores_sigint(tmp_path):
  env = _fake_env(tmp_path)
  log = tmp_path / "log"
  with open(log, "w") as f:
    process = subprocess.Popen([os.path.join(env, "bin", "vllm")], stdout=f, start_new_session=True)
  server = vllm_server.Server(process, 1, str(log))
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
  note = vllm_ceilings.bf16_note({"bf16_flops_per_s": 2e8, "fp32_flops_per_s": 6e10})
  assert "0.2 GFLOP/s" in note and "60.0" in note and "AVX512-BF16" in note
  assert vllm_ceilings.bf16_note({"bf16_flops_per_s": 4e11, "fp32_flops_per_s": 1e11}) is None


def test_ceilings_are_the_fastest_repeat_within_and_the_median_over_measurements():
  """A measurement's fastest repeat is its ceiling (a repeat is only slowed down); over
  invocations the median, so that one fast invocation does not set the machine."""

  def at(bf16: float, read: float) -> dict:
    return {
        **CEILINGS, "bf16_matmul_s": [2 * 2048**3 / bf16, 2 * 2048**3 / (bf16 / 2)],
        "read_s": [512 * 2**20 / (read / 3), 512 * 2**20 / read]
    }

  measured = [at(4e11, 1.2e10), at(3e11, 1.6e10), at(5e11, 1.3e10)]
  rates = vllm_ceilings.ceiling_rates(measured)
  assert rates["bf16_flops_per_s"] == pytest.approx(4e11)  # Fastest repeats 4, 3, 5.
  assert rates["read_bytes_per_s"] == pytest.approx(1.3e10)  # Not the one fast 1.6e10.
  assert vllm_ceilings.ceiling_rates(measured[:1])["read_bytes_per_s"] == pytest.approx(1.2e10)
  entry = vllm_ceilings.accelerator_entry(measured, vllm_server.ServerConfig())
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
  assert vllm_ceilings.ceiling_rates([shrunk])["bf16_flops_per_s"] == pytest.approx(9e9)
  source = vllm_ceilings.accelerator_entry(shrunk, vllm_server.ServerConfig())["sources"]
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


def test_frontend_is_pinned_off_the_engines_core():
  """The API server and the client run where `frontend_cpus` says (the engine re-binds its
  own worker to `engine_cpus`); unpinned by default in the library, a bad core refused."""
  assert vllm_server.pinned_to("") is None
  child = subprocess.run(
      [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
      capture_output=True, text=True, check=True, preexec_fn=vllm_server.pinned_to("0"))
  assert child.stdout.strip() == "[0]"
  with pytest.raises(errors.InputError, match=r"frontend_cpus='99'") as info:
    vllm_server.pinned_to("99")
  assert info.value.field == "frontend_cpus"
  assert dataclasses.asdict(vllm_server.ServerConfig())["frontend_cpus"] == ""


def test_the_device_names_the_cpu_flags_that_choose_the_engines_kernels(tmp_path):
  info = tmp_path / "cpuinfo"
  info.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu avx2 avx512f "
                  "avx512fp16 amx_bf16 amx_tile\n")
  assert vllm_ceilings.cpu_model(str(info)) == "Some CPU (amx_bf16, avx512f, avx2)"
  info.write_text("model name\t: Old CPU\nflags\t\t: fpu sse2\n")
  assert vllm_ceilings.cpu_model(str(info)) == "Old CPU"
  assert vllm_ceilings.cpu_model(str(tmp_path / "absent"))  # Falls back to the platform's name.


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
    for pid in vllm_server._descendants(parent.pid):
      with contextlib.suppress(ProcessLookupError):
        os.kill(pid, 9)
    parent.kill()
    parent.wait()


def test_the_engine_core_is_moved_with_every_thread_and_a_missing_one_is_named(
    engine_core_stand_in):
  """`pin_engine_core` finds the process vLLM names VLLM::EngineCore below the server and
  moves each of its threads."""
  moved = vllm_server.pin_engine_core(engine_core_stand_in, "0")
  assert len(moved) == 1
  tasks = os.listdir(f"/proc/{moved[0]}/task")
  assert len(tasks) >= 2 and all(os.sched_getaffinity(int(t)) == {0} for t in tasks)
  with pytest.raises(errors.InputError, match="engine_core_cpus='0': no VLLM::EngineCor"):
    vllm_server.pin_engine_core(moved[0], "0")
  with pytest.raises(errors.InputError, match="engine_core_cpus='99'"):
    vllm_server.pin_engine_core(engine_core_stand_in, "99")


def test_the_engine_core_is_reniced_with_every_thread(engine_core_stand_in):
  """`renice_engine_core` sets each thread's niceness (per thread on Linux); a niceness out
  of range and a server without an engine core are named."""
  before = {int(t): os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")}
  set_ = vllm_server.renice_engine_core(engine_core_stand_in, 19)
  assert len(set_) == 1
  tasks = [int(t) for t in os.listdir(f"/proc/{set_[0]}/task")]
  assert len(tasks) >= 2 and all(os.getpriority(os.PRIO_PROCESS, t) == 19 for t in tasks)
  assert {t: os.getpriority(os.PRIO_PROCESS, t) for t in before} == before  # Ours untouched.
  for bad in (20, -21, 1.5, True):
    with pytest.raises(errors.InputError, match="engine_core_nice=.* is not allowed"):
      vllm_server.renice_engine_core(engine_core_stand_in, bad)
  with pytest.raises(errors.InputError, match="engine_core_nice=19: no VLLM::EngineCor"):
    vllm_server.renice_engine_core(set_[0], 19)


def test_a_niceness_the_user_may_not_set_is_one_clean_error(engine_core_stand_in, monkeypatch):
  """Lowering a niceness needs privileges: the PermissionError becomes one InputError line."""

  def refuse(*args):
    raise PermissionError(1, "Operation not permitted")

  monkeypatch.setattr(os, "setpriority", refuse)
  with pytest.raises(errors.InputError, match="engine_core_nice=-5: this user may not set it"):
    vllm_server.renice_engine_core(engine_core_stand_in, -5)


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
      f"--accelerator_file={summary['accelerator_file']}", "--server=scheduler=vllm",
      "--search=t0_request,max_simulations=20", f"--json_out={cal}"
  ], capture_output=True, text=True, cwd=REPO, timeout=600)
  assert done.returncode == 0, done.stderr[-2000:]
  assert json.loads(cal.read_text())["heldout"]
