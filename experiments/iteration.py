"""How long is this iteration? One mixed iteration of a model on an accelerator, every term.

The one cost model (`jaxroof.symbolic.cost_model`) for `--decode_rows` decode
rows at `--decode_context` positions each, beside one prefill chunk of
`--prefill_tokens` prompt tokens after `--prefill_done` already prefilled, on
one chip of `--tp/--pp/--ep`. Each operation (linear layers, LM head,
attention with its K/V) is shown with its bytes, FLOPs and roofline time; the
step is their sum (`--bound=per_op`) or one roofline (`--bound=fused`), plus
the communication. An analytic bound from datasheet figures; with `--engine=NAME` the
step is that engine's calibrated prediction (its profile's terms on the same iteration),
the bound beside it, labelled with the engine and its held-out error.

  python -m experiments.iteration --model=llama-3-8b --accelerator=h100-sxm \
      --decode_rows=64 --decode_context=8192 --prefill_tokens=2048
"""

from __future__ import annotations

from absl import flags
from absl import logging

from experiments import _cli
from experiments import _layout_flags
from experiments import _model_flags
from jaxroof import files
from jaxroof.engines import engine_profiles as profiles
from jaxroof.errors import InputError
from jaxroof.report import iteration_table
from jaxroof.serving import replica
from jaxroof.specs import models
from jaxroof.symbolic.step_model import StepModel

_cli.key_flags(*_cli.MODEL_KEYS[:4], "tp", "bound", "engine")

_SHARED = _model_flags.define("model", "accelerator", "accelerator_file", "weight_dtype",
                              "kv_dtype", *_model_flags.COST, "engine")
_DECODE_ROWS = flags.DEFINE_integer("decode_rows", 0, "Decode rows (sequences, one token "
                                    "each). >= 0.", lower_bound=0, upper_bound=1 << 20)
_DECODE_CONTEXT = flags.DEFINE_integer("decode_context", 1, "Positions each decode row attends "
                                       "to (tokens). >= 1.", lower_bound=1)
_PREFILL_TOKENS = flags.DEFINE_integer("prefill_tokens", 0, "Prompt tokens of the prefill chunk "
                                       "(0: none). >= 0.", lower_bound=0)
_PREFILL_DONE = flags.DEFINE_integer("prefill_done", 0, "Prompt tokens already prefilled before "
                                     "the chunk. >= 0.", lower_bound=0)
_JSON_OUT = flags.DEFINE_string("json_out", None, "Write the iteration's terms as JSON here.")


def _check(limit: int | None) -> None:
  if _DECODE_ROWS.value + _PREFILL_TOKENS.value < 1:
    raise InputError("--decode_rows=0 and --prefill_tokens=0: an iteration needs a decode row "
                     "or a prompt token.")
  if _PREFILL_DONE.value and not _PREFILL_TOKENS.value:
    raise InputError(f"--prefill_done={_PREFILL_DONE.value} without --prefill_tokens: give the "
                     "chunk that follows them.")
  if limit is None:
    return
  if _DECODE_ROWS.value and _DECODE_CONTEXT.value > limit:
    raise InputError(f"--decode_context={_DECODE_CONTEXT.value} is not allowed: the model's "
                     f"context is max_position_embeddings = {limit} tokens.")
  if _PREFILL_DONE.value + _PREFILL_TOKENS.value > limit:
    raise InputError(f"--prefill_done + --prefill_tokens = "
                     f"{_PREFILL_DONE.value + _PREFILL_TOKENS.value} is not allowed: the chunk "
                     f"ends beyond the model's context of {limit} tokens.")


def main(argv: list[str]) -> None:
  del argv  # Unused.
  _cli.require_flags(_SHARED.model)
  if not (_SHARED.accelerator.value or _SHARED.accelerator_file.value):
    raise InputError("--accelerator (or --accelerator_file) is required: the iteration runs on "
                     "a device.")
  spec = models.load_model(_SHARED.model.value)
  _check(spec.max_position_embeddings)
  device = _model_flags.device(_SHARED)
  layout = _layout_flags.layout(_SHARED.accelerator.value)
  context = max(_DECODE_CONTEXT.value, _PREFILL_DONE.value + _PREFILL_TOKENS.value, 1)
  rep = replica.from_model(spec, device, context=context, weight_dtype=_SHARED.weight_dtype.value,
                           kv_dtype=_SHARED.kv_dtype.value, layout=layout,
                           mla_prefill=_SHARED.mla_prefill.value,
                           comm_overlap=_SHARED.comm_overlap.value)
  cost = rep.cost
  decode = [float(_DECODE_CONTEXT.value)] * _DECODE_ROWS.value
  offsets, lengths = (([float(_PREFILL_DONE.value)],
                       [float(_PREFILL_TOKENS.value)]) if _PREFILL_TOKENS.value else ([], []))
  mix = cost.mix(decode, offsets, lengths)
  bound = StepModel.bound(_SHARED.bound.value)
  terms = {name: float(value) for name, value in cost.evaluate(mix, bound).items()}
  engine = _model_flags.step_model(
      _SHARED, accelerator=device.name) if _SHARED.engine.value != (profiles.BOUND) else None
  result = iteration_table.result(
      model=spec.name, accelerator=device.name, layout=layout.as_dict(), bound=_SHARED.bound.value,
      mix=mix, terms=terms, assumptions=list(rep.description["notes"]),
      weight_dtype=rep.description["weight_dtype"], kv_dtype=_SHARED.kv_dtype.value,
      engine=None if engine is None else
      (engine.provenance,
       {name: float(value) for name, value in cost.evaluate(mix, engine).items()}))
  print(iteration_table.text(result))
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, result)
    logging.info("wrote %s", _JSON_OUT.value)


if __name__ == "__main__":
  _cli.run(main)
