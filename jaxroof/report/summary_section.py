"""The report's opening summary: the serving answer as one screen of Markdown, a figure,
a JSON file.

`report_section(summary, out_dir)` renders `jaxroof.serving.answer.summarise`'s
result: it writes `summary.json` and `summary.png` into `out_dir` and returns
the Markdown (its table rows, what would move the answer, the figure).
"""

from __future__ import annotations

import os
from typing import Any

from jaxroof import files
from jaxroof.report import plots
from jaxroof.report import table

BINDS = {
    "memory": "memory capacity (weights + K/V fill it)",
    "token_gap": "token-gap target (bandwidth-bound step)",
    "compute": "token-gap target (compute-bound step)",
    "communication": "token-gap target (communication)",
    "ttft": "TTFT target",
    "itl_p99": "p99 inter-token gap (iterations carrying prompts)",
    "slots": "the slots fill (requests queue for one)",
    "search_limit": "nothing up to the search limit",
}


def _ms(value: float | None) -> str:
  return "-" if value is None else f"{value * 1e3:,.1f}"


def _rate(value: float | None) -> str:
  return "-" if value is None else f"{value:,.0f}"


def _top_two(values: dict[str, float]) -> str:
  """The two inputs that move the step most, e.g. "BW -1.00, k +0.90"."""
  names = sorted(values, key=lambda n: -abs(values[n]))[:2]
  return ", ".join(f"{n} {values[n]:+.2f}" for n in names)


def _missed(decision: dict[str, Any], subject: dict[str, Any]) -> str:
  """Why a decision failed, short: which target, by how much."""
  if decision["status"] == "unstable":
    fill = decision.get("slot_capacity_per_s")
    return (f"unstable: {subject['arrival_rate']:g} requests/s is past the rate the slots fill "
            f"at" + ("" if fill is None else f" ({fill:.4g}/s)"))
  if decision["binds"] == "ttft" and decision["ttft_s"] is not None:
    return (f"TTFT target missed: {_ms(decision['ttft_s'])} ms > "
            f"{_ms(subject['ttft_s'])} ms")
  if decision["binds"] == "token_gap":
    return f"token-gap target missed at B = 1 (> {_ms(subject['token_gap_s'])} ms)"
  return decision["reason"] or decision["status"]


def table_rows(summary: dict[str, Any]) -> list[list[str]]:
  """Display rows, one per accelerator in the order given."""
  rows = []
  for e in summary["accelerators"]:
    b, c = e["bound"], e["calibrated"]
    if not e["fits"]:
      rows.append([
          e["accelerator"], f"no: {e['weights_gb']:,.1f} GB of weights, "
          f"{e['memory_gb']:,.0f} GB a chip, no layout within reach holds it", "-", "-", "-", "-",
          "-", "-", "-"
      ])
      continue
    served = b["status"] == "ok"
    chips = e["chips"]
    where = "1 chip" if chips == 1 else f"{e['layout_name']} ({chips} chips)"
    rate = _rate(
        b["aggregate_tokens_per_s"]) + ("" if chips == 1 or b["aggregate_tokens_per_s"] is None else
                                        f" ({_rate(e['aggregate_tokens_per_s_per_chip'])}/chip)")
    rows.append([
        e["accelerator"] + (" **best**" if e["accelerator"] == summary["best"] else ""),
        ("yes: " if served else "no: ") + f"{where}, B <= {e['max_batch_in_memory']:,}",
        f"{b['batch']:,}" if b["batch"] is not None else "-",
        _ms(b.get("loaded_token_gap_s")),
        _ms(b["ttft_s"]), rate,
        BINDS.get(b["binds"], b["binds"]) if served else _missed(b, summary["subject"]),
        _top_two(b["elasticities"]) if b.get("elasticities") else "-", "-" if c is None or
        c["batch"] is None else f"B {c['batch']:,}, {_ms(c['loaded_token_gap_s'])} ms, "
        f"{_rate(c['aggregate_tokens_per_s'])} tok/s "
        f"({BINDS.get(c['binds'], c['binds']).split(' (')[0]}); " + calibrated_error(c)
    ])
  return rows


