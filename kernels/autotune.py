"""Autotuning of Pallas kernel configs, and the JSON cache of its results.

For an op and its argument shapes and dtypes, `tune` tries the op's candidate
configs: configs that do not fit are recorded as skipped, each other one is
compiled (a failure is recorded), checked against the op's reference (a
mismatch is recorded) and timed on the device (`kernels.device_timing`). The
fastest median wins. The winner and every trial are cached as JSON in
`<cache dir>/<device kind>/<op>.json`, keyed by backend, platform, jax version
and the arguments' dtypes and shapes, and written atomically.

`choose_config` is what a kernel calls when it is given no config: an explicit
config is used as is (the kernel does not call this), then the cache, then
tuning (only when the miss policy says so), then the op's heuristic.
Interpreted kernels are never tuned: their timings are not kernel speed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import json
import os
import pathlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import tqdm
from absl import logging

from jaxroof.errors import InputError, require_choice
from jaxroof.io import write_json
from jaxroof.timing import Timing
from kernels import _backend
from kernels import device_timing
from kernels._backend import Target

CACHE_ENV = "JAXROOF_AUTOTUNE_CACHE"
ON_MISS_ENV = "JAXROOF_AUTOTUNE_ON_MISS"
ON_MISS_CHOICES = ("heuristic", "autotune", "error")
DEFAULT_CACHE_DIR = pathlib.Path(__file__).parent / "autotune_cache"
NOT_TUNED_ON_INTERPRET = (
    "interpreted Pallas kernels are never tuned (interpret-mode timings are "
    "not kernel speed); using the heuristic config"
)

_on_miss_override: list[str] = []


@dataclasses.dataclass(frozen=True, kw_only=True)
class TunableOp:
  """What the autotuner needs to know about one op.

  Attributes:
    name: the op's name, also the cache file's name.
    config_type: the frozen config dataclass (rebuilt from cached JSON).
    problem: args -> the op's static problem description.
    kernel: kernel(*args, config=, target=) -> output, for a valid config.
    reference: reference(*args) -> the correct output.
    candidates: (problem, rules) -> configs to try, heuristic first.
    why_invalid: (config, problem, rules) -> reason it cannot run, or None.
    heuristic: (problem, rules) -> a config chosen without timing.
    tolerance: dtype -> (rtol, atol) against the reference.
    chain_feed: (args, output) -> next args, for chained timing.
    example_args: (problem, key) -> random arguments for tuning.
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class Trial:
  """One candidate config's fate: ok, skipped, failed or wrong."""

  config: Any
  status: str
  reason: str = ""
  compile_s: float | None = None
  max_abs_err: float | None = None
  timing: Timing | None = None

  def to_json(self) -> dict[str, Any]:
    return {
        "config": dataclasses.asdict(self.config),
        "status": self.status,
        "reason": self.reason,
        "compile_s": self.compile_s,
        "max_abs_err": self.max_abs_err,
        "timing": None if self.timing is None else self.timing.to_json(),
    }


@dataclasses.dataclass(frozen=True, kw_only=True)
class TuneResult:
  """The chosen config, whether it was tuned, and every trial."""

  config: Any
  tuned: bool
  message: str
  trials: tuple[Trial, ...] = ()
  entry: dict[str, Any] | None = None


# Keys and the cache file ------------------------------------------------------


def args_signature(args: Sequence[Any]) -> list[str]:
  """['bfloat16[8,32,128]', ...]: dtypes and shapes (works on tracers)."""
  return [
      f"{jnp.dtype(a.dtype).name}[{','.join(str(d) for d in a.shape)}]"
      for a in args
  ]


def cache_key(args: Sequence[Any], target: Target) -> str:
  """backend|platform|jax version|argument signature."""
  return "|".join(
      [target.backend, target.platform, f"jax-{jax.__version__}",
       " ".join(args_signature(args))]
  )


