"""The package's shape: every module imports, imports point down the layers,
there is no cycle, the symbolic layer never pulls in jax (nor do the analytic experiments
at start-up, nor matplotlib), no two modules under
jaxroof/ share a name, and no module under jaxroof/ names an experiment's flag.

Experiment modules define absl flags at import, so two of them must not share
a process: each is checked in its own subprocess (`--only_check_args` parses
the flags and exits).
"""

from __future__ import annotations

import ast
import pathlib
import pkgutil
import re
import subprocess
import sys

import pytest

import experiments

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Layer of each package prefix; a module may import its own layer or lower.
LAYERS: dict[str, int] = {
    "jaxroof.errors": 0,
    "jaxroof.files": 0,
    "jaxroof.schema": 0,
    "jaxroof.timing": 0,
    "jaxroof.progress": 0,
    "jaxroof.symbolic": 1,
    "jaxroof.specs": 2,
    "jaxroof.toy": 3,
    "kernels": 3,
    # Engines extend the symbolic cost model with their own terms and ship their data; what
    # measures, simulates or fits (measure and up) may use them, the layers below never.
    "jaxroof.engines": 4,
    "jaxroof.measure": 5,
    "jaxroof.parallel": 6,
    "jaxroof.serving": 7,
    "jaxroof.calibrate": 8,
    "jaxroof.report": 9,
    "experiments": 10,
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


def _upward(graph: dict[str, set[str]]) -> list[str]:
  """Edges to a higher layer, or from or to a module no layer holds."""
  wrong = []
  for module, deps in graph.items():
    here = _layer(module)
    for dep in deps:
      there = _layer(dep)
      if dep == "jaxroof":
        continue
      if here is None or there is None or there > here:
        wrong.append(f"{module} (layer {here}) imports {dep} (layer {there})")
  return sorted(wrong)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One import cycle (its modules, the first repeated at the end), or None."""
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
      return cycle
  return None


def _shared_names(modules) -> dict[str, list[str]]:
  """Last names that two or more modules or packages under jaxroof/ share."""
  names: dict[str, list[str]] = {}
  for module in modules:
    leaf = module.rsplit(".", 1)[-1]
    if not module.startswith("jaxroof.") or leaf == "__main__":
      continue
    names.setdefault(leaf, []).append(module)
  return {k: sorted(v) for k, v in names.items() if len(v) > 1}


def test_imports_point_down_the_layers():
  wrong = _upward(_graph())
  assert not wrong, "\n".join(wrong)


def test_kernels_import_only_jax_leaf_utilities_and_symbolic():
  """Kernels may use the leaf utilities and the sympy counts (`jaxroof.symbolic`, layer
  1, no jax): their `pl.CostEstimate` is the roofline's own FLOPs and bytes
  (`kernels/cost_estimate.py`). Nothing from specs up: a kernel knows shapes, not models."""
  allowed = ("jaxroof.errors", "jaxroof.files", "jaxroof.timing", "jaxroof.symbolic")
  wrong = [
      f"{m} imports {d}" for m, deps in _graph().items() if m.startswith("kernels") for d in deps
      if d.startswith("jaxroof") and not any(d == a or d.startswith(a + ".") for a in allowed)
  ]
  assert not wrong, "\n".join(wrong)


def test_no_import_cycle():
  cycle = _cycle(_graph())
  assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checks_catch_what_they_name():
  """Planted faults: an upward import, an unlayered module, a cycle, a shared name."""
  assert _upward({"jaxroof.symbolic.a": {"jaxroof.specs.b"}
                 }) == ["jaxroof.symbolic.a (layer 1) imports jaxroof.specs.b (layer 2)"]
  assert _upward({"jaxroof.nowhere": {"jaxroof.errors"}})
  assert not _upward({"jaxroof.specs.b": {"jaxroof.symbolic.a", "jaxroof.errors"}})
  assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
  assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
  assert _shared_names([
      "jaxroof.symbolic.serving", "jaxroof.serving", "kernels.linear", "jaxroof.symbolic.formulas"
  ]) == {"serving": ["jaxroof.serving", "jaxroof.symbolic.serving"]}


def test_no_relative_imports():
  """The graph reads absolute imports only, so a relative one would hide an edge."""
  relative = [
      f"{name}:{node.lineno}" for name, path in _modules().items()
      for node in ast.walk(ast.parse(path.read_text()))
      if isinstance(node, ast.ImportFrom) and node.level
  ]
  assert not relative, relative


def test_symbolic_layer_does_not_import_jax():
  code = ("import sys, jaxroof.symbolic, pkgutil, importlib\n"
          "for m in pkgutil.iter_modules(jaxroof.symbolic.__path__):\n"
          "  importlib.import_module('jaxroof.symbolic.' + m.name)\n"
          "bad = sorted(m for m in sys.modules if m == 'jax' or m.startswith('jax.'))\n"
          "assert not bad, bad\n")
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                        timeout=120)
  assert proc.returncode == 0, proc.stderr


# The analytic experiments: none times or runs the toy, so none needs jax at start-up, and
# matplotlib only where a plot is drawn (their imports are about 1.3 s of every run and of
# every refused flag).
ANALYTIC_EXPERIMENTS = ("serving", "plan", "simulate", "batch_sweep", "iteration",
                        "compare_accelerators", "kv_sizing", "list")


@pytest.mark.parametrize("name", ANALYTIC_EXPERIMENTS)
def test_analytic_experiments_start_without_jax_or_matplotlib(name):
  code = (f"import sys, experiments.{name}\n"
          "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'matplotlib'))\n"
          "assert not bad, bad[:5]\n")
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                        timeout=120)
  assert proc.returncode == 0, proc.stderr


def test_no_two_modules_share_a_name():
  """Modules and packages under jaxroof/ each have a last name of their own, so no
  caller needs an alias (`kernels` and `experiments` name ops and apps, and are apart)."""
  shared = _shared_names(_modules())
  assert not shared, shared


# Flags the experiments define: flags.DEFINE_*("name", ...) or DEFINE_*(name="name").
def experiment_flags() -> set[str]:
  names = set()
  for path in (ROOT / "experiments").glob("*.py"):
    for node in ast.walk(ast.parse(path.read_text())):
      if not isinstance(node, ast.Call):
        continue
      func = node.func
      called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
      if not called.startswith("DEFINE_"):
        continue
      first = node.args[0] if node.args else next(
          (k.value for k in node.keywords if k.arg == "name"), None)
      if isinstance(first, ast.Constant) and isinstance(first.value, str):
        names.add(first.value)
  return names


_LONG_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9_]*)(?![a-z0-9_-])")
_DASHED_FLAG = re.compile(r"^--[a-z0-9]+(-[a-z0-9]+)+$")


def _other_programs_spans(tree: ast.AST, source: str) -> list[tuple[int, int]]:
  """Character spans of another program's command line: a list or tuple of strings
  one of which is a dashed long flag (`--max-num-seqs`, vLLM's style; ours use
  underscores), so its `--model` or `--seed` are that program's, not ours."""
  starts = [0]
  for line in source.splitlines(keepends=True):
    starts.append(starts[-1] + len(line))
  spans = []
  for node in ast.walk(tree):
    if isinstance(node, (ast.List, ast.Tuple)) and any(
        isinstance(e, ast.Constant) and isinstance(e.value, str) and _DASHED_FLAG.match(e.value)
        for e in ast.walk(node)):
      spans.append((starts[node.lineno - 1] + node.col_offset,
                    starts[node.end_lineno - 1] + node.end_col_offset))
  return spans


def flag_mentions(source: str, flag_names: set[str]) -> list[tuple[int, str]]:
  """(line, `--name`) for each experiment flag a module's text names (code, strings,
  comments and docstrings alike; `--noname` for a boolean's negation too), outside
  another program's command line."""
  spans = _other_programs_spans(ast.parse(source), source)
  found = []
  for match in _LONG_FLAG.finditer(source):
    name = match.group(1)
    if name not in flag_names and not (name.startswith("no") and name[2:] in flag_names):
      continue
    if any(a <= match.start() < b for a, b in spans):
      continue
    found.append((source.count("\n", 0, match.start()) + 1, match.group(0)))
  return found


def test_flag_mentions_rule():
  names = {"model", "tp", "progress", "json_out"}
  source = ('"""Give --tp with --json_out."""\n'
            'cmd = ["vllm", "serve", "--model", m, "--max-num-seqs", "4"]\n'
            'hint = f"set --model={m} or --noprogress, not --tpx; --max-model-len"  # --tp\n')
  assert flag_mentions(source, names) == [(1, "--tp"), (1, "--json_out"), (3, "--model"),
                                          (3, "--noprogress"), (3, "--tp")]


def test_no_library_module_names_an_experiment_flag():
  """Library errors name fields (`InputError(field=...)`); experiments map them to flags."""
  names = experiment_flags()
  assert {"model", "tp", "json_out", "accelerator"} <= names, sorted(names)
  found = [
      f"{path.relative_to(ROOT)}:{line}: {flag}" for name, path in sorted(_modules().items())
      if name.startswith("jaxroof") for line, flag in flag_mentions(path.read_text(), names)
  ]
  assert not found, "\n".join(found)


@pytest.mark.e2e  # A long job: every experiment started (about 2 minutes on 2 loaded cores).
def test_every_experiment_starts_and_lists_its_flags():
  modules = [
      m.name for m in pkgutil.iter_modules(experiments.__path__) if not m.name.startswith("_")
  ]
  assert {"batch_sweep", "crossovers", "lesson", "report", "bench_sweep"} <= set(modules)
  procs = {
      m: subprocess.Popen([sys.executable, "-m", f"experiments.{m}", "--only_check_args"], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for m in modules
  }
  for module, proc in procs.items():
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"{module}: {err}"
