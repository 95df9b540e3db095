"""Alias of `python -m experiments.calibrate --source=vllm`, kept for older command lines.

vLLM `bench serve` runs replayed through the continuous-batching simulator
(`jaxroof.calibrate.engine_fit`); every flag is `calibrate`'s:

  python -m experiments.calibrate_engine --from_vllm=A.json,B.json \
      --model=llama-3.1-70b --accelerator=a100-40gb --server=tp=8
"""

from __future__ import annotations

from absl import flags

from experiments import _cli
from experiments import calibrate


def main(argv: list[str]) -> None:
  """`calibrate`'s main with --source=vllm unless --source was given."""
  if flags.FLAGS["source"].using_default_value:
    flags.FLAGS.source = "vllm"
  calibrate.main(argv)


if __name__ == "__main__":
  _cli.run(main)
