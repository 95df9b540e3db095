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

Limits (refused up front, in one line naming the field, the value and what is
allowed): at most `MAX_REQUESTS` requests, `MAX_REQUEST_TOKENS` prompt or output
tokens in one request, `MAX_OUTPUT_TOKENS` output tokens in one workload (the
simulator keeps one 8-byte gap per output token, and runs at least one iteration per
output token of its longest request) and arrivals within `MAX_ARRIVAL_S` of the start
(beyond it a float64 clock loses the milliseconds an iteration takes).

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
MAX_REQUESTS = 1_000_000  # Requests in one workload (a trace's rows, a synthetic draw).
MAX_REQUEST_TOKENS = 10**7  # Prompt or output tokens of one request: above any model's context.
MAX_OUTPUT_TOKENS = 2 * 10**8  # Output tokens of one workload (1.6 GB of gaps).
MAX_ARRIVAL_S = 1e9  # Seconds from the start (31 years): a float64 clock keeps 0.1 us there.


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
  num_requests = require_requests(num_requests)
  rate = require_positive("arrival_rate", rate)
  if kind == "poisson":
    gaps = rng.exponential(1.0 / rate, num_requests)
  else:
    shape = require_positive("burstiness", burstiness)
    gaps = rng.gamma(shape, 1.0 / (rate * shape), num_requests)
  times = np.cumsum(gaps)
  if not times[-1] <= MAX_ARRIVAL_S:
    raise InputError(
        f"arrival_rate={rate:g} is not allowed with num_requests={num_requests:,}: the arrivals "
        f"would span {times[-1]:.3g} s, over {MAX_ARRIVAL_S:.0e} s (give a rate of at least "
        f"{num_requests / MAX_ARRIVAL_S:.3g} requests/s).", field="arrival_rate")
  return times


def require_requests(num_requests: int) -> int:
  """`num_requests` checked: a whole number in [1, MAX_REQUESTS]."""
  num_requests = require_positive_int("num_requests", num_requests)
  if num_requests > MAX_REQUESTS:
    raise InputError(
        f"num_requests={num_requests:,} is not allowed: a workload holds at most "
        f"{MAX_REQUESTS:,} requests.", field="num_requests")
  return num_requests


def require_mean_length(name: str, mean: float, num_requests: int | None = None) -> float:
  """A mean length (`prompt_tokens`, `output_tokens`) checked before any draw: > 0, at most
  `MAX_REQUEST_TOKENS`; for outputs, `num_requests` of them within `MAX_OUTPUT_TOKENS`."""
  mean = require_positive(name, mean)
  if mean > MAX_REQUEST_TOKENS:
    raise InputError(
        f"{name}={mean:g} is not allowed: a request holds at most {MAX_REQUEST_TOKENS:,} "
        "prompt or output tokens (above any model's context).", field=name)
  if name == "output_tokens" and num_requests is not None \
      and mean * num_requests > MAX_OUTPUT_TOKENS:
    raise InputError(
        f"output_tokens={mean:g} is not allowed with num_requests={num_requests:,}: "
        f"{mean * num_requests:.3g} output tokens to simulate, over {MAX_OUTPUT_TOKENS:.0e} "
        f"(give at most {MAX_OUTPUT_TOKENS // max(num_requests, 1):,.0f} output tokens per "
        "request, or fewer requests).", field=name)
  return mean


def require_size(prompts: np.ndarray, outputs: np.ndarray, where: str = "",
                 field: str | None = None) -> None:
  """Refuses a workload beyond the limits (see the module): a request of more than
  `MAX_REQUEST_TOKENS` prompt or output tokens, or more than `MAX_OUTPUT_TOKENS` output
  tokens in all. `where` prefixes the message (a trace's `trace='path'`); `field`: the
  error's field (default: the length's name)."""
  prefix = f"{where}: " if where else ""
  for name, values in (("prompt_tokens", prompts), ("output_tokens", outputs)):
    worst = int(np.argmax(values)) if len(values) else 0
    if len(values) and values[worst] > MAX_REQUEST_TOKENS:
      raise InputError(
          f"{prefix}{name}={int(values[worst]):,} (request {worst}) is not allowed: a request "
          f"holds at most {MAX_REQUEST_TOKENS:,} prompt or output tokens.", field=field or name)
  total = int(np.sum(outputs, dtype=np.int64))
  if total > MAX_OUTPUT_TOKENS:
    raise InputError(
        f"{prefix}output_tokens sum to {total:,} over {len(outputs):,} requests: at most "
        f"{MAX_OUTPUT_TOKENS:,} output tokens in one workload (fewer requests or shorter "
        "outputs).", field=field or "output_tokens")


