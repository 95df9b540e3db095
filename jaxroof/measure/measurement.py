"""Measurement records: what was timed, where, how, and what it took.

A `Measurement` is one timed computation (an op at given shapes, a device
ceiling, a decode step) with everything needed to read the figure later: the
device kind and platform, the backend (`xla` or `pallas`), the dtype, the jax
version and the timing method. The timing itself always comes from
`jaxroof.timing.time_call` (warm-up excluded, `block_until_ready`, rotation
over argument sets, median and spread): this module only labels it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import gc
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxroof import errors
from jaxroof.timing import Clock, Timing, time_call

BACKENDS = ("xla", "pallas")
KIND = "measurement"
DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")  # jax.numpy's names.
# jax is imported where it is used: the analytic experiments import this module for its
# labels, and jax's import would add about a second to each of them.


def require_dtype(name: str) -> Any:
  """The jnp dtype of a name, or an InputError naming the known ones."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  return getattr(jnp, errors.require_choice("dtype", name, DTYPES))


_ALLOCATOR = ["default"]  # What `keep_allocations` did in this process.
# glibc mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


def keep_allocations() -> str:
  """Stops glibc malloc from handing large freed buffers back to the OS.

  XLA's CPU runtime allocates a call's temporary buffers with malloc. glibc
  serves large ones with fresh pages (above its mmap threshold, or from the
  64 MiB heaps of its per-thread arenas) that fault in on every call: on a
  2-core VM that added ~9 ms to a 6 ms toy decode step once its K/V
  temporaries passed ~1 MB, and doubled it again past ~16 MB: cliffs no
  roofline explains and no server (whose allocator keeps its pool) pays.
  One arena, no mmap and no trimming (thresholds at SIZE_MAX, passed as -1)
  make calls reuse their buffers; a 1 GiB threshold still let ~1 GB K/V
  temporaries fault in. Process-wide, and best called before jax starts its
  threads; a no-op (reported as such) without glibc. Recorded in every
  measurement.
  """
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    done = (libc.mallopt(_M_ARENA_MAX, 1) == 1 and libc.mallopt(_M_MMAP_THRESHOLD, -1) == 1 and
            libc.mallopt(_M_TRIM_THRESHOLD, -1) == 1)
  except (OSError, AttributeError):
    done = False
  if done:
    _ALLOCATOR[0] = ("glibc malloc keeps freed buffers (one arena, no mmap, "
                     "no trim)")
  return _ALLOCATOR[0]


def release_memory() -> bool:
  """Frees what Python no longer holds and hands glibc's free pages back.

  `keep_allocations` turns glibc's automatic trimming off (for stable
  timings), so a job calls this between its phases: without it the heap keeps
  every phase's peak and a calibration's resident memory only grows.
  Returns whether malloc_trim ran (False without glibc).
  """
  gc.collect()
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.malloc_trim(0)
  except (OSError, AttributeError):
    return False
  return True


def allocator() -> str:
  """How host buffers are allocated in this process (see keep_allocations)."""
  return _ALLOCATOR[0]


def filler(shape: tuple[int, ...], dtype: Any, seed: int = 0) -> Any:
  """Normal values made cheaply, for inputs whose values do not change a time.

  One block of 2**16 draws (numpy), repeated and copied to the device once:
  drawing gigabytes on a CPU takes seconds, and jax ops at each new shape
  would compile (about 0.3 s per operand on a CPU).
  """
  block = np.random.default_rng(seed).standard_normal(2**16, np.float32)
  values = np.resize(block, math.prod(shape)).reshape(shape)
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  return jnp.asarray(values, dtype=jnp.dtype(dtype))


@dataclasses.dataclass(frozen=True)
class Device:
  """Where a measurement ran."""

  device_kind: str  # e.g. "cpu", "NVIDIA H200", "TPU v5 lite".
  platform: str  # jax's backend: cpu, gpu or tpu.
  jax_version: str

  def to_json(self) -> dict[str, str]:
    return dataclasses.asdict(self)


def current_device() -> Device:
  """The default jax device of this process."""
  import jax  # pylint: disable=import-outside-toplevel
  return Device(
      device_kind=jax.devices()[0].device_kind,
      platform=jax.default_backend(),
      jax_version=jax.__version__,
  )


