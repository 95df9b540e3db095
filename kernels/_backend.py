"""Where a Pallas kernel runs and how it is lowered there.

A `Target` names the platform (cpu, cuda, rocm, tpu) and whether the kernel is
interpreted. From it follow the lowering (`interpret`, `triton`, `mosaic_tpu`)
and the compiler parameters. Compiler parameters are always passed explicitly
on a GPU: without `pltriton.CompilerParams` a GPU `pallas_call` is lowered
through Mosaic GPU instead of Triton (`jax_pallas_use_mosaic_gpu` is on by
default), and our kernels are written for Triton.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Callable, Iterator
from typing import Any

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltriton

from jaxroof.errors import InputError, require_choice

PLATFORMS = ("cpu", "cuda", "rocm", "tpu")
LOWERINGS = ("interpret", "triton", "mosaic_tpu")

# Blocks (double-buffered) a TPU kernel may keep in VMEM, and the scoped VMEM
# limit passed to Mosaic. 16 MiB fits every TPU generation's VMEM.
TPU_VMEM_BUDGET_BYTES = 12 * 2**20
TPU_VMEM_LIMIT_BYTES = 16 * 2**20
# Shared memory a Triton config may ask for (num_stages copies of its tiles);
# Hopper offers 227 KiB per block, Ampere 163 KiB.
TRITON_SMEM_BUDGET_BYTES = 192 * 2**10
# The TPU whose lowering rules cross-lowering on a machine without a TPU uses.
CROSS_LOWERING_TPU_KIND = "TPU v5 lite"
# Triton's tl.dot needs every dimension >= 16.
MIN_DOT = 16


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Target:
  """A platform and whether the Pallas kernel is interpreted there."""

  platform: str
  interpret: bool

  @property
  def lowering(self) -> str:
    """`interpret`, `triton` (cuda, rocm) or `mosaic_tpu`."""
    if self.interpret:
      return "interpret"
    return "mosaic_tpu" if self.platform == "tpu" else "triton"

  @property
  def rules(self) -> str:
    """Whose constraints configs must meet: the platform's compiled lowering.

    An interpreted kernel for a GPU or TPU platform keeps that platform's
    rules (and kernel structure), so the CPU can check it; plain CPU
    interpretation (`interpret`) only needs the shapes to divide.
    """
    rules = {"cpu": "interpret", "tpu": "mosaic_tpu"}
    return rules.get(self.platform, "triton")

  @property
  def backend(self) -> str:
    """The label measurements carry: `pallas-<lowering>`."""
    return f"pallas-{self.lowering}"


def default_platform() -> str:
  """The platform of jax's default backend: cpu, cuda, rocm or tpu."""
  backend = jax.default_backend()
  if backend != "gpu":
    return backend
  version = jax.devices()[0].client.platform_version.lower()
  return "rocm" if "rocm" in version else "cuda"


def resolve_target(platform: str | None = None, interpret: bool | None = None) -> Target:
  """The target for a kernel call.

  Args:
    platform: cpu, cuda, rocm or tpu; None means jax's default backend.
    interpret: None means interpret on the CPU and compile elsewhere.

  Raises:
    InputError: for an unknown platform, or a compiled kernel on the CPU.
  """
  platform = default_platform() if platform is None else platform
  require_choice("platform", platform, PLATFORMS)
  if interpret is None:
    interpret = platform == "cpu"
  if platform == "cpu" and not interpret:
    raise InputError(f"{interpret=} is not allowed with {platform=}: Pallas has no CPU "
                     "compiler; use interpret=True (correctness only) or the reference.")
  return Target(platform=platform, interpret=bool(interpret))


def compiler_params(
    target: Target,
    *,
    num_warps: int,
    num_stages: int,
    dimension_semantics: tuple[str, ...],
) -> Any:
  """Explicit compiler parameters for the target's lowering (None: interpret).

  Args:
    target: where the kernel runs.
    num_warps, num_stages: Triton's launch parameters.
    dimension_semantics: per grid axis, "parallel" or "arbitrary" (TPU).
  """
  if target.lowering == "triton":
    return pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)
  if target.lowering == "mosaic_tpu":
    return pltpu.CompilerParams(
        dimension_semantics=dimension_semantics,
        vmem_limit_bytes=TPU_VMEM_LIMIT_BYTES,
    )
  return None


