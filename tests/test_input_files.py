"""Input files: a FIFO, socket or device never blocks a read; reads are bounded
(`jaxroof.files.read_input`), and output paths under a file say so."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from jaxroof import files
from jaxroof.errors import InputError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fifo(tmp_path) -> str:
  path = str(tmp_path / "pipe.json")
  os.mkfifo(path)
  return path


def test_read_input_refuses_special_files_without_blocking(tmp_path):
  with pytest.raises(InputError, match=r"profile=.*pipe.json.* is a FIFO"):
    files.read_input("profile", _fifo(tmp_path))
  with pytest.raises(InputError, match="is a device"):
    files.read_input("profile", os.devnull)
  with pytest.raises(InputError, match="is a folder"):
    files.read_input("profile", tmp_path)
  sock_path = str(tmp_path / "s.sock")
  with socket.socket(socket.AF_UNIX) as sock:
    sock.bind(sock_path)
    with pytest.raises(InputError, match="is a socket"):
      files.read_input("trace", sock_path)


def test_read_input_is_bounded_and_names_the_field(tmp_path):
  big = tmp_path / "big.json"
  big.write_bytes(b" " * 2000)
  with pytest.raises(InputError, match=r"model=.*over the 1,000-byte limit"):
    files.read_input("model", big, max_bytes=1000)
  assert files.read_input("model", big, max_bytes=2000) == b" " * 2000
  with pytest.raises(InputError, match=r"model=.*does not exist"):
    files.read_input("model", tmp_path / "none.json")
  (tmp_path / "afile.txt").write_text("x")
  with pytest.raises(InputError, match="afile.txt' is a file, not a folder"):
    files.read_input("model", tmp_path / "afile.txt" / "config.json")
  (tmp_path / "bad.json").write_bytes(b"\xff")
  with pytest.raises(InputError, match="not UTF-8"):
    files.read_text("model", tmp_path / "bad.json")
  (tmp_path / "ok.json").write_text('{"a": 1}')
  assert files.read_json("model", tmp_path / "ok.json") == {"a": 1}


def test_output_path_under_a_file_says_it_is_a_file(tmp_path):
  (tmp_path / "afile.txt").write_text("x")
  with pytest.raises(InputError, match="afile.txt' is a file, not a folder"):
    files.check_output_path("--json_out", tmp_path / "afile.txt" / "out.json", "json")
  with pytest.raises(InputError, match="does not exist"):
    files.check_output_path("--json_out", tmp_path / "missing" / "out.json", "json")


def _run(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True,
                        timeout=120)


@pytest.mark.parametrize("experiment, flags", [
    ("batch_sweep", ("--profile={fifo}",)),
    ("batch_sweep", ("--model=llama-3-8b", "--accelerator_file={fifo}", "--context=64")),
    ("kv_sizing", ("--model={fifo}", "--context=64")),
    ("calibrate", ("--from_csv={fifo}", "--accelerator=h100-sxm")),
    ("calibrate", ("--from_vllm={fifo}", "--model=llama-3-8b", "--accelerator=h100-sxm")),
    ("simulate", ("--arrival=trace", "--trace={fifo}", "--model=llama-3-8b",
                  "--accelerator=h100-sxm", "--context=64")),
])
def test_a_fifo_input_is_refused_at_once(tmp_path, experiment, flags):
  fifo = _fifo(tmp_path)
  proc = _run(f"experiments.{experiment}", *(f.format(fifo=fifo) for f in flags))
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1, proc.stderr
  assert "FIFO" in lines[0] and lines[0].startswith("error:")


def test_an_output_under_a_file_is_one_line(tmp_path):
  (tmp_path / "afile.txt").write_text("x")
  proc = _run("experiments.batch_sweep", f"--json_out={tmp_path}/afile.txt/out.json")
  assert proc.returncode == 2 and "is a file, not a folder" in proc.stderr, proc.stderr


def test_a_file_error_names_its_field(tmp_path):
  """The experiments map the field to the flag the user typed (`_cli.FIELD_FLAGS`)."""
  for read in (files.read_text, files.read_json):
    with pytest.raises(InputError) as caught:
      read("measurements", tmp_path / "absent.csv")
    assert caught.value.field == "measurements"
