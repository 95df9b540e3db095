"""Plain-text and Markdown tables with units in the headers."""

from __future__ import annotations

from collections.abc import Sequence


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


def factor_table(result: dict) -> str:
  """A fit's factors with whether each was fitted or fixed (and why)."""
  return format_table(("factor", "value", "status"), [[
      name, f"{value:.4g}",
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


def sweep_rows(rows: Sequence[dict]) -> list[list[str]]:
  """Display cells of batch-sweep rows (GB = 1e9 B); marks batches that do not fit."""
  out = []
  for row in rows:
    binds = row["bound"]
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
