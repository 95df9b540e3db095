"""What every kernel op shares: its description, validation and config space.

An op (`KernelOp`, in the spirit of tokamax's `Op`) is described once by its
module: its reference, kernel, `why_invalid`, heuristic and candidates. From
those this module derives, once for all ops, what used to be repeated in each
kernel file: raising on a config that does not fit (`KernelOp.validate`), the
candidates that fit (`KernelOp.config_space`), the first of a list of configs
that fits (`KernelOp.first_fitting`), and the check that every launch
parameter of a config is a whole number >= 1 (`why_not_positive`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax

from jaxroof.errors import InputError

# Programs per streaming multiprocessor the split heuristics aim for, and the
# SM count assumed when the device does not say (an H100/H200 has 132).
PROGRAMS_PER_CORE = 2
DEFAULT_GPU_CORES = 132


def why_not_positive(config: Any) -> str | None:
  """Why a config's fields are not all whole numbers >= 1; None if they are."""
  for field in dataclasses.fields(config):
    value = getattr(config, field.name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      return f"{field.name}={value!r} must be a whole number >= 1"
  return None


def why_not_runnable(config: Any, dtype: str, supported: tuple[str, ...]) -> str | None:
  """The checks every op's `why_invalid` starts with: whole-number config fields >= 1
  and a supported dtype. None if both hold."""
  reason = why_not_positive(config)
  if reason:
    return reason
  if dtype not in supported:
    return f"dtype={dtype} is not supported: use {supported}"
  return None


def device_cores(rules: str) -> int:
  """Streaming multiprocessors of the GPU at hand, for the split heuristics.

  `core_count` of jax's first device when it is a GPU that reports it;
  otherwise (the CPU, cross-lowering, an older jaxlib) `DEFAULT_GPU_CORES`.
  Heuristics for other rules do not depend on it.
  """
  if rules != "triton":
    return DEFAULT_GPU_CORES
  try:
    device = jax.devices()[0]
  except RuntimeError:
    return DEFAULT_GPU_CORES
  cores = getattr(device, "core_count", None)
  if device.platform == "gpu" and isinstance(cores, int) and cores > 0:
    return cores
  return DEFAULT_GPU_CORES


def target_programs(rules: str) -> int:
  """Programs a launch should have to keep every core of the device busy."""
  return PROGRAMS_PER_CORE * device_cores(rules)


@dataclasses.dataclass(frozen=True, kw_only=True)
class KernelOp:
  """One kernel op, as the autotuner and the kernel's own checks see it.

  Attributes:
    name: the op's name, also the autotuning cache file's name.
    config_type: the frozen config dataclass (rebuilt from cached JSON).
    problem: args -> the op's static problem description.
    kernel: kernel(*args, config=, target=) -> output, for a valid config.
    reference: reference(*args) -> the correct output.
    candidates: (problem, rules) -> configs to try, heuristic first.
    why_invalid: (config, problem, rules) -> reason it cannot run, or None.
    heuristic: (problem, rules) -> a config chosen without timing.
    tolerance: dtype -> (rtol, atol) against the reference, for outputs whose
      root mean square is one (the check scales atol by the reference's RMS).
    chain_feed: (args, output) -> next args, for chained timing.
    example_args: (problem, key) -> random arguments for tuning.
    key_fields: problem fields the cache key matches exactly; empty means
      every field not in `bucketed_fields`.
    bucketed_fields: problem fields (batch, sequence length) the cache key
      rounds up to a power of two, so nearby sizes share one tuning.
    check_args: (timed args, key) -> more arguments of the same shapes the
      outputs are checked on (attention: ragged lengths); None: none.
    check_note: what the correctness check runs on, for the cache record.
    timing_note: what `example_args` times on, for the cache record.
  """

  name: str
  config_type: type
  problem: Callable[[Sequence[Any]], Any]
  kernel: Callable[..., Any]
  reference: Callable[..., Any]
  candidates: Callable[[Any, str], list[Any]]
  why_invalid: Callable[[Any, Any, str], str | None]
  heuristic: Callable[[Any, str], Any]
  tolerance: Callable[[Any], tuple[float, float]]
  chain_feed: Callable[[tuple[Any, ...], Any], tuple[Any, ...]]
  example_args: Callable[[Any, jax.Array], tuple[Any, ...]]
  key_fields: tuple[str, ...] = ()
  bucketed_fields: tuple[str, ...] = ()
  check_args: Callable[[tuple[Any, ...], jax.Array], tuple[Any, ...]] | None = None
  check_note: str = "the timed arguments"
  timing_note: str = "example_args"

  def validate(self, config: Any, problem: Any, rules: str) -> None:
    """Raises InputError if `config` cannot run `problem` under `rules`."""
    reason = self.why_invalid(config, problem, rules)
    if reason:
      raise InputError(f"config {config} does not fit {problem}: {reason}.")

  def config_space(self, problem: Any, rules: str) -> list[Any]:
    """The candidates that fit `problem` under `rules`."""
    return [
        c for c in self.candidates(problem, rules) if self.why_invalid(c, problem, rules) is None
    ]

  def first_fitting(self, configs: Iterable[Any], problem: Any, rules: str, *, fallback: Any,
                    advice: str = "") -> Any:
    """The first of `configs` that fits; raises naming why `fallback` fails.

    Raises:
      InputError: when none fits, with `fallback`'s reason and `advice`.
    """
    for config in configs:
      if self.why_invalid(config, problem, rules) is None:
        return config
    raise InputError(f"no {self.name} config fits {problem} for {rules}: "
                     f"{self.why_invalid(fallback, problem, rules)}.{advice}")


def halvings(first: int) -> list[int]:
  """[first, first // 2, ..., 1]: split counts to try, most first."""
  out = [max(1, first)]
  while out[-1] > 1:
    out.append(out[-1] // 2)
  return out
