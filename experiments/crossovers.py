"""Every derived quantity as a closed form (pretty and LaTeX) and, given values, its number.

Crossovers come from `sympy.solve`, the rate limit from `sympy.limit`.
Values are given by symbol name (units: B, s, FLOP, bytes; see jaxroof.symbolic.symbols):

  python -m experiments.crossovers --values=N=8e9,q=2,T=1,k=2.5e8,BW=2e12,F=6e14

or taken from a real model on a real accelerator (N, N_act, q, k, T, P, BW,
F, R; explicit --values entries win), printing only the named quantities:

  python -m experiments.crossovers --model=llama-3-8b --accelerator=h100-sxm \
      --context=8192 --only=compute_crossover_batch,weight_kv_crossover_batch

Zero is allowed where it means something: t_queue=0 (no queueing wait),
t_window=0 (no batching window), g=0 (no output yet).
"""

from __future__ import annotations

import math

from absl import flags

from experiments import _cli
from experiments import _model_flags
from experiments import _model_notes
from jaxroof import errors
from jaxroof import files
from jaxroof.specs import models
from jaxroof.specs import symbol_values
from jaxroof.symbolic import catalogue
from jaxroof.symbolic.symbols import QUANTITIES

_cli.key_flags(*_cli.MODEL_KEYS[:4])

_VALUES = flags.DEFINE_list(
    "values", "N=8e9,q=2,T=1,k=2.5e8,BW=2e12,F=6e14,R=300,B=32,P=3,g=3,L=2,H_kv=2,d=2,b=2,"
    "t_gap=0.012,t_window=0.01,t_queue=0.02",
    "Comma-separated NAME=NUMBER pairs (SI units, each > 0; t_queue, t_window and g may "
    "be 0); NAME is one of: " + ", ".join(f"{q.symbol} [{q.unit}]" for q in QUANTITIES) +
    ". Default: the lesson's example. Give --values= for closed forms only. With "
    "--model, the model's figures replace the example's and entries you give win.")
_SHARED = _model_flags.define("model", "accelerator", "accelerator_file", "weight_dtype",
                              "kv_dtype")
_CONTEXT = flags.DEFINE_integer(
    "context", None, "With --model: tokens each sequence retains (T, and the prompt P). >= 1.",
    lower_bound=1)
_ONLY = flags.DEFINE_list(
    "only", None,
    "Print only these quantities (comma-separated): " + ", ".join(catalogue.NAMES) + ".")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Write expressions, LaTeX and values here.")


def _values() -> tuple[dict[str, float], list[str], dict]:
  """The symbol values (example, model, then the user's), notes, and model inputs."""
  values = catalogue.parse_values(_VALUES.value)
  model, device_given = _SHARED.model.value, (_SHARED.accelerator.value or
                                              _SHARED.accelerator_file.value)
  if not model:
    if device_given or _CONTEXT.value is not None or any(
        flags.FLAGS[h.name].present for h in (_SHARED.weight_dtype, _SHARED.kv_dtype)):
      raise errors.InputError("--accelerator, --accelerator_file, --context, --weight_dtype "
                              "and --kv_dtype apply only with --model.")
    return values, [], {}
  if not device_given or _CONTEXT.value is None:
    raise errors.InputError("--model needs --accelerator (or --accelerator_file) and "
                            "--context.")
  spec, device = models.load_model(model), _model_flags.device(_SHARED)
  given = values if flags.FLAGS[_VALUES.name].present else {}
  batch = int(given.get("B", values.get("B", 1)))
  if batch != given.get("B", batch) or batch < 1:
    raise errors.InputError(f"--values B={given.get('B')!r}: give a whole number >= 1 with "
                            "--model (the batch N is read at).")
  from_model, notes = symbol_values.model_values(spec, device, context=_CONTEXT.value, batch=batch,
                                                 weight_dtype=_SHARED.weight_dtype.value,
                                                 kv_dtype=_SHARED.kv_dtype.value)
  kept = {n: v for n, v in values.items() if n not in from_model}
  merged = {**kept, **from_model, **given}
  overridden = sorted(set(given) & set(from_model))
  if overridden:
    notes.append(f"given in --values, replacing the model's: {', '.join(overridden)}")
  notes += _model_notes.lines(spec, [_CONTEXT.value])
  return merged, notes, {
      "model": spec.name, "accelerator": device.name, "context": _CONTEXT.value,
      "from_model": from_model, **_model_notes.json_fields(spec, [_CONTEXT.value])
  }


def _overflow_note(item: dict, values: dict) -> str:
  """Why a quantity has no finite value: floating point overflowed at its inputs."""
  inputs = ", ".join(f"{name}={values[name]:g}" for name in item["symbols"] if name in values)
  return (f"overflow: beyond floating point (over 1.8e308) at {inputs}; give inputs of a "
          "physical size")


def main(argv: list[str]) -> None:
  del argv  # Unused.
  only = catalogue.require_names(_ONLY.value) if _ONLY.value is not None else None
  values, notes, model_inputs = _values()
  for note in notes:
    print(note if note.startswith(("assumes:", "WARNING")) else f"note: {note}")
  items = catalogue.evaluate(values, only=only)
  for item in items:
    print(f"{item['name']} [{item['unit']}] ({item['derived_by']}): {item['meaning']}")
    print("  " + item["pretty"].replace("\n", "\n  "))
    print(f"  LaTeX: {item['latex']}")
    if item["value"] is not None and not math.isfinite(item["value"]):
      item["note"] = _overflow_note(item, values)
      item["value"] = None
      print(f"  = {item['note']}")
    elif item["value"] is not None:
      print(f"  = {item['value']:,.6g} {item['unit']}")
    elif item["note"]:
      print(f"  no value: {item['note']}")
    else:
      print(f"  no value: give {', '.join(item['missing_symbols'])}")
  if _JSON_OUT.value:
    document = {"kind": "bound", "values": values, "quantities": items}
    if model_inputs:
      document.update(inputs=model_inputs, notes=notes)
    files.write_json(_JSON_OUT.value, document)


if __name__ == "__main__":
  _cli.run(main)
