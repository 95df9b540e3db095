"""Pytest setup: absl flags parsed once, every test marked by its kind, device skips.

Kinds (one per test; `pytest -m KIND` selects them):
  unit    library code called in this process (the default kind);
  cli     starts an experiment (`python -m experiments.NAME`) and checks what it prints,
          writes or refuses;
  golden  tests/test_golden.py: every experiment's JSON against the golden set;
  fuzz    bad flag values fed to every experiment (tests/test_fuzz.py);
  e2e     a whole path or a long job: chained experiments, the full report, real fits,
          the GPU script's dry run, a real engine;
  gpu, tpu  need that device; they skip without it.

A kind marked in a test file wins. Otherwise `golden` and `fuzz` go by file (`FILE_KINDS`);
a test still marked with the old `slow`, or listed in `E2E_TESTS`, is `e2e`; a test is
`cli` when its code, a helper it calls in its module, or a fixture it uses names an
experiment module as a string (`"experiments.serving"`, `f"experiments.{name}"`);
anything else is `unit`.

Tiers: the default (README's test command, setup.cfg's addopts) runs
`not fuzz and not e2e`; CI then runs `-m fuzz` and `-m e2e` (.ci/run). `slow`,
the old name of the later tiers, is added to every fuzz and e2e test, so
`pytest -m slow` still runs what the default tier leaves out.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
import textwrap
from collections.abc import Callable

import pytest
from absl import flags

KINDS = ("unit", "cli", "golden", "fuzz", "e2e", "gpu", "tpu")
DEVICE_KINDS = {"gpu": "gpu", "tpu": "tpu"}  # Kind -> jax.default_backend() it needs.
LATER_TIERS = ("fuzz", "e2e")  # Not in the default tier; `slow` is their old name.
FILE_KINDS = {"test_golden.py": "golden", "test_fuzz.py": "fuzz"}
# Whole paths and long jobs in files that hold other kinds, by file and test name
# (parameters aside); a mark in the file would do the same.
E2E_TESTS = {
    ("test_experiments_cli.py", "test_report_writes_summary_and_plots"),  # The full report.
    ("test_fleet.py", "test_find_max_rate_matches_the_analytic_capacity_within_the_spread"),
    # The slowest whole paths (over 8 s each on 2 cores), so the default tier stays under
    # 6 minutes; each has faster neighbours in the default tier that cover its module.
    ("test_calibrate_carried_fit.py",
     "test_a_carried_fit_predicts_its_recorded_run_and_a_held_term_moves_it"),
    ("test_engine_replay.py",
     "test_held_elementwise_kernels_slow_prefills_and_carry_in_the_factors"),
    ("test_vllm_runner.py", "test_unhealthy_server_is_stopped_with_its_children_and_the_log_shown"),
    ("test_calibrate_vllm.py", "test_engine_terms_cli_predicts_runs_as_the_fit_did"),
    ("test_calibrate_vllm.py", "test_a_fit_carried_to_another_device_predicts_without_fitting"),
    ("test_calibrate_vllm.py", "test_calibrate_engine_cli_with_accelerator_file"),
    ("test_calibrate_vllm.py", "test_heldout_rows_and_refusal"),
    ("test_parallel.py", "test_plan_cli_json"),
    ("test_engine_cli.py",
     "test_iteration_with_an_engine_is_the_predictors_step_with_the_bound_beside"),
    ("test_engine_terms.py",
     "test_an_engines_elementwise_kernels_cost_t_act_per_row_and_activation_element"),
    ("test_op_calibration.py", "test_fit_sensitivity_is_how_the_whole_fit_moves_each_factor"),
    ("test_op_calibration.py",
     "test_the_probe_moves_only_eta_kv_and_its_floor_is_said_when_a_run_misses"),
    ("test_calibrated_error.py",
     "test_summary_shows_each_calibrated_prediction_with_its_profile_error"),
    ("test_serving_cli.py", "test_a_profile_from_another_device_needs_what_if"),
}
_EXPERIMENT_MODULE = re.compile(r"experiments\.[a-z0-9_]*$")


def pytest_configure(config):
  del config  # Unused; the markers are declared in setup.cfg.
  if not flags.FLAGS.is_parsed():
    flags.FLAGS(sys.argv[:1])


def _names_an_experiment(node: ast.AST) -> bool:
  """A string constant `experiments.NAME`, or an f-string that starts `experiments.`."""
  if isinstance(node, ast.Constant) and isinstance(node.value, str):
    return bool(_EXPERIMENT_MODULE.match(node.value))
  if isinstance(node, ast.JoinedStr) and node.values:
    first = node.values[0]
    return (isinstance(first, ast.Constant) and isinstance(first.value, str) and
            bool(_EXPERIMENT_MODULE.match(first.value)))
  return False


def runs_an_experiment(func: Callable, owner: type | None = None, seen: set | None = None) -> bool:
  """Whether `func`, or a function of its module (or method of `owner`) it calls, names an
  experiment module: how a test starts one (`[sys.executable, "-m", "experiments.x"]`)."""
  seen = set() if seen is None else seen
  func = inspect.unwrap(getattr(func, "__func__", func))
  if func in seen or not inspect.isfunction(func):
    return False
  seen.add(func)
  try:
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
  except (OSError, TypeError, SyntaxError):
    return False
  for node in ast.walk(tree):
    if _names_an_experiment(node):
      return True
    if not isinstance(node, ast.Call):
      continue
    callee = None
    if isinstance(node.func, ast.Name):
      callee = func.__globals__.get(node.func.id)
    elif (isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) and
          node.func.value.id in ("self", "cls") and owner is not None):
      callee = getattr(owner, node.func.attr, None)
    if (inspect.isfunction(getattr(callee, "__func__", callee)) and
        getattr(callee, "__module__", None) == func.__module__ and
        runs_an_experiment(callee, owner, seen)):
      return True
  return False


def _fixture_functions(item: pytest.Item) -> list[Callable]:
  info = getattr(item, "_fixtureinfo", None)
  if info is None:
    return []
  return [defs[-1].func for name in item.fixturenames if (defs := info.name2fixturedefs.get(name))]


def kind_of(item: pytest.Item) -> str:
  """The one kind of a collected test (see the module docstring for the rules)."""
  explicit = [kind for kind in KINDS if item.get_closest_marker(kind)]
  if explicit:
    return explicit[0]
  by_file = FILE_KINDS.get(item.path.name)
  if by_file:
    return by_file
  if item.get_closest_marker("slow") or ((item.path.name, getattr(item, "originalname", item.name))
                                         in E2E_TESTS):
    return "e2e"
  func = getattr(item, "function", None)
  owner = getattr(item, "cls", None)
  seen: set = set()
  if func is not None and (runs_an_experiment(func, owner, seen) or any(
      runs_an_experiment(f, owner, seen) for f in _fixture_functions(item))):
    return "cli"
  return "unit"


def pytest_collection_modifyitems(config, items):
  del config  # Unused.
  for item in items:
    kind = kind_of(item)
    if not item.get_closest_marker(kind):
      item.add_marker(kind)
    if kind in LATER_TIERS and not item.get_closest_marker("slow"):
      item.add_marker("slow")


def pytest_runtest_setup(item):
  """gpu and tpu tests skip unless jax's default backend is that device."""
  needs = [backend for kind, backend in DEVICE_KINDS.items() if item.get_closest_marker(kind)]
  if needs:
    import jax  # Only when a device test runs: collection stays free of a backend.
    if jax.default_backend() not in needs:
      pytest.skip(f"needs a {' or '.join(needs).upper()} (jax's default backend is "
                  f"{jax.default_backend()})")


class FakeClock:
  """A clock that only moves when `fn` runs: each call takes the next duration."""

  def __init__(self, durations):
    self.now = 0.0
    self.durations = list(durations)
    self.calls = []

  def __call__(self):
    return self.now

  def fn(self, *args):
    self.calls.append(args)
    self.now += self.durations.pop(0)
    return 0.0


@pytest.fixture
def fake_clock():
  """`fake_clock([d0, d1, ...])` builds a `FakeClock` (tests of the timing harness)."""
  return FakeClock
