"""A broken package __init__ or experiment module fails here first.

Experiment modules define absl flags at import, so two of them must not share
a process: each is checked in its own subprocess (`--only_check_args` parses the flags and exits).
"""

import os
import pkgutil
import subprocess
import sys

import experiments
import jaxroof

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_public_names_exist():
  for name in jaxroof.__all__:
    assert hasattr(jaxroof, name), name


def test_every_experiment_starts_and_lists_its_flags():
  modules = [m.name for m in pkgutil.iter_modules(experiments.__path__)
             if not m.name.startswith("_")]
  assert {"batch_sweep", "crossovers", "lesson", "report", "bench_sweep"} <= set(modules)
  procs = {m: subprocess.Popen([sys.executable, "-m", f"experiments.{m}", "--only_check_args"],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True) for m in modules}
  for module, proc in procs.items():
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"{module}: {err}"
