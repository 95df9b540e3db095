"""What `experiments.batch_sweep` prints and plots: the title, the rows, each sweep's
summary and the rates against batch."""

from __future__ import annotations

from typing import Any

from jaxroof.report import accuracy
from jaxroof.report import plots
from jaxroof.report import table

_CEILING_SOURCES = {
    "profile": "the profile's measured ceilings", "given": "the given datasheet or flag figures"
}


def summary_lines(summary: dict[str, Any], linear: bool = False) -> list[str]:
  """Human-readable summary of a sweep's solved quantities; `linear`: the compute
  crossover is the linear layers' (the per-operation bound), as the rows say."""
  lines = []
  if "answer_binds" in summary:
    gap_ms = summary["token_gap_s"] * 1e3
    limit = {"token_gap": f"the {gap_ms:g} ms token gap",
             "memory_capacity": "memory capacity"}[summary["answer_binds"]]
    if summary["answer_batch"] is None:
      lines.append(f"ANSWER: no batch meets a {gap_ms:g} ms token gap (limited by {limit})")
    else:
      lines.append(f"ANSWER: largest batch for a {gap_ms:g} ms token gap: "
                   f"B = {summary['answer_batch']:,}, limited by {limit} "
                   f"(step {summary['answer_step_s'] * 1e3:,.2f} ms, "
                   f"{summary['answer_step_bound']}-bound)")
  cap = summary.get("max_batch_in_memory")
  limit = (f"memory-limited rate (B -> oo): {summary['memory_limit_tokens_per_s']:,.1f} tokens/s" +
           ("" if cap is None else f", unreachable here: memory holds B <= {cap:,}"))
  lines += [
      f"weight/KV crossover: B = {summary['weight_kv_crossover_batch']:,.1f} sequences", limit
  ]
  if summary["compute_crossover_batch"] is not None:
    lines.append(
        ("linear layers compute-bound from (per-operation bound; K/V reads stay memory-bound)"
         if linear else "compute crossover") +
        f": B = {summary['compute_crossover_batch']:,.1f} sequences")
  if "token_gap_s" in summary:
    gap_ms = summary["token_gap_s"] * 1e3
    best = summary["largest_swept_batch_meeting_token_gap"]
    lines.append(f"largest swept batch with a token gap <= {gap_ms:g} ms" +
                 (" (and fitting in memory)" if "max_batch_in_memory" in summary else "") +
                 f": {best if best is not None else 'none'}")
    if summary.get("max_batch_for_token_gap") is not None:
      lines.append(f"largest batch for that gap (solved): B = "
                   f"{summary['max_batch_for_token_gap']:,.1f}")
  if "max_batch_in_memory" in summary:
    lines.append(f"largest batch that fits in memory: {summary['max_batch_in_memory']:,}")
  lines += [f"note: {n}" for n in summary["notes"] + summary.get("rate_notes", [])]
  return lines


def title(sweeps: list[dict[str, Any]], what_ifs: list[str]) -> str:
  """A model sweep's title: the model on the device, and for one combination its context
  and dtypes; "(what-if)" when datasheet figures were replaced."""
  inputs = sweeps[0]["inputs"]
  text = f"{inputs['model']} on {inputs['accelerator']}" + (
      f", context {inputs['context']}, {inputs['weight_dtype_label']} weights, "
      f"{inputs['kv_dtype']} K/V" if len(sweeps) == 1 else "")
  return text + (" (what-if)" if what_ifs else "")


def title_line(title: str, sweep: dict[str, Any], *, bound_first: bool = False) -> str:
  """The sweep's title with what its numbers are (a bound, or a profile's prediction)."""
  if bound_first:
    return (f"{title} (analytic bound, shown first: the profile's held-out error is larger "
            "than the bound's on the same data; GB = 1e9 B)")
  if sweep["kind"] != "calibrated":
    return f"{title} (analytic bound; GB = 1e9 B)"
  prof = sweep["profile"]
  if "engine" in prof:  # An engine's published-measurement profile.
    return f"{title} ({prof['label']}; the analytic bound's step beside; GB = 1e9 B)"
  return (f"{title} (calibrated prediction: profile of {prof['device_kind']}, "
          f"{prof['backend']}, {prof['dtype']}; held-out error median "
          f"{table.percent(prof['heldout_median_rel_error'])}, max "
          f"{table.percent(prof['heldout_max_rel_error'])}; "
          f"scaling {_CEILING_SOURCES[sweep['ceilings']['source']]}; GB = 1e9 B)")


