"""The lines `experiments.bench` prints for each benchmark's JSON document."""

from __future__ import annotations

from typing import Any


def _sweep(result: dict[str, Any]) -> list[str]:
  lines = [
      f"{name:12s} {r['points_per_s']:>16,.0f} points/s" for name, r in result["backends"].items()
  ]
  return lines + [
      f"grid: {result['points']:,} (batch, context) points; points_per_s (numpy) "
      f"= {result['points_per_s']:,.0f}"
  ]


def _cpu(seconds: list[float] | None) -> str:
  """The CPU seconds of the timed calls (median), where recorded."""
  if not seconds:
    return ""
  ordered = sorted(seconds)
  return f"; CPU {ordered[len(ordered) // 2]:.2f} s median"


def _plan(result: dict[str, Any]) -> list[str]:
  whole, evaluation = result["plan_timing"], result["evaluate_timing"]
  question = result["question"]["timing"]
  load = result.get("load_avg_1m")
  return [
      f"the 70B question with its top 5 simulated and sized: {question['median_s']:.2f} s "
      f"median (min {question['min_s']:.2f}, max {question['max_s']:.2f}"
      f"{_cpu(result['question'].get('cpu_s'))})",
      f"{result['searched']:,} configurations (shared and split pairs): plan "
      f"{whole['median_s']:.2f} s median (min {whole['min_s']:.2f}, max {whole['max_s']:.2f}"
      f"{_cpu(result.get('plan_cpu_s'))}; {result.get('evaluated_groups', 0)} groups answered "
      f"by the load model), the cheap pass over the grid alone {evaluation['median_s']:.2f} s" +
      ("" if load is None else f" (load average {load:.1f} at the end)")
  ]


def _simulate(result: dict[str, Any]) -> list[str]:
  requests = result["workload"]["num_requests"]
  return [
      f"{name}: {r['wall_s_median']:.2f} s (min {r['wall_s_min']:.2f}, max "
      f"{r['wall_s_max']:.2f}) for {requests} requests, {r['iterations']} iterations: "
      f"{r['requests_per_s_simulated']:,.0f} requests/s, "
      f"{r['iterations_per_s_simulated']:,.0f} iterations/s simulated"
      for name, r in result["schedulers"].items()
  ]


def _decode(result: dict[str, Any]) -> list[str]:
  inputs = result["inputs"]
  lines = [
      f"{inputs['preset']} ({inputs['weights']:,} weights, {result['dtype']}), batch "
      f"{inputs['batch']}: {inputs['new_tokens']} tokens after a {inputs['prompt_len']}"
      f"-token prompt on {result['device']} ({result['backend']})"
  ]
  for name, key in (("with KV cache", "cached"), ("recomputing prefix", "recompute")):
    t = result[key]
    lines.append(f"  {name:<19} median {t['median_s']:.3f} s (min {t['min_s']:.3f}, max "
                 f"{t['max_s']:.3f}; {t['repeats']} runs)")
  same = "identical" if result["outputs_match"] else "differ"
  return lines + [f"  speedup {result['speedup']:.1f}x (measured); greedy outputs {same}."]


_LINES = {
    "bench_sweep": _sweep, "bench_plan": _plan, "bench_simulate": _simulate, "bench_decode": _decode
}


def lines(result: dict[str, Any]) -> list[str]:
  """What a benchmark's result says, one line per figure (its `experiment` picks the form)."""
  return _LINES[result["experiment"]](result)
