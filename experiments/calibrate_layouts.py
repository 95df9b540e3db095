"""Alias of `python -m experiments.calibrate --source=layouts`, kept for older command lines.

Measured step times on parallel layouts (tp, pp, ep), fitted with eta_comm
(`jaxroof.calibrate.layout_fit`); every flag is `calibrate`'s:

  python -m experiments.calibrate_layouts \
      --from_csv=tests/data/gptfast_a100_tp_steps.csv --accelerator=a100-80gb [--carry_over]
"""

from __future__ import annotations

from absl import flags

from experiments import _cli
from experiments import calibrate


def main(argv: list[str]) -> None:
  """`calibrate`'s main with --source=layouts unless --source was given."""
  if flags.FLAGS["source"].using_default_value:
    flags.FLAGS.source = "layouts"
  calibrate.main(argv)


if __name__ == "__main__":
  _cli.run(main)
