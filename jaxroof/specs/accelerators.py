"""`Accelerator`: datasheet figures of a device, loaded by slug.

The table `jaxroof/specs/data/accelerators.json` holds dense (no sparsity) figures
only, each field with its source, and records how conflicting sources were
resolved. Loaded figures are converted to SI: bytes, bytes/s, FLOP/s.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jaxroof import errors
from jaxroof.symbolic import formulas
from jaxroof.specs import names

TABLE = Path(__file__).parent / "data" / "accelerators.json"

# The matmul dtype a weight dtype runs at: fp8 and int8 weights with matching
# activations (W8A8); int4 weights are dequantized to bf16 (W4A16); mxfp4 and
# nvfp4 run at the device's rate for that FP4 format where it has one
# (Blackwell both, MI355X mxfp4), else they are dequantized to bf16.
COMPUTE_DTYPE = {
    "bf16": "bf16", "fp16": "bf16", "fp8": "fp8", "int8": "int8", "int4": "bf16", "mxfp4": "mxfp4",
    "nvfp4": "nvfp4"
}
FALLBACK_DTYPE = "bf16"  # Where a device has no tensor rate for the weights' format.
# Attention's kernels compute in bf16 whatever the weights' format (FlashAttention and
# FlashInfer keep Q, K, V in bf16 unless an fp8 attention is asked for).
ATTENTION_DTYPE = "bf16"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Accelerator:
  """One device's datasheet figures (SI units) and where they came from."""

  name: str  # Lowercase slug, e.g. "h100-sxm".
  full_name: str
  vendor: str
  memory_capacity_bytes: float
  memory_bandwidth_bytes_per_s: float
  flops_per_s: Mapping[str, float]  # Dense, by dtype ("int8": op/s); absent: no such path.
  on_chip: Mapping[str, Any]
  interconnect: Mapping[str, Any]
  tdp_w: float | None
  memory_type: str
  sources: Mapping[str, str]
  decisions: tuple[str, ...] = ()
  links: Links | None = None  # Scale-up and scale-out figures (several chips).

  def compute_dtype(self, weight_dtype: str) -> str:
    """The dtype whose FLOP rate a matmul with these weights runs at.

    Falls back to bf16 where the device publishes no rate for the format
    (e.g. fp8 on A100 or TPU v5p, mxfp4 on H100: weights are upcast);
    `compute_note` says so in words.
    """
    errors.require_choice("weight_dtype", weight_dtype, tuple(COMPUTE_DTYPE))
    dtype = COMPUTE_DTYPE[weight_dtype]
    return dtype if dtype in self.flops_per_s else FALLBACK_DTYPE

  def compute_note(self, weight_dtype: str) -> str:
    """One line on the rate `weight_dtype` matmuls run at, naming any fallback."""
    dtype = self.compute_dtype(weight_dtype)
    rate = f"{self.flops_per_s[dtype] / 1e12:g} dense {dtype} TFLOP/s"
    if dtype == COMPUTE_DTYPE[weight_dtype]:
      return f"{weight_dtype} weights multiply at {rate}"
    return (f"{weight_dtype} weights multiply at {rate}: {self.name} publishes no "
            f"{COMPUTE_DTYPE[weight_dtype]} tensor rate, so they are dequantized to "
            f"{dtype} (fallback)")

  def flops(self, weight_dtype: str = "bf16") -> float:
    """Dense FLOP/s of matmuls with `weight_dtype` weights."""
    return self.flops_per_s[self.compute_dtype(weight_dtype)]

  def ridge_point(self, weight_dtype: str = "bf16") -> float:
    """FLOPs per byte at which compute and memory take equally long."""
    return float(formulas.ridge_point(self.flops(weight_dtype), self.memory_bandwidth_bytes_per_s))


# Per-hop latency used where the vendor publishes none: scaling-book's ICI
# figure ("typically around 1us", sharding.md @0819a7d), an assumption.
ASSUMED_HOP_LATENCY_S = 1e-6


@dataclasses.dataclass(frozen=True, kw_only=True)
class Links:
  """How chips of this kind talk: the scale-up fabric, its domain, scale-out.

  `collective_bytes_per_s` is the rate one chip sends at in a ring
  collective: its whole scale-up egress on a switched or fully connected
  fabric (NVLink/NVSwitch, xGMI mesh, Gaudi RoCE mesh), or two links (both
  ring neighbours of one torus axis) on a TPU or Trainium torus, as
  scaling-book's W_ici is. `scale_out_bytes_per_s` is None where no figure
  was found: layouts beyond `domain_chips` are then refused.
  """

  technology: str
  topology: str
  unidirectional_bytes_per_s: float
  per_link_bytes_per_s: float | None
  collective_bytes_per_s: float
  domain_chips: int
  domain_unit: str
  hop_latency_s: float
  hop_latency_basis: str  # "published", "model constant" or "assumed".
  scale_out_bytes_per_s: float | None
  base_latency_s: float = 0.0  # Per collective (NCCL's baseLat and its peers'), sourced.
  base_latency_basis: str = ""
  # A fully connected mesh's one link to each peer (None elsewhere): a collective over n
  # chips of it runs on n - 1 of them.
  peer_bytes_per_s: float | None = None
  slice_shapes: tuple[str, ...] = ()


