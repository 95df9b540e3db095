"""The tensor-parallel toy (jax.shard_map on host CPU devices) in one subprocess.

Host devices are set before jax starts, so the check runs in a fresh
process; its timings (none are taken) would not be interconnect figures.
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_sharded_toy_matches_unsharded_and_hlo_collectives_match_the_formulas():
  env = {
      **os.environ, "XLA_FLAGS": " ".join(
          filter(None, (os.environ.get("XLA_FLAGS"), "--xla_force_host_platform_device_count=4"))),
      "PYTHONPATH": ROOT
  }
  proc = subprocess.run([
      sys.executable, "-c", "from jaxroof.parallel import sharded_check; "
      "sharded_check.main([2, 4])"
  ], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr
  data = json.loads(proc.stdout)
  assert data["devices"] == 4
  for tp in ("2", "4"):
    result = data["results"][tp]
    assert result["dtype"] == "float64"
    assert result["prefill_max_abs_diff"] < 1e-10
    assert result["decode_max_abs_diff"] < 1e-10
    for program in ("prefill", "decode"):
      found = result["collectives"][program]
      expected = result["expected"][program]
      for kind in ("all-reduce", "all-gather"):
        ours = [c["bytes"] for c in found if c["kind"] == kind]
        assert len(ours) == expected[kind]["count"], (tp, program, kind, found)
        assert set(ours) == {expected[kind]["bytes"]}, (tp, program, kind, found)
      assert {c["kind"] for c in found} <= {"all-reduce", "all-gather"}
