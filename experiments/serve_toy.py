"""Run the real toy server on this machine and its simulated twin; compare at three loads.

Measurement against calibrated prediction. The toy Transformer is served with
iteration-level batching over a fixed-size cache with per-row lengths
(`jaxroof.serving.toy_server`, greedy, wall-clock times); the simulator's
twin uses the calibrated iteration model fitted to the server's own
iterations on separate probe and calibration runs
(`jaxroof.serving.compare`). Reports simulated vs measured median and p90
TTFT and ITL and throughput at a light load, near the knee and overloaded.

  python -m experiments.serve_toy --json_out=results/serve_toy_cpu.json \
      --plot_out=results/serve_toy_cpu.png
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from absl import flags

from experiments import _cli
from jaxroof import files
from jaxroof.report import simulation as sim_report
from jaxroof.report import table
from jaxroof.serving import compare
from jaxroof.toy import config as toy_config
from jaxroof.errors import InputError
from jaxroof.toy import weights
from jaxroof.toy.weights import init_params

_PRESET = flags.DEFINE_enum("preset", "cpu_bench", list(toy_config.PRESETS), "Toy config.")
_SLOTS = flags.DEFINE_integer("slots", 8, "Rows of the server's cache (max running).",
                              lower_bound=1)
_NUM_REQUESTS = flags.DEFINE_integer(
    "num_requests", 150, "Requests per load, served for real on this CPU. In [4, 100,000].",
    lower_bound=4, upper_bound=100_000)
_PROMPT_TOKENS = flags.DEFINE_integer("prompt_tokens", 48, "Mean prompt length.", lower_bound=1)
_PROMPT_SPREAD = flags.DEFINE_float("prompt_spread", 0.3, "Uniform half-width / mean.",
                                    lower_bound=0.0, upper_bound=1.0)
_OUTPUT_TOKENS = flags.DEFINE_integer("output_tokens", 32, "Mean output length.", lower_bound=1)
_OUTPUT_SPREAD = flags.DEFINE_float("output_spread", 0.5, "Uniform half-width / mean.",
                                    lower_bound=0.0, upper_bound=1.0)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of weights, workloads and prompts.")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Write the comparison JSON here.")
_PLOT_OUT = flags.DEFINE_string("plot_out", None, "Write the CDF PNG here.")

# Prompt lengths the server compiles a prefill for (one program each); the
# default load has 29. More is minutes of compilation before the first request.
MAX_PROMPT_LENGTHS = 1_000


def _require_feasible(config: toy_config.ToyConfig) -> None:
  """Refuses a load beyond this machine before anything is allocated: the
  prefill programs to compile, and the memory of the server's rows and of one
  prefill's attention (`weights.require_fits`), as `compare.compare_toy` sizes them."""
  top = lambda mean, spread: int(round(mean * (1 + spread)))  # noqa: E731 (uniform's top)
  longest = top(_PROMPT_TOKENS.value, _PROMPT_SPREAD.value)
  lengths = longest - max(1, round(_PROMPT_TOKENS.value * (1 - _PROMPT_SPREAD.value))) + 1
  if lengths > MAX_PROMPT_LENGTHS:
    raise InputError(
        f"--prompt_tokens={_PROMPT_TOKENS.value:,} with --prompt_spread="
        f"{_PROMPT_SPREAD.value:g} gives {lengths:,} prompt lengths, each compiled as its "
        f"own prefill: over {MAX_PROMPT_LENGTHS:,} (minutes of compilation); use shorter "
        "prompts or a smaller spread.")
  if top(_OUTPUT_TOKENS.value, _OUTPUT_SPREAD.value) < 2:
    raise InputError(
        f"--output_tokens={_OUTPUT_TOKENS.value} with --output_spread={_OUTPUT_SPREAD.value:g} "
        "is not allowed: every request would end at its first token, leaving no inter-token "
        "latency to compare (give --output_tokens >= 2, or a spread that reaches 2).")
  max_len = longest + top(_OUTPUT_TOKENS.value, _OUTPUT_SPREAD.value)
  weights.require_fits(config, 4, batch=_SLOTS.value, positions=max_len)
  weights.require_fits(config, 4, batch=1, positions=longest, attention_positions=longest)


def _ms(seconds: float | None) -> str:
  """Milliseconds, or '-' where a run has none (no request emitted a second token)."""
  return "-" if seconds is None else f"{1e3 * seconds:.2f}"


def main(argv: list[str]) -> None:
  del argv  # Unused.
  config = toy_config.preset(_PRESET.value)
  _require_feasible(config)
  params = init_params(config, jax.random.key(_SEED.value), jnp.float32)
  result = compare.compare_toy(params, slots=_SLOTS.value, num_requests=_NUM_REQUESTS.value,
                               prompt_tokens=_PROMPT_TOKENS.value,
                               prompt_spread=_PROMPT_SPREAD.value,
                               output_tokens=_OUTPUT_TOKENS.value,
                               output_spread=_OUTPUT_SPREAD.value, seed=_SEED.value)
  result["toy"]["preset"] = _PRESET.value
  rows = []
  for name, load in result["loads"].items():
    runs = {
        "measured": load["measured"],
        **{f"twin {k}": t["simulated"] for k, t in load["twins"].items()}
    }
    for source, m in runs.items():
      rows.append([
          f"{name} {source}", f"{load['arrival_rate_per_s']:.2f}",
          *(_ms(m[k][q]) for k in ("ttft_s", "itl_s") for q in ("median", "p90")),
          f"{m['request_throughput_per_s']:.2f}"
      ])
  print(
      table.format_table(
          ["run", "rate/s", "TTFT med ms", "TTFT p90 ms", "ITL med ms", "ITL p90 ms", "req/s"],
          rows))
  if _PLOT_OUT.value:
    sim_report.plot_toy_comparison(result, _PLOT_OUT.value)
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, result)


if __name__ == "__main__":
  _cli.run(main)
