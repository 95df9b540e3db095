"""The main job: a decision document for one model, as a folder.

Writes `<out_dir>/README.md` (Markdown), `summary.json` and the PNG plots. It
opens with the answer for --model at --context on each of --accelerators (one
chip, or the fewest chips that hold the model): whether it fits, the largest
batch meeting --token_gap_ms and --ttft_ms, its token gap, TTFT and rate, what
binds and what would move it.
Then come serving, multi-chip, accelerators, K/V sizing and calibration; the
lesson's reproduction and the toy Transformer close it as checks:

  python -m experiments.report --out_dir=report
  python -m experiments.report --model=mixtral-8x7b --context=8192 \\
      --accelerators=h100-sxm,h200,mi300x --token_gap_ms=40

The results are computed first (`jaxroof.serving.report_results`), then the
sections of `jaxroof.report.document` (`SECTIONS`) render them, with the command
lines of `_report_commands` for the reader to repeat or extend a run. Every number
is labelled: analytic bound, calibrated prediction or measurement. With --engine=NAME the
summary leads with that engine's predictions for the subject, the bounds beside them.
"""

from __future__ import annotations

from absl import flags

from experiments import _cli
from experiments import _model_flags
from experiments import _report_commands
from jaxroof import files
from jaxroof.calibrate import toy_job
from jaxroof.errors import InputError
from jaxroof.measure import measurement
from jaxroof.report import document
from jaxroof.serving import answer
from jaxroof.serving import report_results
from jaxroof.specs import accelerators as accelerator_specs

_OUT_DIR = flags.DEFINE_string("out_dir", "report", "Folder for README.md, summary.json and "
                               "the PNG plots.")
_CALIBRATION_BUDGET_S = flags.DEFINE_float(
    "calibration_budget_s", 60.0, "Seconds for the short calibration on this device "
    "(measure, fit, plot); 0 skips it. Below ~25 s there are too few points to fit.",
    lower_bound=0.0)
_SHARED = _model_flags.define("weight_dtype", "kv_dtype", "engine")
_cli.key_flags("weight_dtype", "kv_dtype", "engine")  # Listed by --helpshort, though shared.
_MODEL = flags.DEFINE_string(
    "model", answer.DEFAULT_MODEL, "The report's subject: a shipped model "
    "(python -m experiments.list shows them all).")
_CONTEXT = flags.DEFINE_integer(
    "context", answer.DEFAULT_CONTEXT, "Tokens each sequence holds at its end (prompt + "
    "outputs), tokens. > --output_tokens, at most the model's context.")
_ACCELERATORS = flags.DEFINE_list(
    "accelerators", ",".join(answer.DEFAULT_ACCELERATORS),
    "Accelerator slugs to answer for (one chip, or the fewest that hold the model), "
    "comma-separated, or 'all' "
    f"({', '.join(accelerator_specs.known_accelerators())}).")
_OUTPUT_TOKENS = flags.DEFINE_integer(
    "output_tokens", 256, "Outputs per request, tokens; the prompt is the rest of --context. "
    "2 .. 1,000,000.", lower_bound=2, upper_bound=1_000_000)
_TOKEN_GAP_MS = flags.DEFINE_float(
    "token_gap_ms", 30.0, "Mean gap between one user's "
    "tokens (ITL), the target, ms. > 0.")
_TTFT_MS = flags.DEFINE_float("ttft_ms", 500.0, "Mean time-to-first-token target, ms. > 0.")
_ARRIVAL_RATE = flags.DEFINE_float(
    "arrival_rate", 0.0, "Requests/s (Poisson) for the summary's TTFT (M/D/1); 0: one "
    "prompt on an idle prefill. >= 0.")

for _holder, _unit in ((_TOKEN_GAP_MS, "ms"), (_TTFT_MS, "ms")):
  _cli.require_positive(_holder, _unit)
flags.register_validator(_ARRIVAL_RATE.name, lambda v: 0 <= v < 1e9,
                         message="must be a finite number >= 0 (requests/s)")


def subject() -> answer.Subject:
  """The report's subject from the flags, checked (one-line errors naming the field)."""
  chosen = answer.Subject(model=_MODEL.value, context=_CONTEXT.value,
                          accelerators=answer.accelerator_list(_ACCELERATORS.value),
                          output_tokens=_OUTPUT_TOKENS.value, token_gap_s=_TOKEN_GAP_MS.value / 1e3,
                          ttft_s=_TTFT_MS.value / 1e3, weight_dtype=_SHARED.weight_dtype.value,
                          kv_dtype=_SHARED.kv_dtype.value, arrival_rate=_ARRIVAL_RATE.value,
                          engine=_SHARED.engine.value)
  chosen.check()
  return chosen


def main(argv: list[str]) -> None:
  del argv  # Unused.
  chosen = subject()
  budget = _CALIBRATION_BUDGET_S.value
  if budget:
    toy_job.check_budget("calibration_budget_s", budget)
  measurement.keep_allocations()  # Before any timing; see jaxroof.measure.measurement.
  # --out_dir was checked before this (`_cli.check_outputs`); a folder this run creates is
  # removed if the work fails, so a failure leaves nothing behind.
  with files.output_folder("--out_dir", _OUT_DIR.value) as out_dir:
    results = report_results.compute(chosen, _report_commands.RESULTS_DIR)
    calibration, failure = None, None
    if budget:
      try:
        calibration = toy_job.run(budget)
      except InputError as e:  # A busy machine may measure too few points to fit.
        failure = str(e)
    path = document.build(
        document.Context(out_dir=out_dir, results=results, results_dir=_report_commands.RESULTS_DIR,
                         calibration_budget_s=budget, calibration=calibration,
                         calibration_failure=failure, commands=_report_commands.commands(results)))
  print(f"wrote {path}")


if __name__ == "__main__":
  _cli.run(main)