def calibrated_error(c: dict[str, Any]) -> str:
  """The held-out error beside a calibrated prediction, and the bound's on the same data."""
  cal, top = c.get("profile_heldout_median_rel_error"), c.get("profile_heldout_max_rel_error")
  bound = c.get("bound_heldout_median_rel_error")
  text = ("held-out error unknown" if cal is None else f"held-out error {cal:.0%} median" +
          ("" if top is None else f", {top:.0%} max"))
  if bound is not None:
    text += f"; bound's {bound:.0%}"
  if c.get("worse_than_bound"):
    text += " (worse than the bound: prefer it)"
  return text


HEADERS = ("accelerator", "serves it? (chips that hold it, batch in memory)", "batch",
           "token gap ms", "TTFT ms", "aggregate tok/s (B / step)", "binds", "step moved by",
           "calibrated prediction (held-out error beside it)")


def _ceiling_words(values: dict[str, float]) -> str:
  """Which ceiling moves the step, in words, from the BW and F elasticities."""
  bw, flops = abs(values.get("BW", 0.0)), abs(values.get("F", 0.0))
  if bw >= flops:
    return (f"1% more bandwidth cuts the step {bw:.2f}%; a faster FLOP rate " +
            ("would not move it" if flops < 0.005 else f"{flops:.2f}%"))
  return (f"compute binds: 1% more FLOP/s cuts the step {flops:.2f}%; more bandwidth " +
          ("would not move it" if bw < 0.005 else f"{bw:.2f}%"))


def what_moves_lines(summary: dict[str, Any]) -> list[str]:
  """Bullets: the best accelerator's limits, elasticities and dtype what-ifs."""
  best = next((e for e in summary["accelerators"] if e["accelerator"] == summary["best"]), None)
  if best is None:
    return [
        "No listed accelerator serves it at these targets, on one chip or on the fewest "
        "chips that hold it: see the multi-chip section (`python -m experiments.plan` "
        "searches layouts, batches and dtypes)."
    ]
  b = best["bound"]
  gap_limit, memory_limit = summary["best_token_gap_only_batch"], b["memory_limit_batch"]
  lines = [
      f"- On {best['accelerator']}" +
      ("" if best["chips"] == 1 else f" ({best['layout_name']}, {best['chips']} chips)") +
      f": the token gap alone would allow B <= {gap_limit:,}, memory "
      f"alone B <= {memory_limit:,} ({best['weights_gb']:,.1f} GB weights, "
      f"{best['kv_allocated_gb_per_sequence']:,.3f} GB allocated K/V per sequence, "
      f"{best['memory_gb']:,.0f} GB a chip less 10% workspace); the smaller is the answer.",
      "- The step's elasticities d ln(step)/d ln(x) at that batch: " +
      ", ".join(f"{k} {v:+.2f}" for k, v in b["elasticities"].items() if abs(v) >= 0.005) +
      f" ({_ceiling_words(b['elasticities'])}).",
  ]
  for alt in summary["what_moves_best"]:
    if alt["batch"] is None:
      lines.append(f"- With {alt['change']}: {alt['status']} ({alt['binds']}).")
      continue
    lines.append(
        f"- With {alt['change']}: batch {alt['batch']:,} "
        f"({BINDS.get(alt['binds'], alt['binds'])}), "
        f"{_ms(alt['loaded_token_gap_s'])} ms token gap, {_rate(alt['aggregate_tokens_per_s'])} "
        f"tokens/s (x{alt['aggregate_tokens_per_s'] / b['aggregate_tokens_per_s']:.2f}).")
  return lines


JSON_NAME = "summary.json"
PLOT_NAME = "summary.png"


