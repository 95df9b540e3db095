"""Request arrivals and lengths for the serving simulator and the toy server.

A workload is three arrays of equal length: arrival times (s, sorted), prompt
tokens and output tokens (whole numbers >= 1). They come from

  * `poisson(rate)`: exponential gaps of mean 1/rate;
  * `gamma(rate, burstiness)`: gamma gaps of mean 1/rate and shape
    `burstiness` (vLLM's burstiness setting: 1 is Poisson, < 1 burstier, > 1
    more regular; the gaps' coefficient of variation is 1/sqrt(burstiness));
  * `load_trace(path)`: a JSONL or CSV file with the columns `arrival_s`
    (seconds from the start, non-decreasing), `prompt_tokens` and
    `output_tokens` (whole numbers >= 1), one request per line (CSV: a header
    line names the columns; JSONL: one object per line).

Lengths are `fixed` (exactly the given value), `uniform` (whole numbers from
mean*(1-spread) to mean*(1+spread)) or `lognormal` (mean `mean`,
coefficient of variation `spread`, rounded, at least 1). Every draw uses a
seeded `numpy.random.Generator`, so a seed fixes the workload.
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from jaxroof import files
from jaxroof.errors import InputError, require_choice, require_positive, require_positive_int

ARRIVALS: tuple[str, ...] = ("poisson", "gamma", "trace")
LENGTHS: tuple[str, ...] = ("fixed", "uniform", "lognormal")
TRACE_COLUMNS: tuple[str, ...] = ("arrival_s", "prompt_tokens", "output_tokens")


@dataclasses.dataclass(frozen=True, eq=False)
class Workload:
  """Requests in arrival order."""

  arrival_s: np.ndarray  # float64, non-decreasing.
  prompt_tokens: np.ndarray  # int64, >= 1.
  output_tokens: np.ndarray  # int64, >= 1.
  description: dict

  def __len__(self) -> int:
    return len(self.arrival_s)


def arrival_times(kind: str, num_requests: int, rate: float, rng: np.random.Generator,
                  burstiness: float = 1.0) -> np.ndarray:
  """Arrival times (s) of `num_requests` requests at `rate` per second."""
  require_choice("arrival", kind, ("poisson", "gamma"))
  num_requests = require_positive_int("num_requests", num_requests)
  rate = require_positive("arrival_rate", rate)
  if kind == "poisson":
    gaps = rng.exponential(1.0 / rate, num_requests)
  else:
    shape = require_positive("burstiness", burstiness)
    gaps = rng.gamma(shape, 1.0 / (rate * shape), num_requests)
  return np.cumsum(gaps)


def lengths(name: str, distribution: str, mean: float, spread: float, n: int,
            rng: np.random.Generator) -> np.ndarray:
  """`n` whole lengths >= 1 from `distribution` with `mean` and `spread`."""
  require_choice(f"{name}_distribution", distribution, LENGTHS)
  mean = require_positive(name, mean)
  if distribution == "fixed":
    if mean != int(mean):
      raise InputError(
          f"{name}={mean!r} is not allowed: a fixed length must be a whole number >= 1.")
    return np.full(n, int(mean), dtype=np.int64)
  spread = _spread(name, distribution, spread)
  if distribution == "uniform":
    lo, hi = max(1, round(mean * (1 - spread))), max(1, round(mean * (1 + spread)))
    return rng.integers(lo, hi + 1, n).astype(np.int64)
  sigma2 = math.log1p(spread**2)
  draws = rng.lognormal(math.log(mean) - sigma2 / 2, math.sqrt(sigma2), n)
  return np.maximum(1, np.rint(draws)).astype(np.int64)


MAX_LOGNORMAL_SPREAD = 100.0  # A coefficient of variation beyond this is not a workload.


def _spread(name: str, distribution: str, spread: float) -> float:
  """A checked spread of `name`'s lengths (`prompt_spread`, `output_spread`): > 0; at most
  1 for uniform lengths (half-width / mean), `MAX_LOGNORMAL_SPREAD` for lognormal."""
  field = f"{name.removesuffix('_tokens')}_spread"
  spread = require_positive(field, spread)
  limit = 1.0 if distribution == "uniform" else MAX_LOGNORMAL_SPREAD
  if spread > limit:
    raise InputError(
        f"{field}={spread!r} is not allowed: {distribution} lengths need spread in (0, {limit:g}].",
        field=field)
  return spread


def length_cv2(name: str, distribution: str, spread: float) -> float:
  """Squared coefficient of variation of `lengths`' draws (before rounding): 0 fixed,
  spread**2 / 3 uniform (half-width / mean = spread), spread**2 lognormal (its CV)."""
  require_choice(f"{name}_distribution", distribution, LENGTHS)
  if distribution == "fixed":
    return 0.0
  return _spread(name, distribution, spread)**2 / (3.0 if distribution == "uniform" else 1.0)


LONG_SAMPLES = ("resample", "clip")
_RESAMPLE_ROUNDS = 100


def fit_context(prompts: np.ndarray, outputs: np.ndarray, max_total: int, policy: str,
                draw) -> tuple[np.ndarray, np.ndarray, dict]:
  """Requests with prompt + output > `max_total`: redrawn (`resample`, `draw(n)` ->
  (prompts, outputs), up to 100 rounds, the rest clipped) or `clip`ped (output to
  at most max_total - 1, then the prompt to the rest)."""
  require_choice("long_samples", policy, LONG_SAMPLES)
  max_total = require_positive_int("max_total", max_total)
  if max_total < 2:
    raise InputError(f"max_total={max_total} is not allowed: a request needs a prompt token "
                     "and an output token.")
  prompts, outputs = prompts.copy(), outputs.copy()
  over = prompts + outputs > max_total
  count = int(over.sum())
  resampled = 0
  if policy == "resample":
    for _ in range(_RESAMPLE_ROUNDS):
      idx = np.nonzero(prompts + outputs > max_total)[0]
      if not len(idx):
        break
      prompts[idx], outputs[idx] = draw(len(idx))
      resampled += len(idx)
  idx = np.nonzero(prompts + outputs > max_total)[0]
  outputs[idx] = np.minimum(outputs[idx], max_total - 1)
  prompts[idx] = np.minimum(prompts[idx], max_total - outputs[idx])
  return prompts, outputs, {
      "policy": policy, "max_total_tokens": max_total, "requests_beyond": count,
      "draws_redone": resampled, "clipped": int(len(idx))
  }


def synthetic(*, arrival: str, num_requests: int, arrival_rate: float, seed: int,
              prompt_tokens: float, output_tokens: float, prompt_distribution: str = "fixed",
              output_distribution: str = "fixed", prompt_spread: float = 0.0,
              output_spread: float = 0.0, burstiness: float = 1.0, max_total: int | None = None,
              long_samples: str = "resample") -> Workload:
  """A seeded synthetic workload (arrivals first, then prompt and output lengths).

  `max_total` (the model's context): a request whose prompt + output exceeds it
  is resampled or clipped (`long_samples`, see `fit_context`), counted in the
  description's `beyond_context`.
  """
  rng = np.random.default_rng(seed)
  times = arrival_times(arrival, num_requests, arrival_rate, rng, burstiness)
  prompts = lengths("prompt_tokens", prompt_distribution, prompt_tokens, prompt_spread,
                    num_requests, rng)
  outputs = lengths("output_tokens", output_distribution, output_tokens, output_spread,
                    num_requests, rng)
  beyond = None
  if max_total is not None:
    draw = lambda n: (  # noqa: E731 (the same distributions, later in the seeded stream)
        lengths("prompt_tokens", prompt_distribution, prompt_tokens, prompt_spread, n, rng),
        lengths("output_tokens", output_distribution, output_tokens, output_spread, n, rng))
    prompts, outputs, beyond = fit_context(prompts, outputs, max_total, long_samples, draw)
  description = {
      "arrival": arrival, "arrival_rate_per_s": float(arrival_rate),
      "burstiness": float(burstiness), "num_requests": int(num_requests), "seed": int(seed),
      "prompt_tokens": {
          "distribution": prompt_distribution, "mean": float(prompt_tokens),
          "spread": float(prompt_spread)
      }, "output_tokens": {
          "distribution": output_distribution, "mean": float(output_tokens),
          "spread": float(output_spread)
      }
  }
  if beyond is not None:
    description["beyond_context"] = beyond
  return Workload(times, prompts, outputs, description)


def _number(path: str, line: int, column: str, text) -> float:
  try:
    value = float(text)
  except (TypeError, ValueError):
    raise InputError(f"trace={path!r} line {line}: {column}={text!r} is not a number.") from None
  if not math.isfinite(value):
    raise InputError(f"trace={path!r} line {line}: {column}={text!r} is not finite.")
  return value


def _rows(path: str) -> list[tuple[int, dict]]:
  """(line number, {column: text}) per request, from JSONL or CSV."""
  return files.read_records("trace", path, columns=TRACE_COLUMNS, required=TRACE_COLUMNS,
                            json_suffixes=(".jsonl", ".json"))


def load_trace(path: str | os.PathLike[str]) -> Workload:
  """Requests from a JSONL or CSV trace (columns `TRACE_COLUMNS`), validated by line."""
  path = os.fspath(path)
  times, prompts, outputs = [], [], []
  for line, row in _rows(path):
    missing = [c for c in TRACE_COLUMNS if row.get(c) in (None, "")]
    if missing:
      raise InputError(f"trace={path!r} line {line}: missing columns {missing}.")
    t = _number(path, line, "arrival_s", row["arrival_s"])
    if t < 0 or (times and t < times[-1]):
      raise InputError(f"trace={path!r} line {line}: arrival_s={t:g} is negative or earlier "
                       "than the line before (times must be non-decreasing).")
    lens = []
    for column in ("prompt_tokens", "output_tokens"):
      value = _number(path, line, column, row[column])
      if value < 1 or value != int(value):
        raise InputError(f"trace={path!r} line {line}: {column}={row[column]!r} is not a "
                         "whole number >= 1.")
      lens.append(int(value))
    times.append(t)
    prompts.append(lens[0])
    outputs.append(lens[1])
  if not times:
    raise InputError(f"trace={path!r} holds no requests.")
  return Workload(np.asarray(times, float), np.asarray(prompts, np.int64),
                  np.asarray(outputs, np.int64),
                  {"arrival": "trace", "trace": path, "num_requests": len(times)})
