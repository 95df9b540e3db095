"""One vocabulary of flags for every experiment that takes a model.

Each shared flag is defined here once, with its units and limits; an
experiment asks for the ones it uses (`define("model", "accelerator", ...)`)
and gets their holders back, so `--weight_dtype` means and allows the same in
`batch_sweep`, `kv_sizing`, `compare_accelerators`, `serving`, `simulate`
and `plan`. `python -m experiments.list` lists the accepted names.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable

from absl import flags

from experiments import _cli
from experiments import _engine_flags
from jaxroof.errors import InputError
from jaxroof.engines import engine_profiles as profiles_lib
from jaxroof.measure import profiles
from jaxroof.serving import replica
from jaxroof.specs import accelerators
from jaxroof.specs import kv_sizing
from jaxroof.specs import models
from jaxroof.specs import parameters
from jaxroof.specs import what_if
from jaxroof.specs.accelerators import Accelerator
from jaxroof.symbolic import cost_model
from jaxroof.symbolic.step_model import StepModel

# The cost model's options, on every experiment that computes a step time.
COST = ("bound", "mla_prefill", "comm_overlap")

_LIST = "(python -m experiments.list shows them all)"


def _model() -> flags.FlagHolder:
  return flags.DEFINE_string(
      "model", None, f"Shipped model ({', '.join(models.shipped_models())}) or a path to "
      f"a Hugging Face config.json or its folder {_LIST}.")


def _accelerator() -> flags.FlagHolder:
  return flags.DEFINE_string(
      "accelerator", None, f"Accelerator slug ({', '.join(accelerators.known_accelerators())}) "
      f"or a slice such as 8xh100-sxm or tpu-v5e-8 {_LIST}.")


WEIGHT_CHOICES = (parameters.PUBLISHED,) + tuple(parameters.WEIGHT_DTYPES)
_WEIGHT_HELP = ("Weight storage dtype (block scales included for int4, mxfp4, nvfp4); "
                "published (default): the model's own checkpoint format, e.g. gpt-oss "
                "experts in mxfp4 with the rest bf16, DeepSeek-V3 fp8 in 128x128 blocks")
_KV_HELP = ("K/V cache element dtype; fp8: per-tensor scales (negligible), fp8_block: a "
            "1-byte scale per 32 values (1.03125 B/element)")

DEFINITIONS: dict[str, Callable[[], flags.FlagHolder]] = {
    "model": _model,
    "accelerator": _accelerator,
    "accelerator_file": lambda: flags.DEFINE_string(
        "accelerator_file", None, "Your own accelerator as JSON in the shipped schema "
        "(jaxroof/specs/data/accelerators.json), instead of --accelerator."),
    "weight_dtype": lambda: flags.DEFINE_enum("weight_dtype", parameters.PUBLISHED,
                                              list(WEIGHT_CHOICES), _WEIGHT_HELP + "."),
    "kv_dtype": lambda: flags.DEFINE_enum("kv_dtype", "bf16", list(kv_sizing.KV_DTYPES), _KV_HELP +
                                          "."),
    "block_size": lambda: flags.DEFINE_integer(
        "block_size", 16, "Tokens per K/V page; allocation rounds up per sequence. >= 1 "
        "(1: no paging).", lower_bound=1),
    "workspace_fraction": lambda: flags.DEFINE_float(
        "workspace_fraction", 0.1, "Share of device memory kept free for activations and "
        "workspace. In [0, 0.99].", lower_bound=0.0, upper_bound=0.99),
    "max_new_tokens": lambda: flags.DEFINE_integer(
        "max_new_tokens", 0, "Further tokens per sequence reserved up front (tokens). >= 0.",
        lower_bound=0),
    "group_size": lambda: flags.DEFINE_integer(
        "group_size", None, "Weights per quantization scale (2-byte scales) for quantized "
        "weights; default: the dtype's own (128 for int4, 32 for mxfp4, 16 for nvfp4). >= 1.",
        lower_bound=1),
    "bound": lambda: flags.DEFINE_enum(
        "bound", "per_op", list(cost_model.BOUNDS), "The analytic bound: per_op (default), the "
        "sum of per-operation rooflines (linear layers, LM head, attention with its K/V); "
        "fused, one roofline over the whole step (optimistic; the lesson's)."),
    "mla_prefill": lambda: flags.DEFINE_enum(
        "mla_prefill", "mha", list(cost_model.MLA_PREFILL), "MLA models (DeepSeek, Kimi): the "
        "form of prefill attention. mha (default): per-head K and V up-projected from the "
        "latent, as vLLM prefills (fewer FLOPs per pair); absorbed: attention over the latent, "
        "as in decode."),
    "comm_overlap": lambda: flags.DEFINE_float(
        "comm_overlap", 0.0, "Several chips: fraction of the communication hidden under the "
        "step, in [0, 1] (0: serial, the default).", lower_bound=0.0, upper_bound=1.0),
    "memory_gb": lambda: flags.DEFINE_float(
        "memory_gb", None, "What-if with --model: device memory in GB instead of the "
        "datasheet's. > 0.", lower_bound=1e-9, upper_bound=1e5),
    "profile": lambda: flags.DEFINE_string(
        "profile", None, "Profile JSON from `python -m experiments.calibrate`: step times "
        "become calibrated predictions (fitted efficiency factors and fixed costs). With raw "
        "numbers it predicts for the profiled device unless --bandwidth_tbps/--tflops are "
        "given; with --accelerator it scales that device's figures."),
    "engine": _engine_flags.define,
    "what_if": lambda: flags.DEFINE_bool(
        "what_if", False, "Allow --profile fitted on another device kind than --accelerator "
        "(its factors applied as a what-if)."),
}


def _positive(name: str, default: float | None, unit: str, meaning: str) -> flags.FlagHolder:
  """A raw-number float flag, > 0 in its physical range (`_cli.PLAUSIBLE`)."""
  holder = flags.DEFINE_float(name, default, f"{meaning}, {unit}. > 0.")
  _cli.require_positive(holder, unit)
  return holder


# Raw numbers instead of --model and --accelerator (the lesson's example by default).
RAW: dict[str, Callable[[], flags.FlagHolder]] = {
    "weights_gb": lambda: _positive("weights_gb", 16.0, "GB", "Weight bytes read per step"),
    "bytes_per_weight": lambda: _positive("bytes_per_weight", 2.0, "bytes/weight",
                                          "Bytes per weight (2 = BF16; N = bytes / "
                                          "this)"),
    "kv_gb_per_seq": lambda: _positive(
        "kv_gb_per_seq", None, "GB", "K/V each sequence reads per step, fixed (the lesson's "
        "view; default 0.25 unless --kv_bytes_per_token)"),
    "kv_bytes_per_token": lambda: _positive("kv_bytes_per_token", None, "bytes/token",
                                            "K/V bytes per retained token (all "
                                            "layers)"),
    "bandwidth_tbps": lambda: _positive(
        "bandwidth_tbps", 2.0, "TB/s", "Sustained memory bandwidth (with --model: a what-if "
        "replacing the datasheet's)"),
    "tflops": lambda: _positive(
        "tflops", None, "TFLOP/s", "Sustained FLOP rate; omit for memory only (with --model: "
        "a what-if replacing the datasheet's dense rate)"),
    "layers": lambda: flags.DEFINE_integer(
        "layers", None, "Raw numbers: blocks, for a profile's per-layer fixed cost (--model "
        "knows its own). >= 1.", lower_bound=1),
}
DEFINITIONS.update(RAW)

LISTABLE: dict[str, tuple[tuple[str, ...], str, str]] = {
    "weight_dtype": (WEIGHT_CHOICES, _WEIGHT_HELP, parameters.PUBLISHED),
    "kv_dtype": (tuple(kv_sizing.KV_DTYPES), _KV_HELP, "bf16"),
}


def _list_flag(name: str) -> flags.FlagHolder:
  """A comma-separated form of a choice flag: one value, or several to compare."""
  allowed, meaning, default = LISTABLE[name]
  holder = flags.DEFINE_list(
      name, default, f"{meaning}; several, comma-separated, compare "
      f"in one run. Allowed: {', '.join(allowed)}.")
  flags.register_validator(name, lambda values: bool(values) and all(v in allowed for v in values),
                           message=f"each value must be one of {', '.join(allowed)}")
  return holder


def define(*names: str, lists: tuple[str, ...] = ()) -> types.SimpleNamespace:
  """Defines the named shared flags; returns their holders by name.

  Names in `lists` (of `LISTABLE`) take comma-separated values: the holder's
  value is then a list.
  """
  return types.SimpleNamespace(
      **{name: _list_flag(name) if name in lists else DEFINITIONS[name]() for name in names})


def device(holders: types.SimpleNamespace, *, bandwidth_tbps: float | None = None,
           tflops: float | None = None) -> Accelerator:
  """The accelerator the flags name (`--accelerator` or `--accelerator_file`),
  with any what-if overrides applied and recorded."""
  path = getattr(holders, "accelerator_file", None)
  if path is not None and path.value:
    if holders.accelerator.value:
      raise InputError("--accelerator and --accelerator_file name two devices: give one.")
    base = what_if.load_accelerator_file(path.value)
  else:
    base = accelerators.load_accelerator(holders.accelerator.value)
  memory = getattr(holders, "memory_gb", None)
  return what_if.with_overrides(base, bandwidth_tb_s=bandwidth_tbps, tflops=tflops,
                                memory_gb=None if memory is None else memory.value)


def given(holder: flags.FlagHolder) -> object | None:
  """A flag's value when given on the command line, else None (its default not a what-if)."""
  return holder.value if flags.FLAGS[holder.name].present else None