def _links(entry: Mapping[str, Any]) -> Links | None:
  up = entry.get("scale_up")
  if not up:
    return None
  unidirectional = float(up["unidirectional_gb_s"]) * 1e9
  per_link = up.get("per_link_unidirectional_gb_s")
  per_link = None if per_link is None else float(per_link) * 1e9
  torus = "torus" in up.get("topology", "")
  collective = 2 * per_link if torus and per_link else unidirectional
  hop = entry.get("hop_latency", {})
  if hop.get("value_us") is not None:
    latency, basis = hop["value_us"] * 1e-6, "published" if "assumption" not in hop.get(
        "kind", "") else "assumed (scaling-book)"
  elif _step_key(hop) is not None:
    key, library = _step_key(hop)
    latency, basis = (hop["modeling_assumptions"][key]["LL"] * 1e-6,
                      f"model constant ({library} tuning.cc, ring LL, per step)")
  else:
    latency, basis = ASSUMED_HOP_LATENCY_S, "assumed (scaling-book's ICI 1 us; none published)"
  base, base_basis = _base_latency(hop)
  domain = entry.get("scale_up_domain", {})
  peer = up.get("peer_to_peer_unidirectional_gb_s")
  mesh = not torus and peer is not None and "point-to-point" in up.get("topology", "")
  out = entry.get("scale_out", {}).get("per_chip_unidirectional_gb_s")
  return Links(
      technology=(up.get("generation") or "")
      if up.get("technology", "") in (up.get("generation") or "") else
      f"{up.get('technology')} {up.get('generation') or ''}".strip(),
      topology=up.get("topology", ""), unidirectional_bytes_per_s=unidirectional,
      per_link_bytes_per_s=per_link, collective_bytes_per_s=collective, domain_chips=int(
          domain.get("max_single_slice_chips") or domain.get("chips") or
          1), domain_unit=domain.get("unit", ""), hop_latency_s=latency, hop_latency_basis=basis,
      scale_out_bytes_per_s=None if out is None else float(out) * 1e9, base_latency_s=base,
      base_latency_basis=base_basis, peer_bytes_per_s=float(peer) * 1e9 if mesh else None,
      slice_shapes=tuple(shapes) if isinstance(shapes := domain.get("slice_shapes"), list) else ())


# NCCL's base latency of a ring collective, LL protocol (src/graph/tuning.cc baseLat Ring
# {LL 6.6, LL128 14.0, Simple 8.4} us): a protocol cost, the same over NVLink, PCIe or the
# network; used where a GPU entry records NCCL per-step figures without the base.
NCCL_RING_BASE_LL_S = 6.6e-6

_LIBRARIES = {"nccl": "NCCL", "nccl_pci": "NCCL", "rccl": "RCCL", "hccl": "HCCL (NCCL's model)"}


def _step_key(hop: Mapping[str, Any]) -> tuple[str, str] | None:
  """The entry's per-step ring latency constant and its library, if it records one."""
  model = hop.get("modeling_assumptions", {})
  for prefix, library in _LIBRARIES.items():
    if f"{prefix}_ring_per_step_us" in model:
      return f"{prefix}_ring_per_step_us", library
  return None


def _base_latency(hop: Mapping[str, Any]) -> tuple[float, str]:
  """Per-collective base latency and its basis, from an entry's `hop_latency`: a
  library's ring baseLat (NCCL, RCCL, HCCL), the ICI entries' one hop, or NCCL's where a
  GPU entry records only NCCL's per-step figures."""
  model = hop.get("modeling_assumptions", {})
  for prefix, library in _LIBRARIES.items():
    if f"{prefix}_ring_base_us" in model:
      return (model[f"{prefix}_ring_base_us"]["LL"] * 1e-6,
              f"model constant ({library} tuning.cc baseLat, ring LL)")
  if hop.get("collective_base_us") is not None:
    return hop["collective_base_us"] * 1e-6, hop.get("collective_base_basis", "")
  if any(name.startswith("nccl_") for name in model):
    return NCCL_RING_BASE_LL_S, "model constant (NCCL tuning.cc baseLat, ring LL)"
  raise ValueError("an accelerator entry's fabric records no per-collective base latency")


