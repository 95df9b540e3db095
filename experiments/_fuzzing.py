"""A fuzzer of our own for the experiments: bad flag values, checked against the contract.

The contract for every experiment and every input: either a correct result
(exit 0, finite numbers, complete outputs), or one clean error line (exit 2,
`error: ...`, no traceback), never a hang and never a half-written file.

Speed: one process per experiment imports it once (flags defined, jax loaded),
then forks a child per case, so a case costs milliseconds of start-up rather
than seconds. Cases are made from the experiment's own flag definitions (their
types, enums and bounds), so a new experiment is fuzzed without being listed.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os
import random
import re
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from absl import flags

_FIXTURE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests",
                        "data", "vllm_cpu_detailed_fixture.json")
_GPTFAST = os.path.join(os.path.dirname(_FIXTURE), "gptfast_a100_tp_steps.csv")
# Flags to add to every case of an experiment so that a valid run stays short
# and writes where the fuzzer looks; `{tmp}` is the case's own folder.
BASE_ARGS: dict[str, tuple[str, ...]] = {
    "kv_sizing": ("--model=llama-3-8b", "--context=4096"),
    "compare_accelerators": ("--model=llama-3-8b", "--context=4096",
                             "--accelerators=h100-sxm,tpu-v5e", "--batch_sizes=1,8"),
    "report": ("--calibration_budget_s=0", "--out_dir={tmp}/report"),
    "calibrate": ("--budget_s=25",),
    "bench": ("--what=sweep", "--batches=64", "--contexts=64", "--repeats=2", "--loop_points=10"),
    "bench_sweep":
        ("--what=sweep", "--batches=64", "--contexts=64", "--repeats=2", "--loop_points=10"),
    "bench_plan": ("--what=plan", "--repeats=1"),
    "bench_simulate": ("--what=simulate", "--num_requests=200", "--repeats=1"),
    "bench_decode":
        ("--what=decode", "--new_tokens=2", "--prompt_len=8", "--repeats=2", "--preset=lesson"),
    "bench_decode_step": ("--model=lesson", "--batches=1,2", "--contexts=8,16", "--rounds=1",
                          "--repeats=2", "--bandwidth_mb=8"),
    "measure_ops": ("--decode_rows=1", "--prefill_rows=2", "--batch_sizes=1", "--contexts=64",
                    "--d_in=64", "--d_out=64", "--repeats=2"),
    "gpu_bench": ("--out_dir={tmp}/gpu",),
    "serving": ("--token_gap_ms=12", "--output_tokens=16", "--batch_sizes=1,8"),
    "iteration": ("--model=llama-3-8b", "--accelerator=h100-sxm", "--decode_rows=8",
                  "--decode_context=1024", "--prefill_tokens=256"),
    # Never a real engine: the engine env does not exist, so a valid case ends in
    # its one-line error (experiments/vllm_setup.sh builds a real one).
    "vllm_bench": ("--engine_env={tmp}/no-engine", "--out_dir={tmp}/out", "--num_prompts=2"),
    "calibrate_engine": (f"--from_vllm={_FIXTURE}", "--model=tinyllama-1.1b",
                         "--accelerator=h100-sxm", "--search=max_simulations=10"),
    "calibrate_layouts": (f"--from_csv={_GPTFAST}", "--fit_steps=100"),
    "profile_terms": ("--profiles=gpt-fast", "--variants=without the pooled prior"),
    "plan": ("--model=llama-3-8b", "--context=4096", "--token_gap_ms=50", "--ttft_ms=2000",
             "--aggregate_tokens_per_s=1000", "--accelerators=h100-sxm", "--top_k=1",
             "--sim_seeds=1", "--sim_requests=10", "--top=3"),
    "simulate":
        ("--model=llama-3-8b", "--accelerator=h100-sxm", "--context=4096", "--num_requests=50"),
    "serve_toy": ("--num_requests=4", "--prompt_tokens=8", "--output_tokens=4"),
}
# Experiments whose valid base run ends in a clean error by design (no engine, no GPU here).
BASE_REFUSED = frozenset({"vllm_bench", "gpu_bench"})
# Former names that run another experiment with its --what: fuzzed as that experiment with
# their own base flags, so each benchmark's flags get cases of their own.
ALIASES: dict[str, str] = {
    "bench_sweep": "bench", "bench_plan": "bench", "bench_simulate": "bench",
    "bench_decode": "bench"
}
SKIP = frozenset({"fuzz"})  # Not fuzzed: the fuzzer itself.
OUTPUT_FLAGS = ("json_out", "plot_out", "profile_out", "summary_out")
_ABSL_LOG = re.compile(r"^[IWEF]\d{4} ")  # absl's own log lines are not errors.
_NUMBER = re.compile(r"(?<![\w.])(nan|inf|-inf|infinity)(?![\w])", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Case:
  """One run: an experiment, its flags, and whether the input must be refused."""

  experiment: str
  args: tuple[str, ...]
  must_refuse: bool
  kind: str  # What was broken, e.g. "float:nan", "path:folder"; "base:valid": nothing.


@dataclasses.dataclass(frozen=True)
class Outcome:
  case: Case
  verdict: str  # ok, clean_error, traceback, nonfinite, half_written, hang, accepted_bad
  exit_code: int | None
  seconds: float
  detail: str = ""

  @property
  def breaks_contract(self) -> bool:
    return self.verdict in ("traceback", "nonfinite", "half_written", "hang", "accepted_bad")

  def to_json(self) -> dict[str, Any]:
    return {
        "experiment": self.case.experiment, "args": list(self.case.args), "kind": self.case.kind,
        "must_refuse": self.case.must_refuse, "verdict": self.verdict, "exit_code": self.exit_code,
        "seconds": round(self.seconds, 3), "detail": self.detail[:300]
    }


def _shared(module_key: str) -> bool:
  """A shared flag module (`experiments._model_flags`, `_layout_flags`, ...)."""
  name = module_key.replace(os.sep, ".").removesuffix(".py")
  return ".experiments._" in f".{name}"


def experiment_flags(module_name: str) -> list[flags.Flag]:
  """The flags an imported experiment defines: its own, and the shared ones it
  asked for (`_model_flags.define`, `_layout_flags`), which absl files under
  the shared module. One experiment is imported per process, so every shared
  flag defined here is one of its own."""
  module = sys.modules[module_name]
  by_module = flags.FLAGS.flags_by_module_dict()
  found = list(by_module.get(module.__file__, []) or by_module.get(module_name, []))
  for key, defined in by_module.items():
    if _shared(key):
      found += defined
  return sorted({f.name: f for f in found}.values(), key=lambda f: f.name)


def _bad_values(flag: flags.Flag, rng: random.Random) -> Iterator[tuple[str, str, bool]]:
  """(value, kind, must_refuse) for one flag, from its type."""
  name = flag.name
  if name in OUTPUT_FLAGS:
    yield "{tmp}", "path:folder", True
    yield "{tmp}/", "path:trailing_slash", True
    yield "{tmp}/out.xyz", "path:extension", True
    yield "{tmp}/missing/out.json", "path:no_parent", True
    yield "/dev/null", "path:special_file", True
    yield "{tmp}/noext", "path:no_extension", True
    return
  kind = type(flag).__name__
  parser = type(flag.parser).__name__
  if "Enum" in kind or "Enum" in parser:
    yield "not_a_choice", "enum:unknown", True
    yield "", "enum:empty", True
    return
  if "Boolean" in kind:
    yield "maybe", "bool:word", True
    return
  if "List" in kind or "List" in parser:
    yield "", "list:empty", False  # Empty may mean "none" (crossovers --values=).
    yield "1,x,3", "list:non_number", True
    yield "1,nan", "list:nan", True
    yield "-5", "list:negative", True
    yield ",".join(["7"] * 2000) + ",oops", "list:huge_bad", True
    return
  if "Integer" in parser or isinstance(flag.default, int) and not isinstance(flag.default, bool):
    yield "abc", "int:word", True
    yield "1.5", "int:fraction", True
    yield "9" * 30, "int:30_digits", True
    yield "-1", "int:negative", True
    yield str(10**9), "int:huge", False  # Refused, or no slower (see `_classify`).
    yield str(10**12), "int:beyond", True  # Past any count this tool takes (2**31 - 1).
    return
  if "Float" in parser or isinstance(flag.default, float):
    yield "nan", "float:nan", True
    yield "inf", "float:inf", True
    yield "-1", "float:negative", False
    yield "5e-324", "float:subnormal", False
    yield "1e308", "float:huge", False
    yield "abc", "float:word", True
    return
  yield "", "string:empty", True  # Never "absent": often an unset shell variable.
  yield "\x7f\x01garbage", "string:garbage", False
  yield "/nonexistent/x.json", "string:missing_path", False
  yield "../" * 20, "string:up_path", False


def cases_for(module_name: str, seed: int = 0, limit: int | None = None,
              experiment: str | None = None) -> list[Case]:
  """Every single-flag mutation of an experiment's flags (at most `limit`); `experiment`
  names an alias of the module, whose base flags then apply."""
  experiment = experiment or module_name.rsplit(".", 1)[-1]
  # An alias draws its own sample of the shared module's cases.
  rng = random.Random(f"{seed}:{experiment}" if experiment in ALIASES else seed)
  base = BASE_ARGS.get(experiment, ())
  out = []
  for flag in experiment_flags(module_name):
    for value, kind, must_refuse in _bad_values(flag, rng):
      keep = tuple(a for a in base if not a.startswith(f"--{flag.name}="))
      out.append(Case(experiment, keep + (f"--{flag.name}={value}",), must_refuse, kind))
  rng.shuffle(out)
  # The base run first (it must keep the contract too, and it times the sizes' cases).
  return [Case(experiment, base, False, "base:valid")] + (out[:limit] if limit else out)


def _tmp_leftovers(folder: str) -> list[str]:
  return [
      os.path.join(root, f) for root, _, names in os.walk(folder) for f in names
      if f.startswith(".tmp-")
  ]


def _classify(case: Case, code: int | None, out: str, err: str, tmp: str, seconds: float,
              base_fast: bool = False) -> Outcome:
  if code is None:
    # A slow valid run is not a fault; a size set huge is, where the base run is fast: it
    # is work without a limit (refused up front, or bounded, never hours).
    unbounded = base_fast and case.kind == "int:huge"
    verdict = "hang" if case.must_refuse or unbounded else "ok"
    return Outcome(case, verdict, None, seconds,
                   "timed out" + (" (a huge size; the base run is fast)" if unbounded else ""))
  leftovers = _tmp_leftovers(tmp)
  if leftovers:
    return Outcome(case, "half_written", code, seconds, leftovers[0])
  if "Traceback" in err or code < 0:
    last = err.strip().splitlines()[-1] if err.strip() else f"signal {-code}"
    return Outcome(case, "traceback", code, seconds, last)
  said = [line for line in err.splitlines() if line.strip() and not _ABSL_LOG.match(line)]
  if code != 0 and said:
    if len(said) != 1:
      return Outcome(case, "traceback", code, seconds, f"{len(said)} lines on stderr")
    return Outcome(case, "clean_error", code, seconds, said[0])
  for path in _json_outputs(tmp):
    try:
      with open(path, encoding="utf-8") as f:
        json.load(f, parse_constant=_refuse_constant)
    except (ValueError, OSError) as e:
      return Outcome(case, "half_written" if "constant" not in str(e) else "nonfinite", code,
                     seconds, f"{path}: {e}")
  if _NUMBER.search(out):
    return Outcome(case, "nonfinite", code, seconds, _NUMBER.search(out).group(0))
  if case.must_refuse:
    return Outcome(case, "accepted_bad", code, seconds, "exit 0")
  return Outcome(case, "ok", code, seconds)


def _refuse_constant(name: str) -> float:
  raise ValueError(f"non-finite constant {name}")


def _json_outputs(folder: str) -> list[str]:
  return [
      os.path.join(root, f) for root, _, names in os.walk(folder) for f in names
      if f.endswith(".json")
  ]


def run_case(module_name: str, case: Case, timeout_s: float, base_fast: bool = False) -> Outcome:
  """Forks a child that parses the case's flags and runs the experiment."""
  from experiments import _cli  # Deferred: the runner imports experiments lazily.

  module = sys.modules[module_name]
  with tempfile.TemporaryDirectory() as tmp:
    args = [a.replace("{tmp}", tmp) for a in case.args]
    out_path, err_path = os.path.join(tmp, ".stdout"), os.path.join(tmp, ".stderr")
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # Child: never returns.
      try:
        os.chdir(tmp)
        fd_out = os.open(out_path, os.O_WRONLY | os.O_CREAT)
        fd_err = os.open(err_path, os.O_WRONLY | os.O_CREAT)
        os.dup2(fd_out, 1)
        os.dup2(fd_err, 2)
        sys.argv = [module_name, *args]
        _cli.run(module.main)
        code = 0
      except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
      except BaseException:  # noqa: BLE001  (the child reports, then dies)
        import traceback
        traceback.print_exc()
        code = 1
      sys.stdout.flush()
      sys.stderr.flush()
      os._exit(code)
    code = _wait(pid, timeout_s)
    seconds = time.monotonic() - start
    out = _read(out_path)
    err = _read(err_path)
    for path in (out_path, err_path):
      if os.path.exists(path):
        os.remove(path)
    return _classify(case, code, out, err, tmp, seconds, base_fast)


