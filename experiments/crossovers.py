"""Every derived quantity as a closed form (pretty and LaTeX) and, given values, its number.

Crossovers come from `sympy.solve`, the rate limit from `sympy.limit`.
Values are given by symbol name (units: B, s, FLOP, bytes; see jaxroof.symbolic.symbols):

  python -m experiments.crossovers --values=N=8e9,q=2,T=1,k=2.5e8,BW=2e12,F=6e14
"""

from __future__ import annotations

from absl import flags

from experiments import _cli
from jaxroof.symbolic import catalogue
from jaxroof import files
from jaxroof.symbolic.symbols import QUANTITIES

_VALUES = flags.DEFINE_list(
    "values", "N=8e9,q=2,T=1,k=2.5e8,BW=2e12,F=6e14,R=300,B=32,P=3,g=3,L=2,H_kv=2,d=2,b=2,"
    "t_gap=0.012,t_window=0.01,t_queue=0.02",
    "Comma-separated NAME=NUMBER pairs (SI units, each > 0); NAME is one of: "
    + ", ".join(f"{q.symbol} [{q.unit}]" for q in QUANTITIES)
    + ". Default: the lesson's example. Give --values= for closed forms only.")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Write expressions, LaTeX and values here.")


def main(argv: list[str]) -> None:
  del argv  # Unused.
  values = catalogue.parse_values(_VALUES.value)
  items = catalogue.evaluate(values)
  for item in items:
    print(f"{item['name']} [{item['unit']}] ({item['derived_by']}): {item['meaning']}")
    print("  " + item["pretty"].replace("\n", "\n  "))
    print(f"  LaTeX: {item['latex']}")
    if item["value"] is not None:
      print(f"  = {item['value']:,.6g} {item['unit']}")
    elif item["note"]:
      print(f"  no value: {item['note']}")
    else:
      print(f"  no value: give {', '.join(item['missing_symbols'])}")
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, {"kind": "bound", "values": values, "quantities": items})


if __name__ == "__main__":
  _cli.run(main)
