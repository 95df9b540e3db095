"""Walks the weight-reuse lesson: each worked number, recomputed, then the quiz.

For every claim: the formula, our value and the lesson's value. Exits 1 if any
disagrees. `--json_out` writes a list of {claim, expected, computed, unit,
agrees} (plus section, formula, tolerance and supporting details).

  python -m experiments.lesson --json_out=/tmp/lesson.json
"""

from __future__ import annotations

from absl import flags

from experiments import _cli
from jaxroof import files
from jaxroof.serving import lesson_claims
from jaxroof.report import table

_JSON_OUT = flags.DEFINE_string("json_out", None, "Write the claims as JSON here.")


def render(claims: list[lesson_claims.Claim]) -> str:
  """The claims as a text table."""
  rows = [[
      c.section, c.claim,
      table.fmt(c.expected),
      table.fmt(c.computed), c.unit, "yes" if c.agrees else "NO", c.formula
  ] for c in claims]
  headers = ("section", "claim", "lesson", "ours", "unit", "agrees", "formula")
  return table.format_table(headers, rows)


def main(argv: list[str]) -> int:
  del argv  # Unused.
  claims = lesson_claims.all_claims()
  print(render(claims))
  bad = [c for c in claims if not c.agrees]
  print(f"\n{len(claims) - len(bad)} of {len(claims)} claims agree (analytic bounds).")
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, [c.to_json() for c in claims])
  return 1 if bad else 0


if __name__ == "__main__":
  _cli.run(main)
