"""The fuzz tier: every experiment, fed bad flag values made from its own flag
definitions, keeps the contract (a clean one-line error or a correct result;
no traceback, no nan/inf, nothing half-written, no hang). Each experiment's valid base
run comes first and must work (exit 0, or a slow run cut off; its one-line refusal
where there is no engine or GPU here); where it is fast, a size flag set huge (10^9 or
10^12) must be refused or stay fast: work without a limit is a hang.

A sample of cases per experiment runs here; `python -m experiments.fuzz` runs
them all and writes a JSON summary.
"""

from __future__ import annotations

import json
import pathlib
import pkgutil
import subprocess
import sys

import pytest

import experiments
from experiments import _fuzzing

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXPERIMENTS = sorted(m.name for m in pkgutil.iter_modules(experiments.__path__)
                     if not m.name.startswith("_") and m.name != "fuzz")
CASES_PER_EXPERIMENT = 8
TIMEOUT_S = 6.0


@pytest.mark.fuzz
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_bad_flags_keep_the_contract(experiment):
  proc = subprocess.run([
      sys.executable, "-m", "experiments._fuzzing", experiment,
      str(CASES_PER_EXPERIMENT),
      str(TIMEOUT_S), "0"
  ], cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  outcomes = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
  assert outcomes, f"{experiment}: no cases ran"
  base = outcomes[0]  # Its valid base run: the fuzz cases start from a run that works.
  assert base["kind"] == "base:valid", base
  expected = "clean_error" if experiment in _fuzzing.BASE_REFUSED else "ok"
  assert base["verdict"] == expected, base
  broken = [
      o for o in outcomes
      if o["verdict"] in ("traceback", "nonfinite", "half_written", "hang", "accepted_bad")
  ]
  assert not broken, json.dumps(broken[:5], indent=1)
