"""Device ceilings, measured: sustained memory bandwidth and matmul FLOP/s.

Whatever device jax runs on (the CPU included), with the harness of
`jaxroof.measure.measurement`:

* read bandwidth: a sum over an array far larger than the device's caches,
  bytes read / median time.
* copy bandwidth: an in-place update of such an array (the buffer is donated,
  so nothing is allocated), bytes read + written / median time.
* the sustained bandwidth `BW` that the calibrated model scales is the larger
  of the two (a reduction can be limited by its arithmetic on a CPU).
* matmul FLOP/s per dtype: a square n x n x n product, 2 n^3 / median time.

Buffers rotate between calls so a cache never holds the next call's input.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jaxroof import errors
from jaxroof.symbolic import formulas
from jaxroof.measure import measurement

# Sizes per platform: arrays far beyond the last-level cache (32 MB L3 on the
# development CPU, ~50 MB L2 on an H100/H200), matmuls long enough to time.
_BANDWIDTH_BYTES = {"cpu": 256 * 2**20}
_BANDWIDTH_BYTES_ACCELERATOR = 2 * 2**30
_MATMUL_SIZE = {"cpu": 2048}
_MATMUL_SIZE_ACCELERATOR = 8192


@dataclasses.dataclass(frozen=True)
class Ceilings:
  """Measured ceilings of one device (all *measurements*)."""

  device_kind: str
  bandwidth_Bps: float  # Sustained: the larger of read and copy, B/s.
  copy_bandwidth_Bps: float  # In-place update, read + write, B/s.
  read_bandwidth_Bps: float  # A sum's bytes read, B/s.
  flops_per_s: Mapping[str, float]  # Matmul FLOP/s by dtype name.
  records: Sequence[measurement.Measurement] = ()

  def flop_rate(self, dtype: str) -> float:
    if dtype not in self.flops_per_s:
      raise errors.InputError(f"dtype={dtype!r} has no measured matmul rate: measured "
                              f"{', '.join(self.flops_per_s) or 'none'}.")
    return self.flops_per_s[dtype]

  def to_json(self) -> dict[str, Any]:
    return {
        "kind": measurement.KIND,
        "device_kind": self.device_kind,
        "bandwidth_Bps": self.bandwidth_Bps,
        "copy_bandwidth_Bps": self.copy_bandwidth_Bps,
        "read_bandwidth_Bps": self.read_bandwidth_Bps,
        "flops_per_s": dict(self.flops_per_s),
        "units": {
            "bandwidth_Bps": "B/s", "copy_bandwidth_Bps": "B/s", "read_bandwidth_Bps": "B/s",
            "flops_per_s": "FLOP/s"
        },
        "records": [r.to_json() for r in self.records],
    }

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> Ceilings:
    return cls(device_kind=data["device_kind"], bandwidth_Bps=float(data["bandwidth_Bps"]),
               copy_bandwidth_Bps=float(data["copy_bandwidth_Bps"]),
               read_bandwidth_Bps=float(data["read_bandwidth_Bps"]),
               flops_per_s={k: float(v) for k, v in data["flops_per_s"].items()},
               records=tuple(measurement.Measurement.from_json(r) for r in data.get("records", ())))


def default_sizes(platform: str | None = None) -> tuple[int, int]:
  """(bandwidth array bytes, matmul n) for a platform (default: this one)."""
  platform = jax.default_backend() if platform is None else platform
  return (_BANDWIDTH_BYTES.get(platform, _BANDWIDTH_BYTES_ACCELERATOR),
          _MATMUL_SIZE.get(platform, _MATMUL_SIZE_ACCELERATOR))


def _arrays(count: int, shape: tuple[int, ...], dtype: Any) -> list[jax.Array]:
  return [measurement.filler(shape, dtype, seed) for seed in range(count)]


def read_bandwidth(nbytes: int, *, warmup: int = 2, repeats: int = 10) -> measurement.Measurement:
  """Sums a float32 array of `nbytes` (two rotated): bytes read per second."""
  n = errors.require_positive_int("nbytes", nbytes) // 4
  arrays = _arrays(2, (n,), jnp.float32)
  return measurement.measure(jax.jit(jnp.sum), [(a,) for a in arrays], op="read", shapes={"n": n},
                             dtype="float32", warmup=warmup, repeats=repeats, flops=float(n),
                             bytes=4.0 * n)


def copy_bandwidth(nbytes: int, *, warmup: int = 2, repeats: int = 10) -> measurement.Measurement:
  """Updates a donated float32 array in place: bytes read + written per s."""
  n = errors.require_positive_int("nbytes", nbytes) // 4
  arrays = _arrays(2, (n,), jnp.float32)
  update = jax.jit(lambda x: x * 0.5 + 1.0, donate_argnums=0)

  def call(slot: int) -> jax.Array:
    arrays[slot] = update(arrays[slot])
    return arrays[slot]

  return measurement.measure(call, [(0,), (1,)], op="copy", shapes={"n": n}, dtype="float32",
                             warmup=warmup, repeats=repeats, flops=2.0 * n, bytes=8.0 * n,
                             extra={"donated": True})


def matmul_rate(n: int, dtype: Any, *, warmup: int = 2,
                repeats: int = 10) -> measurement.Measurement:
  """A square n x n x n matmul at `dtype`: 2 n^3 FLOPs per median time."""
  n = errors.require_positive_int("matmul_size", n)
  dtype = jnp.dtype(dtype)
  a, b = _arrays(2, (n, n), dtype)
  return measurement.measure(jax.jit(jnp.matmul), [(a, b), (b, a)], op="matmul",
                             shapes={"m": n, "k": n, "n": n}, dtype=dtype.name, warmup=warmup,
                             repeats=repeats, flops=float(formulas.linear_flops(n * n, n)),
                             bytes=float(formulas.linear_bytes(n, n, n, dtype.itemsize)),
                             extra={"precision": "default"})


def _best_of(rounds: int,
             measure_once: Callable[[], measurement.Measurement]) -> measurement.Measurement:
  """The fastest of `rounds` measurements (load from other processes only
  ever slows a round down); the others' medians are kept in `extra`."""
  records = [measure_once() for _ in range(rounds)]
  best = min(records, key=lambda r: r.median_s)
  return dataclasses.replace(
      best, extra={
          **best.extra, "round_medians_s": [r.median_s for r in records],
          "statistic": "best round's median"
      })


