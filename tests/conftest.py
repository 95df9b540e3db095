"""Pytest setup: parse absl flags once so experiment modules can be imported."""

import sys

import pytest
from absl import flags


def pytest_configure(config):
  del config  # Unused.
  if not flags.FLAGS.is_parsed():
    flags.FLAGS(sys.argv[:1])


class FakeClock:
  """A clock that only moves when `fn` runs: each call takes the next duration."""

  def __init__(self, durations):
    self.now = 0.0
    self.durations = list(durations)
    self.calls = []

  def __call__(self):
    return self.now

  def fn(self, *args):
    self.calls.append(args)
    self.now += self.durations.pop(0)
    return 0.0


@pytest.fixture
def fake_clock():
  """`fake_clock([d0, d1, ...])` builds a `FakeClock` (tests of the timing harness)."""
  return FakeClock
