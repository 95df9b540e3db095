"""The referee check: shipped engine profiles against published points never fitted on.

Predicts every `referee` point of the shipped published data
(`jaxroof/engines/data/published/whole_system.csv`) with the shipped profile of its
engine (`jaxroof/engines/data/profiles/`), and prints the absolute relative error by
engine and overall (median, p90, max) beside the targets and each profile's own
leave-one-source-out error, the analytic bound's ratio to the measurements (never
faster: a ratio >= 1), the worst points, and the points not predicted with the reason.
Nothing is fitted here.

  python -m experiments.referee --json_out=/tmp/referee.json
"""

from __future__ import annotations

from absl import flags
from absl import logging

from experiments import _cli
from jaxroof import files
from jaxroof.calibrate import published_referee
from jaxroof.report import referee_lines

_cli.key_flags("json_out")
_JSON_OUT = flags.DEFINE_string(
    "json_out", None, "Write every referee point's prediction, "
    "the summaries and the bound's ratio as JSON here.")


def main(argv: list[str]) -> None:
  del argv  # Unused.
  result = published_referee.referee()
  print(referee_lines.text(result))
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, result)
    logging.info("wrote %s", _JSON_OUT.value)


if __name__ == "__main__":
  _cli.run(main)
