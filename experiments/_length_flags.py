"""The request-length shape flags shared by `simulate` and `plan`: --prompt_distribution,
--output_distribution, --prompt_spread, --output_spread, --long_samples.

The means are each experiment's own --prompt_tokens and --output_tokens (`plan`'s are
whole numbers with other defaults). Import this module to define the flags; `lengths()`
gives `jaxroof.serving.arrivals.synthetic`'s keywords for them.
"""

from __future__ import annotations

from collections.abc import Callable

from absl import flags

from jaxroof.errors import InputError
from jaxroof.serving import arrivals

PROMPT_DIST = flags.DEFINE_enum(
    "prompt_distribution", "fixed", list(arrivals.LENGTHS),
    "Prompt lengths around --prompt_tokens (their mean): fixed (exact), uniform, lognormal.")
OUTPUT_DIST = flags.DEFINE_enum(
    "output_distribution", "fixed", list(arrivals.LENGTHS),
    "Output lengths around --output_tokens, as "
    "--prompt_distribution.")
PROMPT_SPREAD = flags.DEFINE_float(
    "prompt_spread", 0.0, "Uniform: half-width / mean; lognormal: coefficient of variation. "
    ">= 0.", lower_bound=0)
OUTPUT_SPREAD = flags.DEFINE_float("output_spread", 0.0, "As --prompt_spread, for outputs.",
                                   lower_bound=0)
LONG_SAMPLES = flags.DEFINE_enum(
    "long_samples", "resample", list(arrivals.LONG_SAMPLES),
    "Sampled prompt + output beyond the model's context: drawn again, or clipped.")


def lengths() -> dict[str, object]:
  """`arrivals.synthetic`'s length keywords from the flags."""
  return dict(prompt_distribution=PROMPT_DIST.value, output_distribution=OUTPUT_DIST.value,
              prompt_spread=PROMPT_SPREAD.value, output_spread=OUTPUT_SPREAD.value,
              long_samples=LONG_SAMPLES.value)


def output_cv2() -> float:
  """The output lengths' squared coefficient of variation (`arrivals.length_cv2`)."""
  return arrivals.length_cv2("output_tokens", OUTPUT_DIST.value, OUTPUT_SPREAD.value)


def _spread_ok(name: str) -> Callable[[dict], bool]:
  """A validator of `--{name}_distribution` with `--{name}_spread` (`arrivals.length_cv2`),
  so that a lognormal or uniform shape without a valid spread is refused as the flags
  are parsed, before any search or run."""

  def ok(values: dict) -> bool:
    try:
      arrivals.length_cv2(f"{name}_tokens", values[f"{name}_distribution"],
                          values[f"{name}_spread"])
    except InputError:
      shape = values[f"{name}_distribution"]
      top = 1 if shape == "uniform" else arrivals.MAX_LOGNORMAL_SPREAD
      raise flags.ValidationError(
          f"--{name}_spread={values[f'{name}_spread']!r} is not allowed with --{name}_"
          f"distribution={shape}: {shape} lengths need --{name}_spread in (0, {top:g}].") from None
    return True

  return ok


for _name in ("prompt", "output"):
  flags.register_multi_flags_validator([f"{_name}_distribution", f"{_name}_spread"],
                                       _spread_ok(_name))
