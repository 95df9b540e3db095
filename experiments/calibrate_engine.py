"""Calibrates from serving-benchmark results through the continuous-batching simulator.

Each run of a vLLM `bench serve` result JSON (or SGLang `bench_serving` JSONL)
is replayed by the simulator, and the factors are searched whose simulated
median TTFT, TPOT and ITL reproduce the measured ones
(`jaxroof.serving.engine_fit`); held out: leave one run out.

  R=tests/data/vllm_llama-3.3-70b_8xa100-40gb_tp8_sharegpt
  python -m experiments.calibrate_engine \
      --from_vllm=${R}_qps_01.json,${R}_qps_04_16.jsonl,${R}_qps_inf.json \
      --model=llama-3.1-70b --accelerator=a100-40gb --served_tp=8 \
      --profile_out=results/profile_a100-40gb_vllm_engine.json \
      --json_out=results/engine_calibration_vllm_llama70b_a100-40gb_tp8.json

A real engine on this CPU (experiments.vllm_bench writes OUT): fit on some
runs, predict others (other rates, lengths, a model folder never fitted),
each replayed with its own arrivals and lengths from the detailed result:

  python -m experiments.calibrate_engine --from_vllm=A.json,B.json \
      --heldout_vllm=C.json,D.json --model=OUT/model --heldout_model=OUT2/model \
      --accelerator_file=OUT/accelerator.json --scheduler=vllm --request_cost \
      --json_out=results/vllm_cpu/calibration.json

Numbers are labelled: measured (the files' medians), simulated with the
fitted factors (calibrated), simulated at the bound (eta = 1, no fixed cost).
"""

from __future__ import annotations

from absl import flags

from experiments import _cli
from jaxroof import errors
from jaxroof import files
from jaxroof.measure import profiles
from jaxroof.serving import engine_fit
from jaxroof.serving import simulator
from jaxroof.report import table
from jaxroof.specs import kv_sizing
from jaxroof.specs import parameters

_FROM_VLLM = flags.DEFINE_list(
    "from_vllm", None, "vLLM bench serve result JSON files (or SGLang bench_serving JSONL), "
    "comma-separated.")
_HELDOUT_VLLM = flags.DEFINE_list(
    "heldout_vllm", None, "vLLM bench serve result JSONs with per-request detail "
    "(--save-detailed), predicted with the factors fitted on --from_vllm.")
_MODEL = flags.DEFINE_string("model", None, "Shipped model name or config.json folder the "
                             "runs served.")
_HELDOUT_MODEL = flags.DEFINE_list("heldout_model", None, "The model (name or folder) the "
                                   "--heldout_vllm runs served: one for all, or one per file; "
                                   "default --model.")
_ACCELERATOR = flags.DEFINE_string("accelerator", None, "Shipped accelerator slug.")
_ACCELERATOR_FILE = flags.DEFINE_string(
    "accelerator_file", None, "Your own accelerator as JSON in the shipped schema (e.g. "
    "OUT/accelerator.json of experiments.vllm_bench), instead of --accelerator.")
_REQUEST_COST = flags.DEFINE_bool(
    "request_cost", False, "Also fit a fixed cost per request (HTTP, API server, "
    "tokenisation) that delays when the engine sees it (0 at the bound).")
_SERVED_TP = flags.DEFINE_integer("served_tp", 1, "Tensor-parallel chips of the server.",
                                  lower_bound=1)
_WEIGHT_DTYPE = flags.DEFINE_enum("weight_dtype", "bf16", list(parameters.WEIGHT_DTYPES),
                                  "The served weights' dtype.")
_KV_DTYPE = flags.DEFINE_enum("kv_dtype", "bf16", list(kv_sizing.KV_DTYPES), "The K/V dtype.")
_SCHEDULER = flags.DEFINE_enum("scheduler", "chunked", list(simulator.SCHEDULERS),
                               "The server's scheduler (vllm: vLLM V1's own; chunked: "
                               "Sarathi's).")
_MAX_RUNNING = flags.DEFINE_integer("max_running", 256, "vLLM --max-num-seqs.",
                                    lower_bound=1)
_TOKEN_BUDGET = flags.DEFINE_integer("token_budget", 2048,
                                     "vLLM --max-num-batched-tokens (chunked prefill).",
                                     lower_bound=1)