def cache_path(
    op_name: str,
    kind: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> pathlib.Path:
  """`<cache dir>/<device kind slug>/<op>.json`.

  The cache dir is `cache_dir`, else $JAXROOF_AUTOTUNE_CACHE, else
  `kernels/autotune_cache`.
  """
  root = pathlib.Path(
      cache_dir or os.environ.get(CACHE_ENV) or DEFAULT_CACHE_DIR
  )
  return root / _backend.device_kind_slug(kind) / f"{op_name}.json"


@functools.lru_cache(maxsize=64)
def _read_cached(path: str, mtime_ns: int) -> dict[str, Any]:
  del mtime_ns  # Part of the lru key: a rewritten file is read again.
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def load_cache(path: pathlib.Path) -> dict[str, Any]:
  """The cache file's content; an empty cache if it is missing or unreadable."""
  if not path.exists():
    return {"entries": {}}
  try:
    return _read_cached(str(path), path.stat().st_mtime_ns)
  except (OSError, ValueError) as e:
    logging.warning("ignoring unreadable autotune cache %s: %s", path, e)
    return {"entries": {}}


def _config_from_json(op: TunableOp, data: dict[str, Any]) -> Any | None:
  try:
    return op.config_type(**data)
  except TypeError:
    return None  # Written by an older config type: ignore the entry.


def cached_config(
    op: TunableOp,
    args: Sequence[Any],
    target: Target,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Any | None:
  """The cached winner for these args on this device, if any still fits."""
  entry = load_cache(cache_path(op.name, None, cache_dir))["entries"].get(
      cache_key(args, target)
  )
  if not entry or entry.get("best") is None:
    return None
  config = _config_from_json(op, entry["best"])
  if config is None:
    return None
  if op.why_invalid(config, op.problem(args), target.rules):
    return None
  return config


def _store(path: pathlib.Path, key: str, entry: dict[str, Any],
           op_name: str, kind: str) -> None:
  """Adds one entry to the cache file (read, update, atomic rewrite)."""
  data = load_cache(path)
  entries = dict(data.get("entries", {}))
  entries[key] = entry
  write_json(path, {"op": op_name, "device_kind": kind, "entries": entries})


# Miss policy ------------------------------------------------------------------


def on_miss_policy() -> str:
  """heuristic (default), autotune or error: what a cache miss does."""
  if _on_miss_override:
    return _on_miss_override[-1]
  value = os.environ.get(ON_MISS_ENV, "heuristic")
  return require_choice(ON_MISS_ENV, value, ON_MISS_CHOICES)


@contextlib.contextmanager
def on_miss(policy: str) -> Iterator[None]:
  """Sets the cache-miss policy inside a `with` block."""
  require_choice("policy", policy, ON_MISS_CHOICES)
  _on_miss_override.append(policy)
  try:
    yield
  finally:
    _on_miss_override.pop()


def choose_config(
    op: TunableOp,
    args: Sequence[Any],
    target: Target,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Any:
  """A config for a kernel called without one: cache, tuning, heuristic.

  Only the device the process runs on has a cache and can be tuned; an
  interpreted kernel or a cross-lowering target gets the heuristic.
  """
  problem = op.problem(args)
  local = (not target.interpret
           and target.platform == _backend.default_platform())
  if not local:
    return op.heuristic(problem, target.rules)
  config = cached_config(op, args, target, cache_dir=cache_dir)
  if config is not None:
    return config
  policy = on_miss_policy()
  if policy == "autotune":
    return tune(op, problem, target=target, cache_dir=cache_dir).config
  if policy == "error":
    raise InputError(
        f"no cached {op.name} config for {cache_key(args, target)} in "
        f"{cache_path(op.name, None, cache_dir)} and {ON_MISS_ENV}=error."
    )
  return op.heuristic(problem, target.rules)


# Tuning -----------------------------------------------------------------------


def _first_line(error: BaseException, limit: int = 300) -> str:
  text = f"{type(error).__name__}: {error}".strip().splitlines()[0]
  return text[:limit]


def _max_abs_err(out: Any, expected: Any) -> float:
  diff = np.abs(np.asarray(out, np.float64) - np.asarray(expected, np.float64))
  return float(np.nanmax(diff)) if np.isfinite(diff).all() else float("inf")


def _matches(op: TunableOp, out: Any, expected: Any) -> bool:
  rtol, atol = op.tolerance(expected.dtype)
  a = np.asarray(out, np.float64)
  b = np.asarray(expected, np.float64)
  return bool(np.isfinite(a).all() and np.allclose(a, b, rtol=rtol, atol=atol))


# timer(jitted kernel, args, chain feed) -> per-call Timing.
Timer = Callable[[Callable[..., Any], tuple[Any, ...], Any], Timing]


def default_timer(repeats: int = 10, warmup: int = 2) -> Timer:
  """Chained device timing (see `kernels.device_timing`)."""

  def timer(fn, args, feed):
    return device_timing.time_chained(
        fn, args, feed=feed, warmup=warmup, repeats=repeats
    )

  return timer


def _try_candidate(
    op: TunableOp,
    config: Any,
    args: tuple[Any, ...],
    expected: Any,
    target: Target,
    timer: Timer,
) -> Trial:
  """Compiles, checks and times one config that fits.

  The timer gets the jitted kernel, whose compiled executable is cached, so
  timing single calls does not compile it again.
  """
  fn = jax.jit(functools.partial(op.kernel, config=config, target=target))
  start = time.perf_counter()
  try:
    out = jax.block_until_ready(fn(*args))  # Compiles, then runs once.
  except Exception as e:  # noqa: BLE001 - any compile error skips the config.
    return Trial(config=config, status="failed", reason=_first_line(e))
  compile_s = time.perf_counter() - start
  err = _max_abs_err(out, expected)
  if not _matches(op, out, expected):
    return Trial(config=config, status="wrong", compile_s=compile_s,
                 max_abs_err=err, reason="output differs from the reference")
  try:
    timing = timer(fn, args, op.chain_feed)
  except Exception as e:  # noqa: BLE001 - e.g. out of memory while timing.
    return Trial(config=config, status="failed", compile_s=compile_s,
                 max_abs_err=err, reason=_first_line(e))
  return Trial(config=config, status="ok", compile_s=compile_s,
               max_abs_err=err, timing=timing)


def tune(
    op: TunableOp,
    problem: Any,
    *,
    target: Target,
    args: tuple[Any, ...] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    max_candidates: int = 12,
    time_budget_s: float | None = None,
    timer: Timer | None = None,
    progress: bool = True,
    save: bool = True,
    seed: int = 0,
) -> TuneResult:
  """Tries the op's candidate configs on `problem`; caches and returns the best.

  Args:
    op: the op.
    problem: its static description (shapes, dtype).
    target: where to run; an interpreted target is never tuned.
    args: arguments to tune on; None makes random ones (`op.example_args`).
    cache_dir: where the cache lives (see `cache_path`).
    max_candidates: at most this many candidates, the heuristic first.
    time_budget_s: candidates left when this much time has passed are
      recorded as skipped.
    timer: `timer(fn, args, feed) -> Timing`; default chained device timing.
    progress: show a progress bar.
    save: write the result to the cache.
    seed: for the random arguments.

  Returns:
    A `TuneResult`; when no candidate is valid, the heuristic (tuned=False).
  """
  heuristic = op.heuristic(problem, target.rules)
  if target.interpret:
    logging.warning("%s: %s", op.name, NOT_TUNED_ON_INTERPRET)
    return TuneResult(config=heuristic, tuned=False,
                      message=NOT_TUNED_ON_INTERPRET)
  timer = timer or default_timer()
  if args is None:
    args = op.example_args(problem, jax.random.key(seed))
  args = tuple(args)
  expected = jax.block_until_ready(jax.jit(op.reference)(*args))
  configs = op.candidates(problem, target.rules)[:max_candidates]
  start = time.perf_counter()
  trials = []
  bar = tqdm.tqdm(configs, desc=f"tune {op.name}", disable=not progress,
                  leave=False)
  for config in bar:
    reason = op.why_invalid(config, problem, target.rules)
    if reason:
      trials.append(Trial(config=config, status="skipped", reason=reason))
    elif time_budget_s is not None and (
        time.perf_counter() - start > time_budget_s
    ):
      trials.append(Trial(config=config, status="skipped",
                          reason=f"time budget of {time_budget_s} s spent"))
    else:
      trials.append(_try_candidate(op, config, args, expected, target, timer))
  ok = [t for t in trials if t.status == "ok"]
  best = min(ok, key=lambda t: t.timing.median_s) if ok else None
  config = best.config if best else heuristic
  message = (
      f"best of {len(ok)} valid configs out of {len(trials)} tried"
      if best else "no candidate ran correctly; using the heuristic config"
  )
  kind = _backend.device_kind()
  entry = {
      "op": op.name,
      "device_kind": kind,
      "backend": target.backend,
      "platform": target.platform,
      "jax_version": jax.__version__,
      "args": args_signature(args),
      "problem": dataclasses.asdict(problem),
      "best": dataclasses.asdict(best.config) if best else None,
      "best_median_s": best.timing.median_s if best else None,
      "heuristic": dataclasses.asdict(heuristic),
      "timing_method": best.timing.method if best else None,
      "tuned_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
      "trials": [t.to_json() for t in trials],
  }
  if save:
    _store(cache_path(op.name, kind, cache_dir), cache_key(args, target),
           entry, op.name, kind)
  return TuneResult(config=config, tuned=best is not None, message=message,
                    trials=tuple(trials), entry=entry)
