"""`Accelerator`: datasheet figures of a device, loaded by slug.

The table `jaxroof/specs/data/accelerators.json` holds dense (no sparsity) figures
only, each field with its source, and records how conflicting sources were
resolved. Loaded figures are converted to SI: bytes, bytes/s, FLOP/s.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jaxroof import errors
from jaxroof.symbolic import formulas
from jaxroof.specs import names

TABLE = Path(__file__).parent / "data" / "accelerators.json"

# The matmul dtype a weight dtype runs at: fp8 and int8 weights with matching
# activations (W8A8); int4 weights are dequantized to bf16 (W4A16); FP4 formats
# run at the device's fp4 rate where it has one (Blackwell, MI355X), else
# dequantized to bf16.
COMPUTE_DTYPE = {"bf16": "bf16", "fp16": "bf16", "fp8": "fp8", "int8": "int8",
                 "int4": "bf16", "mxfp4": "fp4", "nvfp4": "fp4"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Accelerator:
  """One device's datasheet figures (SI units) and where they came from."""

  name: str  # Lowercase slug, e.g. "h100-sxm".
  full_name: str
  vendor: str
  memory_capacity_bytes: float
  memory_bandwidth_bytes_per_s: float
  flops_per_s: Mapping[str, float]  # Dense, by dtype ("int8": op/s).
  on_chip: Mapping[str, Any]
  interconnect: Mapping[str, Any]
  tdp_w: float | None
  memory_type: str
  sources: Mapping[str, str]
  decisions: tuple[str, ...] = ()

  def compute_dtype(self, weight_dtype: str) -> str:
    """The dtype whose FLOP rate a matmul with these weights runs at.

    Falls back to bf16 where the device has no faster path for the dtype
    (e.g. fp8 on A100 or TPU v5p: weights are upcast).
    """
    errors.require_choice("weight_dtype", weight_dtype, tuple(COMPUTE_DTYPE))
    dtype = COMPUTE_DTYPE[weight_dtype]
    return dtype if dtype in self.flops_per_s else "bf16"

  def flops(self, weight_dtype: str = "bf16") -> float:
    """Dense FLOP/s of matmuls with `weight_dtype` weights."""
    return self.flops_per_s[self.compute_dtype(weight_dtype)]

  def ridge_point(self, weight_dtype: str = "bf16") -> float:
    """FLOPs per byte at which compute and memory take equally long."""
    return float(formulas.ridge_point(self.flops(weight_dtype),
                                      self.memory_bandwidth_bytes_per_s))


def entry_to_accelerator(slug: str, entry: Mapping[str, Any]) -> Accelerator:
  """An `Accelerator` from one entry of the shipped schema (TB/s, GB, TFLOP/s)."""
  return Accelerator(
      name=slug,
      full_name=entry["name"],
      vendor=entry["vendor"],
      memory_capacity_bytes=entry["memory_capacity_gb"] * 1e9,
      memory_bandwidth_bytes_per_s=entry["memory_bandwidth_tb_s"] * 1e12,
      flops_per_s={k: v * 1e12 for k, v in entry["dense_tflops"].items()},
      on_chip=dict(entry["on_chip"]),
      interconnect=dict(entry["interconnect"]),
      tdp_w=entry["tdp_w"],
      memory_type=entry["memory_type"],
      sources=dict(entry["sources"]),
      decisions=tuple(entry["decisions"]),
  )


@functools.cache
def _table() -> dict[str, Accelerator]:
  entries = json.loads(TABLE.read_text(encoding="utf-8"))["accelerators"]
  return {slug: entry_to_accelerator(slug, e) for slug, e in entries.items()}


def known_accelerators() -> tuple[str, ...]:
  """The shipped slugs, sorted."""
  return tuple(sorted(_table()))


def load_accelerator(name: str) -> Accelerator:
  """The shipped accelerator `name` (a slug, case-insensitive).

  Raises:
    InputError: an unknown name, listing the known ones and the closest match.
  """
  if not isinstance(name, str):
    raise errors.InputError(f"accelerator={name!r} is not a name: give one of "
                            f"{', '.join(known_accelerators())}.")
  slug = names.require_known("accelerator", name.strip().lower(), known_accelerators())
  return _table()[slug]


def load_accelerators(names: str) -> list[Accelerator]:
  """Accelerators from a comma-separated list of slugs, or "all"."""
  if names.strip().lower() == "all":
    return [_table()[s] for s in known_accelerators()]
  slugs = [n for n in (s.strip() for s in names.split(",")) if n]
  if not slugs:
    raise errors.InputError(f"accelerators={names!r} is empty: give slugs or 'all'.")
  return [load_accelerator(s) for s in dict.fromkeys(slugs)]
