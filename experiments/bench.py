"""How fast jaxroof itself runs on this machine: one benchmark per --what.

  sweep     the lambdified step model over a (batch, context) grid of >= 10M points
            (numpy, jit-compiled JAX, and a per-point Python loop for scale)
  plan      the planner's search (configurations/s) and the README's plan question
  simulate  the simulator: 10,000 requests (prompts ~1,000, outputs ~200) per scheduler
  decode    the toy's generation with the K/V cache against recomputing the prefix

Every figure is timed through `jaxroof.timing.time_call` (warm-up excluded,
synchronised, median and spread of --repeats) and is a measurement of this
machine, recorded with it in the JSON.

  python -m experiments.bench --what=sweep --json_out=results/bench_sweep_cpu.json
  python -m experiments.bench --what=decode --preset=small_12l --dtype=bfloat16

The former `experiments.bench_sweep`, `bench_plan`, `bench_simulate` and
`bench_decode` still run, as this app with their --what.
"""

from __future__ import annotations

import dataclasses

from absl import flags

from experiments import _benchmarks
from experiments import _plan_benchmark
from experiments import _cli
from jaxroof import files
from jaxroof.errors import InputError
from jaxroof.report import bench_table
from jaxroof.serving import simulator
from jaxroof.toy import config as config_lib

_WHAT = flags.DEFINE_enum("what", None, ["sweep", "plan", "simulate", "decode"],
                          "What to time (see the module docstring). Required.")
_REPEATS = flags.DEFINE_integer(
    "repeats", None, "Timed repeats. In [1, 10,000]. Default per --what: sweep 10, plan 5, "
    "simulate 3, decode 5.", lower_bound=1, upper_bound=10_000)
_JSON_OUT = flags.DEFINE_string("json_out", None, "Write the timings as JSON here.")
# --what=sweep
_BATCHES = flags.DEFINE_integer("batches", 4096, "sweep: batch sizes 1..this in the grid. >= 1.",
                                lower_bound=1)
_CONTEXTS = flags.DEFINE_integer("contexts", 2500, "sweep: context lengths in the grid. >= 1.",
                                 lower_bound=1)
_LOOP_POINTS = flags.DEFINE_integer("loop_points", 20000,
                                    "sweep: points of the per-point Python loop baseline. >= 1.",
                                    lower_bound=1)
# --what=plan
_MODEL = flags.DEFINE_string("model", "llama-3.1-70b", "plan: the model to plan for.")
_CONTEXT = flags.DEFINE_integer("context", 8192, "plan: context, tokens. >= 1.", lower_bound=1)
# --what=simulate
_NUM_REQUESTS = flags.DEFINE_integer(
    "num_requests", 10_000, "simulate: requests per run. In [1, 1,000,000] (as simulate: more "
    "would not fit in memory).", lower_bound=1, upper_bound=1_000_000)
_ARRIVAL_RATE = flags.DEFINE_float("arrival_rate", 20.0, "simulate: Poisson arrivals per second.")
_SCHEDULERS = flags.DEFINE_list("schedulers", list(simulator.SCHEDULERS),
                                "simulate: schedulers to time.")
_PROGRESS = _cli.define_progress()
# --what=decode
_PRESET = flags.DEFINE_enum("preset", "cpu_bench", list(config_lib.PRESETS),
                            "decode: the toy model's sizes.")
_BLOCKS = flags.DEFINE_integer("blocks", None, "decode: override the preset's blocks (>= 1).",
                               lower_bound=1)
_WIDTH = flags.DEFINE_integer("width", None, "decode: override the preset's residual width "
                              "(>= 1).", lower_bound=1)
_DTYPE = flags.DEFINE_enum("dtype", "float32", list(_benchmarks.DECODE_DTYPES),
                           "decode: weights and K/V.")
_BATCH = flags.DEFINE_integer("batch", 1, "decode: sequences generated together (>= 1).",
                              lower_bound=1)
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 1024, "decode: prompt tokens (>= 1).",
                                   lower_bound=1)
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 128, "decode: generated tokens (>= 1).",
                                   lower_bound=1)
_SEED = flags.DEFINE_integer("seed", 0, "decode: seeds the weights and the prompt. In "
                             "[0, 2**32).", lower_bound=0, upper_bound=2**32 - 1)
_cli.require_positive(_ARRIVAL_RATE, "requests/s")
flags.register_validator(_SCHEDULERS.name, bool, message="name at least one scheduler")

# The flags each benchmark reads; one given to another is refused, never ignored.
FLAGS_OF = {
    "sweep": (_BATCHES, _CONTEXTS, _LOOP_POINTS),
    "plan": (_MODEL, _CONTEXT),
    "simulate": (_NUM_REQUESTS, _ARRIVAL_RATE, _SCHEDULERS),
    "decode": (_PRESET, _BLOCKS, _WIDTH, _DTYPE, _BATCH, _PROMPT_LEN, _NEW_TOKENS, _SEED),
}
DEFAULT_REPEATS = {"sweep": 10, "plan": 5, "simulate": 3, "decode": 5}


def _check_flags(what: str) -> None:
  for other, holders in FLAGS_OF.items():
    for holder in holders:
      if other != what and flags.FLAGS[holder.name].present:
        raise InputError(f"--{holder.name} applies only with --what={other} (given "
                         f"--what={what}).")


def _run(what: str, repeats: int) -> dict:
  if what == "sweep":
    return _benchmarks.sweep(batches=_BATCHES.value, contexts=_CONTEXTS.value, repeats=repeats,
                             loop_points=_LOOP_POINTS.value)
  if what == "plan":
    return _plan_benchmark.plan(model=_MODEL.value, context=_CONTEXT.value, repeats=repeats)
  if what == "simulate":
    return _benchmarks.simulate(num_requests=_NUM_REQUESTS.value, arrival_rate=_ARRIVAL_RATE.value,
                                schedulers=_SCHEDULERS.value, repeats=repeats,
                                show_progress=_PROGRESS.value)
  overrides = {"num_blocks": _BLOCKS.value, "width": _WIDTH.value}
  config = dataclasses.replace(config_lib.preset(_PRESET.value),
                               **{k: v for k, v in overrides.items() if v is not None})
  return _benchmarks.decode(config, preset=_PRESET.value, dtype_name=_DTYPE.value,
                            batch=_BATCH.value, prompt_len=_PROMPT_LEN.value,
                            new_tokens=_NEW_TOKENS.value, repeats=repeats, seed=_SEED.value)


def main(argv: list[str]) -> None:
  del argv  # Unused.
  _cli.require_flags(_WHAT)
  what = _WHAT.value
  _check_flags(what)
  result = _run(what, _REPEATS.value or DEFAULT_REPEATS[what])
  print("\n".join(bench_table.lines(result)))
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, result)


def run_as(what: str) -> None:
  """Runs this app as a former `bench_<what>` module: --what defaults to `what`."""
  flags.FLAGS.set_default(_WHAT.name, what)
  _cli.run(main)


if __name__ == "__main__":
  _cli.run(main)