def _tagged_cells(sweeps: list[dict], cells: list[list[str]]) -> list[list[str]]:
  """Table cells with the combination's weight dtype, K/V dtype and context in front."""
  rows = [row for sweep in sweeps for row in sweep["rows"]]
  return [[r["weight_dtype_label"], r["kv_dtype"], f"{r['context']:,}"] + c
          for r, c in zip(rows, cells)]


def lines(sweeps: list[dict], sweep: dict, *, priced: bool = False) -> list[str]:
  """The table of every sweep's rows (or the one raw-number `sweep` when `sweeps` is
  empty) and, per combination, its summary lines. Model rows add the rates per chip and
  kW, and with `priced` tokens per dollar."""
  rows = [row for each in sweeps or [sweep] for row in each["rows"]]
  headers = table.SWEEP_HEADERS
  cells = [
      c for each in sweeps or [sweep]
      for c in table.sweep_rows(each["rows"], table.linear_compute_from(each))
  ]
  if any(row.get("comm_s") for row in rows):
    headers = headers + ("comm ms", "chips")
    cells = [c + [f"{r['comm_s'] * 1e3:,.3f}", f"{r['chips']}"] for c, r in zip(cells, rows)]
  if sweeps:
    headers = headers + ("tok/s/chip", "tok/s/kW") + (("tok/$",) if priced else ())
    cells = [
        c + [
            f"{r['tokens_per_s_per_chip']:,.1f}",
            "n/a" if r["tokens_per_s_per_kw"] is None else f"{r['tokens_per_s_per_kw']:,.1f}"
        ] + ([f"{r['tokens_per_dollar']:,.0f}"] if priced else []) for c, r in zip(cells, rows)
    ]
  if all("bound_step_s" in r for r in rows):
    headers = headers + ("bound step ms",)
    cells = [c + [f"{r['bound_step_s'] * 1e3:,.3f}"] for c, r in zip(cells, rows)]
  headers, cells = headers + ("moved by",), [c + [r["moved_by"]] for c, r in zip(cells, rows)]
  if sweep["kind"] == "calibrated":  # The error beside every calibrated number.
    headers = headers + (accuracy.HEADER,)
    cells = [c + [accuracy.cell(sweep["profile"])] for c in cells]
  if len(sweeps) > 1:
    headers, cells = ("weights", "K/V", "context") + headers, _tagged_cells(sweeps, cells)
  out = [table.format_table(headers, cells)]
  for each in sweeps if len(sweeps) > 1 else [sweep]:
    if len(sweeps) > 1:
      out.append(f"-- {each['inputs']['weight_dtype_label']} weights, "
                 f"{each['inputs']['kv_dtype']} K/V, context {each['inputs']['context']:,}:")
    out += summary_lines(each["summary"], linear=table.linear_compute_from(each) is not None)
  return out


def bound_first_lines(title: str, sweeps: list[dict], sweep: dict, priced: bool) -> list[str]:
  """The bound's table, shown before a profile whose held-out error is larger than the
  bound's, and a blank line."""
  return ([title_line(title, sweep, bound_first=True)] + lines(sweeps, sweep, priced=priced) + [""])


def plot(sweeps: list[dict[str, Any]], sweep: dict[str, Any], path: str, title: str) -> None:
  """Writes both rates against batch as a PNG: every combination of a model's sweeps,
  or the one sweep."""
  if len(sweeps) > 1:
    plots.plot_variants(sweeps, path, title)
  else:
    plots.plot_sweep(sweep, path, title)
