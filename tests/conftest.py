"""Pytest setup: parse absl flags once so experiment modules can be imported."""

import sys

from absl import flags


def pytest_configure(config):
  del config  # Unused.
  if not flags.FLAGS.is_parsed():
    flags.FLAGS(sys.argv[:1])
