"""The long fuzz run: every experiment, every bad flag value, every malformed
input file, a JSON summary.

Each experiment runs in its own worker process (`experiments._fuzzing`), which
imports it once and forks a child per case; so does each file kind
(`experiments._file_fuzzing`: files made field by field from valid ones, fed
to the experiment that reads them); `--workers` of them run at once.

  python -m experiments.fuzz --json_out=results/fuzz_cpu.json
  python -m experiments.fuzz --experiments=list --file_kinds=model_config

The summary counts cases by verdict (clean_error, ok, and the contract
breakers: traceback, nonfinite, half_written, hang, accepted_bad) and per
experiment, and lists the worst cases. Exit 1 if any case breaks the contract.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import os
import pkgutil
import subprocess
import sys
import time

from absl import flags

import experiments
from experiments import _cli
from experiments import _file_fuzzing
from experiments import _fuzzing
from jaxroof import errors
from jaxroof import files
from jaxroof import progress

_PROGRESS = _cli.define_progress()
_EXPERIMENTS = flags.DEFINE_list("experiments", [],
                                 "Experiments to fuzz (default: every one but this).")
_LIMIT = flags.DEFINE_integer("limit", 0, "Cases per experiment, 0 for all (>= 0).", lower_bound=0)
_TIMEOUT_S = flags.DEFINE_float(
    "timeout_s", 20.0, "Seconds a case may run (a bad input must be refused "
    "sooner). In [1, 600].", lower_bound=1.0, upper_bound=600.0)
_SEEDS = flags.DEFINE_integer(
    "seeds", 1, "Passes with different seeds (case order and random values). In [1, 20].",
    lower_bound=1, upper_bound=20)
_WORKERS = flags.DEFINE_integer("workers", 2, "Experiments fuzzed at once. In [1, 16].",
                                lower_bound=1, upper_bound=16)
_FILE_KINDS = flags.DEFINE_list(
    "file_kinds", list(_file_fuzzing.KINDS), "Input file kinds to fuzz "
    f"({', '.join(_file_fuzzing.KINDS)}; empty: none).")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Write the summary as JSON here.")


def _all_experiments() -> list[str]:
  return sorted(m.name for m in pkgutil.iter_modules(experiments.__path__)
                if not m.name.startswith("_") and m.name not in _fuzzing.SKIP)


def _worker(experiment: str, seed: int) -> list[dict]:
  """The outcomes of one experiment's flag cases, or (`file:KIND`) of one file kind's."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  if experiment.startswith("file:"):
    command = [
        "experiments._file_fuzzing", experiment[len("file:"):],
        str(_LIMIT.value),
        str(_TIMEOUT_S.value)
    ]
  else:
    command = [
        "experiments._fuzzing", experiment,
        str(_LIMIT.value),
        str(_TIMEOUT_S.value),
        str(seed)
    ]
  proc = subprocess.run([sys.executable, "-m", *command], cwd=root, capture_output=True, text=True,
                        timeout=24 * 3600)
  rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
  if proc.returncode != 0:
    rows.append({
        "experiment": experiment, "args": [], "kind": "worker", "must_refuse": False,
        "verdict": "traceback", "exit_code": proc.returncode, "seconds": 0.0,
        "detail": proc.stderr.strip()[-300:]
    })
  return rows


def main(argv: list[str]) -> int:
  del argv  # Unused.
  known = _all_experiments()
  chosen = _EXPERIMENTS.value or known
  for name in chosen:
    errors.require_choice("--experiments", name, known)
  for kind in _FILE_KINDS.value:
    errors.require_choice("--file_kinds", kind, tuple(_file_fuzzing.KINDS))
  jobs = [(name, seed) for seed in range(_SEEDS.value) for name in chosen]
  jobs += [(f"file:{kind}", 0) for kind in _FILE_KINDS.value]  # Files: no random values.
  start = time.monotonic()
  rows: list[dict] = []
  with concurrent.futures.ThreadPoolExecutor(_WORKERS.value) as pool:
    futures = [pool.submit(_worker, name, seed) for name, seed in jobs]
    for future in progress.bar(concurrent.futures.as_completed(futures), total=len(futures),
                               desc="experiments", unit="exp", requested=_PROGRESS.value):
      rows.extend(future.result())
  outcomes = [
      _fuzzing.Outcome(
          _fuzzing.Case(r["experiment"], tuple(r["args"]), r["must_refuse"], r["kind"]),
          r["verdict"], r["exit_code"], r["seconds"], r["detail"]) for r in rows
  ]
  summary = {
      "kind": "fuzz",
      "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "machine": {"cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0]},
      "experiments": chosen,
      "file_kinds": _FILE_KINDS.value,
      "seeds": _SEEDS.value,
      "timeout_s": _TIMEOUT_S.value,
      "wall_s": round(time.monotonic() - start, 1),
      **_fuzzing.summarize(outcomes),
  }
  print(f"{summary['cases']} cases over {len(chosen)} experiments and "
        f"{len(_FILE_KINDS.value)} file kinds in {summary['wall_s']} s:")
  for verdict, count in sorted(summary["by_verdict"].items()):
    print(f"  {verdict:>13}: {count}")
  for case in summary["contract_breaks"][:10]:
    print(f"  BREAKS: {case['experiment']} {' '.join(case['args'])[:100]} -> "
          f"{case['verdict']}: {case['detail'][:100]}")
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, summary)
  return 1 if summary["contract_breaks"] else 0


if __name__ == "__main__":
  _cli.run(main)
