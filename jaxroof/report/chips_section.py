"""The report's section on several chips (analytic bounds).

Renders `jaxroof.serving.report_results.chips`: the fewest chips each shipped
model needs per accelerator (bf16 weights and K/V, one sequence fitting
per-chip memory), one worked plan from the planner, and the single-stream case
end to end (batch one on the fewest chips that hold it).
"""

from __future__ import annotations

from typing import Any

from jaxroof.report import plan_table
from jaxroof.report import table


def _cell(layout: dict[str, int] | None) -> str:
  if layout is None:
    return "-"
  parts = [f"tp{layout['tp']}"] + ([f"pp{layout['pp']}"] if layout["pp"] > 1 else
                                   []) + ([f"ep{layout['ep']}"] if layout["ep"] > 1 else [])
  return f"{layout['chips']} ({' '.join(parts)})"


def chips_table(chips: dict[str, Any]) -> str:
  """Fewest chips per model (rows, the subject's in bold) and accelerator (columns)."""
  accelerators = chips["accelerators"]
  rows = [[f"**{name}**" if name == chips["subject_model"] else name] +
          [_cell(row[a]) for a in accelerators] for name, row in chips["fewest"].items()]
  return table.markdown_table(("model",) + tuple(accelerators), rows)


def single_stream_table(rows: list[dict[str, Any]], accelerator: str) -> str:
  """One row per tensor-parallel degree: fits, memory, communication and step, rate."""
  cells = [[
      r["tp"], "yes" if r["fits_in_memory"] else "no", f"{r['memory_s'] * 1e3:.2f}",
      f"{r['comm_s'] * 1e3:.2f}", f"{r['step_s'] * 1e3:.2f}",
      f"{r['per_sequence_tokens_per_s']:.1f}", r["bound"]
  ] for r in rows]
  return table.markdown_table(
      (f"{accelerator} chips (tp)", "fits", "memory ms", "comm ms", "step ms", "tokens/s", "binds"),
      cells)


def report_section(chips: dict[str, Any], plan_command: str | None = None) -> str:
  """Markdown of the multi-chip section (analytic bounds); `plan_command` is the
  caller's command line that searches the worked plan again (None: not shown)."""
  context, plan, stream = chips["context"], chips["plan"], chips["single_stream"]
  question = chips["plan_question"]
  targets = question["targets"]
  headers, rows = plan_table.plan_rows(plan)
  fewest = next((r for r in stream["rows"] if r["fits_in_memory"]), None)
  lines = [
      "## Several chips: tensor, pipeline and expert parallel (analytic bound)",
      "",
      f"Fewest chips per replica in which one {context}-token sequence fits (bf16 weights "
      "and K/V, 10% of memory kept free; tensor parallel first, pipeline and experts when "
      "heads or the interconnect stop it; '-' = no layout within the recorded "
      "interconnect fits):",
      "",
      chips_table(chips),
      "",
      f"Worked plan: {question['model']} at {context} tokens, token gap <= "
      f"{targets['token_gap_s'] * 1e3:g} ms, TTFT <= {targets['ttft_s'] * 1e3:g} ms, "
      f"{targets['aggregate_tokens_per_s']:,.0f} tokens/s; {plan['searched']:,} "
      f"configurations searched, {plan['meeting']:,} meet the targets" +
      (f" (`{plan_command}`)" if plan_command else "") + ":",
      "",
      table.markdown_table(headers, rows),
      "",
      f"Single stream: {stream['model']} (bf16) at batch one, {context} tokens, on "
      f"{stream['accelerator']} with NVLink all-reduces (450 GB/s per chip, 0.6 us per ring "
      "step from NCCL's model constants; serial with memory):",
      "",
      single_stream_table(stream["rows"], stream["accelerator"]),
      "",
  ]
  if fewest is not None:
    lines.append(
        f"The fewest {stream['accelerator']} chips that hold it are {fewest['tp']}: "
        f"{fewest['per_sequence_tokens_per_s']:.1f} tokens/s for one user "
        f"({fewest['step_s'] * 1e3:.2f} ms a token, {fewest['comm_s'] * 1e3:.2f} ms of it "
        "communication). More chips cut the weight-streaming time per chip, while the "
        f"{stream['allreduces_per_token']} all-reduces per token cost latency that does not "
        "shrink.")
  lines += ["", "Assumptions: " + "; ".join(chips["assumptions"]) + "."]
  return "\n".join(lines) + "\n"
