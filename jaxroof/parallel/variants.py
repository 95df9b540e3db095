"""One model on one device, several dtypes and contexts in one run; rates per chip, kW, dollar.

`variant_sweeps` runs `layout_sweep` for every combination of weight dtype,
K/V dtype and context (in that order, each varying slowest first), tags each
row with its own `weight_dtype`, `kv_dtype` and `context`, and adds the
normalised rates of `normalise_rows`. `combined` puts several sweeps into one
JSON document (rows of every combination, one summary per combination).

Normalised rates divide the fleet's aggregate rate (dp replicas) by the
chips, by the chips' thermal design power (TDP, from the accelerator table
with its source; null with a note where none is published) and, given a
price per chip-hour, turn it into tokens per dollar. TDP is the board's rated
power, not a measured draw: an upper-bound denominator for the chips alone
(host, network and cooling left out).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from jaxroof import errors
from jaxroof.parallel.layout import Layout
from jaxroof.parallel.layout_sweep import layout_sweep
from jaxroof.specs.accelerators import Accelerator
from jaxroof.specs.model_spec import ModelSpec
from jaxroof.symbolic.step_model import StepModel

RATE_UNITS: dict[str, str] = {
    "tokens_per_s_per_chip": "tokens/s per chip",
    "tokens_per_s_per_kw": "tokens/s per kW of TDP",
    "tokens_per_dollar": "tokens per dollar",
}
TAGS: tuple[str, ...] = ("weight_dtype", "kv_dtype", "context")


def normalise_rows(rows: list[dict[str, Any]], device: Accelerator, chips: int, *,
                   price_per_hour: float | None = None) -> list[str]:
  """Adds `RATE_UNITS` keys to each row in place; returns the notes to print.

  Args:
    rows: sweep rows with `fleet_tokens_per_s` (or `aggregate_tokens_per_s`).
    device: the accelerator, for its TDP.
    chips: every chip of the fleet (tp * pp * ep * dp).
    price_per_hour: price of one chip for an hour (any currency, called
      dollars); None leaves `tokens_per_dollar` out.
  """
  chips = errors.require_positive_int("chips", chips)
  if price_per_hour is not None:
    errors.require_positive("price_per_hour", price_per_hour)
  tdp_kw = None if device.tdp_w is None else device.tdp_w / 1e3
  notes = []
  if tdp_kw is None:
    notes.append(f"tokens_per_s_per_kw is null: no TDP is published for {device.name}")
  else:
    notes.append(f"tokens_per_s_per_kw: the fleet's rate over {chips} x {device.tdp_w:g} W "
                 "TDP (rated board power, chips only)")
  if price_per_hour is not None:
    notes.append(f"tokens_per_dollar: the fleet's rate x 3600 s over {chips} chip(s) x "
                 f"{price_per_hour:g} per chip-hour")
  for row in rows:
    rate = row.get("fleet_tokens_per_s", row["aggregate_tokens_per_s"])
    row["tokens_per_s_per_chip"] = rate / chips
    row["tokens_per_s_per_kw"] = None if tdp_kw is None else rate / (chips * tdp_kw)
    if price_per_hour is not None:
      row["tokens_per_dollar"] = rate * 3600.0 / (chips * price_per_hour)
  return notes


def _unique(name: str, values: Sequence[Any]) -> list[Any]:
  values = list(dict.fromkeys(values))
  if not values:
    raise errors.InputError(f"{name} is empty: give at least one value.", field=name)
  return values


def variant_sweeps(spec: ModelSpec, device: Accelerator, *, contexts: Sequence[int],
                   weight_dtypes: Sequence[str], kv_dtypes: Sequence[str],
                   batch_sizes: Sequence[int], layout: Layout | None = None,
                   model: StepModel | None = None, token_gap_s: float | None = None,
                   price_per_hour: float | None = None,
                   **step_input_kw: Any) -> list[dict[str, Any]]:
  """One `layout_sweep` per (weight dtype, K/V dtype, context), rows tagged and normalised.

  Each sweep is exactly the single-combination sweep, plus the tags and the
  normalised rates on its rows and their `rate_notes` in its summary.
  """
  layout = layout or Layout()
  out = []
  for weight_dtype, kv_dtype, context in itertools.product(_unique("weight_dtypes", weight_dtypes),
                                                           _unique("kv_dtypes", kv_dtypes),
                                                           _unique("contexts", contexts)):
    sweep = layout_sweep(spec, device, context=context, batch_sizes=batch_sizes, layout=layout,
                         weight_dtype=weight_dtype, kv_dtype=kv_dtype, model=model,
                         token_gap_s=token_gap_s, **step_input_kw)
    for row in sweep["rows"]:  # The stored dtype ("published" resolved).
      row.update(weight_dtype=sweep["inputs"]["weight_dtype"],
                 weight_dtype_label=sweep["inputs"]["weight_dtype_label"], kv_dtype=kv_dtype,
                 context=context)
    notes = normalise_rows(sweep["rows"], device, layout.chips, price_per_hour=price_per_hour)
    sweep["summary"]["rate_notes"] = notes
    sweep["units"] = {**sweep["units"], **RATE_UNITS}
    out.append(sweep)
  return out


# Inputs that describe one combination's weight format, kept per combination.
_PER_FORMAT = ("weight_dtype_label", "weight_format", "weight_dtype_published")


def combined(sweeps: list[dict[str, Any]]) -> dict[str, Any]:
  """Several tagged sweeps as one document: every row, one summary per combination."""
  first = sweeps[0]
  tags = [{tag: sweep["rows"][0][tag] for tag in TAGS} for sweep in sweeps]
  inputs = {
      key: value for key, value in first["inputs"].items()
      if key not in ("weight_dtype", "kv_dtype", "context", "si", *_PER_FORMAT)
  }
  inputs.update(weight_dtypes=list(dict.fromkeys(t["weight_dtype"] for t in tags)),
                kv_dtypes=list(dict.fromkeys(t["kv_dtype"] for t in tags)),
                contexts=list(dict.fromkeys(t["context"] for t in tags)))
  return {
      "kind": first["kind"],
      "units": first["units"],
      "assumptions": first["assumptions"],
      "inputs": inputs,
      "combinations": [{
          **tag, "si": sweep["inputs"].get("si"),
          **{key: sweep["inputs"].get(key) for key in _PER_FORMAT}
      } for tag, sweep in zip(tags, sweeps)],
      "rows": [row for sweep in sweeps for row in sweep["rows"]],
      "summaries": [{**tag, **sweep["summary"]} for tag, sweep in zip(tags, sweeps)],
  }