_MAX_SIMULATIONS = flags.DEFINE_integer(
    "max_simulations", engine_fit.MAX_EVALUATIONS,
    "Loss evaluations per search (each simulates every run once).", lower_bound=10)
_SEED = flags.DEFINE_integer("seed", 0, "Seeds the replayed arrivals.")
_PROFILE_OUT = flags.DEFINE_string("profile_out", None, "Write the fitted profile here.")
_JSON_OUT = flags.DEFINE_string("json_out", None, "Write the result JSON here.")



def main(argv: list[str]) -> None:
  del argv  # Unused.
  if not _FROM_VLLM.value:
    raise errors.InputError("--from_vllm is required: the vLLM bench serve result files.")
  if not _MODEL.value:
    raise errors.InputError("--model is required: the shipped model name.")
  if _HELDOUT_MODEL.value and not _HELDOUT_VLLM.value:
    raise errors.InputError(f"--heldout_model={','.join(_HELDOUT_MODEL.value)[:60]} without "
                            "--heldout_vllm: give the held-out runs it belongs to.")
  if bool(_ACCELERATOR.value) == bool(_ACCELERATOR_FILE.value):
    raise errors.InputError("give one of --accelerator (a shipped name) and "
                            "--accelerator_file (your device's JSON).")
  setup = engine_fit.ServingSetup(
      model=_MODEL.value, accelerator=_ACCELERATOR.value or "", tp=_SERVED_TP.value,
      weight_dtype=_WEIGHT_DTYPE.value, kv_dtype=_KV_DTYPE.value, scheduler=_SCHEDULER.value,
      max_running=_MAX_RUNNING.value, token_budget=_TOKEN_BUDGET.value, seed=_SEED.value,
      accelerator_file=_ACCELERATOR_FILE.value or None, request_cost=_REQUEST_COST.value)
  result = engine_fit.calibrate_engine(_FROM_VLLM.value, setup,
                                       heldout_paths=_HELDOUT_VLLM.value or (),
                                       heldout_model=_HELDOUT_MODEL.value or None,
                                       max_simulations=_MAX_SIMULATIONS.value)
  print(f"Fitted through the simulator ({result['simulations']} loss evaluations): " +
        ", ".join(f"{n} = {v:.4g}" for n, v in result["factors"].items()))
  cells = []
  for run in result["runs"]:
    for name, cal in run["calibrated"].items():
      bound = run["bound"][name]
      cells.append([run["run"], name, f"{cal['measured_s'] * 1e3:.2f}",
                    f"{cal['simulated_s'] * 1e3:.2f}" if cal["simulated_s"] else "n/a",
                    table.percent(cal["rel_error"]),
                    f"{bound['simulated_s'] * 1e3:.2f}" if bound["simulated_s"] else "n/a",
                    table.percent(bound["rel_error"])])
  print(table.format_table(("run", "metric", "measured ms", "calibrated ms", "error",
                            "bound ms", "bound error"), cells))
  for flag in result["flags"]:
    print(f"FLAG: {flag}")
  if result.get("heldout"):
    print(table.format_table(
        ("held-out run", "metric", "measured ms", "predicted ms", "error", "bound ms"),
        [[r["run"], f"p{r['percentile']} {r['metric']}", f"{r['measured_s'] * 1e3:.2f}",
          f"{r['predicted_s'] * 1e3:.2f}", table.percent(r["rel_error"]),
          f"{r['bound_s'] * 1e3:.2f}" if r["bound_s"] else "n/a"] for r in result["heldout"]]))
    for r in result["heldout_throughput"]:
      print(f"{r['run']}: throughput measured {r['measured_per_s']:.3f} req/s, predicted "
            f"{r['predicted_per_s']:.3f} ({table.percent(r['rel_error'])})")
  print(f"held-out ({result['heldout_method']}): median "
        f"{table.percent(result['heldout_median_rel_error'])}, max "
        f"{table.percent(result['heldout_max_rel_error'])}")
  if _PROFILE_OUT.value:
    profiles.save_profile(engine_fit.engine_profile(result), _PROFILE_OUT.value)
  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, result)


if __name__ == "__main__":
  _cli.run(main)
