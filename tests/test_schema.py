"""The schema mechanism (`jaxroof/schema.py`), the output checks and atomic writes of
`jaxroof/files.py`, and the non-finite guard of the experiments (`experiments/_finite.py`):
each refusal is one line naming the file, the field, the value and what is allowed."""

from __future__ import annotations

import io
import json
import math
import os
import sys

import numpy as np
import pytest

from experiments import _finite
from jaxroof import files
from jaxroof import schema
from jaxroof.errors import InputError, NonFiniteResult
from jaxroof.schema import (Anything, Flag, ListOf, MapOf, Number, Object, OneOf, Positive, Text,
                            Whole)

LINK = Object(
    {
        "scale_up": Object({"unidirectional_gb_s": Positive(1e5, unit="GB/s")},
                           required=("unidirectional_gb_s",)),
        "chips": Whole(1, 64, null=True),
        "name": Text(max_len=20),
        "itls": ListOf(ListOf(Number(low=0))),
        "rates": MapOf(Positive(null=True), keys=("bf16", "fp8")),
        "rank": OneOf((Text(choices=("auto",)), Whole(1))),
        "on": Flag(),
    }, rules=(schema.at_most("chips", "max_chips"),), extra=Anything())
GOOD = {
    "scale_up": {"unidirectional_gb_s": 450}, "chips": 8, "name": "h", "itls": [[0.1, 0.2], []],
    "rates": {"bf16": 989.4, "fp8": None}, "rank": "auto", "on": True, "max_chips": 8
}


def _refusal(doc, spec=LINK) -> str:
  with pytest.raises(InputError) as caught:
    schema.check(spec, doc, where="a.json", field="accelerator_file")
  message = str(caught.value)
  assert "\n" not in message and len(message) < 400 and message.startswith("a.json")
  assert caught.value.field == "accelerator_file"
  return message


def test_a_valid_document_passes_and_edges_are_kept():
  schema.check(LINK, GOOD, where="a.json")
  schema.check(LINK, {**GOOD, "chips": 8.0, "rank": 3, "unknown": {"deep": [1]}}, where="a.json")
  schema.check(Whole(1, 10), 1, where="x")  # The bounds are inclusive.
  schema.check(Whole(1, 10), 10, where="x")


@pytest.mark.parametrize("path, value, needles", [
    (("scale_up", "unidirectional_gb_s"), math.nan,
     ["field scale_up.unidirectional_gb_s=nan", "finite number > 0", "GB/s"]),
    (("scale_up", "unidirectional_gb_s"), -450, ["=-450 is not allowed"]),
    (("scale_up", "unidirectional_gb_s"), 0, ["=0 is not allowed"]),
    (("scale_up", "unidirectional_gb_s"), "450", ["='450' is not allowed"]),
    (("scale_up", "unidirectional_gb_s"), True, ["=true is not allowed"]),
    (("scale_up", "unidirectional_gb_s"), 10**400, ["<a 401-digit number>"]),
    (("scale_up",), [1], ["field scale_up=[1]", "a JSON object with unidirectional_gb_s"]),
    (("chips",), 8.5, ["chips=8.5", "whole number >= 1 and <= 64, or null"]),
    (("name",), "x" * 50, ["name='xxx", "at most 20 characters"]),
    (("itls",), [0.1, 0.2], ["field itls[0]=0.1", "a list"]),
    (("itls",), [[0.1, math.inf]], ["field itls[0][1]=inf"]),
    (("rates",), {"bf16": 1, "fp4": 2}, ["field rates.fp4=2", "among bf16, fp8"]),
    (("rank",), "car", ["rank='car'", "one of 'auto'"]),
    (("on",), None, ["on=null", "true or false"]),
])
def test_each_wrong_value_is_one_line_naming_its_path(path, value, needles):
  doc = json.loads(json.dumps(GOOD))
  target = doc
  for part in path[:-1]:
    target = target[part]
  target[path[-1]] = value
  message = _refusal(doc)
  for needle in needles:
    assert needle in message, message


def test_missing_fields_rules_and_top_level_are_named():
  doc = json.loads(json.dumps(GOOD))
  del doc["scale_up"]["unidirectional_gb_s"]
  assert "a.json lacks scale_up.unidirectional_gb_s: give a finite number" in _refusal(doc)
  message = _refusal({**GOOD, "chips": 16})
  assert "chips=16 with max_chips=8 is not allowed: chips must be at most max_chips" in message
  assert "holds <list of 1 item(s)>, which is not allowed: give a JSON object" in _refusal([GOOD])
  closed = Object({"a": Whole()}, extra=None)
  assert "field b=1 is not allowed: not a known field (known: a)" in _refusal({"b": 1}, closed)


def test_rules_between_fields():
  spec = Object(rules=(schema.agree("k", "top_k"), schema.same_length("x", "y"),
                       schema.at_most("k", "experts", unless_zero=True)))
  schema.check(spec, {"k": 4, "top_k": 4.0, "experts": 0, "x": [1], "y": [2]}, where="c")
  assert "k=4 with top_k=64" in _refusal({"k": 4, "top_k": 64}, spec)
  assert "x=<1 items> with y=<2 items>" in _refusal({"x": [1], "y": [1, 2]}, spec)
  assert "k=64 with experts=32" in _refusal({"k": 64, "experts": 32}, spec)