def lengths(name: str, distribution: str, mean: float, spread: float, n: int,
            rng: np.random.Generator) -> np.ndarray:
  """`n` whole lengths >= 1 from `distribution` with `mean` and `spread`."""
  require_choice(f"{name}_distribution", distribution, LENGTHS)
  mean = require_mean_length(name, mean)
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
  require_requests(num_requests)
  require_mean_length("prompt_tokens", prompt_tokens)
  require_mean_length("output_tokens", output_tokens, num_requests)
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
  require_size(prompts, outputs)  # A lognormal's tail, beyond a model without a context.
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


def _number(path: str, line: int, column: str, text, json_value: bool = False) -> float:
  """A cell as a number: CSV text, or (`json_value`) a JSON number, never its text."""
  try:
    if isinstance(text, bool) or json_value and not isinstance(text, (int, float)):
      raise TypeError(text)  # JSON's true is not 1 token, nor "300" 300.
    value = float(text)
  except (TypeError, ValueError, OverflowError):  # A 400-digit JSON integer overflows.
    shown = text if len(repr(text)) <= 40 else f"{repr(text)[:30]}... ({len(repr(text))} chars)"
    kind = "a JSON number, never text" if json_value else "a finite number"
    raise InputError(f"trace={path!r} line {line}: {column}={shown!r} is not a number ({kind}).",
                     field="trace") from None
  if not math.isfinite(value):
    raise InputError(f"trace={path!r} line {line}: {column}={text!r} is not finite.", field="trace")
  return value


def _rows(path: str) -> list[tuple[int, dict]]:
  """(line number, {column: text}) per request, from JSONL or CSV."""
  return files.read_records("trace", path, columns=TRACE_COLUMNS, required=TRACE_COLUMNS,
                            json_suffixes=(".jsonl", ".json"), max_rows=MAX_REQUESTS)


def load_trace(path: str | os.PathLike[str]) -> Workload:
  """Requests from a JSONL or CSV trace (columns `TRACE_COLUMNS`), validated by line."""
  path = os.fspath(path)
  json_values = path.endswith((".jsonl", ".json"))
  times, prompts, outputs = [], [], []
  for line, row in _rows(path):
    missing = [c for c in TRACE_COLUMNS if row.get(c) in (None, "")]
    if missing:
      raise InputError(f"trace={path!r} line {line}: missing columns {missing}.", field="trace")
    t = _number(path, line, "arrival_s", row["arrival_s"], json_values)
    if t < 0 or (times and t < times[-1]):
      raise InputError(
          f"trace={path!r} line {line}: arrival_s={t:g} is negative or earlier "
          "than the line before (times must be non-decreasing).", field="trace")
    if t > MAX_ARRIVAL_S:
      raise InputError(
          f"trace={path!r} line {line}: arrival_s={t:g} is not allowed: at most "
          f"{MAX_ARRIVAL_S:.0e} s from the start.", field="trace")
    lens = []
    for column in ("prompt_tokens", "output_tokens"):
      value = _number(path, line, column, row[column], json_values)
      if not 1 <= value <= MAX_REQUEST_TOKENS or value != int(value):
        raise InputError(
            f"trace={path!r} line {line}: {column}={row[column]!r} is not allowed: "
            f"a whole number in [1, {MAX_REQUEST_TOKENS:,}].", field="trace")
      lens.append(int(value))
    times.append(t)
    prompts.append(lens[0])
    outputs.append(lens[1])
  if not times:
    raise InputError(f"trace={path!r} holds no requests.", field="trace")
  require_size(np.asarray(prompts, np.int64), np.asarray(outputs, np.int64), f"trace={path!r}",
               "trace")
  return Workload(np.asarray(times, float), np.asarray(prompts, np.int64),
                  np.asarray(outputs, np.int64),
                  {"arrival": "trace", "trace": path, "num_requests": len(times)})
