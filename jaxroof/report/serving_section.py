"""Serving: the frontier plot, request tables and the report section.

Everything here is an analytic bound unless a calibrated profile was given
(the caller's JSON says which); TTFT figures are M/D/1 means. The section
renders `jaxroof.serving.decision_study`'s results.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxroof.report import plots
from jaxroof.report import table
from jaxroof.serving import elasticity
from jaxroof.symbolic import prefill as prefill_formulas

REQUEST_HEADERS = ("batch", "prefill ms", "TTFT ms", "token gap ms", "e2e s",
                   "aggregate tok/s (B/gap)", "per-seq tok/s", "moved by")
PEER_HEADERS = ("batch", "prefill s (ours)", "prefill s (peer)", "mean step ms (ours)",
                "mean step ms (peer)", "total s (ours)", "total s (peer)", "total ratio")
_LABEL = {"bound": "analytic bound", "calibrated": "calibrated prediction"}


def request_cells(rows: Sequence[dict[str, Any]]) -> list[list[str]]:
  """Display cells of request rows; "unstable" where the load leaves a value undefined."""

  def ms(value: float | None) -> str:
    return "unstable" if value is None else f"{value * 1e3:,.2f}"

  def rate(value: float | None) -> str:
    return "unstable" if value is None else f"{value:,.1f}"

  out = []
  for row in rows:
    batch = f"{row['batch']}" + (" (no fit)" if row.get("fits_in_memory") is False else "")
    out.append([
        batch, f"{row['prefill_s'] * 1e3:,.2f}",
        ms(row["ttft_s"]),
        ms(row["mean_token_gap_s"]), "unstable" if row["e2e_s"] is None else f"{row['e2e_s']:,.3f}",
        rate(row["aggregate_tokens_per_s"]),
        rate(row["per_sequence_tokens_per_s"]),
        row.get("moved_by", "")
    ])
  return out


def peer_cells(rows: Sequence[dict[str, Any]]) -> list[list[str]]:
  """Display cells of `serving.peer.compare` rows."""
  return [[
      f"{r['batch']}", f"{r['jaxroof_prefill_s']:.4f}", f"{r['peer_prefill_s']:.4f}",
      f"{r['jaxroof_mean_step_s'] * 1e3:.3f}", f"{r['peer_mean_step_s'] * 1e3:.3f}",
      f"{r['jaxroof_total_s']:.4f}", f"{r['peer_total_s']:.4f}", f"{r['total_ratio']:.3f}"
  ] for r in rows]


def decision_lines(decision: dict[str, Any]) -> list[str]:
  """The decision in words."""
  if decision["batch"] is None:
    return [f"decision: {decision['status']} ({decision['binds']} binds): {decision['reason']}"]
  point = decision.get("operating_point") or {}
  budget = decision.get("token_budget")
  scheduling = (f"{decision.get('scheduler')} scheduler" +
                (f", {budget}-token budget" if budget else ", whole prompts per iteration"))
  lines = [
      f"decision: max_running {decision['batch']} (the running sequences with the largest max "
      f"rate; {scheduling}; {decision['binds']} binds the max rate; status "
      f"{decision['status']}{': ' + decision['reason'] if decision['reason'] else ''})",
      f"  max rate {decision['max_arrival_rate_per_s']:.4g} requests/s per replica (load model: "
      f"mean gap, p90 TTFT, p99 inter-token gap within the targets); its slots fill at "
      f"{decision['slot_capacity_per_s']:.4g}/s when all are held",
      f"  mean step {decision['step_s'] * 1e3:.3f} ms unloaded at {decision['batch']} running; "
      f"{decision['aggregate_tokens_per_s']:,.0f} tokens/s aggregate, "
      f"{decision['per_sequence_tokens_per_s']:,.1f} per sequence",
      f"  limits: unloaded step within the gap for B <= {decision['token_gap_limit_batch']}, "
      f"memory B <= "
      f"{decision['memory_limit_batch'] if decision['memory_limit_batch'] is not None else 'n/a'}",
  ]
  if decision.get("elasticities"):
    lines.append(f"  moved by: {elasticity.moved_by(decision['elasticities'])}; elasticities " +
                 ", ".join(f"{k} {v:+.3f}" for k, v in decision["elasticities"].items()))
  if point.get("running_batch") is not None and point.get("arrival_rate_per_s"):
    lines.append(
        f"operating point at {point['arrival_rate_per_s']:g} requests/s: "
        f"{point['running_batch']:.1f} sequences running, token gap "
        f"{point['token_gap_s'] * 1e3:.3f} ms (mean), TTFT {point['ttft_s'] * 1e3:.2f} ms mean / "
        f"{point['ttft_p90_s'] * 1e3:.2f} ms p90{_slot_note(point)}, p99 inter-token gap "
        f"{point['itl_p99_s'] * 1e3:.2f} ms")
  elif point.get("reason"):
    lines.append(f"operating point: {point['reason']}")
  return lines


def _slot_note(point: dict[str, Any]) -> str:
  if point.get("slot_wait_s") is None:
    return ""
  return (f" (mean waits: {point['slot_wait_s'] * 1e3:.2f} ms for a slot, "
          f"{(point.get('prefill_wait_s') or 0.0) * 1e3:.2f} ms for the prefill; "
          f"{point['slot_utilisation']:.0%} of the slots held)")


def plot_frontier(frontier: dict[str, Any], decision: dict[str, Any], path: str, title: str, *,
                  kind: str = "bound", token_gap_s: float | None = None,
                  memory_limit: int | None = None) -> None:
  """Aggregate tokens/s against per-sequence tokens/s over batch, decision marked."""
  plt = plots.pyplot()

  per_seq = np.asarray(frontier["per_sequence_tokens_per_s"])
  agg = np.asarray(frontier["aggregate_tokens_per_s"])
  batch = np.asarray(frontier["batch"], dtype=int)
  fig, ax = plt.subplots(figsize=(7.5, 5))
  fits = np.ones_like(batch, dtype=bool) if memory_limit is None else batch <= memory_limit
  ax.plot(per_seq, agg, "-", color="tab:blue", alpha=0.5)
  ax.plot(per_seq[fits], agg[fits], "o", color="tab:blue",
          label="batch" if memory_limit is None else "batch that fits in memory")
  if (~fits).any():
    ax.plot(per_seq[~fits], agg[~fits], "x", color="red", markersize=8,
            label=f"does not fit (B > {memory_limit})")
  if memory_limit is not None and memory_limit in batch:
    at = int(np.nonzero(batch == memory_limit)[0][0])
    ax.axvline(per_seq[at], color="red", linestyle=":",
               label=f"memory limit: B = {memory_limit} ({per_seq[at]:,.0f} tok/s per sequence)")
  for b, x, y in zip(batch, per_seq, agg):
    if b == memory_limit or b == decision.get("batch"):
      continue
    ax.annotate(f"{b}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
  if token_gap_s is not None:
    # The frontier is unloaded; at the load, prefills stretch each gap by 1/(1 - rho).
    # Unstable (rho None): no loaded gap exists, the target is drawn unloaded and says so.
    rho = decision.get("utilisation")
    share = 0.0 if rho is None else rho
    rate = 1 / (token_gap_s * (1 - share)) if share < 1 else None
    if rate is not None:
      load = (" (unloaded: the load is unstable)"
              if rho is None else f", prefills take {rho:.0%} of the chip" if rho > 0 else "")
      ax.axvline(rate, color="tab:orange", linestyle="--",
                 label=f"token-gap target {token_gap_s * 1e3:g} ms{load} (x = {rate:,.0f})")
  if decision.get("batch") is not None:
    ax.plot([decision["per_sequence_tokens_per_s"]], [decision["aggregate_tokens_per_s"]], "*",
            color="tab:green", markersize=16,
            label=f"decision: B = {decision['batch']} ({decision['binds']} binds)")
  ax.set_xlabel("per-sequence tokens/s (1 / mean decode step)")
  ax.set_ylabel("aggregate tokens/s (batch / mean decode step)")
  ax.set_xlim(left=0)
  ax.set_ylim(bottom=0)
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize=8, loc="upper right")
  ax.set_title(f"{title}\n({_LABEL.get(kind, kind)}; batch labels on points)", fontsize=10)
  plots.save(fig, path)


def _ms_or(value: float | None) -> str:
  return "unstable" if value is None else f"{value * 1e3:.2f}"


def _lesson_table(decisions: Sequence[dict[str, Any]]) -> str:
  rows = [[
      f"{d['token_gap_s'] * 1e3:g}", f"{d['batch']}", d["binds"], f"{d['step_s'] * 1e3:.3f}",
      f"{d['aggregate_tokens_per_s']:,.0f}", f"{d['per_sequence_tokens_per_s']:.1f}"
  ] for d in decisions]
  return table.markdown_table(
      ("token gap ms", "batch", "binds", "step ms", "aggregate tok/s", "per-seq tok/s"), rows)


def _pools_sentence(study: dict[str, Any]) -> str:
  pool = study["pools"]
  split, shared = pool["split"], pool["shared"]
  return (f"At {pool['arrival_rate_per_s']:g} requests/s: split pools need " +
          (f"{split['chips']} chips ({split['prefill_chips']} prefill + {split['decode_chips']} "
           f"decode), {split['goodput_per_chip']:.1f} requests/s per chip"
           if split["feasible"] else "no feasible split") + "; one shared pool needs " +
          (f"{shared['chips']} chips (batch {shared['batch']}), "
           f"{shared['goodput_per_chip']:.1f} requests/s per chip"
           if shared["feasible"] else "more chips than searched") + ". A shared pool wins with " +
          "; ".join(study["shared_wins"]) + ". The split wins with " +
          "; ".join(study["split_wins"]) + ".")


def report_section(out_dir: str, study: dict[str, Any], lesson: Sequence[dict[str, Any]],
                   elasticities: Sequence[dict[str, Any]]) -> str:
  """The serving decision: the lesson's, a real model's frontier, prefill vs decode, pools,
  elasticities (`jaxroof.serving.decision_study`'s `lesson_decisions`, `study` and
  `lesson_elasticities`); writes the frontier plot into `out_dir`."""
  d, outputs = study["decision"], study["output_tokens"]
  lines = [
      "## Serving: the decision from both rates (analytic bounds; the load model's means and p90)",
      "", "The lesson's decision (16 GB of BF16 weights, 0.25 GB of K/V per sequence, 2 TB/s): "
      "the number of running sequences with the largest max rate at the token-gap target.", "",
      _lesson_table(lesson), ""
  ]
  layout, chips = study["layout"], study["chips"]
  where = "" if chips == 1 else (
      f" (tp{layout['tp']} pp{layout['pp']} ep{layout['ep']}, {chips} chips)")
  title = (f"{study['model']} on {study['accelerator']}{where}, prompt "
           f"{study['prompt_tokens']:,} + {outputs} outputs, {study['weight_dtype']} weights, "
           f"{study['kv_dtype']} K/V")
  plot_frontier(study["frontier"], d, os.path.join(out_dir, "serving_frontier.png"), title,
                token_gap_s=study["token_gap_s"], memory_limit=study["max_batch_in_memory"])
  lines += [
      f"### {title}", "",
      f"Targets: {study['token_gap_s'] * 1e3:g} ms token gap, {study['ttft_s'] * 1e3:g} ms "
      f"TTFT, at {study['arrival_rate_per_s']:.3g} requests/s with a "
      f"{study['window_s'] * 1e3:g} ms batching window. " +
      (f"Decision: max_running {d['batch']} ({d['binds']} binds the max rate), mean step "
       f"{d['step_s'] * 1e3:.2f} ms ({_ms_or(d['loaded_token_gap_s'])} ms with prefills at "
       f"this load), {d['aggregate_tokens_per_s']:,.0f} tokens/s aggregate, "
       f"{d['per_sequence_tokens_per_s']:.1f} per sequence; TTFT " +
       ("unstable" if d["ttft_s"] is None else f"{d['ttft_s'] * 1e3:.1f} ms (mean)") +
       f"; max rate {d['max_arrival_rate_per_s']:.1f} requests/s."
       if d["batch"] is not None else " ".join(decision_lines(d))) +
      f" Rows: a static batch of B requests (prefill of all B prompts, then {outputs - 1} "
      "decode steps); TTFT for one prompt prefilled on arrival.", "",
      table.markdown_table(REQUEST_HEADERS[:-1], [c[:-1] for c in request_cells(study["rows"])]),
      "", "![serving frontier](serving_frontier.png)", ""
  ]

  cross = study["crossovers"]
  decode_cross = cross["decode_sequences_per_step"]
  lines += [
      "### Prefill and decode tuned apart", "",
      f"Prefill turns compute-bound at about {cross['prefill_tokens_per_step_linear']:,.0f} "
      f"prompt tokens per step (linear layers, R*q/2; "
      f"{cross['prefill_tokens_per_step_with_attention']:,.0f} with causal attention and K/V "
      "writes); decode " +
      ("never does at this context: each sequence adds more K/V time than compute time"
       if decode_cross is None else f"at {decode_cross:,.0f} sequences per step") +
      f". Attention FLOPs overtake the linear FLOPs past a "
      f"{cross['attention_overtakes_linear_at_prompt']:,.0f}-token prompt. "
      "So prefill wants a few hundred tokens per step, decode as many sequences as the "
      "token gap and memory allow.", "",
      _pools_sentence(study), ""
  ]

  el_rows = [[f"{e['batch']}"] + [f"{e['elasticities'][n]:+.3f}"
                                  for n in elasticity.INPUT_NAMES] + [e["moved_by"]]
             for e in elasticities]
  lines += [
      "### What moves the step: the lesson's 0.5 GB case", "",
      "Elasticities d ln(step)/d ln(x) from `jax.grad` of the lambdified step (16 GB weights, "
      "0.5 GB K/V per sequence, 2 TB/s, 600 TFLOP/s). Memory binds at every batch, so the "
      "elasticity to F is exactly 0: faster arithmetic alone would not move the step; "
      "bandwidth moves it one for one (-1), and the K/V share grows with batch.", "",
      table.markdown_table(("batch",) + elasticity.INPUT_NAMES + ("moved by",), el_rows), "",
      "Prefill convention: linear FLOPs 2*N_act*P*B; causal attention over the lower "
      "triangle, 2*L*H*d*P*(P+1) per sequence for QK^T and PV (softmax omitted); weights "
      "read once, K/V written; floor = max(memory, compute) "
      "(`jaxroof.symbolic.prefill`); attention overtakes the linear FLOPs at "
      f"P = `{prefill_formulas.attention_overtakes_linear_prompt()}` (A_f: attention FLOPs "
      "per (query, key) pair over all blocks, 4*L*H*d for full attention)."
  ]
  return "\n".join(lines)
