"""The planner's ranked plans as table rows: one table for `experiments.plan` and the report.

Prices add the cost columns and a simulated check (`serving.plan_check`) the
p90 columns; without them those columns are left out.
"""

from __future__ import annotations

from typing import Any

_BASE = ("rank", "accelerator", "chips", "pools", "tp", "pp", "ep", "dp", "batch", "weights", "K/V",
         "gap ms", "TTFT ms")
_COST = ("$/h", "$/Mtok")
_SIMULATED = ("sim p90 TTFT/TPOT ms", "meets")


def _cell(value: float | None, fmt: str) -> str:
  return "-" if value is None else format(value, fmt)


def _pools(pools: dict[str, Any]) -> str:
  if pools["kind"] == "shared":
    return "shared"
  pre = pools["prefill"]
  return (f"split {pools['prefill_chips']}+{pools['decode_chips']} "
          f"(prefill tp{pre['tp']}x{pre['replicas']})")


def plan_rows(result: dict[str, Any]) -> tuple[tuple[str, ...], list[list[Any]]]:
  """Headers and one row per plan of `planner.plan`'s result, in rank order."""
  priced = bool(result.get("prices_per_hour"))
  simulated = "simulation" in result
  headers = _BASE + (_COST if priced else ()) + (_SIMULATED if simulated else ())
  rows = []
  for p in result["plans"]:
    merged = "".join(f" (= {m['weight_dtype']}/{m['kv_dtype']})" for m in p["merged"])
    row = [
        p["rank"] if priced else f"{p['rank']} ({p['rank_within_accelerator']})", p["accelerator"],
        p["chips"],
        _pools(p["pools"]), p["tp"], p["pp"], p["ep"], p["dp"], p["batch"], p["weight_dtype"],
        p["kv_dtype"] + merged, f"{p['loaded_token_gap_s'] * 1e3:,.1f}", f"{p['ttft_s'] * 1e3:,.0f}"
    ]
    if priced:
      row += [_cell(p["cost_per_hour"], ",.2f"), _cell(p["cost_per_million_tokens"], ",.3f")]
    if simulated:
      s = p.get("simulated")
      row += [
          "-" if s is None else f"{s['ttft_p90_s'] * 1e3:,.0f} / {s['tpot_p90_s'] * 1e3:,.1f}",
          "-" if s is None else ("yes" if s["meets"] else "MISSES")
      ]
    rows.append(row)
  return headers, rows


def simulation_lines(result: dict[str, Any]) -> list[str]:
  """What the simulated check ran (`serving.plan_check.check_top`), and how many drawn
  lengths fell beyond the context, resampled or clipped."""
  sim = result.get("simulation")
  if not sim:
    return []
  lines = [
      f"top {sim['top_k']} simulated ({sim['scheduler']} scheduler, {sim['num_requests']} "
      f"requests each, seeds {sim['seed']}..{sim['seed'] + sim['seeds'] - 1}, "
      f"{sim['wall_s']:.1f} s): the worst seed's p90 TTFT / TPOT; a plan that misses in any "
      "seed ranks below the rest"
  ]
  lengths = sim.get("lengths", {})
  if {lengths.get("prompt_distribution"), lengths.get("output_distribution")} != {"fixed"}:
    runs = [r for p in result["plans"] if p.get("simulated") for r in p["simulated"]["runs"]]
    beyond = [r["beyond_context"] for r in runs if r.get("beyond_context")]
    if beyond:
      count = sum(b["requests_beyond"] for b in beyond)
      lines.append(
          f"lengths: prompts {lengths['prompt_distribution']}, outputs "
          f"{lengths['output_distribution']}; {count:,} of {len(runs) * sim['num_requests']:,} "
          f"drawn requests were beyond the {result['context']:,}-token context and "
          f"{'drawn again' if beyond[0]['policy'] == 'resample' else 'clipped'} "
          "(the search uses the requested means)")
  return lines
