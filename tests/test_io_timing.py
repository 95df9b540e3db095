"""Atomic output and the timing harness (on a fake clock)."""

import json
import os

import pytest

from jaxroof import files
from jaxroof.errors import InputError
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


@pytest.mark.parametrize("make, kind, message", [
    (lambda d: str(d) + "/", "json", "is a folder"),
    (lambda d: str(d / "x.xyz"), "json", "unknown extension"),
    (lambda d: str(d / "noext"), "plot", "unknown extension"),
    (lambda d: "/dev/null", "json", "not a regular file"),
    (lambda d: str(d / "missing" / "a.json"), "json", "does not exist"),
    (lambda d: "", "json", "is empty"),
])
def test_bad_output_paths_are_refused_before_work(tmp_path, make, kind, message):
  with pytest.raises(InputError, match=message):
    files.check_output_path("--out", make(tmp_path), kind)


def test_the_same_file_twice_is_refused(tmp_path):
  path = str(tmp_path / "a.json")
  with pytest.raises(InputError, match="same file"):
    files.check_distinct({"--json_out": path, "--profile_out": path})


def test_atomic_write_never_replaces_a_special_file_and_names_the_users_path(tmp_path):
  fifo = tmp_path / "fifo.json"
  os.mkfifo(fifo)
  with pytest.raises(InputError, match="not a regular file"):
    files.write_json(fifo, {"a": 1})
  assert fifo.is_fifo() and not list(tmp_path.glob(".tmp-*"))
