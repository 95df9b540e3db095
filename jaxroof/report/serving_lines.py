"""What `experiments.serving` prints and plots: its request table, decision, pools,
percentiles and the rate frontier."""

from __future__ import annotations

from typing import Any

from jaxroof.report import accuracy
from jaxroof.report import serving_section
from jaxroof.report import table
from jaxroof.serving import requests

_LABEL = {"bound": "analytic bound", "calibrated": "calibrated prediction"}


def pools_line(p: dict[str, Any]) -> str:
  """The split-vs-shared answer in GPUs (a replica is tp*pp*ep of them)."""
  per = p["chips_per_replica"]
  unit = "" if per == 1 else f" (a replica is {per} GPUs)"
  split, shared = p["split"], p["shared"]
  a = (f"split {split['prefill_gpus']} prefill + {split['decode_gpus']} decode = "
       f"{split['gpus']} GPUs (K/V transfer {split['kv_transfer_s'] * 1e3:.3g} ms)"
       if split["feasible"] else f"split infeasible ({split['reason']})")
  b = (f"shared {shared['gpus']} GPUs"
       if shared["feasible"] else f"shared infeasible ({shared['reason']})")
  return (f"  pools at {p['arrival_rate_per_s']:g} requests/s{unit}: {a}; {b}; fewer: "
          f"{p['fewer_chips'] or 'neither'} ({p['kv_transfer']['note']})")


def percentiles_line(out: dict[str, Any], arrival_rate: float, batch: int) -> str:
  """The simulator's TTFT and ITL percentiles at the decision."""
  ttft, itl = out["metrics"]["ttft_s"], out["metrics"]["itl_s"]
  return (f"simulated ({out['num_requests']} requests at {arrival_rate:g}/s per replica, "
          f"at most {batch} running): TTFT median/p90/p99 {ttft['median'] * 1e3:.1f}/"
          f"{ttft['p90'] * 1e3:.1f}/{ttft['p99'] * 1e3:.1f} ms; ITL "
          f"{itl['median'] * 1e3:.2f}/{itl['p90'] * 1e3:.2f}/{itl['p99'] * 1e3:.2f} ms")


def bound_first_lines(bound_decision: dict[str, Any]) -> list[str]:
  """The bound's decision, shown before a profile whose held-out error is the larger."""
  return ([
      "Analytic bound, shown first (the profile's held-out error is larger than the "
      "bound's on the same data):"
  ] + serving_section.decision_lines(bound_decision) + [""])


def _pair(decision: dict[str, Any], key: str, scale: float, fmt: str) -> str:
  value, bound = decision.get(key), decision.get("bound_" + key)
  shown = "-" if value is None else format(value * scale, fmt)
  return shown + " (bound " + ("-" if bound is None else format(bound * scale, fmt)) + ")"


def engine_lines(result: dict[str, Any]) -> list[str]:
  """An engine's decision beside the bound's answer to the same question."""
  if not result.get("engine"):
    return []
  d = result["decision"]
  return [
      f"prediction: {result['engine_label']}; {result['engine_rules']}",
      f"  beside the bound: max rate {_pair(d, 'max_arrival_rate_per_s', 1, '.4g')} requests/s "
      f"per replica; max_running {_pair(d, 'batch', 1, 'g')}; step "
      f"{_pair(d, 'step_s', 1e3, '.3f')} ms; TTFT p90 {_pair(d, 'ttft_p90_s', 1e3, ',.0f')} ms "
      f"(with t0_request {result['t0_request_s'] * 1e3:.3g} ms); "
      f"{_pair(d, 'fleet_aggregate_tokens_per_s', 1, ',.0f')} tokens/s"
  ]


def lines(result: dict[str, Any]) -> list[str]:
  """The serving result as a user reads it: what was asked, one row per batch, the
  decision, the error of a calibrated profile, the layout, pools and the peer's rows."""
  inputs, decision, rows = result["inputs"], result["decision"], result["requests"]
  provenance = result.get("profile")
  out = [
      f"Serving {inputs['label']}: prompt {inputs['prompt_tokens']}, "
      f"{inputs['output_tokens']} outputs, {inputs['arrival_rate_per_s']:g} requests/s "
      f"({_LABEL[result['kind']]}; rows: a static batch, TTFT M/D/1; decision: the load model)"
  ]
  headers, cells = serving_section.REQUEST_HEADERS, serving_section.request_cells(rows)
  if provenance is not None:
    headers = tuple(headers) + (accuracy.HEADER,)
    cells = [c + [accuracy.cell(provenance)] for c in cells]
  out += [table.format_table(headers, cells)] + serving_section.decision_lines(decision)
  if provenance is not None:
    out += accuracy.footnote_lines(provenance)
  out += engine_lines(result)
  if decision.get("comm_s") is not None:
    out.append(f"  layout: {decision['chips']} chips ({decision['replicas']} replica(s)); "
               f"communication {decision['comm_s'] * 1e3:.3f} ms of each step at the decision "
               "(serial; the elasticities are the step's floor without it); fleet "
               f"{decision['fleet_aggregate_tokens_per_s']:,.0f} tokens/s, max rate "
               f"{decision['fleet_max_arrival_rate_per_s']:.4g} requests/s")
  if "pools" in result:
    out.append(pools_line(result["pools"]))
  if "peer" in result:
    out.append(
        table.format_table(serving_section.PEER_HEADERS,
                           serving_section.peer_cells(result["peer"]["rows"])))
  if "percentiles" in result:
    out.append(
        percentiles_line(result["percentiles"], inputs["arrival_rate_per_replica_s"],
                         decision["batch"]))
  return out


def annotate_calibrated(result: dict[str, Any], provenance: dict[str, Any]) -> None:
  """Puts the profile and its held-out error beside every calibrated number of a serving
  result (the JSON): the error travels with the number."""
  result["profile"] = dict(provenance)
  result["accuracy"] = accuracy.fields(provenance)
  for row in result["requests"] + [result["decision"]]:
    row[accuracy.ROW_FIELD] = accuracy.row_error(provenance)


def plot_frontier(frontier: dict[str, Any], kind: str, inputs: requests.ServingInputs,
                  question: Any, decision: dict[str, Any], path: str) -> None:
  """Writes the rate frontier around the decision (`serving_result.frontier`) as a PNG."""
  prompt, outputs = question.prompt_tokens, question.output_tokens
  serving_section.plot_frontier(frontier, decision, path,
                                f"{inputs.label}\nprompt {prompt} + {outputs} outputs", kind=kind,
                                token_gap_s=question.token_gap_s,
                                memory_limit=inputs.max_batch_in_memory)
