"""vLLM's CPU server as subprocesses of its own venv: configuration, commands, process hygiene.

The engine lives in its own venv (`experiments/vllm_setup.sh DIR`), never imported
here. `serving` starts `vllm serve` on 127.0.0.1 with dummy weights and a stated
`ServerConfig`, waits for /health (bounded), and stops the server by its process id
(SIGINT, then SIGKILL of what is left of its process tree); `pin_engine_core` and
`renice_engine_core` move and lower vLLM's engine core once healthy; `parse_server_log`
reads the K/V blocks the server allocated.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from jaxroof import errors

ENGINE_VERSION = "0.32.0+cpu"  # What experiments/vllm_setup.sh installs.
SETUP_HINT = "build it with: bash experiments/vllm_setup.sh DIR (about 3.4 GB, 75 s)"
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
  # tiny-llama requests whole, TTFT = their duration; at 19, 0 in two A/B runs of 120, the
  # steps as long (docs/cpu-engine.md).
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
