"""The shipped accelerator table: slugs, dense figures with sources, ridges.

Expected ridge points are the research notes' (shared/data/facts.md: dense
BF16 FLOP/s / bandwidth); dense figures are NVIDIA's sparse datasheet
figures halved, as the notes record.
"""

import json

import pytest

from jaxroof.specs import accelerators
from jaxroof.specs.accelerators import TABLE, known_accelerators, load_accelerator, load_accelerators
from jaxroof.errors import InputError

REQUIRED = {"a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "b200", "l4", "l40s",
            "rtx-4090", "mi250x", "mi300x", "mi325x", "mi355x", "tpu-v4", "tpu-v5e",
            "tpu-v5p", "tpu-v6e", "gaudi3", "trainium2"}

FACTS_RIDGE = {"rtx-4090": 164, "mi250x": 117, "a100-80gb": 153, "a100-40gb": 201,
               "tpu-v5p": 166, "h200": 206, "mi325x": 218, "tpu-v4": 229, "trainium2": 230,
               "tpu-v5e": 240, "mi300x": 247, "b200": 281, "h100-sxm": 295, "gb200": 312.5,
               "mi355x": 312.5, "tpu7x": 313, "h100-pcie": 378, "l4": 403, "l40s": 419,
               "gaudi3": 500, "tpu-v6e": 560}


def test_required_slugs_are_lowercase_and_shipped():
  assert REQUIRED <= set(known_accelerators())
  assert all(s == s.lower() and " " not in s for s in known_accelerators())


@pytest.mark.parametrize("slug, ridge", sorted(FACTS_RIDGE.items()))
def test_ridge_points_match_the_research_notes(slug, ridge):
  assert load_accelerator(slug).ridge_point("bf16") == pytest.approx(ridge, rel=0.005)


def test_every_figure_has_a_source():
  entries = json.loads(TABLE.read_text())["accelerators"]
  for slug, e in entries.items():
    for field in ("memory_capacity_gb", "memory_bandwidth_tb_s", "dense_tflops",
                  "on_chip", "interconnect", "tdp_w"):
      assert e["sources"].get(field), f"{slug}: no source for {field}"
    assert e["dense_tflops"]["bf16"] > 0 and e["on_chip"] and e["interconnect"]["type"]


@pytest.mark.parametrize("slug, sparse_bf16", [
    ("h100-sxm", 1978.9), ("h200", 1978.9), ("l4", 242), ("b200", 4500)])
def test_nvidia_figures_are_dense_not_sparse(slug, sparse_bf16):
  assert load_accelerator(slug).flops_per_s["bf16"] == pytest.approx(sparse_bf16 / 2 * 1e12,
                                                                     rel=0.01)


def test_units_are_si():
  h100 = load_accelerator("h100-sxm")
  assert h100.memory_capacity_bytes == 80e9
  assert h100.memory_bandwidth_bytes_per_s == pytest.approx(3.35e12)
  assert load_accelerator("tpu-v4").memory_capacity_bytes == pytest.approx(32 * 2**30, rel=1e-3)


def test_compute_dtype_falls_back_to_bf16_without_a_native_path():
  a100, h100 = load_accelerator("a100-80gb"), load_accelerator("h100-sxm")
  assert a100.compute_dtype("fp8") == "bf16"  # Ampere has no FP8.
  assert h100.compute_dtype("fp8") == "fp8"
  assert h100.flops("fp8") == pytest.approx(2 * h100.flops("bf16"), rel=1e-3)
  assert h100.compute_dtype("int4") == "bf16"  # Weight-only: dequantized to bf16.
  assert load_accelerator("tpu-v5p").compute_dtype("fp8") == "bf16"


def test_unknown_names_list_the_known_ones_and_the_closest():
  with pytest.raises(InputError) as e:
    load_accelerator("h100")
  message = str(e.value)
  assert "accelerator='h100'" in message and "'h100-sxm'" in message
  assert all(s in message for s in REQUIRED)
  with pytest.raises(InputError, match="Did you mean 'mi300x'"):
    load_accelerator("mi300xx")
  with pytest.raises(InputError, match="empty"):
    load_accelerators(" , ")


def test_lists_and_all():
  assert [a.name for a in load_accelerators("H100-SXM, l4,l4")] == ["h100-sxm", "l4"]
  assert len(load_accelerators("all")) == len(known_accelerators())
  assert accelerators.load_accelerator(" TPU-V6E ").name == "tpu-v6e"