def measure_ceilings(
    dtypes: Sequence[str] = ("float32",),
    *,
    bandwidth_bytes: int | None = None,
    matmul_size: int | None = None,
    repeats: int = 10,
    rounds: int = 3,
    progress: Callable[[str], None] | None = None,
) -> Ceilings:
  """Measures read and copy bandwidth and the matmul rate of each dtype.

  Each is measured in `rounds` rounds of `repeats` timed calls, and the best
  round's median is kept: a ceiling is what the device sustains.
  """
  default_bytes, default_n = default_sizes()
  nbytes = default_bytes if bandwidth_bytes is None else bandwidth_bytes
  n = default_n if matmul_size is None else matmul_size
  rounds = errors.require_positive_int("rounds", rounds)
  say = progress or (lambda _: None)
  read = _best_of(rounds, lambda: read_bandwidth(nbytes, repeats=repeats))
  say(f"read bandwidth: {read.rate(read.bytes) / 1e9:,.1f} GB/s")
  copy = _best_of(rounds, lambda: copy_bandwidth(nbytes, repeats=repeats))
  say(f"copy bandwidth: {copy.rate(copy.bytes) / 1e9:,.1f} GB/s")
  records = [read, copy]
  rates = {}
  for name in dtypes:
    dtype = measurement.require_dtype(name)
    record = _best_of(rounds, lambda: matmul_rate(n, dtype, repeats=repeats))
    rates[name] = record.rate(record.flops)
    records.append(record)
    say(f"matmul {name} n={n}: {rates[name] / 1e9:,.1f} GFLOP/s")
  return Ceilings(device_kind=read.device.device_kind,
                  bandwidth_Bps=max(read.rate(read.bytes), copy.rate(copy.bytes)),
                  copy_bandwidth_Bps=copy.rate(copy.bytes),
                  read_bandwidth_Bps=read.rate(read.bytes), flops_per_s=rates,
                  records=tuple(records))
