"""The fuzz tier for input files: malformed files, made field by field from the
valid ones we ship (`experiments/_file_fuzzing.py`), each fed to the experiment
that reads it (a model config to kv_sizing, an accelerator file to iteration,
at tp=8 for the link figures, a vLLM result to calibrate --source=vllm,
measurements as CSV and JSONL to calibrate --from_csv, an earlier fit's terms to
calibrate --engine_terms, a profile to batch_sweep --profile, a request trace as CSV
and JSONL to simulate --trace), keep
the contract: a clean one-line error or a correct result; no traceback, no nan
or inf, nothing half-written, no hang; refused wherever the file's schema
refuses it.

A deterministic sample of each kind runs here (every fault, fields in turn);
`python -m experiments.fuzz --file_kinds=...` runs them all. All kinds run once
per session (both xdist workers share the outcomes through a locked file).
"""

from __future__ import annotations

import concurrent.futures
import fcntl
import json
import pathlib
import subprocess
import sys

import pytest

from experiments import _file_fuzzing

pytestmark = pytest.mark.fuzz

ROOT = pathlib.Path(__file__).resolve().parent.parent
LIMITS = {
    "model_config": 40, "accelerator_file": 16, "accelerator_links": 40, "vllm_result": 16,
    "measurements_csv": 14, "measurements_jsonl": 12, "engine_terms": 14, "profile": 20,
    "trace_csv": 12, "trace_jsonl": 12
}
TIMEOUT_S = 6.0  # A refused file is refused in well under a second.


def _params() -> list:
  out = []
  for kind, limit in LIMITS.items():
    for case in _file_fuzzing.sample(kind, limit):
      out.append(pytest.param(case.id, id=case.id))
  return out


def _run_all() -> dict[str, dict]:

  def one(kind: str) -> list[dict]:
    proc = subprocess.run([
        sys.executable, "-m", "experiments._file_fuzzing", kind,
        str(LIMITS[kind]),
        str(TIMEOUT_S)
    ], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]

  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    rows = [row for rows in pool.map(one, LIMITS) for row in rows]
  return {row["id"]: row for row in rows}


@pytest.fixture(scope="session")
def outcomes(tmp_path_factory, worker_id) -> dict[str, dict]:
  """Every sampled case's outcome, computed once per test run."""
  shared = tmp_path_factory.getbasetemp()
  if worker_id != "master":  # xdist: the run's folder above each worker's.
    shared = shared.parent
  cache = shared / "file_fuzz_outcomes.json"
  with open(shared / "file_fuzz_outcomes.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not cache.exists():
      cache.write_text(json.dumps(_run_all()))
  return json.loads(cache.read_text())


@pytest.mark.parametrize("case_id", _params())
def test_a_malformed_file_keeps_the_contract(outcomes, case_id):
  outcome = outcomes[case_id]
  if case_id.endswith(":<file>:valid"):  # The base file runs: the kind's flags are current.
    assert outcome["verdict"] == "ok", json.dumps(outcome, indent=1)
  assert outcome["verdict"] in ("ok", "clean_error"), json.dumps(outcome, indent=1)
