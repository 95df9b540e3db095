"""The package's shape: every module imports, imports point down the layers,
there is no cycle, and the symbolic layer never pulls in jax.

Experiment modules define absl flags at import, so two of them must not share
a process: each is checked in its own subprocess (`--only_check_args` parses
the flags and exits).
"""

from __future__ import annotations

import ast
import pathlib
import pkgutil
import subprocess
import sys

import pytest

import experiments

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Layer of each package prefix; a module may import its own layer or lower.
LAYERS: dict[str, int] = {
    "jaxroof.errors": 0, "jaxroof.files": 0, "jaxroof.timing": 0, "jaxroof.progress": 0,
    "jaxroof.symbolic": 1,
    "jaxroof.specs": 2,
    "jaxroof.toy": 3, "kernels": 3,
    "jaxroof.measure": 4,
    "jaxroof.parallel": 5,
    "jaxroof.serving": 6,
    "jaxroof.calibrate": 7,
    "jaxroof.report": 8,
    "experiments": 9,
}


def _layer(module: str) -> int | None:
  best = None
  for prefix, layer in LAYERS.items():
    if module == prefix or module.startswith(prefix + "."):
      if best is None or len(prefix) > len(best[0]):
        best = (prefix, layer)
  return None if best is None else best[1]


def _modules() -> dict[str, pathlib.Path]:
  found = {}
  for top in ("jaxroof", "kernels", "experiments"):
    for path in (ROOT / top).rglob("*.py"):
      parts = path.relative_to(ROOT).with_suffix("").parts
      if parts[-1] == "__init__":
        parts = parts[:-1]
      found[".".join(parts)] = path
  return found


def _imports(path: pathlib.Path, known: set[str]) -> set[str]:
  """Project modules a file imports, at any depth (function-level too)."""
  out = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    else:
      continue
    out.update(name for name in names if name in known)
  return out


def _graph() -> dict[str, set[str]]:
  modules = _modules()
  known = set(modules)
  graph = {}
  for name, path in modules.items():
    deps = _imports(path, known) - {name}
    # A package's __init__ importing its own submodules is not an edge back.
    graph[name] = {d for d in deps if not d.startswith(name + ".")}
  return graph


def test_imports_point_down_the_layers():
  wrong = []
  for module, deps in _graph().items():
    here = _layer(module)
    for dep in deps:
      there = _layer(dep)
      if dep in ("jaxroof",):
        continue
      if here is None or there is None or there > here:
        wrong.append(f"{module} (layer {here}) imports {dep} (layer {there})")
  assert not wrong, "\n".join(sorted(wrong))


def test_kernels_import_only_jax_and_leaf_utilities():
  leaf = ("jaxroof.errors", "jaxroof.files", "jaxroof.timing")
  wrong = [f"{m} imports {d}" for m, deps in _graph().items() if m.startswith("kernels")
           for d in deps if d.startswith("jaxroof") and d not in leaf]
  assert not wrong, "\n".join(wrong)


def test_no_import_cycle():
  graph = _graph()
  state: dict[str, int] = {}
  stack: list[str] = []

  def visit(node: str) -> list[str] | None:
    state[node] = 1
    stack.append(node)
    for dep in sorted(graph.get(node, ())):
      if state.get(dep) == 1:
        return stack[stack.index(dep):] + [dep]
      if dep not in state and (cycle := visit(dep)):
        return cycle
    stack.pop()
    state[node] = 2
    return None

  for node in sorted(graph):
    if node not in state and (cycle := visit(node)):
      raise AssertionError("import cycle: " + " -> ".join(cycle))


def test_symbolic_layer_does_not_import_jax():
  code = ("import sys, jaxroof.symbolic, pkgutil, importlib\n"
          "for m in pkgutil.iter_modules(jaxroof.symbolic.__path__):\n"
          "  importlib.import_module('jaxroof.symbolic.' + m.name)\n"
          "bad = sorted(m for m in sys.modules if m == 'jax' or m.startswith('jax.'))\n"
          "assert not bad, bad\n")
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr


def test_no_two_modules_share_a_name():
  names = {}
  for module in _modules():
    leaf = module.rsplit(".", 1)[-1]
    if module.startswith(("experiments", "kernels")) or leaf in ("jaxroof", "__main__"):
      continue
    names.setdefault(leaf, []).append(module)
  shared = {k: v for k, v in names.items() if len(v) > 1}
  assert not shared, shared


@pytest.mark.slow  # The fuzz tier starts and runs every experiment in the default tiers.
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
