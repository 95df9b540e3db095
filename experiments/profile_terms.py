"""Which cost terms the published data asks for: held-out error with and without each.

Refits every engine profile that has published training points under each variant of
the shipped design (a term left out, per-accelerator efficiencies added, the engines'
memory reservation or the pooled prior taken away) and prints the error leaving out one
whole source at a time (median, p90, max), over all their points and per profile. A term
is kept only where leaving it out raises that error. Slow: about a minute per variant.

  python -m experiments.profile_terms --json_out=/tmp/terms.json
  python -m experiments.profile_terms --variants="without m_moe"
"""

from __future__ import annotations

from absl import flags
from absl import logging

from experiments import _cli
from jaxroof import errors
from jaxroof import files
from jaxroof import progress
from jaxroof.calibrate import published_profile as profile_lib
from jaxroof.calibrate import published_terms
from jaxroof.report import calibration_tables

_cli.key_flags("json_out", "variants")
_VARIANTS = flags.DEFINE_list(
    "variants", None, "Variants to run (default: all): " + "; ".join(published_terms.VARIANTS))
_PROFILES = flags.DEFINE_list(
    "profiles", None, "Engine profiles to refit (default: every one with training points): " +
    ", ".join(profile_lib.PROFILES))
_JSON_OUT = flags.DEFINE_string("json_out", None, "Write the table as JSON here.")
_PROGRESS = _cli.define_progress()


def main(argv: list[str]) -> None:
  del argv  # Unused.
  names = _VARIANTS.value or list(published_terms.VARIANTS)
  for name in names:
    errors.require_choice("variants", name, tuple(published_terms.VARIANTS))
  for name in _PROFILES.value or []:
    errors.require_choice("profiles", name, profile_lib.PROFILES)
  result = {}
  for name in progress.bar(names, desc="variants", unit="variant", requested=_PROGRESS.value):
    result[name] = published_terms.loso(published_terms.VARIANTS[name], _PROFILES.value)
  print(calibration_tables.terms_table_text(result))
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, result)
    logging.info("wrote %s", _JSON_OUT.value)


if __name__ == "__main__":
  _cli.run(main)