def check_model_or_raw(holders: types.SimpleNamespace, *, model_only: tuple, raw: tuple) -> None:
  """`--model` on a device, or raw numbers (`RAW`), never a mix: one-line errors naming
  the flags given. `model_only`: flags that apply only with `--model`; `raw`: those it
  replaces (with it `--bandwidth_tbps`, `--tflops` and `--memory_gb` are what-ifs)."""
  model = holders.model.value is not None
  if model != (holders.accelerator.value is not None or bool(holders.accelerator_file.value)):
    raise InputError("--model and --accelerator (or --accelerator_file) go together.")
  named = lambda given: ", ".join(f"--{h.name}" for h in given  # noqa: E731
                                  if flags.FLAGS[h.name].present)
  if not model and named(model_only):
    raise InputError(f"{named(model_only)} apply only with --model.")
  if model and named(raw):
    raise InputError(f"--model replaces the raw-number flags (given: {named(raw)}); with it "
                     "--bandwidth_tbps, --tflops and --memory_gb are what-ifs on the "
                     "datasheet.")


def what_if_device(holders: types.SimpleNamespace,
                   memory_gb: flags.FlagHolder | None = None) -> Accelerator:
  """The device with `--bandwidth_tbps`, `--tflops` (and `memory_gb`) as what-ifs on its
  datasheet when given on the command line (their raw-number defaults are not)."""
  return what_if.with_overrides(
      device(holders, bandwidth_tbps=given(holders.bandwidth_tbps), tflops=given(holders.tflops)),
      memory_gb=None if memory_gb is None else given(memory_gb))


