"""The summary in words: its table rows and its "what would move it" bullets.

Display only: `jaxroof.report.summary` computes every figure.
"""

from __future__ import annotations

from typing import Any

BINDS = {
    "memory": "memory capacity (weights + K/V fill it)",
    "token_gap": "token-gap target (bandwidth-bound step)",
    "compute": "token-gap target (compute-bound step)",
    "communication": "token-gap target (communication)",
    "ttft": "TTFT target",
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
  if decision["status"] == "unstable" and decision["batch"] is None:
    return (f"prefill queue unstable: utilisation {decision['utilisation']:.2f} >= 1 at "
            f"{subject['arrival_rate']:g} requests/s")
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
      rows.append([e["accelerator"], f"no: {e['weights_gb']:,.1f} GB of weights, "
                   f"{e['memory_gb']:,.0f} GB a chip, no layout within reach holds it",
                   "-", "-", "-", "-", "-", "-", "-"])
      continue
    served = b["status"] == "ok"
    chips = e["chips"]
    where = "1 chip" if chips == 1 else f"{e['layout_name']} ({chips} chips)"
    rate = _rate(b["aggregate_tokens_per_s"]) + (
        "" if chips == 1 or b["aggregate_tokens_per_s"] is None
        else f" ({_rate(e['aggregate_tokens_per_s_per_chip'])}/chip)")
    rows.append([
        e["accelerator"] + (" **best**" if e["accelerator"] == summary["best"] else ""),
        ("yes: " if served else "no: ") + f"{where}, B <= {e['max_batch_in_memory']:,}",
        f"{b['batch']:,}" if b["batch"] is not None else "-",
        _ms(b.get("loaded_token_gap_s")), _ms(b["ttft_s"]), rate,
        BINDS.get(b["binds"], b["binds"]) if served else _missed(b, summary["subject"]),
        _top_two(b["elasticities"]) if b.get("elasticities") else "-",
        "-" if c is None or c["batch"] is None else
        f"B {c['batch']:,}, {_ms(c['loaded_token_gap_s'])} ms, "
        f"{_rate(c['aggregate_tokens_per_s'])} tok/s "
        f"({BINDS.get(c['binds'], c['binds']).split(' (')[0]}); " + calibrated_error(c)])
  return rows


def calibrated_error(c: dict[str, Any]) -> str:
  """The held-out error beside a calibrated prediction, and the bound's on the same data."""
  cal, top = c.get("profile_heldout_median_rel_error"), c.get("profile_heldout_max_rel_error")
  bound = c.get("bound_heldout_median_rel_error")
  text = ("held-out error unknown" if cal is None else
          f"held-out error {cal:.0%} median" + ("" if top is None else f", {top:.0%} max"))
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
    return (f"1% more bandwidth cuts the step {bw:.2f}%; a faster FLOP rate "
            + ("would not move it" if flops < 0.005 else f"{flops:.2f}%"))
  return (f"compute binds: 1% more FLOP/s cuts the step {flops:.2f}%; more bandwidth "
          + ("would not move it" if bw < 0.005 else f"{bw:.2f}%"))


def what_moves_lines(summary: dict[str, Any]) -> list[str]:
  """Bullets: the best accelerator's limits, elasticities and dtype what-ifs."""
  best = next((e for e in summary["accelerators"] if e["accelerator"] == summary["best"]), None)
  if best is None:
    return ["No listed accelerator serves it at these targets, on one chip or on the fewest "
            "chips that hold it: see the multi-chip section (`python -m experiments.plan` "
            "searches layouts, batches and dtypes)."]
  b = best["bound"]
  gap_limit, memory_limit = summary["best_token_gap_only_batch"], b["memory_limit_batch"]
  lines = [
      f"- On {best['accelerator']}"
      + ("" if best["chips"] == 1 else f" ({best['layout_name']}, {best['chips']} chips)")
      + f": the token gap alone would allow B <= {gap_limit:,}, memory "
      f"alone B <= {memory_limit:,} ({best['weights_gb']:,.1f} GB weights, "
      f"{best['kv_allocated_gb_per_sequence']:,.3f} GB allocated K/V per sequence, "
      f"{best['memory_gb']:,.0f} GB a chip less 10% workspace); the smaller is the answer.",
      "- The step's elasticities d ln(step)/d ln(x) at that batch: "
      + ", ".join(f"{k} {v:+.2f}" for k, v in b["elasticities"].items() if abs(v) >= 0.005)
      + f" ({_ceiling_words(b['elasticities'])}).",
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
