"""`calibrate --engine_terms=FIT --heldout_vllm=RUN`: an earlier fit carried to another run.

The fixture is a committed vLLM-on-CPU fit (pass 5's terms, `tests/data/vllm_cpu/`) and one run
of another pass it predicted when it was made: carried through the command line with nothing
fitted, the prediction equals the one the fit file recorded, and holding a term by `--hold`
moves it the way its formula says.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "vllm_cpu"
FIT = DATA / "calibration_pass5_predicts_pass6_engine_kernels.json"
RUN = DATA / "tiny_vllm_rate4_in128_out32.json"
FLAGS = (f"--engine_terms={FIT}", f"--heldout_vllm={RUN}", f"--model={DATA / 'models/tiny-llama'}",
         f"--accelerator_file={DATA / 'accelerator_pass5.json'}", "--server=scheduler=vllm")


def _calibrate(*extra: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "experiments.calibrate", *FLAGS, *extra],
                        capture_output=True, text=True, cwd=REPO, timeout=600)


def _p50_tpot(rows: list[dict]) -> float:
  return next(r["predicted_s"] for r in rows if (r["metric"], r["percentile"]) == ("tpot", 50))


def test_a_carried_fit_predicts_its_recorded_run_and_a_held_term_moves_it(tmp_path):
  out, slower = tmp_path / "pred.json", tmp_path / "slower.json"
  done = _calibrate(f"--json_out={out}")
  assert done.returncode == 0, done.stderr[-2000:]
  assert "no fit" in done.stdout
  recorded = [r for r in json.loads(FIT.read_text())["heldout"] if r["run"].startswith(RUN.name)]
  predicted = json.loads(out.read_text())["heldout"]
  assert recorded and [r["predicted_s"] for r in predicted] == pytest.approx(
      [r["predicted_s"] for r in recorded], rel=1e-9)
  eta_w = json.loads(FIT.read_text())["factors"]["eta_w"]
  done = _calibrate(f"--hold=eta_w={eta_w / 2}", f"--json_out={slower}")
  assert done.returncode == 0, done.stderr[-2000:]
  # Half the weights' rate: slower decode steps.
  assert _p50_tpot(json.loads(slower.read_text())["heldout"]) > _p50_tpot(predicted)
