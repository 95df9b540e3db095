"""Writes the golden JSON of every case in `tests.golden.cases` (run from the root).

    python -m tests.golden.capture [NAME ...]
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import tempfile

from tests.golden import cases

HERE = pathlib.Path(__file__).parent


def run_case(name: str) -> dict:
  """Runs one case and returns its stripped JSON."""
  module, flags = cases.CASES[name]
  with tempfile.TemporaryDirectory() as tmp:
    out = pathlib.Path(tmp) / "out.json"
    proc = subprocess.run(
        [sys.executable, "-m", f"experiments.{module}", *flags, f"--json_out={out}"],
        capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
      raise RuntimeError(f"{name}: exit {proc.returncode}: {proc.stderr[-2000:]}")
    return cases.strip(json.loads(out.read_text()))


def main(names: list[str]) -> None:
  for name in names or sorted(cases.CASES):
    data = run_case(name)
    (HERE / f"{name}.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {name}")


if __name__ == "__main__":
  main(sys.argv[1:])
