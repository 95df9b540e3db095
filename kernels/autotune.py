"""Autotuning of Pallas kernel configs, and the JSON cache of its results.

For an op and its problem (shapes, dtype), `tune` tries the op's candidate
configs: configs that do not fit are recorded as skipped, each other one is
compiled (a failure is recorded), checked against the op's reference (a
mismatch is recorded; attention is checked on ragged lengths including 1) and
timed on the device (`kernels.device_timing`). The fastest median wins. The
winner and every trial are cached as JSON in
`<cache dir>/<device kind>/<op>.json`, written atomically and keyed by
backend, platform, jax version and the problem fields configs depend on, with
batch and sequence length rounded up to powers of two (`cache_key`).

Cache dirs (`write_dir`, `read_dirs`): results are written to
$JAXROOF_AUTOTUNE_CACHE if set, else to the package's `kernels/autotune_cache`
if it is writable, else to `~/.cache/jaxroof/autotune`; lookups read that dir,
then the shipped package dir. An explicit `cache_dir` is the only dir used.

`choose_config` is what a kernel calls when it is given no config: an explicit
config is used as is (the kernel does not call this), then the cache, then
tuning (only when the miss policy says so), then the op's heuristic. A cached
tuning that found no valid config is not a miss: it gets the heuristic without
tuning again. Interpreted kernels are never tuned: their timings are not
kernel speed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
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

from jaxroof.errors import InputError, require_choice, require_non_negative
from jaxroof.files import read_json, write_json
from jaxroof.timing import Timing
from kernels import _backend
from kernels import base
from kernels import device_timing
from kernels._backend import Target

CACHE_ENV = "JAXROOF_AUTOTUNE_CACHE"
ON_MISS_ENV = "JAXROOF_AUTOTUNE_ON_MISS"
ON_MISS_CHOICES = ("heuristic", "autotune", "error")
# Shipped results; written to only when the package dir is writable.
PACKAGE_CACHE_DIR = pathlib.Path(__file__).parent / "autotune_cache"
NOT_TUNED_ON_INTERPRET = ("interpreted Pallas kernels are never tuned (interpret-mode timings are "
                          "not kernel speed); using the heuristic config")

_on_miss_override: list[str] = []
# (cache file, key) of failed tunings already reported, to log each once.
_reported_failures: set[tuple[str, str]] = set()

# The op description lives in `kernels.base` (shared with the kernels).
TunableOp = base.KernelOp


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
  return [f"{jnp.dtype(a.dtype).name}[{','.join(str(d) for d in a.shape)}]" for a in args]


def problem_key(op: TunableOp, problem: Any) -> str:
  """The problem's part of the cache key: the fields configs depend on.

  Exact fields first (`op.key_fields`), then the bucketed ones rounded up to a
  power of two (`op.bucketed_fields`), in the op's order; for decode attention
  'dtype=bfloat16 heads=32 kv_heads=8 head_dim=128 batch<=32 max_len<=8192'.
  """
  exact = op.key_fields or tuple(
      f.name for f in dataclasses.fields(problem) if f.name not in op.bucketed_fields)
  parts = [f"{name}={getattr(problem, name)}" for name in exact]
  parts += [
      f"{name}<={_backend.next_power_of_two(getattr(problem, name))}" for name in op.bucketed_fields
  ]
  return " ".join(parts)


def cache_key(op: TunableOp, problem: Any, target: Target) -> str:
  """backend|platform|jax version|problem key (see `problem_key`)."""
  return "|".join(
      [target.backend, target.platform, f"jax-{jax.__version__}",
       problem_key(op, problem)])


def user_cache_dir() -> pathlib.Path:
  """`~/.cache/jaxroof/autotune`: results of a read-only (installed) package."""
  return pathlib.Path.home() / ".cache" / "jaxroof" / "autotune"


def _writable(path: pathlib.Path) -> bool:
  return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def write_dir(cache_dir: str | os.PathLike[str] | None = None,) -> pathlib.Path:
  """Where tuning results are written.

  `cache_dir` if given, else $JAXROOF_AUTOTUNE_CACHE if set, else the
  package's `kernels/autotune_cache` if writable (a source checkout), else
  `user_cache_dir()` (an installed, read-only package).
  """
  if cache_dir:
    return pathlib.Path(cache_dir)
  if os.environ.get(CACHE_ENV):
    return pathlib.Path(os.environ[CACHE_ENV])
  if _writable(PACKAGE_CACHE_DIR):
    return PACKAGE_CACHE_DIR
  return user_cache_dir()


def read_dirs(cache_dir: str | os.PathLike[str] | None = None,) -> list[pathlib.Path]:
  """Where lookups read, in order: `write_dir()`, then the shipped results.

  An explicit `cache_dir` is read alone.
  """
  if cache_dir:
    return [pathlib.Path(cache_dir)]
  first = write_dir()
  return [first] if first == PACKAGE_CACHE_DIR else [first, PACKAGE_CACHE_DIR]


def cache_path(
    op_name: str,
    kind: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    root: pathlib.Path | None = None,
) -> pathlib.Path:
  """`<root>/<device kind slug>/<op>.json`; root defaults to `write_dir`."""
  root = write_dir(cache_dir) if root is None else root
  return root / _backend.device_kind_slug(kind) / f"{op_name}.json"


@functools.lru_cache(maxsize=64)
def _read_cached(path: str, mtime_ns: int) -> dict[str, Any]:
  del mtime_ns  # Part of the lru key: a rewritten file is read again.
  return read_json("cache", path, max_bytes=16 * 2**20)


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


@dataclasses.dataclass(frozen=True, kw_only=True)
class Lookup:
  """What the cache holds for a problem.

  Attributes:
    config: the cached winner, when one still fits.
    failed: an entry whose tuning found no valid config (when no dir had a
      winner that fits); the kernel then gets the heuristic without tuning.
    path: the cache file `config` or `failed` came from.
  """

  config: Any | None = None
  failed: dict[str, Any] | None = None
  path: pathlib.Path | None = None


def lookup(
    op: TunableOp,
    problem: Any,
    target: Target,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Lookup:
  """Reads `read_dirs(cache_dir)` in order: the first winner that fits wins.

  Winners written by an older config type, or that do not fit this exact
  problem (its key is bucketed), are skipped.
  """
  key = cache_key(op, problem, target)
  failed = None
  for root in read_dirs(cache_dir):
    path = cache_path(op.name, None, root=root)
    entry = load_cache(path).get("entries", {}).get(key)
    if not entry:
      continue
    if entry.get("best") is None:
      failed = failed or Lookup(failed=entry, path=path)
      continue
    config = _config_from_json(op, entry["best"])
    if config is None or op.why_invalid(config, problem, target.rules):
      continue
    return Lookup(config=config, path=path)
  return failed or Lookup()


def cached_config(
    op: TunableOp,
    args: Sequence[Any],
    target: Target,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Any | None:
  """The cached winner for these args on this device, if any still fits."""
  return lookup(op, op.problem(args), target, cache_dir=cache_dir).config


def _store(path: pathlib.Path, key: str, entry: dict[str, Any], op_name: str, kind: str) -> None:
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
  local = (not target.interpret and target.platform == _backend.default_platform())
  if not local:
    return op.heuristic(problem, target.rules)
  found = lookup(op, problem, target, cache_dir=cache_dir)
  if found.config is not None:
    return found.config
  heuristic = op.heuristic(problem, target.rules)
  if found.failed is not None:
    _report_failed_tuning(op, found, heuristic)
    return heuristic
  policy = on_miss_policy()
  if policy == "autotune":
    return tune(op, problem, target=target, cache_dir=cache_dir).config
  if policy == "error":
    dirs = ", ".join(str(d) for d in read_dirs(cache_dir))
    raise InputError(f"no cached {op.name} config for {cache_key(op, problem, target)} in "
                     f"{dirs} and {ON_MISS_ENV}=error.")
  return heuristic


def _report_failed_tuning(op: TunableOp, found: Lookup, heuristic: Any) -> None:
  """Logs, once per cache entry, that a failed tuning gives the heuristic."""
  key = (str(found.path), found.failed.get("key", ""))
  if key in _reported_failures:
    return
  _reported_failures.add(key)
  logging.warning(
      "%s: the cached tuning in %s (tuned at %s) found no config that runs "
      "correctly; using the heuristic %s without tuning again (tune "
      "explicitly, e.g. experiments/autotune, to retry).",
      op.name,
      found.path,
      found.failed.get("tuned_at"),
      heuristic,
  )


# Tuning -----------------------------------------------------------------------


def _first_line(error: BaseException, limit: int = 300) -> str:
  text = f"{type(error).__name__}: {error}".strip().splitlines()[0]
  return text[:limit]


def _max_abs_err(out: Any, expected: Any) -> float:
  diff = np.abs(np.asarray(out, np.float64) - np.asarray(expected, np.float64))
  return float(np.nanmax(diff)) if np.isfinite(diff).all() else float("inf")


def _matches(op: TunableOp, out: Any, expected: Any) -> bool:
  """Whether `out` is finite and within the op's tolerance of `expected`.

  The absolute tolerance scales with the reference's root mean square: at
  long contexts attention outputs are small (averages of many values), and
  a fixed atol would pass a kernel that drops positions.
  """
  rtol, atol = op.tolerance(expected.dtype)
  a = np.asarray(out, np.float64)
  b = np.asarray(expected, np.float64)
  rms = float(np.sqrt(np.mean(np.square(b)))) if b.size else 0.0
  scaled = atol * rms if rms > 0 else atol
  return bool(np.isfinite(a).all() and np.allclose(a, b, rtol=rtol, atol=scaled))


# timer(jitted kernel, args, chain feed) -> per-call Timing.
Timer = Callable[[Callable[..., Any], tuple[Any, ...], Any], Timing]


def default_timer(repeats: int = 10, warmup: int = 2, inner: int | None = None) -> Timer:
  """Chained device timing (see `kernels.device_timing`).

  `inner` calls per chain, when the caller knows how many (the benchmark
  derives it from the analytic bytes); None times single calls to choose.
  """

  def timer(fn, args, feed):
    return device_timing.time_chained(fn, args, feed=feed, warmup=warmup, repeats=repeats,
                                      inner=inner)

  return timer


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChainTiming:
  """Chained timing with a chain length known in advance (compile once)."""

  inner: int
  repeats: int = 10
  warmup: int = 2


# (arguments, the reference's output on them): what a candidate must match.
Check = tuple[tuple[Any, ...], Any]


def _try_candidate(
    op: TunableOp,
    config: Any,
    args: tuple[Any, ...],
    checks: Sequence[Check],
    target: Target,
    timer: Timer,
    chain: ChainTiming | None = None,
) -> Trial:
  """Compiles, checks (on every check's arguments) and times one config.

  The check arguments have the timed arguments' shapes, so the kernel
  compiles once. The timer gets the jitted kernel, whose compiled executable
  is cached, so timing single calls does not compile it again. With `chain`
  (calls per chain known in advance) only the chain is compiled: its first
  output is checked and the same executable is timed.
  """
  kernel = functools.partial(op.kernel, config=config, target=target)
  if chain is None:
    fn = jax.jit(kernel)
  else:
    chained = jax.jit(device_timing.chain_with_first(kernel, op.chain_feed, chain.inner))
    fn = lambda *a: chained(*a)[0]  # noqa: E731
    timer = lambda _, timed_args, __: device_timing.time_chain(  # noqa: E731
        chained, timed_args, inner=chain.inner, warmup=chain.warmup, repeats=chain.repeats)
  compile_s = None
  err = 0.0
  for check_args, expected in checks:
    start = time.perf_counter()
    try:
      out = jax.block_until_ready(fn(*check_args))  # Compiles on the first.
    except Exception as e:  # noqa: BLE001 - a compile error skips the config.
      return Trial(config=config, status="failed", compile_s=compile_s, reason=_first_line(e))
    if compile_s is None:
      compile_s = time.perf_counter() - start
    err = max(err, _max_abs_err(out, expected))
    if not _matches(op, out, expected):
      return Trial(config=config, status="wrong", compile_s=compile_s, max_abs_err=err,
                   reason="output differs from the reference")
  try:
    timing = timer(fn, args, op.chain_feed)
  except Exception as e:  # noqa: BLE001 - e.g. out of memory while timing.
    return Trial(config=config, status="failed", compile_s=compile_s, max_abs_err=err,
                 reason=_first_line(e))
  return Trial(config=config, status="ok", compile_s=compile_s, max_abs_err=err, timing=timing)


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
    on_trial: Callable[[Trial], None] | None = None,
    chain: ChainTiming | None = None,
) -> TuneResult:
  """Tries the op's candidate configs on `problem`; caches and returns the best.

  Args:
    op: the op.
    problem: its static description (shapes, dtype).
    target: where to run; an interpreted target is never tuned.
    args: arguments to time on; None makes random ones (`op.example_args`).
      Outputs are checked on them and on `op.check_args` (ragged lengths).
    cache_dir: where the cache is written (see `write_dir`).
    max_candidates: at most this many candidates, the heuristic first.
    time_budget_s: candidates left when this much time has passed are
      recorded as skipped.
    timer: `timer(fn, args, feed) -> Timing`; default chained device timing.
    progress: show a progress bar.
    save: write the result to the cache.
    seed: for the random arguments.
    on_trial: called with each trial as soon as it is decided (the GPU run
      prints and flushes it, so a crash loses no finished trial).
    chain: when given, each candidate compiles only its timed chain, which
      also yields the output checked (`timer` is then not used).

  Returns:
    A `TuneResult`; when no candidate is valid, the heuristic (tuned=False).
    That outcome is cached too: `choose_config` then gives the heuristic
    without tuning again.
  """
  if time_budget_s is not None:
    require_non_negative("time_budget_s", time_budget_s)  # 0: no time to tune.
  heuristic = op.heuristic(problem, target.rules)
  if target.interpret:
    logging.warning("%s: %s", op.name, NOT_TUNED_ON_INTERPRET)
    return TuneResult(config=heuristic, tuned=False, message=NOT_TUNED_ON_INTERPRET)
  timer = timer or default_timer()
  timed_on = (op.timing_note if args is None else "the arguments given to tune")
  rng = jax.random.key(seed)
  if args is None:
    args = op.example_args(problem, rng)
  args = tuple(args)
  reference = jax.jit(op.reference)
  checks = [(args, jax.block_until_ready(reference(*args)))]
  if op.check_args is not None:
    ragged = tuple(op.check_args(args, jax.random.fold_in(rng, 1)))
    checks.insert(0, (ragged, jax.block_until_ready(reference(*ragged))))
  configs = op.candidates(problem, target.rules)[:max_candidates]
  start = time.perf_counter()
  trials = []
  bar = tqdm.tqdm(configs, desc=f"tune {op.name}", disable=not progress, leave=False)
  for config in bar:
    reason = op.why_invalid(config, problem, target.rules)
    if reason:
      trials.append(Trial(config=config, status="skipped", reason=reason))
    elif time_budget_s is not None and (time.perf_counter() - start > time_budget_s):
      trials.append(
          Trial(config=config, status="skipped", reason=f"time budget of {time_budget_s} s spent"))
    else:
      trials.append(_try_candidate(op, config, args, checks, target, timer, chain))
    if on_trial is not None:
      on_trial(trials[-1])
  ok = [t for t in trials if t.status == "ok"]
  best = min(ok, key=lambda t: t.timing.median_s) if ok else None
  config = best.config if best else heuristic
  message = (f"best of {len(ok)} valid configs out of {len(trials)} tried"
             if best else "no candidate ran correctly; using the heuristic config "
             "(cached: later calls use it without tuning again)")
  kind = _backend.device_kind()
  key = cache_key(op, problem, target)
  entry = {
      "key": key,
      "message": message,
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
      "checked_on": op.check_note,
      "timed_on": timed_on,
      "tuned_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
      "trials": [t.to_json() for t in trials],
  }
  if save:
    _store(cache_path(op.name, kind, cache_dir), key, entry, op.name, kind)
  return TuneResult(config=config, tuned=best is not None, message=message, trials=tuple(trials),
                    entry=entry)