def whole_array_scalars_spec(target: Target) -> pl.BlockSpec:
  """A spec handing the kernel a whole small int array to read scalars from.

  On TPU scalars are read from SMEM; Triton and the interpreter index the
  array in place.
  """
  if target.platform == "tpu":
    return pl.BlockSpec(memory_space=pltpu.SMEM)
  return pl.BlockSpec()


def is_power_of_two(n: int) -> bool:
  return n >= 1 and n & (n - 1) == 0


def next_power_of_two(n: int) -> int:
  return 1 << max(0, int(n) - 1).bit_length()


def largest_pow2_divisor(total: int, cap: int, floor: int) -> int | None:
  """The largest power of two in [floor, cap] dividing total, if any.

  `cap` is a power of two; halving it walks the candidates.
  """
  block = cap
  while block >= floor:
    if total % block == 0:
      return block
    block //= 2
  return None


def device_kind() -> str:
  """The default device's kind, e.g. 'NVIDIA H200' or 'cpu'."""
  return jax.devices()[0].device_kind


def device_kind_slug(kind: str | None = None) -> str:
  """A file-name form of a device kind: 'NVIDIA H200' -> 'nvidia_h200'."""
  kind = device_kind() if kind is None else kind
  return re.sub(r"[^a-z0-9]+", "_", kind.lower()).strip("_") or "unknown"


# The GPU whose lowering rules cross-lowering for cuda uses without a GPU.
CROSS_LOWERING_GPU_KIND = "NVIDIA H100 80GB HBM3"
CROSS_LOWERING_GPU_CORES = 132


def _abstract_device(platform: str) -> Any | None:
  """The abstract device cross-lowering for `platform` stands in with.

  None when the platform's lowering needs none: the TPU lowering always asks
  for the TPU generation; the Pallas GPU lowering asks for GPU info only
  from jax 0.11 (feature-detected by `pltriton.get_gpu_info`), and on older
  versions an abstract mesh is not needed.
  """
  if platform == "tpu":
    return jax.sharding.AbstractDevice(device_kind=CROSS_LOWERING_TPU_KIND, num_cores=1,
                                       platform="tpu")
  if platform in ("cuda", "rocm") and hasattr(pltriton, "get_gpu_info"):
    return jax.sharding.AbstractDevice(device_kind=CROSS_LOWERING_GPU_KIND,
                                       num_cores=CROSS_LOWERING_GPU_CORES, platform=platform)
  return None


@contextlib.contextmanager
def _lowering_context(platform: str) -> Iterator[None]:
  """Lets a platform's lowering run where no such device is attached.

  The Mosaic TPU lowering (and, from jax 0.11, the Pallas GPU lowering) asks
  the default device what it is; an abstract mesh of one abstract device of
  that platform answers instead. On the platform itself nothing changes.
  """
  native = {"tpu": "tpu", "cuda": "gpu", "rocm": "gpu"}.get(platform)
  device = _abstract_device(platform)
  if device is None or jax.default_backend() == native:
    yield
    return
  mesh = jax.sharding.AbstractMesh((1,), ("_",), abstract_device=device)
  with jax.sharding.use_abstract_mesh(mesh):
    yield


def cross_lower(fn: Callable[..., Any], *args: Any, platform: str) -> str:
  """Runs the real lowering of `jit(fn)(*args)` for `platform`; returns MLIR.

  Works on a CPU-only jaxlib: this is how tests check that a config lowers
  through Triton (cuda) or Mosaic (tpu). It does not run the backend compiler
  (register or shared-memory overflows show only on the device). `args` may be
  `jax.ShapeDtypeStruct`s, so large shapes cost nothing.
  """
  with _lowering_context(platform):
    lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,))
    return lowered.as_text()