@dataclasses.dataclass(frozen=True)
class Measurement:
  """One timed computation, labelled.

  Attributes:
    op: what ran, e.g. "linear", "decode_attention", "decode_step", "matmul".
    shapes: the sizes that define it (e.g. batch, context, rows, d_in).
    dtype: the element type of its main operands.
    backend: "xla" (jit of the jnp computation) or "pallas".
    device: where it ran.
    timing: median and spread of the timed repeats.
    flops: analytic FLOPs of one call, if counted.
    bytes: analytic bytes moved by one call, if counted.
    extra: anything else that identifies the run (model sizes, config).
  """

  op: str
  shapes: Mapping[str, int]
  dtype: str
  backend: str
  device: Device
  timing: Timing
  flops: float | None = None
  bytes: float | None = None
  extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def median_s(self) -> float:
    return self.timing.median_s

  @property
  def spread(self) -> float:
    return self.timing.spread

  @property
  def method(self) -> str:
    return self.timing.method

  def rate(self, amount: float | None) -> float | None:
    """`amount` per second of the median time (None if not counted)."""
    return None if amount is None else amount / self.median_s

  def to_json(self) -> dict[str, Any]:
    """A flat JSON row: op, shapes, dtype, backend, device, median_s, spread."""
    return {
        "kind": KIND,
        "op": self.op,
        "shapes": dict(self.shapes),
        "dtype": self.dtype,
        "backend": self.backend,
        **self.device.to_json(),
        "method": self.method,
        "median_s": self.median_s,
        "spread": self.spread,
        "timing": self.timing.to_json(),
        "flops": self.flops,
        "bytes": self.bytes,
        "achieved_flops_per_s": self.rate(self.flops),
        "achieved_bytes_per_s": self.rate(self.bytes),
        "extra": dict(self.extra),
    }

  @classmethod
  def from_json(cls, row: Mapping[str, Any]) -> Measurement:
    """Rebuilds a record written by `to_json`."""
    timing_fields = {f.name for f in dataclasses.fields(Timing)}
    timing = Timing(**{k: v for k, v in row["timing"].items() if k in timing_fields})
    device = Device(**{f.name: row[f.name] for f in dataclasses.fields(Device)})
    return cls(op=row["op"], shapes=dict(row["shapes"]), dtype=row["dtype"], backend=row["backend"],
               device=device, timing=timing, flops=row.get("flops"), bytes=row.get("bytes"),
               extra=dict(row.get("extra") or {}))


def _check_backend(backend: str) -> None:
  if backend not in BACKENDS:
    raise ValueError(f"{backend=} is not allowed: use one of {BACKENDS}.")


def measure(
    fn: Callable[..., Any],
    arg_sets: Sequence[Sequence[Any]],
    *,
    op: str,
    shapes: Mapping[str, int],
    dtype: str,
    backend: str = "xla",
    warmup: int = 2,
    repeats: int = 10,
    flops: float | None = None,
    bytes: float | None = None,  # noqa: A002  (the record's field name)
    extra: Mapping[str, Any] | None = None,
    clock: Clock = time.perf_counter,
    device: Device | None = None,
) -> Measurement:
  """Times `fn` over rotating `arg_sets` with `time_call` and labels it.

  Args:
    fn: the (jit-compiled) computation; its result is synchronised.
    arg_sets: argument tuples, rotated call by call (see `time_call`).
    op, shapes, dtype, backend, flops, bytes, extra: the record's labels.
    warmup: untimed calls first (compilation, caches, allocator).
    repeats: timed calls; the record keeps their median and spread.
    clock: injectable for tests.
    device: where it runs; None means this process's default device.

  Returns:
    The labelled `Measurement`.
  """
  _check_backend(backend)
  timing = time_call(fn, arg_sets, warmup=warmup, repeats=repeats, clock=clock)
  return labelled(timing, op=op, shapes=shapes, dtype=dtype, backend=backend, flops=flops,
                  bytes=bytes, extra=extra, device=device)


def labelled(
    timing: Timing,
    *,
    op: str,
    shapes: Mapping[str, int],
    dtype: str,
    backend: str = "xla",
    flops: float | None = None,
    bytes: float | None = None,  # noqa: A002  (the record's field name)
    extra: Mapping[str, Any] | None = None,
    device: Device | None = None,
) -> Measurement:
  """Labels a `Timing` taken through `time_call` (directly or chained)."""
  _check_backend(backend)
  return Measurement(op=op, shapes=dict(shapes), dtype=dtype, backend=backend,
                     device=current_device() if device is None else device, timing=timing,
                     flops=flops, bytes=bytes,
                     extra={"host_allocator": allocator(), **(extra or {})})
