"""Every experiment's JSON on fixed inputs equals the golden set captured before
the re-layering (`tests/golden/`), figures to 1e-9 relative. New keys are
allowed (an interface may grow); a changed or missing one fails."""

from __future__ import annotations

import json
import math
import pathlib

import pytest

from tests.golden import capture
from tests.golden import cases

GOLDEN = pathlib.Path(capture.__file__).parent


def _diff(path: str, want, got, out: list[str]) -> None:
  if isinstance(want, dict) and isinstance(got, dict):
    for key in sorted(set(want) | set(got)):
      if key not in got:
        out.append(f"{path}.{key}: missing")
      elif key not in want:
        continue  # Adding keys keeps the interface; changing or dropping does not.
      else:
        _diff(f"{path}.{key}", want[key], got[key], out)
  elif isinstance(want, list) and isinstance(got, list) and len(want) == len(got):
    for i, (a, b) in enumerate(zip(want, got)):
      _diff(f"{path}[{i}]", a, b, out)
  elif (isinstance(want, (int, float)) and isinstance(got, (int, float))
        and not isinstance(want, bool)):
    if not math.isclose(want, got, rel_tol=1e-9, abs_tol=1e-300):
      out.append(f"{path}: {want!r} -> {got!r}")
  elif want != got:
    out.append(f"{path}: {str(want)[:80]!r} -> {str(got)[:80]!r}")


@pytest.mark.parametrize("name", sorted(cases.CASES))
def test_experiment_json_matches_golden(name):
  want = json.loads((GOLDEN / f"{name}.json").read_text())
  got = json.loads(json.dumps(capture.run_case(name)))
  differences: list[str] = []
  _diff(name, want, got, differences)
  assert not differences, "\n".join(differences[:40])
