"""Sample tests for tests/test_test_kinds.py: collected (never run) to check the kinds
tests/conftest.py gives. Not named test_*.py, so the suite does not collect it."""

import subprocess
import sys

import pytest


def _run(module, *flags):
  return subprocess.run([sys.executable, "-m", f"experiments.{module}", *flags], check=False)


@pytest.fixture
def plan_result():
  return _run("plan", "--model=llama-3-8b")


def test_library_call():
  assert sum([1, 2]) == 3


def test_other_program():
  subprocess.run([sys.executable, "-m", "jaxroof.parallel.sharded_check"], check=False)


def test_through_a_helper():
  _run("serving")


def test_direct():
  subprocess.run([sys.executable, "-m", "experiments.batch_sweep"], check=False)


def test_through_a_fixture(plan_result):
  del plan_result  # Unused.


@pytest.mark.slow
def test_old_slow_mark():
  _run("report")


@pytest.mark.golden
def test_explicit_kind_wins():
  _run("lesson")


@pytest.mark.gpu
def test_device():
  pass


class TestMethods:

  def _start(self):
    return _run("simulate")

  def test_through_a_method(self):
    self._start()

  def test_plain_method(self):
    assert True