def _read(path: str) -> str:
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      return f.read()
  except OSError:
    return ""


def _wait(pid: int, timeout_s: float) -> int | None:
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
      return os.waitstatus_to_exitcode(status)
    time.sleep(0.01)
  os.kill(pid, signal.SIGKILL)
  os.waitpid(pid, 0)
  return None


def fuzz_experiment(experiment: str, *, limit: int | None, timeout_s: float,
                    seed: int = 0) -> list[Outcome]:
  """Imports `experiments.<experiment>` (an alias: the module it runs) and runs its cases."""
  module_name = f"experiments.{ALIASES.get(experiment, experiment)}"
  importlib.import_module(module_name)
  base, *cases = cases_for(module_name, seed=seed, limit=limit, experiment=experiment)
  first = run_case(module_name, base, timeout_s)
  # Fast: the base run ends in under a tenth of the time a case may take (a busy machine
  # slows a case a few times, not ten).
  fast = first.exit_code is not None and first.seconds < timeout_s / 10
  return [first] + [run_case(module_name, case, timeout_s, fast) for case in cases]


def summarize(outcomes: list[Outcome]) -> dict[str, Any]:
  """Totals by verdict and experiment, and the contract-breaking cases."""
  by_verdict: dict[str, int] = {}
  by_experiment: dict[str, dict[str, int]] = {}
  for o in outcomes:
    by_verdict[o.verdict] = by_verdict.get(o.verdict, 0) + 1
    per = by_experiment.setdefault(o.case.experiment, {})
    per[o.verdict] = per.get(o.verdict, 0) + 1
  worst = sorted((o for o in outcomes if o.breaks_contract), key=lambda o: -o.seconds)
  slowest = max((o.seconds for o in outcomes), default=math.nan)
  return {
      "cases": len(outcomes), "by_verdict": by_verdict, "by_experiment": by_experiment,
      "contract_breaks": [o.to_json() for o in worst[:50]],
      "slowest_case_s": None if math.isnan(slowest) else round(slowest, 3)
  }


def main(argv: list[str]) -> None:
  """Worker: `python -m experiments._fuzzing NAME LIMIT TIMEOUT_S SEED` prints
  one JSON outcome per line (one experiment per process: absl flags are global)."""
  experiment, limit, timeout_s, seed = argv[1], int(argv[2]), float(argv[3]), int(argv[4])
  for outcome in fuzz_experiment(experiment, limit=limit or None, timeout_s=timeout_s, seed=seed):
    print(json.dumps(outcome.to_json()), flush=True)


if __name__ == "__main__":
  main(sys.argv)