def test_a_switch_names_the_fields_of_the_form_it_chose():
  entry = Object({"v": Positive()}, required=("v",))
  spec = schema.Switch(lambda d: Object({"table": MapOf(entry, min_len=1, max_len=1)})
                       if isinstance(d, dict) and "table" in d else entry)
  assert "field table.x.v=-1" in _refusal({"table": {"x": {"v": -1}}}, spec)
  assert "field v=-1" in _refusal({"v": -1}, spec)
  assert "of exactly 1 field(s)" in _refusal({"table": {}}, spec)


def test_csv_and_jsonl_rows_name_the_line_and_the_column():
  columns = {"time_s": Positive(1e4, unit="s"), "batch": Whole(1, 10**6), "tp": Whole(1, null=True)}
  row = schema.check_record(columns, {"time_s": "0.0149", "batch": "8", "tp": "", "x": "y"},
                            where="m.csv", line=4, csv=True)
  assert row == {"time_s": 0.0149, "batch": 8, "tp": None, "x": "y"}
  for cell in ("1e-300x", "nan", "-1", "inf"):
    with pytest.raises(InputError, match=rf"^m.csv line 4, column time_s={cell} is not "):
      schema.check_record(columns, {"time_s": cell, "batch": "8"}, where="m.csv", line=4, csv=True)
  with pytest.raises(InputError, match=r"^m.jsonl line 2, field batch=1.5 is not allowed"):
    schema.check_record(columns, {"time_s": 1, "batch": 1.5}, where="m.jsonl", line=2, csv=False)


def test_load_bounds_the_size_and_nesting_before_checking(tmp_path):
  kind = schema.FileKind(what="t", schema=Object({"a": Whole()}), max_bytes=10**6, max_depth=3)
  small = schema.FileKind(what="t", schema=kind.schema, max_bytes=100, max_depth=3)
  path = tmp_path / "t.json"
  path.write_text('{"a": 1}')
  assert schema.load(kind, "t_file", path) == {"a": 1}
  for bounds, text, needle in [(small, '{"a": 1}' + " " * 100, "over the 100-byte limit"),
                               (kind, '{"b": [[[1]]]}', "nested over 3 levels deep"),
                               (kind, "[" * 100000 + "]" * 100000, "nested too deeply"),
                               (kind, '{"a": ' + "1" * 5000 + "}", "cannot be read as JSON"),
                               (kind, '{"a": 0}', "field a=0 is not allowed")]:
    path.write_text(text)
    with pytest.raises(InputError, match=needle) as caught:
      schema.load(bounds, "t_file", path)
    assert caught.value.field == "t_file" and str(caught.value).startswith("t_file=")
    assert "\n" not in str(caught.value)


# Outputs.


def test_a_folder_output_is_checked_before_work(tmp_path):
  regular = tmp_path / "file"
  regular.write_text("x")
  with pytest.raises(InputError, match=r"out_dir='.*file' is a file: give a folder"):
    files.check_output_folder("out_dir", regular)
  with pytest.raises(InputError, match=r"is a file, not a folder"):
    files.check_output_folder("out_dir", regular / "below")
  with pytest.raises(InputError, match="is empty"):
    files.check_output_folder("out_dir", " ")
  assert files.check_output_folder("out_dir", tmp_path / "new" / "deeper")
  assert not (tmp_path / "new").exists()  # Nothing created by a check.
  with pytest.raises(InputError, match="not writable"):  # A read-only file system.
    files.check_output_folder("out_dir", "/proc/jaxroof-out")
  assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_read_only_folder_is_refused(tmp_path):
  tmp_path.chmod(0o555)
  try:
    with pytest.raises(InputError, match="not writable"):
      files.check_output_folder("out_dir", tmp_path)
    with pytest.raises(InputError, match="not writable"):
      files.check_output_path("json_out", tmp_path / "a.json", "json")
  finally:
    tmp_path.chmod(0o755)


def test_a_full_disk_is_refused_before_work(tmp_path, monkeypatch):

  class Full:
    f_bavail = f_bfree = 0
    f_frsize = 4096

  monkeypatch.setattr(os, "statvfs", lambda path: Full())
  with pytest.raises(InputError, match="0 bytes free"):
    files.check_output_folder("out_dir", tmp_path)
  with pytest.raises(InputError, match="0 bytes free"):
    files.check_output_path("json_out", tmp_path / "a.json", "json")


