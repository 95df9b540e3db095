"""One iteration's terms as a result (JSON) and a table (the `iteration` experiment)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxroof.report import table
from jaxroof.symbolic import cost_model

UNITS = {"bytes": "B", "flops": "FLOP", "s": "s"}
HEADERS = ("operation", "bytes", "FLOPs", "memory ms", "compute ms", "roofline ms", "binds")

ERRORS = ("median_rel_error", "p90_rel_error", "max_rel_error")


def result(*, model: str, accelerator: str, layout: Mapping[str,
                                                            Any], bound: str, mix: Mapping[str,
                                                                                           Any],
           terms: Mapping[str, float], assumptions: list[str], weight_dtype: str, kv_dtype: str,
           engine: tuple[Mapping[str, Any], Mapping[str, float]] | None = None) -> dict[str, Any]:
  """The JSON: `step_s` (the engine's prediction, or the bound), `bound_step_s`, `kind`,
  `engine`, `heldout_error`, and `terms` (the bound's, name to seconds, bytes or FLOP)
  with the mix; an engine's own terms under `engine_terms`."""
  out = {
      "experiment": "iteration", "kind": "bound", "engine": "bound",
      "label": f"analytic bound ({bound}), datasheet figures of {accelerator}", "model": model,
      "accelerator": accelerator, "layout": dict(layout), "bound": bound,
      "weight_dtype": weight_dtype, "kv_dtype": kv_dtype, "step_s": terms["step_s"],
      "bound_step_s": terms["step_s"], "heldout_error": None, "terms": dict(terms), "units": {
          name: UNITS[name.rsplit("_", 1)[-1]] for name in terms if name.rsplit("_", 1)[-1] in UNITS
      }, "mix": {name: float(value) for name, value in mix.items()
                }, "assumptions": [cost_model.ASSUMPTIONS[bound], *assumptions]
  }
  if engine is not None:
    provenance, calibrated = engine
    out.update(kind="calibrated", engine=provenance["engine"], label=provenance["label"],
               step_s=calibrated["step_s"], engine_terms=dict(calibrated),
               heldout_error={k: provenance.get(f"heldout_{k}") for k in ERRORS},
               derived_entry=provenance["derived"], engine_rule=provenance["rule"])
  return out


def text(out: Mapping[str, Any]) -> str:
  """The operations table, then the step and its sum."""
  t = out["terms"]
  rows = []
  for op in cost_model.OPERATIONS:
    memory, compute = t[f"{op}_memory_s"], t[f"{op}_compute_s"]
    rows.append([
        op, f"{t[f'{op}_bytes']:,.4g}", f"{t[f'{op}_flops']:,.4g}", f"{memory * 1e3:,.4f}",
        f"{compute * 1e3:,.4f}", f"{t[f'{op}_s'] * 1e3:,.4f}",
        "compute" if compute > memory else "memory"
    ])
  mix = out["mix"]
  lines = [
      f"{out['model']} on {out['accelerator']} (analytic bound ({out['bound']}), datasheet "
      "figures): "
      f"{int(mix['n_dec'])} decode rows, {int(mix['n_pre'])} prompt tokens",
      table.format_table(HEADERS, rows),
      f"communication {t['comm_s'] * 1e3:,.4f} ms; bound step {out['bound_step_s'] * 1e3:,.4f} ms "
      f"({'sum of the operations' if out['bound'] == 'per_op' else 'one roofline'}"
      " plus communication)"
  ]
  if out["kind"] == "calibrated":
    e = out["engine_terms"]
    parts = ", ".join(f"{n[:-2]} {e[n] * 1e3:,.4f}" for n in PARTS if n in e)
    lines.append(f"prediction: step {out['step_s'] * 1e3:,.4f} ms, {out['label']} "
                 f"[{parts} ms]; the bound above beside it")
  lines += [f"assumes: {a}" for a in out["assumptions"]]
  return "\n".join(lines)


PARTS = ("weight_s", "kv_s", "compute_s", "attention_s", "fixed_s", "comm_s")