def entry_to_accelerator(slug: str, entry: Mapping[str, Any]) -> Accelerator:
  """An `Accelerator` from one entry of the shipped schema (TB/s, GB, TFLOP/s)."""
  return Accelerator(
      name=slug,
      full_name=entry["name"],
      vendor=entry["vendor"],
      memory_capacity_bytes=entry["memory_capacity_gb"] * 1e9,
      memory_bandwidth_bytes_per_s=entry["memory_bandwidth_tb_s"] * 1e12,
      flops_per_s={k: v * 1e12 for k, v in entry["dense_tflops"].items() if v is not None},
      on_chip=dict(entry["on_chip"]),
      interconnect=dict(entry["interconnect"]),
      tdp_w=entry["tdp_w"],
      memory_type=entry["memory_type"],
      sources=dict(entry["sources"]),
      decisions=tuple(entry["decisions"]),
      links=_links(entry),
  )


@functools.cache
def _table() -> dict[str, Accelerator]:
  entries = json.loads(TABLE.read_text(encoding="utf-8"))["accelerators"]
  return {slug: entry_to_accelerator(slug, e) for slug, e in entries.items()}


def kv_transfer_link(device: Accelerator) -> tuple[float | None, str]:
  """The per-chip network a prefill pool's K/V crosses to the decode pool: (bytes/s, what
  it is). The scale-out figure, the scale-up one where the device records none, or None
  (the transfer assumed free) where it records no network."""
  net = device.links
  if net is None:
    return None, f"{device.name} records no network: K/V transfer assumed free"
  if net.scale_out_bytes_per_s is not None:
    return net.scale_out_bytes_per_s, (f"{device.name} scale-out "
                                       f"{net.scale_out_bytes_per_s / 1e9:g} GB/s per chip")
  return net.collective_bytes_per_s, (f"{device.name} scale-up {net.technology} "
                                      f"{net.collective_bytes_per_s / 1e9:g} GB/s per chip "
                                      "(no scale-out figure)")


def known_accelerators() -> tuple[str, ...]:
  """The shipped slugs, sorted."""
  return tuple(sorted(_table()))


def device_kind_matches(slug: str, device_kind: str) -> bool:
  """Whether jax's device kind names this accelerator's family.

  E.g. "NVIDIA H100 80GB HBM3" and h100-sxm: a profile measured on that
  device describes this accelerator (not a what-if).
  """
  family = slug.strip().lower().split("-")[0]
  return bool(family) and family in device_kind.lower().replace(" ", "")


def load_accelerator(name: str) -> Accelerator:
  """The shipped accelerator `name` (a slug, case-insensitive).

  Raises:
    InputError: an unknown name, listing the known ones and the closest match.
  """
  if not isinstance(name, str):
    raise errors.InputError(
        f"accelerator={name!r} is not a name: give one of "
        f"{', '.join(known_accelerators())}.", field="accelerator")
  return parse_slice(name)[0]


_SLICE_PREFIX = re.compile(r"^(\d+)x(.+)$")  # "8xh100-sxm"
_SLICE_SUFFIX = re.compile(r"^(.+?)-(\d+)$")  # "tpu-v5e-8"


def parse_slice(name: str) -> tuple[Accelerator, int | None]:
  """An accelerator slug or a slice name: (device, chips or None for a bare slug).

  Slices: `8xh100-sxm` (chips x slug) or `tpu-v5e-8` (slug-chips). A slug
  that itself ends in digits (e.g. "mi300x") is matched as a slug first.

  Raises:
    InputError: an unknown slug, or zero chips.
  """
  text = name.strip().lower()
  known = known_accelerators()
  if text in known:
    return _table()[text], None
  for pattern, slug_group, chips_group in ((_SLICE_PREFIX, 2, 1), (_SLICE_SUFFIX, 1, 2)):
    match = pattern.match(text)
    if match and match.group(slug_group) in known:
      chips = int(match.group(chips_group))
      if chips < 1:
        raise errors.InputError(
            f"accelerator={name!r} has {chips} chips: a slice needs "
            "at least 1 (e.g. 8xh100-sxm or tpu-v5e-8).", field="accelerator")
      return _table()[match.group(slug_group)], chips
  slug = names.require_known("accelerator", text, known)
  return _table()[slug], None


def load_accelerators(names: str) -> list[Accelerator]:
  """Accelerators from a comma-separated list of slugs, or "all"."""
  if names.strip().lower() == "all":
    return [_table()[s] for s in known_accelerators()]
  slugs = [n for n in (s.strip() for s in names.split(",")) if n]
  if not slugs:
    raise errors.InputError(f"accelerators={names!r} is empty: give slugs or 'all'.",
                            field="accelerators")
  return [load_accelerator(s) for s in dict.fromkeys(slugs)]
