"""The planner's ranked plans as table rows: one table for `experiments.plan` and the report.

Prices add the cost columns and a simulated check (`serving.plan_check`) the
p90 columns and the replicas the simulator needed; without them those columns are left
out.
"""

from __future__ import annotations

from typing import Any

_BASE = ("rank", "accelerator", "chips", "pools", "tp", "pp", "ep", "dp", "max_running",
         "scheduler", "weights", "K/V", "rate/replica", "gap ms", "TTFT p90 ms")
_COST = ("$/h", "$/Mtok")
_SIMULATED = ("sim replicas", "sim p90 TTFT/TPOT ms", "sim p99 ITL ms", "meets")
_ENGINE = ("tok/s/chip", "bound tok/s/chip")  # An engine's prediction, the bound beside.


def _cell(value: float | None, fmt: str) -> str:
  return "-" if value is None else format(value, fmt)


def _pools(pools: dict[str, Any]) -> str:
  if pools["kind"] == "shared":
    return "shared"
  pre = pools["prefill"]
  return (f"split {pools['prefill_chips']}+{pools['decode_chips']} "
          f"(prefill tp{pre['tp']}x{pre['replicas']})")


def _scheduler(p: dict[str, Any]) -> str:
  return p["scheduler"] + ("" if p.get("token_budget") is None else f" {p['token_budget']}")


def plan_rows(result: dict[str, Any]) -> tuple[tuple[str, ...], list[list[Any]]]:
  """Headers and one row per plan of `planner.plan`'s result, in rank order."""
  priced = bool(result.get("prices_per_hour"))
  simulated = "simulation" in result
  engine = result.get("kind") == "calibrated"
  headers = (_BASE + (_COST if priced else ()) + (_ENGINE if engine else
                                                  ()) + (_SIMULATED if simulated else ()))
  rows = []
  for p in result["plans"]:
    merged = "".join(f" (= {m['weight_dtype']}/{m['kv_dtype']})" for m in p["merged"])
    row = [
        p["rank"] if priced or result.get("chips") else
        f"{p['rank']} ({p['rank_within_accelerator']})", p["accelerator"], p["chips"],
        _pools(p["pools"]), p["tp"], p["pp"], p["ep"], p["dp"], p["max_running"],
        _scheduler(p), p["weight_dtype"], p["kv_dtype"] + merged,
        f"{p['max_rate_per_replica_s']:,.3g}/s", f"{p['loaded_token_gap_s'] * 1e3:,.1f}",
        f"{p['ttft_p90_s'] * 1e3:,.0f}"
    ]
    if priced:
      row += [_cell(p["cost_per_hour"], ",.2f"), _cell(p["cost_per_million_tokens"], ",.3f")]
    if engine:
      row += [
          _cell(p["tokens_per_s_per_chip"], ",.1f"),
          _cell(p.get("bound_tokens_per_s_per_chip"), ",.1f")
      ]
    if simulated:
      s = p.get("simulated")
      if s is None:
        row += ["-", "-", "-", "-"]
      else:
        row += [
            _replicas(s), "-" if s["ttft_p90_s"] is None else
            f"{s['ttft_p90_s'] * 1e3:,.0f} / {s['tpot_p90_s'] * 1e3:,.1f}",
            _cell(None if s["itl_p99_s"] is None else s["itl_p99_s"] * 1e3,
                  ",.1f"), "yes" if s["meets"] else "MISSES"
        ]
    rows.append(row)
  return headers, rows


def _replicas(s: dict[str, Any]) -> str:
  need = s.get("replicas_needed")
  if need is None:
    return "none meets"
  if isinstance(need, dict):
    return f"{need['prefill']}+{need['decode']}"
  return f"{need}"


def header_lines(result: dict[str, Any]) -> list[str]:
  """What was asked and how much was searched: shared configurations and split pairs
  counted apart."""
  work, targets = result["workload"], result["targets"]
  load = ("" if work["arrival_rate_per_s"] is None else
          f", {work['arrival_rate_per_s']:,.4g} requests/s "
          f"({work['output_tokens_per_s']:,.0f} output tokens/s)")
  fleet = "" if result.get("chips") is None else f", a fixed fleet of {result['chips']} chips"
  ttft_q, itl_q = targets.get("ttft_quantile", 0.9), targets.get("itl_quantile", 0.99)
  itl = ("" if itl_q is None else f", the p{100 * itl_q:g} inter-token gap within the token gap")
  what = result.get("engine_label") or "analytic bound"
  return [
      f"{result['model']} at {result['context']} tokens, {work['prompt_tokens']} in / "
      f"{work['output_tokens']} out{load}{fleet}: targets {targets['token_gap_s'] * 1e3:g} ms "
      f"mean token gap, {targets['ttft_s'] * 1e3:g} ms TTFT p{100 * ttft_q:g}{itl} ({what}, "
      f"the load model; searched in {result['wall_s']:.2f} s on this CPU); ranked by "
      f"{result['ranked_by']}",
      f"can meet the targets at some size: {result['meeting']:,} of {result['searched']:,} "
      f"shared configurations (layout x bytes x running sequences); "
      f"{result['split_meeting']:,} of {result['split_searched']:,} split prefill/decode "
      "layout pairs"
  ]


