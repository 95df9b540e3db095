"""The request-length shape flags shared by `simulate` and `plan`: --prompt_distribution,
--output_distribution, --prompt_spread, --output_spread, --long_samples.

The means are each experiment's own --prompt_tokens and --output_tokens (`plan`'s are
whole numbers with other defaults). Import this module to define the flags; `lengths()`
gives `jaxroof.serving.arrivals.synthetic`'s keywords for them.
"""

from __future__ import annotations

from absl import flags

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
