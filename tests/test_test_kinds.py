"""The suite's own contract: every test gets one kind, every kind runs in a CI tier,
and `pytest -m KIND` selects what the kind means (tests/conftest.py)."""

from __future__ import annotations

import configparser
import json
import pathlib
import re
import shlex
import subprocess
import sys

from _pytest.mark.expression import Expression

from tests import conftest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _selects(expression: str, kind: str) -> bool:
  return Expression.compile(expression).evaluate(lambda name, **_: name == kind)


def test_every_kind_runs_in_exactly_one_ci_tier():
  """The default tier (setup.cfg's addopts, what README's command runs) and the later
  tiers .ci/run runs after it cover each kind once; the device kinds run (and skip
  without their device) in the default tier."""
  cfg = configparser.ConfigParser()
  cfg.read(ROOT / "setup.cfg")
  addopts = shlex.split(cfg["tool:pytest"]["addopts"])
  default = addopts[addopts.index("-m") + 1]
  later = re.search(r"^for tier in ([\w ]+); do$", (ROOT / ".ci" / "run").read_text(),
                    re.MULTILINE).group(1).split()
  for kind in conftest.KINDS:
    tiers = [default] * _selects(default, kind) + [t for t in later if _selects(t, kind)]
    assert len(tiers) == 1, (kind, tiers)
  assert all(_selects(default, kind) for kind in ("unit", "cli", "golden", "gpu", "tpu"))


_COLLECT = """
import json, sys
import pytest

class Names:
  def pytest_collection_finish(self, session):
    self.names = sorted(item.name.split("[")[0] for item in session.items)

out = {}
for expression in json.loads(sys.argv[1]):
  names = Names()
  pytest.main(["--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider", "-m",
               expression, *sys.argv[2:]], plugins=[names])
  out[expression] = names.names
print("KINDS " + json.dumps(out))
"""


def _collect(expressions: list[str], *files: str) -> dict[str, set[str]]:
  """Test names `pytest -m EXPRESSION` selects in `files`, per expression (collection only,
  in one subprocess: absl flags and experiments are per process)."""
  proc = subprocess.run([sys.executable, "-c", _COLLECT,
                         json.dumps(expressions), *files], cwd=ROOT, capture_output=True, text=True,
                        timeout=300)
  line = [ln for ln in proc.stdout.splitlines() if ln.startswith("KINDS ")]
  assert line, proc.stdout[-2000:] + proc.stderr[-2000:]
  return {k: set(v) for k, v in json.loads(line[0][len("KINDS "):]).items()}


def test_markers_select_by_kind():
  got = _collect(["unit", "cli", "e2e", "golden", "gpu or tpu", "fuzz", "slow", ""],
                 "tests/data/kinds_sample.py", "tests/test_fuzz.py", "tests/test_golden.py")
  assert got["unit"] == {"test_library_call", "test_other_program", "test_plain_method"}
  assert got["cli"] == {
      "test_through_a_helper", "test_direct", "test_through_a_fixture", "test_through_a_method"
  }
  assert got["e2e"] == {"test_old_slow_mark"}
  assert got["gpu or tpu"] == {"test_device"}
  assert got["fuzz"] == {"test_bad_flags_keep_the_contract"}
  # tests/test_golden.py is golden by its file; elsewhere only an explicit mark is.
  assert "test_explicit_kind_wins" in got["golden"]
  assert len(got["golden"]) > 1 and not got["golden"] & (got["unit"] | got["cli"])
  # `-m slow`, the old name of the later tiers, still selects them: fuzz and e2e.
  assert got["slow"] == got["e2e"] | got["fuzz"]
  kinds = ("unit", "cli", "e2e", "golden", "gpu or tpu", "fuzz")
  assert sum(len(got[k]) for k in kinds) == len(got[""])  # One kind per test.
