"""The parallel-layout flags shared by experiments: --tp --pp --ep --dp --microbatches
--chips.

Import this module in an experiment to define the flags, then call
`layout()` for the validated `jaxroof.parallel.layout.Layout` (a slice name
given as --accelerator, e.g. `8xh100-sxm` or `tpu-v5e-8`, supplies the chips)
and `accelerator(name)` for the device of a slug or slice.
"""

from __future__ import annotations

from absl import flags

from jaxroof.errors import InputError
from jaxroof.parallel.layout import Layout, from_slice
from jaxroof.specs.accelerators import Accelerator, parse_slice

_TP = flags.DEFINE_integer("tp", 1, "Tensor-parallel degree (heads and MLP columns). >= 1.")
_PP = flags.DEFINE_integer("pp", 1, "Pipeline stages. >= 1.")
_EP = flags.DEFINE_integer("ep", 1, "Expert-parallel degree (MoE models). >= 1.")
_DP = flags.DEFINE_integer("dp", 1, "Data-parallel replicas. >= 1.")
_MICROBATCHES = flags.DEFINE_integer(
    "microbatches", 1, "Microbatches in flight through the pp stages (as plan's rows; the "
    "simulator runs one virtual engine per microbatch). >= 1.")
_CHIPS = flags.DEFINE_integer("chips", None,
                              "Chips of the slice (tp*pp*ep*dp); alone, tp = chips. >= 1.")


def accelerator(name: str) -> Accelerator:
  """The device of a slug or a slice name."""
  return parse_slice(name)[0]


def layout(accelerator_name: str | None = None) -> Layout:
  """The layout the flags (and a slice-named accelerator) describe.

  Raises:
    InputError: a degree < 1, or chips that do not match the layout.
  """
  for holder in (_TP, _PP, _EP, _DP, _MICROBATCHES):
    if holder.value is None or holder.value < 1:
      raise InputError(f"--{holder.name}={holder.value} is not allowed: give a whole "
                       "number >= 1.")
  chips = _CHIPS.value
  if chips is not None and chips < 1:
    raise InputError(f"--chips={chips} is not allowed: a slice needs at least 1 chip.")
  slice_chips = parse_slice(accelerator_name)[1] if accelerator_name else None
  if chips is not None and slice_chips is not None and chips != slice_chips:
    raise InputError(f"--chips={chips} contradicts --accelerator={accelerator_name} "
                     f"({slice_chips} chips).")
  base = Layout(tp=_TP.value, pp=_PP.value, ep=_EP.value, dp=_DP.value,
                microbatches=_MICROBATCHES.value)
  return from_slice(base, chips if chips is not None else slice_chips)