def figures_given(holders: types.SimpleNamespace) -> bool:
  """Whether step times scale figures the user gave (a model's datasheet, or
  `--bandwidth_tbps`/`--tflops`) rather than a profile's measured ceilings."""
  return holders.model.value is not None or any(
      flags.FLAGS[h.name].present for h in (holders.bandwidth_tbps, holders.tflops))


def raw_numbers(holders: types.SimpleNamespace) -> dict[str, float | None]:
  """The raw-number flags (`RAW`) in SI units, as `jaxroof.serving.raw_inputs` takes them."""
  tflops, kv_gb = holders.tflops.value, holders.kv_gb_per_seq.value
  return dict(weight_bytes=holders.weights_gb.value * 1e9,
              bytes_per_weight=holders.bytes_per_weight.value,
              bandwidth_bytes_per_s=holders.bandwidth_tbps.value * 1e12,
              flops_per_s=None if tflops is None else tflops * 1e12,
              kv_bytes_per_token=holders.kv_bytes_per_token.value,
              kv_per_sequence_bytes=None if kv_gb is None else kv_gb * 1e9)


def what_ifs(device: Accelerator) -> list[str]:
  """The what-if replacements applied to a device's datasheet figures, as notes."""
  return [d for d in device.decisions if d.startswith("what-if")]


def step_model(holders: types.SimpleNamespace, *, accelerator: str | None,
               use_profile_ceilings: bool = True, bound: bool = False) -> StepModel:
  """The step model the flags ask for: the `--bound`, or with `--profile` its calibrated
  model, checked against `accelerator` (a profile of another device kind needs
  `--what_if`). `use_profile_ceilings=False` scales the given figures instead of the
  profile's measured ones; `bound=True` is the bound even with a profile."""
  engine = getattr(holders, "engine", None)
  if engine is not None and engine.value != profiles_lib.BOUND and not bound:
    if getattr(holders, "profile", None) is not None and holders.profile.value:
      raise InputError("--engine and --profile name two calibrations: give one.")
    if not accelerator:
      raise InputError(f"--engine={engine.value} predicts for an accelerator: give "
                       "--model and --accelerator.")
    return profiles_lib.step_model(_engine_flags.entry(engine, accelerator))
  if getattr(holders, "profile", None) is None or holders.profile.value is None or bound:
    return StepModel.bound(holders.bound.value)
  profile = profiles.load_profile(holders.profile.value)
  notes = (profiles.check_applies(profile, accelerator, what_if=holders.what_if.value)
           if accelerator else [])
  model = profiles.step_model(profile, use_profile_ceilings=use_profile_ceilings,
                              notes=tuple(notes))
  predicted = holders.model.value if hasattr(holders, "model") else None  # Whose error it is.
  return dataclasses.replace(model, provenance={**model.provenance, "applied_to": predicted})


def model_options(holders: types.SimpleNamespace) -> dict[str, object]:
  """The allocation and cost flags a model's inputs and its replica both take."""
  return dict(weight_dtype=holders.weight_dtype.value, kv_dtype=holders.kv_dtype.value,
              block_size=holders.block_size.value,
              workspace_fraction=holders.workspace_fraction.value,
              mla_prefill=holders.mla_prefill.value, comm_overlap=holders.comm_overlap.value)


def model_replica(holders: types.SimpleNamespace, device: Accelerator, **kw) -> replica.Replica:
  """One simulated replica of `--model` on `device`, with the shared flags' allocation
  and cost options; `kw`: the context, step model, layout and scheduling."""
  return replica.from_model(models.load_model(holders.model.value), device,
                            **model_options(holders), **kw)
