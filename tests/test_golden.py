"""Every experiment's JSON on fixed inputs equals the golden set captured before
the re-layering (`tests/golden/`), figures to 1e-9 relative. New keys are
allowed (an interface may grow); a changed or missing one fails.

Rounding residuals are bounds, not figures. A float the golden run recorded below
`RESIDUAL` in magnitude (an error, a difference, a float64 rounding residual) depends
on the CPU's instruction set and the kernels XLA picks for it (6.7e-16 on an AMD EPYC
with AVX-512, 1.0e-15 on an Intel Xeon with AMX), so it is checked as
``|value| <= RESIDUAL``, never as equal. The rule goes by magnitude, not by key, so
a new residual field is covered without a list to keep.
"""

from __future__ import annotations

import json
import math
import pathlib

import pytest

from tests.golden import capture
from tests.golden import cases

GOLDEN = pathlib.Path(capture.__file__).parent

# Golden floats below this magnitude are rounding residuals: compared as a bound.
RESIDUAL = 1e-12


def _same_figure(want: float, got: float) -> bool:
  """Equal to 1e-9 relative, or both within the residual bound."""
  if isinstance(want, float) and abs(want) < RESIDUAL:
    return abs(got) <= RESIDUAL
  return math.isclose(want, got, rel_tol=1e-9, abs_tol=1e-300)


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
  elif (isinstance(want, (int, float)) and isinstance(got, (int, float)) and
        not isinstance(want, bool)):
    if not _same_figure(want, got):
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


@pytest.mark.parametrize(
    "want, got, same",
    [
        (6.661338147750939e-16, 9.992007221626409e-16, True),  # The Intel/AMD residual.
        (6.661338147750939e-16, 0.0, True),
        (0.0, -3e-16, True),
        (6.661338147750939e-16, 1e-9, False),  # A residual that grew is a failure.
        (0.0125, 0.0125 * (1 + 1e-7), False),  # A figure is still compared to 1e-9.
        (2, 2, True),
    ])
def test_residuals_are_bounds_and_figures_are_equal(want, got, same):
  differences: list[str] = []
  _diff("x", want, got, differences)
  assert (not differences) is same, differences
