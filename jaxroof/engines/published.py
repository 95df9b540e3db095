"""Published, measured whole-system points (`data/published/`), read and checked.

Each row of `whole_system.csv` is one measured figure of a served setup: its engine,
accelerator, layout, model, dtypes, lengths, load and metric (the README beside the
data says what every column means). `read_points` reads them into `Point`s and refuses
a file whose rows mix units or hold impossible values, one line each. Nothing here
predicts: `jaxroof.calibrate.published_points` drives the cost model for a point.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import io
import math
import os
import re

from jaxroof import errors
from jaxroof import files
from jaxroof.specs import kv_sizing
from jaxroof.specs import parameters

DATA = os.path.join(os.path.dirname(__file__), "data", "published")
WHOLE_SYSTEM = os.path.join(DATA, "whole_system.csv")
DEFAULTS = os.path.join(DATA, "engine_defaults.json")
MODELS = os.path.join(DATA, "models")

# Each metric's unit; a row in another unit is refused (no mixed units in one column).
METRICS: dict[str, str] = {
    "step_s": "s", "itl_s": "s", "tpot_s": "s", "ttft_s": "s", "e2e_latency_s": "s",
    "output_tokens_per_s": "tokens/s", "output_tokens_per_s_per_user": "tokens/s"
}
STATISTICS: tuple[str, ...] = ("mean", "median", "p99", "value")
SPLITS: tuple[str, ...] = ("train", "referee")
# A length the source does not give: `Point.lengths_note` says what stands in for it.
_REQUESTS = re.compile(r"([\d,]+) (?:requests|prompts)")


@dataclasses.dataclass(frozen=True)
class Point:
  """One published measurement (SI units; None where the source gives none)."""

  point_id: str
  split: str
  source: str
  engine: str
  accelerator: str
  n_chips: int
  tp: int
  pp: int
  ep: int
  model: str
  weight_dtype: str
  kv_dtype: str | None
  prompt_tokens: float | None
  output_tokens: float | None
  batch: int | None
  concurrency: float | None
  request_rate: float | None
  metric: str
  statistic: str
  value: float
  dataset: str = ""

  @property
  def replicas(self) -> int:
    """Independent replicas sharing the load (`n_chips / (tp * pp)`)."""
    return self.n_chips // (self.tp * self.pp)

  @property
  def layout(self) -> tuple[int, int, int]:
    """(tp, pp, ep) as jaxroof's `Layout` counts them: a row's `ep` spreads the experts
    over its `tp` chips (attention data-parallel over them, as the engines run MoE), so a
    replica is `tp / ep` tensor ranks in each of `ep` expert groups."""
    return self.tp // self.ep, self.pp, self.ep

  @property
  def requests(self) -> float | None:
    """Requests a saturating run submits at once: the concurrency column, else the count
    the dataset column states (`500 requests`), else None."""
    if self.concurrency is not None:
      return self.concurrency
    found = _REQUESTS.search(self.dataset)
    return float(found.group(1).replace(",", "")) if found else None

  @property
  def seconds(self) -> bool:
    return METRICS[self.metric] == "s"


def _number(row: dict, name: str, where: str, *, whole: bool = False) -> float | None:
  text = (row.get(name) or "").strip()
  if not text:
    return None
  try:
    value = float(text)
  except ValueError:
    raise errors.InputError(f"{where}: {name}={text!r} is not a number.", field=name) from None
  if math.isnan(value) or value <= 0 or (whole and (not value.is_integer() or math.isinf(value))):
    raise errors.InputError(
        f"{where}: {name}={text!r} is not allowed: it must be a "
        f"{'whole number' if whole else 'number'} > 0{'' if whole else ' (inf for a rate)'}.",
        field=name)
  if math.isinf(value) and name != "request_rate":
    raise errors.InputError(
        f"{where}: {name}={text!r} is not allowed: only request_rate may be "
        "inf.", field=name)
  return value


def _point(row: dict, where: str) -> Point:
  """One row as a `Point`, or one InputError naming the row, the column and the value."""
  metric, unit = row.get("metric", ""), row.get("unit", "")
  if metric not in METRICS:
    errors.require_choice("metric", metric, tuple(METRICS))
  if unit != METRICS[metric]:
    raise errors.InputError(
        f"{where}: unit={unit!r} with metric={metric!r}: this metric is in {METRICS[metric]!r} "
        "(SI; convert ms and per-GPU figures first, one unit per metric).", field="unit")
  for name, allowed in (("statistic", STATISTICS), ("split", SPLITS),
                        ("weight_dtype", tuple(parameters.WEIGHT_DTYPES))):
    if row.get(name, "") not in allowed:
      raise errors.InputError(
          f"{where}: {name}={row.get(name, '')!r} is not one of "
          f"{', '.join(allowed)}.", field=name)
  kv = (row.get("kv_dtype") or "").strip() or None
  if kv is not None and kv not in kv_sizing.KV_DTYPES:
    raise errors.InputError(
        f"{where}: kv_dtype={kv!r} is not one of "
        f"{', '.join(kv_sizing.KV_DTYPES)}.", field="kv_dtype")
  whole = {n: _number(row, n, where, whole=True) for n in ("n_chips", "tp", "pp", "ep", "batch")}
  value = _number(row, "value", where)
  if value is None or math.isinf(value):
    raise errors.InputError(
        f"{where}: value={row.get('value')!r} is not allowed: give a finite "
        "measured value > 0.", field="value")
  tp, pp, ep = (int(whole[n] or 1) for n in ("tp", "pp", "ep"))
  chips = int(whole["n_chips"] or 0)
  if chips < 1 or chips % (tp * pp) or tp % ep:
    raise errors.InputError(
        f"{where}: n_chips={row.get('n_chips')!r} with tp={tp} pp={pp} ep={ep}: n_chips must be "
        "a whole multiple of tp*pp (the replicas sharing the load) and ep must divide tp (the "
        "experts spread over the tensor ranks).", field="n_chips")
  return Point(point_id=row["point_id"], split=row["split"], source=row["source_id"],
               engine=row["engine"], accelerator=row["accelerator"], n_chips=chips, tp=tp, pp=pp,
               ep=ep, model=row["model"], weight_dtype=row["weight_dtype"], kv_dtype=kv,
               prompt_tokens=_number(row, "prompt_tokens",
                                     where), output_tokens=_number(row, "output_tokens", where),
               batch=None if whole["batch"] is None else int(whole["batch"]),
               concurrency=_number(row, "concurrency",
                                   where), request_rate=_number(row, "request_rate",
                                                                where), metric=metric,
               statistic=row["statistic"], value=value, dataset=row.get("dataset", ""))


REQUIRED = ("point_id", "split", "source_id", "engine", "accelerator", "n_chips", "tp", "model",
            "weight_dtype", "metric", "statistic", "value", "unit")


def parse_points(text: str, name: str = "published") -> tuple[Point, ...]:
  """`whole_system.csv`'s text as checked `Point`s (see the module docstring)."""
  reader = csv.DictReader(io.StringIO(text))
  missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
  if missing:
    raise errors.InputError(
        f"{name}: columns {missing} are missing (the published schema: "
        f"{', '.join(REQUIRED)}, ...).", field=name)
  points, seen = [], set()
  for line, row in enumerate(reader, start=2):
    point = _point(row, f"{name} line {line} ({row.get('point_id')})")
    if point.point_id in seen:
      raise errors.InputError(f"{name} line {line}: point_id={point.point_id!r} is given twice.",
                              field=name)
    seen.add(point.point_id)
    points.append(point)
  return tuple(points)


@functools.cache
def read_points(path: str = WHOLE_SYSTEM) -> tuple[Point, ...]:
  """Every published point of `path` (default: the shipped `whole_system.csv`)."""
  return parse_points(files.read_text("published", path), os.path.basename(path))


@functools.cache
def engine_defaults(path: str = DEFAULTS) -> dict:
  """`engine_defaults.json`: each engine's scheduler defaults and memory rules, sourced."""
  return files.read_json("engine_defaults", path)


def model_path(model: str) -> str:
  """A point's model: a shipped slug, or a config shipped beside the data."""
  local = os.path.join(MODELS, f"{model}.json")
  return local if os.path.exists(local) else model
