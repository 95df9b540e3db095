"""What breaks K/V reuse, and the decode_equivalence / bench_decode apps."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from jaxroof import errors, toy
from jaxroof.report import toy_section

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REL_TOL = 1e-10


@pytest.mark.parametrize("name", toy.BREAKS)
def test_each_break_is_detected(name):
  result = toy.lesson_check(toy.LESSON, toy.LESSON_PROMPT, steps=2, break_name=name)
  assert not result.agrees
  assert result.max_rel_diff > 1e3 * REL_TOL  # Far above rounding.
  decode_rows = result.rows[1:]
  assert any(not row.agrees for row in decode_rows)
  if name in ("revision", "position_offset"):
    # Prefill itself is fine: the mismatch appears where the stale K/V or
    # the wrong position is used.
    assert result.rows[0].agrees


def test_mask_change_needs_two_blocks():
  # With one block the retained K/V come from each token's embedding alone,
  # so no prefill mask can change them: the break is refused, not faked.
  one_block = dataclasses.replace(toy.LESSON, num_blocks=1)
  with pytest.raises(errors.InputError, match="num_blocks >= 2"):
    toy.lesson_check(one_block, (1, 4, 6), 2, break_name="mask")


def _run(module, *flags):
  return subprocess.run([sys.executable, "-m", f"experiments.{module}", *flags], cwd=REPO,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True,
                        timeout=300, check=False)


def test_experiment_lesson_run(tmp_path):
  path = tmp_path / "d.json"
  proc = _run("decode_equivalence", f"--json_out={path}")
  assert proc.returncode == 0, proc.stderr
  result = json.loads(path.read_text())
  assert result["agrees"] and not result["detected"] and result["ok"]
  assert result["tolerance"] == REL_TOL
  assert result["max_rel_diff"] <= REL_TOL
  assert result["positions_with_kv"] == 5  # Three outputs.
  assert result["kv_bytes_per_position_2byte"] == 32
  assert [row["positions_with_kv"] for row in result["rows"]] == [3, 4, 5]
  assert "Cached decode agrees" in toy_section.decode_equivalence_section(result)


def test_experiment_break_is_a_detected_mismatch(tmp_path):
  path = tmp_path / "d.json"
  proc = _run("decode_equivalence", "--break=position_offset", "--blocks=4", "--layout=growing",
              f"--json_out={path}")
  assert proc.returncode == 0, proc.stderr
  result = json.loads(path.read_text())
  assert not result["agrees"] and result["detected"] and result["ok"]
  assert result["max_rel_diff"] > result["tolerance"]
  assert result["kv_bytes_per_position_2byte"] == 64
  assert result["kv_bytes_2byte"] == 320


def test_experiment_bad_input_is_one_line_and_writes_nothing(tmp_path):
  path = tmp_path / "d.json"
  proc = _run("decode_equivalence", "--break=revison", f"--json_out={path}")
  assert proc.returncode == 2
  assert "error: flag --break=revison" in proc.stderr
  assert "Did you mean 'revision'?" in proc.stderr and "Traceback" not in proc.stderr
  assert proc.stderr.count("\n") == 1
  assert not path.exists()


def test_bench_decode_writes_both_times(tmp_path):
  path = tmp_path / "b.json"
  proc = _run("bench_decode", "--preset=lesson", "--prompt_len=6", "--new_tokens=3", "--repeats=2",
              f"--json_out={path}")
  assert proc.returncode == 0, proc.stderr
  result = json.loads(path.read_text())
  assert result["kind"] == "measurement"
  for path_name in ("cached", "recompute"):
    t = result[path_name]
    assert t["repeats"] == 2 and t["warmup"] == 1
    assert 0 < t["min_s"] <= t["median_s"] <= t["max_s"]
  assert result["speedup"] == pytest.approx(result["recompute"]["median_s"] /
                                            result["cached"]["median_s"])
  assert result["outputs_match"]
  assert "Speedup from caching" in toy_section.bench_decode_section(result)
