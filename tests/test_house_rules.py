"""The house rules that keep the repository small and the library general.

Each test lists every file that breaks its rule, so one run shows all that is left:
- no module (`*.py` under jaxroof/, experiments/, kernels/, tests/) over 600 lines and no
  experiment (`experiments/*.py` not starting with `_`) over 200;
- `calibrate` takes at most 30 flags of its own (those of experiments/calibrate.py and of
  the flag modules it imports; absl's own left out);
- README.md at most 250 lines, WORKSPACE.md at most 300, results/ at most 5 MB;
- the library (`jaxroof/`) names no results path, no CPU model and no issue number;
- `--helpshort` of serving, simulate and plan lists the model and the accelerator(s).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODULE_LINES, EXPERIMENT_LINES = 600, 200
CALIBRATE_FLAGS = 30
DOC_LINES = {"README.md": 250, "WORKSPACE.md": 300}
RESULTS_BYTES = 5 * 10**6
# What the library never names: where a result lies, which host measured it, which issue
# asked for it (those belong to results/README.md, docs/ and the history).
FORBIDDEN = {
    "a results path": re.compile(r"results/"),
    "a CPU model": re.compile(r"EPYC|Xeon"),
    "an issue number": re.compile(r"[Ii]ssue \d+|issue #"),
}


def _lines(path: pathlib.Path) -> int:
  with open(path, encoding="utf-8") as f:
    return sum(1 for _ in f)


def _python_files(*folders: str) -> list[pathlib.Path]:
  return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def test_no_module_is_over_600_lines():
  long = {
      str(p.relative_to(ROOT)): n
      for p in _python_files("jaxroof", "experiments", "kernels", "tests")
      if (n := _lines(p)) > MODULE_LINES
  }
  assert not long, f"modules over {MODULE_LINES} lines (split them by concept): {long}"


def test_no_experiment_is_over_200_lines():
  experiments = [p for p in (ROOT / "experiments").glob("*.py") if not p.name.startswith("_")]
  assert len(experiments) > 10  # The rule checks the real experiments, not an empty glob.
  long = {p.name: n for p in sorted(experiments) if (n := _lines(p)) > EXPERIMENT_LINES}
  assert not long, (f"experiments over {EXPERIMENT_LINES} lines (the logic belongs in the "
                    f"library): {long}")


def test_calibrate_takes_at_most_30_flags_of_its_own():
  # A fresh process: experiment modules define their flags at import.
  code = ("import sys; sys.argv = ['calibrate']; import experiments.calibrate; "
          "import json; from absl import flags; "
          "own = {m: [f.name for f in fl] for m, fl in flags.FLAGS.flags_by_module_dict().items() "
          "if m.startswith('experiments')}; "
          "print(json.dumps(sorted({n for names in own.values() for n in names})))")
  done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                        timeout=120, check=True)
  names = json.loads(done.stdout.strip().splitlines()[-1])
  assert "from_csv" in names  # The count sees calibrate's flags.
  assert len(names) <= CALIBRATE_FLAGS, (f"calibrate has {len(names)} flags of its own, at "
                                         f"most {CALIBRATE_FLAGS}: {names}")


@pytest.mark.parametrize("name", sorted(DOC_LINES))
def test_the_top_level_documents_stay_short(name):
  assert _lines(ROOT / name) <= DOC_LINES[name], (
      f"{name} has {_lines(ROOT / name)} lines, at most {DOC_LINES[name]}: deep dives go to "
      "docs/")


def test_results_hold_at_most_5_mb():
  sizes = {
      os.path.relpath(os.path.join(folder, name), ROOT): os.path.getsize(os.path.join(folder, name))
      for folder, _, names in os.walk(ROOT / "results") for name in names
  }
  total = sum(sizes.values())
  largest = sorted(sizes.items(), key=lambda item: -item[1])[:5]
  assert total <= RESULTS_BYTES, (f"results/ holds {total / 1e6:.1f} MB, at most "
                                  f"{RESULTS_BYTES / 1e6:.0f} MB; largest: {largest}")


def test_the_library_names_no_results_path_cpu_model_or_issue():
  found = []
  for path in _python_files("jaxroof"):
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
      found += [
          f"{path.relative_to(ROOT)}:{number}: {what}: {line.strip()[:80]}"
          for what, pattern in FORBIDDEN.items() if pattern.search(line)
      ]
  assert not found, (f"{len(found)} library lines name what belongs in results/README.md, "
                     "docs/ or the history:\n" + "\n".join(found))


@pytest.mark.parametrize("experiment, accelerator", [("serving", "--accelerator"),
                                                     ("simulate", "--accelerator"),
                                                     ("plan", "--accelerators")])
def test_helpshort_lists_the_model_and_the_accelerator(experiment, accelerator):
  done = subprocess.run([sys.executable, "-m", f"experiments.{experiment}", "--helpshort"],
                        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
  listed = set(re.findall(r"^\s+--(?:\[no\])?(\w+):", done.stdout + done.stderr, re.M))
  assert {"model", accelerator.lstrip("-")} <= listed, sorted(listed)
