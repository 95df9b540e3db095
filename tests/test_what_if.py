"""User accelerator files and datasheet overrides (what-ifs)."""

import json

import pytest

from jaxroof.errors import InputError
from jaxroof.specs import accelerators
from jaxroof.specs import what_if

ENTRY = {
    "name": "My NPU", "memory_capacity_gb": 64, "memory_bandwidth_tb_s": 1.5,
    "dense_tflops": {"bf16": 300, "fp8": 600}, "tdp_w": 350
}


def _write(tmp_path, data, name="my-npu.json"):
  path = tmp_path / name
  path.write_text(json.dumps(data))
  return path


def test_a_user_file_in_the_shipped_schema_loads(tmp_path):
  device = what_if.load_accelerator_file(_write(tmp_path, {"accelerators": {"npu": ENTRY}}))
  assert device.name == "npu"
  assert device.memory_bandwidth_bytes_per_s == 1.5e12
  assert device.ridge_point("bf16") == pytest.approx(300e12 / 1.5e12)
  bare = what_if.load_accelerator_file(_write(tmp_path, ENTRY))
  assert bare.name == "my-npu" and bare.flops("fp8") == 600e12


@pytest.mark.parametrize("change, field", [
    ({"memory_capacity_gb": None}, "memory_capacity_gb"),
    ({"memory_bandwidth_tb_s": -1}, "memory_bandwidth_tb_s"),
    ({"memory_bandwidth_tb_s": "fast"}, "memory_bandwidth_tb_s"),
    ({"dense_tflops": {"fp8": 10}}, "dense_tflops"),
    ({"dense_tflops": {"bf16": float("nan")}}, "dense_tflops.bf16"),
    ({"memory_capacity_gb": 1e9}, "memory_capacity_gb"),
    ({"dense_tflops": {"bf16": 100, "fp8": -5}}, "dense_tflops.fp8"),
    ({"dense_tflops": {"bf16": 100, "mxfp4": "fast"}}, "dense_tflops.mxfp4"),
    ({"dense_tflops": {"bf16": 100, "nvfp4": True}}, "dense_tflops.nvfp4"),
    ({"dense_tflops": {"bf16": 100, "fp4": 400}}, "dense_tflops.fp4"),
    ({"dense_tflops": {"bf16": None, "fp8": 200}}, "dense_tflops"),
])
def test_bad_fields_are_refused_naming_the_field(tmp_path, change, field):
  entry = {**ENTRY, **change}
  with pytest.raises(InputError, match=field.replace(".", r"\.")):
    what_if.load_accelerator_file(_write(tmp_path, entry))


def test_missing_fields_and_bad_files_are_refused(tmp_path):
  entry = dict(ENTRY)
  del entry["dense_tflops"]
  with pytest.raises(InputError, match="lacks dense_tflops"):
    what_if.load_accelerator_file(_write(tmp_path, entry))
  bad = tmp_path / "bad.json"
  bad.write_bytes(b"\xff\xfe")
  with pytest.raises(InputError, match="not UTF-8"):
    what_if.load_accelerator_file(bad)
  bad.write_text("{")
  with pytest.raises(InputError, match="not valid JSON"):
    what_if.load_accelerator_file(bad)
  with pytest.raises(InputError, match="does not exist"):
    what_if.load_accelerator_file(tmp_path / "none.json")


def test_overrides_replace_the_datasheet_and_say_so():
  h100 = accelerators.load_accelerator("h100-sxm")
  faster = what_if.with_overrides(h100, bandwidth_tb_s=4.0, memory_gb=96)
  assert faster.memory_bandwidth_bytes_per_s == 4e12
  assert faster.memory_capacity_bytes == 96e9
  assert faster.flops_per_s == h100.flops_per_s
  assert sum("what-if" in d for d in faster.decisions) == 2
  assert what_if.with_overrides(h100) is h100
  with pytest.raises(InputError, match=r"^tflops=0 is not allowed") as caught:
    what_if.with_overrides(h100, tflops=0)
  assert caught.value.field == "tflops"


def test_low_precision_rates_in_a_user_file_set_the_compute_rate(tmp_path):
  """fp8/mxfp4/nvfp4 given: weights in that format multiply at it; null or
  absent: they fall back to bf16, and the note says so."""
  entry = {**ENTRY, "dense_tflops": {"bf16": 100, "fp8": 200, "mxfp4": 400, "nvfp4": None}}
  device = what_if.load_accelerator_file(_write(tmp_path, entry))
  assert device.flops("fp8") == 200e12 and device.flops("mxfp4") == 400e12
  assert device.compute_dtype("nvfp4") == "bf16" and device.flops("nvfp4") == 100e12
  assert "fallback" in device.compute_note("nvfp4")
  assert "fallback" not in device.compute_note("mxfp4")
