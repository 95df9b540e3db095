"""The summary as the report's opening: one screen of Markdown, a figure, a JSON file.

`report_section(subject, out_dir, results_dir)` writes `summary.json` and
`summary.png` into `out_dir` and returns the Markdown (`jaxroof.report.summary`
computes the figures, `jaxroof.report.summary_text` words them).
"""

from __future__ import annotations

import os
from typing import Any

from jaxroof import files
from jaxroof.report import plots
from jaxroof.report import summary as summary_lib
from jaxroof.report import summary_text
from jaxroof.report import table

JSON_NAME = "summary.json"
PLOT_NAME = "summary.png"


def plot_summary(summary: dict[str, Any], path: str, title: str) -> None:
  """Aggregate tokens/s at each accelerator's answer, sorted, batch and binding labelled."""
  import matplotlib.pyplot as plt

  def per_chip(e: dict[str, Any]) -> float | None:
    served = e["fits"] and e["bound"]["status"] == "ok"
    return e["aggregate_tokens_per_s_per_chip"] if served else None

  entries = sorted(summary["accelerators"], key=lambda e: per_chip(e) or 0.0)
  fig, ax = plt.subplots(figsize=(8.5, 0.45 * len(entries) + 1.8))
  top = max((per_chip(e) or 0.0) for e in entries) or 1.0
  for y, e in enumerate(entries):
    b, c = e["bound"], e["calibrated"]
    rate = per_chip(e)
    if rate is None:
      target = summary_text.BINDS.get(b["binds"], b["binds"]).split(" (")[0]
      why = ("does not fit in memory" if not e["fits"] else f"misses the {target}"
             + ("" if e["chips"] == 1 else f" on {e['layout_name']}"))
      ax.text(top * 0.01, y, why, va="center", fontsize=8, color="red")
      continue
    best = e["accelerator"] == summary["best"]
    ax.barh(y, rate, color="tab:green" if best else "tab:blue", alpha=0.8,
            label="analytic bound, highest rate" if best else "analytic bound")
    binds = summary_text.BINDS.get(b["binds"], b["binds"]).split(" (")[0]
    where = "" if e["chips"] == 1 else f"{e['layout_name']}, "
    ax.text(rate + top * 0.01, y, f"{where}B = {b['batch']:,}, {binds} binds; gap "
            f"{b['loaded_token_gap_s'] * 1e3:.1f} ms", va="center", fontsize=8)
    if c is not None and c["batch"] is not None:
      ax.plot([c["aggregate_tokens_per_s"]], [y], "D", color="tab:orange", markersize=7,
              label="calibrated prediction (shipped profile; ± held-out median error)")
      error = c.get("profile_heldout_median_rel_error")
      ax.annotate(f"B = {c['batch']:,}" + ("" if error is None else f", ±{error:.0%}"),
                  (c["aggregate_tokens_per_s"], y),
                  textcoords="offset points", xytext=(0, -13), ha="center", fontsize=7,
                  bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8})
  handles, labels = ax.get_legend_handles_labels()
  unique = dict(zip(labels, handles))
  if unique:
    ax.legend(unique.values(), unique.keys(), fontsize=8, loc="lower right")
  ax.set_yticks(range(len(entries)), [e["accelerator"] for e in entries])
  ax.set_ylim(-0.7, len(entries) - 0.4)
  ax.set_xlim(0, top * 1.6)
  if top >= 10:  # Thousands separators; below that (nothing served) the default labels.
    ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda x, _: f"{x:,.0f}"))
  ax.set_xlabel("aggregate tokens/s per chip (B / step / chips, at the batch that meets "
                "the targets)")
  ax.set_ylabel("accelerator (tpN: chips)")
  ax.grid(True, axis="x", alpha=0.3)
  ax.set_title(title, fontsize=9)
  plots.save(fig, path)


def report_section(subject: summary_lib.Subject, out_dir: str, results_dir: str) -> str:
  """The opening summary, as Markdown; writes its JSON and figure into `out_dir`."""
  summary = summary_lib.summarise(subject, results_dir)
  files.write_json(os.path.join(out_dir, JSON_NAME), summary)
  targets = (f"mean token gap <= {subject.token_gap_s * 1e3:g} ms, mean TTFT <= "
             f"{subject.ttft_s * 1e3:g} ms"
             + (f" at {subject.arrival_rate:g} requests/s (M/D/1)" if subject.arrival_rate
                else " (one prompt, idle prefill)"))
  plot_summary(summary, os.path.join(out_dir, PLOT_NAME),
               f"{subject.describe()}\n{targets} (analytic bound; orange: calibrated)")
  served = [e for e in summary["accelerators"] if e["accelerator"] in summary["serving"]]
  single = sum(e["chips"] == 1 for e in served)
  best = next((e for e in served if e["accelerator"] == summary["best"]), None)
  lines = [
      f"## Summary: serving {subject.model} at {subject.context:,} tokens (analytic bounds; "
      "calibrated predictions where shown)",
      "",
      f"**{subject.describe()}; targets: {targets}.** "
      f"{len(served)} of {len(summary['accelerators'])} accelerators serve it"
      + (f" ({single} on one chip)" if served else "")
      + ("." if best is None else
         f"; the highest rate per chip is on **{best['accelerator']}**"
         + ("" if best["chips"] == 1 else f" ({best['layout_name']}, {best['chips']} chips)")
         + f": batch {best['bound']['batch']:,}, "
         f"{best['bound']['aggregate_tokens_per_s']:,.0f} tokens/s, "
         f"{summary_text.BINDS.get(best['bound']['binds'], best['bound']['binds'])} binds."),
      "Each row: the largest decode batch whose mean token gap meets the target and whose "
      "weights + paged K/V (reserved for the whole request) fit in 90% of memory, on one "
      "chip or, when the model does not fit one, on the fewest chips that hold it (tensor "
      "parallel first; `jaxroof.serving.decision`). TTFT: the prefill of one prompt "
      "(M/D/1 mean with queueing under load)."
      + (" The fewest chips are not the best layout: more hold more K/V, so a larger batch "
         f"(`python -m experiments.plan --model={subject.model} --context={subject.context}` "
         "searches layouts, batches and dtypes)."
         if any(e["chips"] > 1 for e in summary["accelerators"]) else "")
      + " *Analytic bound* from datasheet figures; *calibrated "
      "prediction* where a profile fitted to that accelerator's measured TensorRT-LLM "
      "step times ships (`results/profile_<slug>_trtllm_0.9.0.json`, fp8 measurements), "
      "with its held-out error (whole models the fit never saw) and the bound's on the "
      "same rows beside it; where the calibrated error is the larger, the bound is the "
      "better estimate.",
      "",
      table.markdown_table(summary_text.HEADERS, summary_text.table_rows(summary)),
      "",
      "What would move it (analytic bounds):",
      "",
      *summary_text.what_moves_lines(summary),
      "",
      f"![summary]({PLOT_NAME})",
      "",
      f"(`{JSON_NAME}` beside this file holds every figure; `python -m experiments.serving "
      f"--model={subject.model} --accelerator=SLUG --prompt_tokens={subject.prompt_tokens} "
      f"--output_tokens={subject.output_tokens} --token_gap_ms={subject.token_gap_s * 1e3:g} "
      f"--ttft_ms={subject.ttft_s * 1e3:g}` gives one accelerator in full.)",
  ]
  return "\n".join(lines)