def test_a_set_of_outputs_must_name_distinct_paths(tmp_path):
  json_out, rows = str(tmp_path / "r.json"), str(tmp_path / "rows.csv")
  given = files.check_outputs(
      {"json_out": (json_out, "json"), "rows_out": (rows, "rows"), "plot_out": (None, "plot")})
  assert given == {"json_out": json_out, "rows_out": rows}
  with pytest.raises(InputError, match="rows_out and json_out name the same file"):
    files.check_outputs({"json_out": (json_out, "json"), "rows_out": (json_out, "json")})
  with pytest.raises(InputError, match="has an unknown extension: use .csv or .jsonl"):
    files.check_outputs({"rows_out": (json_out, "rows")})
  plot = str(tmp_path / "sim.png")
  with pytest.raises(InputError, match=r"kv_plot and plot_out \(_kv beside it\) name the same"):
    files.check_outputs(
        {"plot_out": (plot, "plot"), "kv_plot": (str(tmp_path / "sim_kv.png"), "plot")},
        siblings={"plot_out": ("_kv",)})
  with pytest.raises(InputError, match="is a folder"):
    files.check_outputs({"json_out": (str(tmp_path), "json")})
  both = str(tmp_path / "out.json")  # Neither exists yet: a file and a folder of one name.
  with pytest.raises(InputError, match="json_out and out_dir name the same file"):
    files.check_outputs({"out_dir": (both, "folder"), "json_out": (both, "json")})


def test_a_file_and_its_siblings_are_written_all_or_none(tmp_path):
  main, kv = tmp_path / "sim.png", tmp_path / "sim_kv.png"
  assert files.sibling_path(main, "_kv") == str(kv)
  with pytest.raises(RuntimeError):
    with files.atomic_paths([main, kv]) as (a, b):
      open(a, "w").write("main")
      raise RuntimeError("the sibling's plot failed")
  assert os.listdir(tmp_path) == []
  with files.atomic_paths([main, kv]) as (a, b):
    open(a, "w").write("main")
    open(b, "w").write("kv")
  assert main.read_text() == "main" and kv.read_text() == "kv"
  assert sorted(os.listdir(tmp_path)) == ["sim.png", "sim_kv.png"]


def test_a_folder_made_for_failed_work_is_removed(tmp_path):
  with pytest.raises(RuntimeError):
    with files.output_folder("out_dir", tmp_path / "a" / "b") as folder:
      open(os.path.join(folder, "half.json"), "w").write("{")
      raise RuntimeError("the engine did not start")
  assert os.listdir(tmp_path) == []
  kept = tmp_path / "kept"
  kept.mkdir()
  with pytest.raises(RuntimeError):
    with files.output_folder("out_dir", kept):
      raise RuntimeError("failed")
  assert kept.is_dir()
  with files.output_folder("out_dir", tmp_path / "ok") as folder:
    open(os.path.join(folder, "done.json"), "w").write("{}")
  assert (tmp_path / "ok" / "done.json").exists()


def test_nonfinite_values_are_found_by_path(tmp_path):
  assert files.nonfinite_at({"a": [1.0, {"b": 2}]}) is None
  path, value = files.nonfinite_at({"fit": {"factors": {"eta_w": 0.5, "eta_kv": math.nan}}})
  assert path == "fit.factors.eta_kv" and math.isnan(value)
  assert files.nonfinite_at({"rows": np.array([1.0, np.inf])})[0] == "rows[1]"
  assert files.nonfinite_at(math.inf)[0] == "(the whole result)"
  out = tmp_path / "r.json"
  files.write_json(out, {"x": math.nan})  # By default nan is written as null.
  assert json.loads(out.read_text()) == {"x": None}
  files.require_finite_json(True)
  try:
    with pytest.raises(NonFiniteResult, match=r"holds nan at x, not a finite number"):
      files.write_json(tmp_path / "s.json", {"x": math.nan})
  finally:
    files.require_finite_json(False)
  assert not (tmp_path / "s.json").exists()


# The experiments' guard against a printed nan or inf.


@pytest.mark.parametrize(
    "text, bad",
    [
        ("step nan ms", True),
        ("eta_w nan  fitted", True),
        ("error 12.5 nan%", True),
        ("cost inf $/h", True),
        ("-inf", True),
        ("Infinity", True),
        ("(rate inf)", True),  # A run at rate inf is labelled "all at once".
        ("r.json:1 (all at once)", False),
        ("inf.json:1, nan.jsonl", False),  # File names.
        ("step nan.", True),
        ("information on nanoseconds, infinite", False),
        ("1e308 and 5e-324", False),
    ])
def test_a_printed_nonfinite_number_is_found(text, bad):
  assert (_finite.nonfinite_in(text) is not None) == bad


def test_the_guarded_stdout_refuses_a_nonfinite_line(monkeypatch):
  out = io.StringIO()
  monkeypatch.setattr(sys, "stdout", out)
  monkeypatch.setattr(files, "_FINITE_JSON", False)
  _finite.install()
  _finite.install(strict_json=True)  # Idempotent; JSON results refused too.
  assert files._FINITE_JSON
  print("step 12.5 ms")
  with pytest.raises(NonFiniteResult, match=r"would print 'nan' in 'step nan ms'"):
    print("step nan ms")
  assert out.getvalue() == "step 12.5 ms\n"
