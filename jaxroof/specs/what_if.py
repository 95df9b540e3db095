"""What-ifs on an accelerator: a user's own accelerator file, and datasheet overrides.

A user's file has the shipped schema (`jaxroof/specs/data/accelerators.json`):
either one entry, or `{"accelerators": {slug: entry}}` with one slug. Every
field is checked before use, naming the field, the value and what is allowed.
Overrides replace datasheet figures (bandwidth, dense FLOP/s, memory) and
are recorded in the accelerator's `decisions`, so every output says so.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import Any

from jaxroof import errors
from jaxroof import schema
from jaxroof.specs import accelerator_schema
from jaxroof.specs import accelerators
from jaxroof.specs.accelerators import Accelerator

# Upper limits of physical plausibility (about 100x today's largest parts), so a
# typo in units is refused rather than swept.
_LIMITS = {"memory_capacity_gb": 1e5, "memory_bandwidth_tb_s": 1e3, "dense_tflops": 1e6}
_REQUIRED = ("name", "memory_capacity_gb", "memory_bandwidth_tb_s", "dense_tflops")
# The dense rates an entry may give, in TFLOP/s (int8: TOP/s); fp8, mxfp4 and
# nvfp4 are optional, and null (or absent) means the device has no such
# datapath, so weights in that format run at the bf16 rate.
RATE_DTYPES = ("bf16", "fp16", "fp8", "int8", "mxfp4", "nvfp4", "fp32")


def _number(where: str, value: Any, limit: float, field: str = "accelerator_file") -> float:
  """`value` as a float in (0, limit]; errors name `where` and carry `field`."""
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise errors.InputError(f"{where}={value!r} is not a number: give one > 0.", field=field)
  if not (math.isfinite(value) and 0 < value <= limit):
    raise errors.InputError(
        f"{where}={value!r} is not allowed: give a finite number in "
        f"(0, {limit:g}].", field=field)
  return float(value)


def check_entry(slug: str, entry: Any, where: str) -> dict[str, Any]:
  """A validated copy of one accelerator entry, with defaults for optional fields."""
  if not isinstance(entry, Mapping):
    raise errors.InputError(f"{where} is not a JSON object: give an accelerator entry.")
  missing = [f for f in _REQUIRED if f not in entry]
  if missing:
    raise errors.InputError(f"{where} lacks {', '.join(missing)}: see the shipped "
                            "jaxroof/specs/data/accelerators.json for the schema.")
  if not isinstance(entry["name"], str) or not entry["name"].strip():
    raise errors.InputError(f"{where}.name={entry['name']!r} is not a name.")
  for field in ("memory_capacity_gb", "memory_bandwidth_tb_s"):
    _number(f"{where}.{field}", entry[field], _LIMITS[field])
  rates = entry["dense_tflops"]
  if not isinstance(rates, Mapping) or rates.get("bf16") is None:
    raise errors.InputError(f"{where}.dense_tflops={rates!r} must be an object with at "
                            "least a bf16 rate, in TFLOP/s.")
  for dtype, rate in rates.items():
    if dtype not in RATE_DTYPES:
      raise errors.InputError(f"{where}.dense_tflops.{dtype} is not a known rate: give "
                              f"{', '.join(RATE_DTYPES)} (null: no such datapath).")
    if rate is not None:
      _number(f"{where}.dense_tflops.{dtype}", rate, _LIMITS["dense_tflops"])
  tdp = entry.get("tdp_w")
  if tdp is not None:
    _number(f"{where}.tdp_w", tdp, 1e5)
  return {
      "vendor": "user", "on_chip": {}, "interconnect": {}, "tdp_w": None, "memory_type": "unknown",
      "decisions": [], "sources": {"file": where}, **dict(entry)
  }


def load_accelerator_file(path: str | os.PathLike[str]) -> Accelerator:
  """An accelerator from a user's JSON file in the shipped schema."""
  path = os.fspath(path)
  where = f"accelerator_file={path!r}"
  data = schema.load(accelerator_schema.KIND, "accelerator_file", path)
  if isinstance(data, Mapping) and isinstance(data.get("accelerators"), Mapping):
    table = data["accelerators"]
    if len(table) != 1:
      raise errors.InputError(f"{where} holds {len(table)} accelerators: give one.")
    [(slug, entry)] = table.items()
  else:
    slug, entry = os.path.splitext(os.path.basename(path))[0], data
  entry = check_entry(slug, entry, where)
  return accelerators.entry_to_accelerator(str(slug).lower(), entry)


def with_overrides(device: Accelerator, *, bandwidth_tb_s: float | None = None,
                   tflops: float | None = None, memory_gb: float | None = None) -> Accelerator:
  """The device with datasheet figures replaced, each replacement recorded.

  `tflops` replaces every dtype's dense rate by the same figure (the what-if
  is "this much arithmetic"), `bandwidth_tb_s` the memory bandwidth,
  `memory_gb` the capacity.
  """
  changes: dict[str, Any] = {}
  notes = []
  if bandwidth_tb_s is not None:
    value = _number("bandwidth_tb_s", bandwidth_tb_s, _LIMITS["memory_bandwidth_tb_s"],
                    "bandwidth_tb_s")
    changes["memory_bandwidth_bytes_per_s"] = value * 1e12
    notes.append(f"what-if: bandwidth {value:g} TB/s instead of the datasheet's "
                 f"{device.memory_bandwidth_bytes_per_s / 1e12:g}")
  if tflops is not None:
    value = _number("tflops", tflops, _LIMITS["dense_tflops"], "tflops")
    changes["flops_per_s"] = {dtype: value * 1e12 for dtype in device.flops_per_s}
    notes.append(f"what-if: {value:g} dense TFLOP/s for every dtype instead of the "
                 f"datasheet's {device.flops_per_s['bf16'] / 1e12:g} (bf16)")
  if memory_gb is not None:
    value = _number("memory_gb", memory_gb, _LIMITS["memory_capacity_gb"], "memory_gb")
    changes["memory_capacity_bytes"] = value * 1e9
    notes.append(f"what-if: {value:g} GB of memory instead of the datasheet's "
                 f"{device.memory_capacity_bytes / 1e9:g}")
  if not changes:
    return device
  return dataclasses.replace(device, decisions=tuple(device.decisions) + tuple(notes), **changes)
