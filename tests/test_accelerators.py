"""The shipped accelerator table: slugs, dense figures with sources, ridges.

Expected ridge points are the research notes' (shared/data/facts.md: dense
BF16 FLOP/s / bandwidth); dense figures are NVIDIA's sparse datasheet
figures halved, as the notes record.
"""

import json

import pytest

from jaxroof.specs import accelerators
from jaxroof.specs import what_if
from jaxroof.specs.accelerators import TABLE, known_accelerators, load_accelerator, load_accelerators
from jaxroof.errors import InputError

REQUIRED = {
    "a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "b200", "l4", "l40s", "rtx-4090",
    "mi250x", "mi300x", "mi325x", "mi355x", "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "gaudi3",
    "trainium2"
}

FACTS_RIDGE = {
    "rtx-4090": 164, "mi250x": 117, "a100-80gb": 153, "a100-40gb": 201, "tpu-v5p": 166, "h200": 206,
    "mi325x": 218, "tpu-v4": 229, "trainium2": 230, "tpu-v5e": 240, "mi300x": 247, "b200": 281,
    "h100-sxm": 295, "gb200": 312.5, "mi355x": 312.5, "tpu7x": 313, "h100-pcie": 378, "l4": 403,
    "l40s": 419, "gaudi3": 500, "tpu-v6e": 560
}


def test_required_slugs_are_lowercase_and_shipped():
  assert REQUIRED <= set(known_accelerators())
  assert all(s == s.lower() and " " not in s for s in known_accelerators())


@pytest.mark.parametrize("slug, ridge", sorted(FACTS_RIDGE.items()))
def test_ridge_points_match_the_research_notes(slug, ridge):
  assert load_accelerator(slug).ridge_point("bf16") == pytest.approx(ridge, rel=0.005)


def test_every_figure_has_a_source():
  entries = json.loads(TABLE.read_text())["accelerators"]
  for slug, e in entries.items():
    for field in ("memory_capacity_gb", "memory_bandwidth_tb_s", "dense_tflops", "on_chip",
                  "interconnect", "tdp_w"):
      assert e["sources"].get(field), f"{slug}: no source for {field}"
    assert e["dense_tflops"]["bf16"] > 0 and e["on_chip"] and e["interconnect"]["type"]


@pytest.mark.parametrize("slug, sparse_bf16", [("h100-sxm", 1978.9), ("h200", 1978.9), ("l4", 242),
                                               ("b200", 4500)])
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
  assert h100.compute_dtype("mxfp4") == "bf16"  # Hopper has no FP4 datapath.
  assert "fallback" in h100.compute_note("mxfp4") and "h100-sxm" in h100.compute_note("mxfp4")
  assert "fallback" not in h100.compute_note("fp8")


# Dense low-precision tensor rates, TFLOP/s, from the cited datasheets:
#   b200  FP4 9000 / FP8 4500: glennklockwood.com/garden/processors/B200 (HGX B200,
#         1,000 W; its sparse figures 18000 / 9000 halved); scaling-book gpus.md
#         FLOPs table (B200 fp4 9.0e15).
#   gb200 FP4 10000 / FP8 5000: glennklockwood B200 page (GB200 variant, 1,200 W);
#         NVL72 rack 1,440 PF FP4 sparse / 72 GPUs / 2 = 10000.
#   mi355x MXFP4 10100 / FP8 5000: AMD dense figures as tabled in stas00
#         ml-engineering compute/accelerator/README.md (note 22).
#   h100-sxm FP8 1978.9: NVIDIA H100 SXM datasheet 3,958 with sparsity / 2.
#   mi300x FP8 2614.9: ROCm mi300.md (Matrix FP8 2614.9).
#   tpu7x FP8 4614: cloud.google.com/tpu/docs/tpu7x.
#   gaudi3 FP8 1835: Intel Hot Chips 2024 Gaudi 3 slides (BF16/FP8 matrix 1835).
DATASHEET_LOW_PRECISION = [
    ("b200", "nvfp4", 9000),
    ("b200", "mxfp4", 9000),
    ("b200", "fp8", 4500),
    ("gb200", "nvfp4", 10000),
    ("gb200", "mxfp4", 1440e3 / 72 / 2),
    ("gb200", "fp8", 5000),
    ("mi355x", "mxfp4", 10100),
    ("mi355x", "fp8", 5000),
    ("h100-sxm", "fp8", 3958 / 2),
    ("h200", "fp8", 3958 / 2),
    ("mi300x", "fp8", 2614.9),
    ("tpu7x", "fp8", 4614),
    ("gaudi3", "fp8", 1835),
    ("trainium2", "fp8", 1299),
]


@pytest.mark.parametrize("slug, weight_dtype, tflops", DATASHEET_LOW_PRECISION)
def test_low_precision_weights_run_at_the_datasheet_rate(slug, weight_dtype, tflops):
  device = load_accelerator(slug)
  assert device.compute_dtype(weight_dtype) == weight_dtype
  assert device.flops(weight_dtype) == pytest.approx(tflops * 1e12, rel=0.002)


@pytest.mark.parametrize("slug, weight_dtype", [("a100-80gb", "fp8"), ("a100-40gb", "fp8"),
                                                ("mi250x", "fp8"), ("tpu-v5e", "fp8"),
                                                ("h100-sxm", "mxfp4"), ("h200", "nvfp4"),
                                                ("mi300x", "mxfp4"), ("mi355x", "nvfp4"),
                                                ("tpu7x", "nvfp4"), ("l40s", "mxfp4")])
def test_formats_without_a_datapath_fall_back_to_bf16_and_say_so(slug, weight_dtype):
  """No published rate (Ampere/CDNA2 lack FP8; only Blackwell has NVFP4, only
  Blackwell and CDNA4 have MXFP4): the bf16 rate, labelled as a fallback."""
  device = load_accelerator(slug)
  assert device.flops(weight_dtype) == device.flops("bf16")
  assert "fallback" in device.compute_note(weight_dtype)


def test_fp4_doubles_fp8_where_both_exist():
  """A property of every published FP4 datapath: twice the FP8 rate or more."""
  for slug in known_accelerators():
    device = load_accelerator(slug)
    for fp4 in ("mxfp4", "nvfp4"):
      if fp4 in device.flops_per_s:
        assert device.flops_per_s[fp4] >= 2 * device.flops_per_s["fp8"] * 0.999, slug


def test_every_entry_states_its_low_precision_rates_and_passes_the_user_schema():
  """Every shipped entry lists fp8, mxfp4 and nvfp4 (a number, or null for no
  datapath) with a source, and passes the validation a user's file gets."""
  entries = json.loads(TABLE.read_text())["accelerators"]
  for slug, e in entries.items():
    assert {"fp8", "mxfp4", "nvfp4"} <= set(e["dense_tflops"]), slug
    for dtype in ("mxfp4", "nvfp4"):
      assert dtype in e["sources"]["dense_tflops"], slug
    what_if.check_entry(slug, e, slug)


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