def footer_lines(result: dict[str, Any]) -> list[str]:
  """What the columns mean, and what the simulated check ran."""
  lines = []
  if not result["prices_per_hour"] and not result.get("chips"):
    lines.append("no prices: rank (rank within its accelerator); chips of different kinds are "
                 "not compared (give prices per hour to rank by cost)")
  lines.append("max_running: the running sequences to give the engine (its largest max "
               "rate); rate/replica: that max rate; split: prefill + decode chips, tp..rate the "
               "decode pool's (the JSON's pools has both and the K/V transfer)")
  return lines + engine_lines(result) + simulation_lines(result)


def engine_lines(result: dict[str, Any]) -> list[str]:
  """An engine's plans: what they predict with, and the bound's best plan beside."""
  if result.get("kind") != "calibrated":
    return []
  best = (result.get("bound") or {}).get("best")
  bound = ("none meets" if best is None else
           f"{best['accelerator']} tp{best['tp']} pp{best['pp']} ep{best['ep']} x{best['dp']} "
           f"({best['chips']} chips, max_running {best['max_running']}), "
           f"{best['tokens_per_s_per_chip']:,.1f} tokens/s per chip" +
           ("" if best["cost_per_million_tokens"] is None else
            f", ${best['cost_per_million_tokens']:,.3f}/Mtok"))
  return [
      f"prediction: {result['engine_label']}; every figure above is the engine's (its step, "
      "scheduler defaults, running cap and memory reservation); bound tok/s/chip: the bound's "
      "plan of the same layout and bytes (- where the bound's list has none)",
      f"bound beside: the same question as an analytic bound: {bound}"
  ]


def no_plan_line(result: dict[str, Any]) -> str:
  """One line when no configuration meets the targets: the closest plan and what it
  misses."""
  closest = result.get("closest") or {}
  dropped = result.get("simulation", {}).get("dropped") or []
  if dropped:
    return (f"no plan meets the targets in simulation: {len(dropped)} simulated, none met at "
            f"any size tried (first: {dropped[0]['line']})")
  return ("no configuration meets the targets: " +
          (closest.get("line") or "relax the token gap, TTFT or rate, or allow more chips, "
           "formats or accelerators"))


def simulation_lines(result: dict[str, Any]) -> list[str]:
  """What the simulated check ran (`serving.plan_check.check_top`), and how many drawn
  lengths fell beyond the context, resampled or clipped."""
  sim = result.get("simulation")
  if not sim:
    return []
  lines = [
      f"top {sim['top_k']} simulated and sized ({sim['requests_rule']}, seeds "
      f"{sim['seed']}..{sim['seed'] + sim['seeds'] - 1}, {sim['wall_s']:.1f} s): each plan's "
      "own scheduler; sim replicas: the fewest whose p90 TTFT, p90 TPOT and p99 inter-token "
      "gap meet the targets in every seed; the worst seed's figures there" +
      (f"; dropped (no size met): {len(sim['dropped'])}" if sim.get("dropped") else "")
  ]
  lengths = sim.get("lengths", {})
  if {lengths.get("prompt_distribution"), lengths.get("output_distribution")} != {"fixed"}:
    runs = [r for p in result["plans"] if p.get("simulated") for r in p["simulated"]["runs"]]
    beyond = [r["beyond_context"] for r in runs if r.get("beyond_context")]
    if beyond:
      count = sum(b["requests_beyond"] for b in beyond)
      lines.append(f"lengths: prompts {lengths['prompt_distribution']}, outputs "
                   f"{lengths['output_distribution']}; {count:,} drawn requests were beyond the "
                   f"{result['context']:,}-token context and "
                   f"{'drawn again' if beyond[0]['policy'] == 'resample' else 'clipped'} "
                   "(the search uses the requested means)")
  return lines