def plot_summary(summary: dict[str, Any], path: str, title: str) -> None:
  """Aggregate tokens/s at each accelerator's answer, sorted, batch and binding labelled."""
  plt = plots.pyplot()

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
      target = BINDS.get(b["binds"], b["binds"]).split(" (")[0]
      why = ("does not fit in memory" if not e["fits"] else f"misses the {target}" +
             ("" if e["chips"] == 1 else f" on {e['layout_name']}"))
      ax.text(top * 0.01, y, why, va="center", fontsize=8, color="red")
      continue
    best = e["accelerator"] == summary["best"]
    ax.barh(y, rate, color="tab:green" if best else "tab:blue", alpha=0.8,
            label="analytic bound, highest rate" if best else "analytic bound")
    binds = BINDS.get(b["binds"], b["binds"]).split(" (")[0]
    where = "" if e["chips"] == 1 else f"{e['layout_name']}, "
    ax.text(
        rate + top * 0.01, y, f"{where}B = {b['batch']:,}, {binds} binds; gap "
        f"{b['loaded_token_gap_s'] * 1e3:.1f} ms", va="center", fontsize=8)
    if c is not None and c["batch"] is not None:
      ax.plot([c["aggregate_tokens_per_s"]], [y], "D", color="tab:orange", markersize=7,
              label="calibrated prediction (shipped profile; ± held-out median error)")
      error = c.get("profile_heldout_median_rel_error")
      ax.annotate(f"B = {c['batch']:,}" + ("" if error is None else f", ±{error:.0%}"),
                  (c["aggregate_tokens_per_s"], y), textcoords="offset points", xytext=(0, -13),
                  ha="center", fontsize=7,
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


def engine_lines(summary: dict[str, Any]) -> list[str]:
  """An engine's predictions for the subject, one bullet per accelerator, the bound beside
  (they lead the summary); an accelerator the engine has no entry for says why."""
  engine = summary.get("engine") or "bound"
  if engine == "bound":
    return []
  out = [
      f"Predicted by **{engine}** (its profile fitted on published measurements, its "
      "scheduler defaults and memory rule; the analytic bound beside):", ""
  ]
  for e in summary["accelerators"]:
    b, c = e["bound"], e.get("calibrated")
    if c is None:
      why = e.get("engine_note") or "does not fit in memory"
      out.append(f"- {e['accelerator']}: no prediction ({why})")
      continue
    shown = ("no batch meets the targets" if c["batch"] is None else
             f"batch {c['batch']:,}, token gap {_ms(c['loaded_token_gap_s'])} ms, TTFT "
             f"{_ms(c['ttft_s'])} ms, {_rate(c['aggregate_tokens_per_s'])} tokens/s")
    bound = ("-" if b["batch"] is None else f"batch {b['batch']:,}, "
             f"{_rate(b['aggregate_tokens_per_s'])} tokens/s")
    out.append(f"- {e['accelerator']}: {shown} (bound: {bound}); {c['profile']}")
  return out + [""]


def _calibrated_words(summary: dict[str, Any]) -> str:
  """Where the calibrated column comes from: the shipped profiles the entries name, and
  what their held-out error was measured on."""
  if (summary.get("engine") or "bound") != "bound":
    return (f"*calibrated prediction* of {summary['engine']} (above), with its held-out "
            "error leaving out whole published sources.")
  calibrated = [e["calibrated"] for e in summary["accelerators"] if e.get("calibrated")]
  if not calibrated:
    return "no accelerator here ships a profile, so no calibrated prediction."
  named = ", ".join(f"`{p}`" for p in sorted({c["profile"] for c in calibrated}))
  by = {c.get("profile_heldout_by", "model") for c in calibrated}
  on = ("whole models the fit never saw" if by == {"model"} else
        "held-out rows of the models it fitted: another model is a carry-over")
  return ("*calibrated prediction* where a profile fitted to that accelerator's measured "
          f"step times ships ({named}), with its held-out error ({on}) and the bound's on "
          "the same rows beside it; where the calibrated error is the larger, the bound is "
          "the better estimate.")


def describe(subject: dict[str, Any]) -> str:
  """The subject in words: model, context split into prompt and outputs, dtypes."""
  return (f"{subject['model']}, context {subject['context']:,} tokens "
          f"({subject['prompt_tokens']:,} prompt + {subject['output_tokens']} outputs), "
          f"{subject['weight_dtype']} weights, {subject['kv_dtype']} K/V")


def report_section(summary: dict[str, Any], out_dir: str, *, serving_command: str | None = None,
                   plan_command: str | None = None) -> str:
  """The opening summary, as Markdown; writes its JSON and figure into `out_dir`.

  The caller's command lines, where given, close it: `serving_command` gives one
  accelerator in full (SLUG standing for it) and `plan_command` searches layouts for
  the subject; None names the experiment instead.
  """
  subject = summary["subject"]
  files.write_json(os.path.join(out_dir, JSON_NAME), summary)
  targets = (f"mean token gap <= {subject['token_gap_s'] * 1e3:g} ms, mean TTFT <= "
             f"{subject['ttft_s'] * 1e3:g} ms" +
             (f" at {subject['arrival_rate']:g} requests/s (M/D/1)"
              if subject['arrival_rate'] else " (one prompt, idle prefill)"))
  plot_summary(summary, os.path.join(out_dir, PLOT_NAME),
               f"{describe(subject)}\n{targets} (analytic bound; orange: calibrated)")
  served = [e for e in summary["accelerators"] if e["accelerator"] in summary["serving"]]
  single = sum(e["chips"] == 1 for e in served)
  best = next((e for e in served if e["accelerator"] == summary["best"]), None)
  lines = [
      f"## Summary: serving {subject['model']} at {subject['context']:,} tokens " +
      ("(analytic bounds; calibrated predictions where shown)" if (summary.get("engine") or "bound")
       == "bound" else f"(predictions of {summary['engine']}, analytic bounds beside)"),
      "",
      f"**{describe(subject)}; targets: {targets}.** "
      f"{len(served)} of {len(summary['accelerators'])} accelerators serve it" +
      (f" ({single} on one chip)" if served else "") +
      ("." if best is None else f"; the highest rate per chip is on **{best['accelerator']}**" +
       ("" if best["chips"] == 1 else f" ({best['layout_name']}, {best['chips']} chips)") +
       f": batch {best['bound']['batch']:,}, "
       f"{best['bound']['aggregate_tokens_per_s']:,.0f} tokens/s, "
       f"{BINDS.get(best['bound']['binds'], best['bound']['binds'])} binds."),
      "Each row: the largest decode batch whose mean token gap meets the target and whose "
      "weights + paged K/V (reserved for the whole request) fit in 90% of memory, on one "
      "chip or, when the model does not fit one, on the fewest chips that hold it (tensor "
      "parallel first; `jaxroof.serving.decision`). TTFT: the prefill of one prompt "
      "(M/D/1 mean with queueing under load)." +
      (" The fewest chips are not the best layout: more hold more K/V, so a larger batch "
       f"(`{plan_command or 'experiments.plan'}` searches layouts, batches and dtypes)." if any(
           e["chips"] > 1 for e in summary["accelerators"]) else "") +
      " *Analytic bound* from datasheet figures; " + _calibrated_words(summary),
      "",
      *engine_lines(summary),
      table.markdown_table(HEADERS, table_rows(summary)),
      "",
      "What would move it (analytic bounds):",
      "",
      *what_moves_lines(summary),
      "",
      f"![summary]({PLOT_NAME})",
      "",
      f"(`{JSON_NAME}` beside this file holds every figure; "
      f"`{serving_command or 'experiments.serving'}` gives one accelerator in full.)",
  ]
  return "\n".join(lines)
