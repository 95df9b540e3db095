"""Atomic output and the timing harness (on a fake clock)."""

import json
import os

import pytest

from jaxroof import files
from jaxroof.timing import time_call


def test_write_json_is_atomic_and_nulls_non_finite(tmp_path):
  path = tmp_path / "out.json"
  files.write_json(path, {"a": float("inf"), "b": [1.5, float("nan")]})
  assert json.loads(path.read_text()) == {"a": None, "b": [1.5, None]}
  assert os.listdir(tmp_path) == ["out.json"]


def test_failed_write_leaves_nothing(tmp_path):
  path = tmp_path / "out.json"
  with pytest.raises(TypeError):
    files.write_json(path, {"a": object()})
  with pytest.raises(RuntimeError):
    with files.atomic_path(tmp_path / "plot.png") as tmp:
      open(tmp, "w").write("half")
      raise RuntimeError("boom")
  assert os.listdir(tmp_path) == []


def test_warmup_is_excluded_and_median_taken(fake_clock):
  clock = fake_clock([100.0, 50.0, 3.0, 1.0, 2.0, 9.0, 4.0])
  timing = time_call(clock.fn, [("a",), ("b",)], warmup=2, repeats=5, clock=clock)
  assert timing.median_s == 3.0
  assert (timing.min_s, timing.max_s) == (1.0, 9.0)
  assert timing.repeats == 5 and timing.warmup == 2
  # Inputs rotate across calls, warm-up included.
  assert clock.calls == [("a",), ("b",), ("a",), ("b",), ("a",), ("b",), ("a",)]


def test_bad_arguments():
  with pytest.raises(ValueError):
    time_call(lambda: 0, [], repeats=1)
  with pytest.raises(ValueError):
    time_call(lambda: 0, [()], repeats=0)
