"""Alias of `python -m experiments.calibrate --source=layouts`, kept for older command lines.

Measured step times on parallel layouts (tp, pp, ep), fitted with eta_comm
(`jaxroof.calibrate.layout_fit`); every flag is `calibrate`'s:

  python -m experiments.calibrate_layouts \
      --from_csv=tests/data/gptfast_a100_tp_steps.csv --accelerator=a100-80gb [--carry_over]
"""

from __future__ import annotations

import sys

from experiments import _cli
from experiments import calibrate

if __name__ == "__main__":
  sys.argv.insert(1, "--source=layouts")
  _cli.run(calibrate.main)
