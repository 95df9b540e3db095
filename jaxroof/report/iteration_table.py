"""One iteration's terms as a result (JSON) and a table (the `iteration` experiment)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxroof.report import table
from jaxroof.symbolic import cost_model

UNITS = {"bytes": "B", "flops": "FLOP", "s": "s"}
HEADERS = ("operation", "bytes", "FLOPs", "memory ms", "compute ms", "roofline ms", "binds")


def result(*, model: str, accelerator: str, layout: Mapping[str, Any], bound: str,
           mix: Mapping[str, Any], terms: Mapping[str, float], assumptions: list[str],
           weight_dtype: str, kv_dtype: str) -> dict[str, Any]:
  """The JSON: `step_s` and `terms` (name to seconds, bytes or FLOP), with the mix."""
  return {
      "experiment": "iteration", "kind": "bound",
      "label": f"analytic bound ({bound}), datasheet figures of {accelerator}", "model": model,
      "accelerator": accelerator, "layout": dict(layout), "bound": bound,
      "weight_dtype": weight_dtype, "kv_dtype": kv_dtype, "step_s": terms["step_s"],
      "terms": dict(terms), "units": {
          name: UNITS[name.rsplit("_", 1)[-1]] for name in terms if name.rsplit("_", 1)[-1] in UNITS
      }, "mix": {name: float(value) for name, value in mix.items()
                }, "assumptions": [cost_model.ASSUMPTIONS[bound], *assumptions]
  }


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
      f"{out['model']} on {out['accelerator']} ({out['label']}): "
      f"{int(mix['n_dec'])} decode rows, {int(mix['n_pre'])} prompt tokens",
      table.format_table(HEADERS, rows),
      f"communication {t['comm_s'] * 1e3:,.4f} ms; step {out['step_s'] * 1e3:,.4f} ms "
      f"({'sum of the operations' if out['bound'] == 'per_op' else 'one roofline'}"
      " plus communication)"
  ]
  lines += [f"assumes: {a}" for a in out["assumptions"]]
  return "\n".join(lines)
