"""Plain-text and Markdown tables with units in the headers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jaxroof.symbolic import step_model


def fmt(value: float | str | None) -> str:
  """A number with 6 significant digits and thousands separators; text as is."""
  if value is None:
    return "n/a"
  return value if isinstance(value, str) else f"{value:,.6g}"


def percent(value: float | None) -> str:
  """A relative error or fraction as a percentage with one decimal; n/a when absent."""
  return "n/a" if value is None else f"{value:.1%}"


def heldout_error(row: dict) -> str:
  """A held-out row's relative error; "coalesced" where the measurement was tokens the
  client received together (`engine_fit`: no relative error is defined), and marked
  where its run was paced by the client (`engine_fit.CLIENT_BOUND_SHARE`)."""
  if row.get("rel_error") is None and row.get("note"):
    return "coalesced"
  if row.get("client_bound"):
    return f"({percent(row.get('rel_error'))}, client-bound)"
  return percent(row.get("rel_error"))


# An efficiency (eta_*) is a fraction of its ceiling; a fitted value outside (0, 1] is none.
OUTSIDE_FRACTION = ("FLAGGED: outside (0, 1], so no fraction of its ceiling; the fit absorbed "
                    "a cost the model does not name")


def outside_fraction(name: str, value: float) -> bool:
  """Whether `name` is an efficiency (a fraction of a ceiling) whose value lies outside
  (0, 1]: such a value is flagged, never shown as a fraction."""
  return name.startswith("eta_") and not 0 < value <= 1


def factor_value(name: str, value: float, spec: str = ".3g") -> str:
  """A factor's value, flagged where an efficiency lies outside (0, 1]."""
  text = format(value, spec)
  return f"{text} (outside (0, 1])" if outside_fraction(name, value) else text


def factor_table(result: dict) -> str:
  """A fit's factors with whether each was fitted or fixed (and why); an efficiency
  outside (0, 1] is flagged."""
  return format_table(("factor", "value", "status"), [[
      name,
      factor_value(name, value, ".4g"), OUTSIDE_FRACTION if outside_fraction(name, value) else
      "fitted" if name in result["free_factors"] else result["fixed_factors"].get(name, "")
  ] for name, value in result["factors"].items()])


def heldout_line(result: dict, label: str = "held-out") -> str:
  """One line: a fit's held-out median and max beside the analytic bound's."""
  line = (f"{label} relative error: calibrated median "
          f"{percent(result['heldout_median_rel_error'])}, max "
          f"{percent(result['heldout_max_rel_error'])}; bound median "
          f"{percent(result['bound_heldout_median_rel_error'])}")
  if "bound_heldout_max_rel_error" in result:
    line += f", max {percent(result['bound_heldout_max_rel_error'])}"
  return line


def _is_number(cell: str) -> bool:
  try:
    float(cell.replace(",", ""))
  except ValueError:
    return False
  return True


# A terminal table longer than this shows its first and last rows and a note;
# the JSON output holds every row.
MAX_TERMINAL_ROWS = 200


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]], *,
                 max_rows: int | None = MAX_TERMINAL_ROWS) -> str:
  """Fixed-width text table: numeric columns right-aligned, text left-aligned.

  Over `max_rows` rows (None: no cap), it keeps the first and last
  `max_rows // 2` and says how many it left out in a line between them.
  """
  omitted = 0
  if max_rows is not None and len(rows) > max_rows:
    half = max(max_rows // 2, 1)
    omitted = len(rows) - 2 * half
    rows = list(rows[:half]) + list(rows[-half:])
  cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
  widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
  numeric = [all(_is_number(row[i]) for row in cells[1:]) for i in range(len(headers))]
  lines = [
      "  ".join(c.rjust(w) if n else c.ljust(w) for c, w, n in zip(row, widths, numeric)).rstrip()
      for row in cells
  ]
  lines.insert(1, "  ".join("-" * w for w in widths))
  if omitted:
    lines.insert(
        2 + len(rows) // 2, f"... {omitted:,} rows not shown ({len(rows) + omitted:,} rows in all; "
        "the JSON output has every row) ...")
  return "\n".join(lines)


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
  """GitHub-flavoured Markdown table."""
  cells = [[str(c) for c in row] for row in rows]
  numeric = [all(_is_number(row[i]) for row in cells) for i in range(len(headers))]
  lines = ["| " + " | ".join(str(h) for h in headers) + " |"]
  lines.append("|" + "|".join("---:" if n else ":---" for n in numeric) + "|")
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(lines)


SWEEP_HEADERS = (
    "batch",
    "traffic GB",
    "step ms",
    "aggregate tok/s",
    "per-seq tok/s",
    "binds",
)


def linear_compute_from(sweep: Mapping[str, Any]) -> float | None:
  """Under the per-operation bound, the batch from which the linear layers are
  compute-bound: the sweep's compute crossover is theirs there
  (`cost_model.decode_compute_crossover_batch`), while attention's K/V reads stay
  memory-bound. None for the fused bound, a calibrated sweep or no crossover."""
  if sweep.get("kind") != "bound":
    return None
  per_op = (step_model.FORM_ASSUMPTIONS["per_op"] in sweep.get("assumptions", ()) or
            any(_sum_of_rooflines(row) for row in sweep.get("rows", ())))
  return sweep["summary"].get("compute_crossover_batch") if per_op else None


def _sum_of_rooflines(row: Mapping[str, Any]) -> bool:
  """A row whose step exceeds both its memory and its compute time (communication
  aside): a sum of per-operation rooflines, some operations bound on each side."""
  larger = max(row["memory_s"], row.get("compute_s") or 0.0)
  return row["step_s"] - (row.get("comm_s") or 0.0) > larger * (1 + 1e-9)


def row_binds(row: Mapping[str, Any], linear_from: float | None = None) -> str:
  """What binds a sweep row: the step's larger time (memory, compute or communication),
  and, under the per-operation bound past `linear_from`, that the linear layers are
  compute-bound inside it."""
  binds = row["bound"]
  if linear_from is not None and row["batch"] >= linear_from and binds != "compute":
    binds += " (linear layers compute-bound)"
  return binds


def sweep_rows(rows: Sequence[dict], linear_from: float | None = None) -> list[list[str]]:
  """Display cells of batch-sweep rows (GB = 1e9 B); marks batches that do not fit, and
  under the per-operation bound the rows whose linear layers are compute-bound
  (`linear_from`, from `linear_compute_from`)."""
  out = []
  for row in rows:
    binds = row_binds(row, linear_from)
    if row.get("fits_in_memory") is False:
      binds += " (does not fit)"
    if row.get("meets_token_gap") is False:
      binds += " (misses token gap)"
    out.append([
        f"{row['batch']}",
        f"{row['traffic_bytes'] / 1e9:,.3f}",
        f"{row['step_s'] * 1e3:,.3f}",
        f"{row['aggregate_tokens_per_s']:,.1f}",
        f"{row['per_sequence_tokens_per_s']:,.1f}",
        binds,
    ])
  return out
