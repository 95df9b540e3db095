"""Per-call device time of a jitted function, from a chain inside one jit.

A decode kernel runs for tens of microseconds, about as long as dispatching a
jitted call and waiting for it, so timing single calls from Python measures
the dispatch as much as the kernel. `time_chained` instead runs `inner`
dependent calls in one `lax.fori_loop` inside one jit, times that whole jit
with `jaxroof.timing.time_call` (warm-up, `block_until_ready`, median and
spread of repeats) and divides by `inner`. The loop has a static trip count,
so XLA's GPU runtime runs it without a host round trip per iteration. Each
call's output feeds the next call's arguments (`feed`), and an optimization
barrier separates iterations, so XLA can neither hoist a call out of the loop,
nor merge or simplify consecutive calls; attention feeds also write one
element of the K/V cache (`poke`), as a decode step does, so that nothing
derived from the cache can be hoisted out of the loop either. What remains in
the figure is the per-iteration launch and feed cost, which makes a kernel
look slower, never faster. (A cache written in the loop is copied once per
chain, since the caller keeps its buffers; chains of about 50 ms make that
copy a small part of each call.)
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax import lax

from jaxroof.timing import Clock, Timing, time_call

Feed = Callable[[tuple[Any, ...], Any], tuple[Any, ...]]


def chain(fn: Callable[..., Any], feed: Feed, inner: int) -> Callable[..., Any]:
  """A function running `inner` dependent calls of `fn`; returns last args."""

  def run(*args):

    def body(_, carry):
      return lax.optimization_barrier(tuple(feed(carry, fn(*carry))))

    return lax.fori_loop(0, inner, body, tuple(args))

  return run


def chain_with_first(fn: Callable[..., Any], feed: Feed, inner: int) -> Callable[..., Any]:
  """Like `chain`, but returns (first call's output, last args).

  One compiled executable then serves both the correctness check (the first
  output) and the timing, so a candidate config is compiled once.
  """

  def run(*args):
    first = fn(*args)
    carry = lax.optimization_barrier(tuple(feed(tuple(args), first)))

    def body(_, carry):
      return lax.optimization_barrier(tuple(feed(carry, fn(*carry))))

    return first, lax.fori_loop(0, inner - 1, body, carry)

  return run


def in_sequence(fn: Callable[..., Any]) -> Callable[..., Any]:
  """A function calling `fn` once on each of several argument sets, in order.

  `run(sets)` takes a tuple of argument tuples and returns a flag. Each
  call's first argument is perturbed by a NaN flag of the previous call's
  output (`flag_first`), so the calls run one after another and none is dead
  or merged, with no loop around them: in one straight-line executable, as a
  decode step runs its layers' operations. Dividing its time by the number
  of sets gives an operation's time without a dispatch per call, while the
  distinct sets keep weights streaming from memory, not a cache.
  """

  def run(sets):
    flag = jax.numpy.bool_(False)
    for args in sets:
      out = fn(*flag_first(tuple(args), flag))
      flag = jax.numpy.isnan(out.sum(dtype=jax.numpy.float32))
    return flag

  return run


def flag_first(args: tuple[Any, ...], flag: Any) -> tuple[Any, ...]:
  """args with `flag` (False unless an output held a NaN) added to the first
  element of args[0]: a data dependency that leaves the values as they were."""
  first = args[0]
  bumped = first.at[(0,) * first.ndim].add(flag.astype(first.dtype))
  return (bumped, *args[1:])


def time_chain(chained: Callable[..., Any], args: Sequence[Any], *, inner: int, warmup: int = 2,
               repeats: int = 10, clock: Clock = time.perf_counter) -> Timing:
  """Per-call time of an already jitted chain of `inner` calls."""
  timing = time_call(chained, [tuple(args)], warmup=warmup, repeats=repeats, clock=clock)
  method = (f"jit fori_loop chain of {inner} dependent calls, wall-clock with "
            f"block_until_ready, median of {repeats} chains after {warmup} "
            "warm-up, divided by the chain length")
  return per_call(timing, inner, method)


def per_call(timing: Timing, inner: int, method: str) -> Timing:
  """Divides every time of a chain's timing by its number of calls."""
  scaled = {
      f.name: getattr(timing, f.name) / inner for f in dataclasses.fields(timing)
      if f.name.endswith("_s")
  }
  return dataclasses.replace(timing, **scaled, method=method)


def pick_inner(
    fn: Callable[..., Any],
    args: Sequence[Any],
    *,
    target_s: float,
    max_inner: int,
) -> int:
  """Calls per chain so that one chain lasts about `target_s` seconds.

  Uses the time of single calls, which includes dispatch, so it errs short.
  An already jitted `fn` is called as is (its executable is reused).
  """
  jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
  single = time_call(jitted, [tuple(args)], warmup=1, repeats=3).median_s
  return max(1, min(max_inner, math.ceil(target_s / max(single, 1e-9))))


def time_chained(
    fn: Callable[..., Any],
    args: Sequence[Any],
    *,
    feed: Feed,
    inner: int | None = None,
    warmup: int = 2,
    repeats: int = 10,
    target_s: float = 0.05,
    max_inner: int = 1000,
    clock: Clock = time.perf_counter,
) -> Timing:
  """Per-call time of `fn(*args)` measured over chains of dependent calls.

  Args:
    fn: a traceable function (a kernel with its config bound).
    args: its arguments, already on the device.
    feed: `feed(args, out) -> next args`; must make the next call depend on
      `out` (e.g. the attention output becomes the next query).
    inner: calls per chain; None picks enough for about `target_s` seconds.
    warmup, repeats: passed to `jaxroof.timing.time_call` (per chain).
    target_s, max_inner: how `inner` is picked when it is None.
    clock: injectable for tests.

  Returns:
    A `Timing` whose times are per call and whose `method` says how.
  """
  if inner is None:
    inner = pick_inner(fn, args, target_s=target_s, max_inner=max_inner)
  if inner < 1:
    raise ValueError(f"{inner=} must be >= 1")
  chained = jax.jit(chain(fn, feed, inner))
  return time_chain(chained, args, inner=inner, warmup=warmup, repeats=repeats, clock=clock)


def perturb_first(args: tuple[Any, ...], out: Any) -> tuple[Any, ...]:
  """A generic feed: args[0] changes by 0 unless `out` holds a NaN.

  XLA cannot know `out` is NaN-free, so the next call waits for this one and
  reads all of `out`; the values of args stay as they were.
  """
  return flag_first(args, jax.numpy.isnan(out.sum(dtype=jax.numpy.float32)))


def poke(array: Any, out: Any) -> Any:
  """`array` with its first element set from `out`'s first element.

  Feeding a poked K/V cache to the next call is what a decode step does (it
  writes a new row), and it keeps XLA from hoisting work that depends only on
  the cache (a gather of pages, a cast, a mask) out of the timed loop.
  """
  first = out.reshape(-1)[0].astype(array.dtype)
  return array.at[(0,) * array.ndim].set(first)
