"""The flags of `experiments.calibrate`, grouped by the source they serve.

Defined at import, once per process; `calibrate_engine` and `calibrate_layouts`
run `calibrate` with these same flags (older command lines keep working).
"""

from __future__ import annotations

from absl import flags

from experiments import _cli
from jaxroof import errors
from jaxroof.calibrate import engine_fit
from jaxroof.calibrate import toy_fit
from jaxroof.measure import measurement
from jaxroof.serving import simulator
from jaxroof.specs import kv_sizing
from jaxroof.specs import parameters

# What is fitted; the default is the one a bare `calibrate` always ran.
SOURCES = ("ops", "toy", "csv", "vllm", "layouts")
SOURCE = flags.DEFINE_enum(
    "source", "ops", list(SOURCES),
    "ops: the toy decode step's operations timed here (linear layer, decode attention), "
    "fixed costs from its smallest steps; toy: every factor from the toy's whole steps; "
    "csv: your measured step times (--from_csv, or --from_vllm mapped to rows); vllm: "
    "serving-benchmark runs replayed through the simulator (--from_vllm); layouts: rows "
    "on parallel layouts, with eta_comm (--from_csv). Given --from_csv or --from_vllm "
    "without --source, csv.")

# The toy calibration on this device (ops, toy).
BUDGET_S = flags.DEFINE_float(
    "budget_s", 600.0, "Wall-clock budget of the calibration, seconds (> 0; under 150 s a "
    "sparser grid is measured).")
DTYPE = flags.DEFINE_enum("dtype", "float32", list(measurement.DTYPES), "Weights and K/V.")
ROUNDS = flags.DEFINE_integer(
    "rounds", 5, "Passes over the points while the budget lasts (>= 1); each point keeps "
    "its lower-quartile round (the 2nd fastest of 5); points whose fastest rounds "
    "disagree get up to 3 more.", lower_bound=1)
REPEATS = flags.DEFINE_integer("repeats", 3, "Timed steps per point and round (>= 1).",
                               lower_bound=1)
SEED = flags.DEFINE_integer("seed", 0, "Seeds the order and data (toy), the replayed "
                            "arrivals (vllm).")
FIT = flags.DEFINE_enum(
    "fit", None, list(toy_fit.FITS), "Older spelling of the toy fit: ops is "
    "--source=ops, steps is --source=toy.")
COMPARE_PROFILE = flags.DEFINE_string(
    "compare_profile", None, "An earlier calibration's profile JSON: report whether this "
    "run agrees with it (factors within 10%, held-out medians within 3 points) under "
    "`repeatability`.")
VALIDATE = flags.DEFINE_bool(
    "validate", False, "Validate --profile at --batch_sizes x --contexts instead of "
    "calibrating.")
PROFILE = flags.DEFINE_string("profile", None, "Profile JSON to validate (with --validate).")
VALIDATE_MODEL = flags.DEFINE_string(
    "validate_model", "calibration", "With --validate: which of the profile's toy models to "
    "time (a fit or a held-out model).")
BATCH_SIZES = flags.DEFINE_list("batch_sizes", "2,24,64", "Validation batch sizes "
                                "(sequences), whole numbers >= 1.")
CONTEXTS = flags.DEFINE_list(
    "contexts", "200,1500", "Validation contexts (tokens already "
    "cached per sequence), whole numbers >= 1.")

# Measurements you already have (csv, layouts, vllm).
FROM_CSV = flags.DEFINE_string(
    "from_csv", None, "Measured step times, CSV (or .jsonl): columns model, accelerator, "
    "phase, batch, time_s, context|prompt_tokens, optional weight_dtype, kv_dtype, tp, pp, "
    "ep, source.")
FROM_VLLM = flags.DEFINE_list(
    "from_vllm", None, "vLLM `bench serve` result JSONs (or SGLang bench_serving JSONL), "
    "comma-separated; needs --model and --accelerator (or --accelerator_file).")
ACCELERATOR = flags.DEFINE_string(
    "accelerator", None, "Accelerator slug of the rows to fit (required when the file holds "
    "several devices, and with --from_vllm).")
CARRY_OVER = flags.DEFINE_bool(
    "carry_over", False, "csv: fit on each model's rows and predict the others; layouts: "
    "fit on some layouts and predict the others (per device).")
MODEL = flags.DEFINE_string(
    "model", None, "With --from_vllm: the shipped model (or "
    "config folder) the runs served.")
SERVED_TP = flags.DEFINE_integer("served_tp", 1, "With --from_vllm: tensor-parallel chips "
                                 "of the server.", lower_bound=1, upper_bound=1024)
WEIGHT_DTYPE = flags.DEFINE_enum("weight_dtype", "bf16", list(parameters.WEIGHT_DTYPES),
                                 "With --from_vllm: the served weights' dtype.")
KV_DTYPE = flags.DEFINE_enum("kv_dtype", "bf16", list(kv_sizing.KV_DTYPES),
                             "With --from_vllm: the K/V dtype.")
ROWS_OUT = flags.DEFINE_string(
    "rows_out", None, "csv with --from_vllm: write the derived "
    "rows as the documented CSV.")
DROP_SUSPICIOUS = flags.DEFINE_bool(
    "drop_suspicious", False, "csv: leave out rows faster than their analytic bound or more "
    "than 20x slower (flagged by line either way).")
FIT_STEPS = flags.DEFINE_integer("fit_steps", 3000, "Adam steps of a csv or layouts fit, "
                                 "in [10, 100000].", lower_bound=10, upper_bound=100_000)

# vLLM runs through the simulator (vllm).
HELDOUT_VLLM = flags.DEFINE_list(
    "heldout_vllm", None, "vllm: result JSONs with per-request detail (--save-detailed), "
    "predicted with the factors fitted on --from_vllm.")
HELDOUT_MODEL = flags.DEFINE_list(
    "heldout_model", None, "vllm: the model (name or folder) the --heldout_vllm runs "
    "served: one for all, or one per file; default --model.")
FIT_MODEL = flags.DEFINE_list(
    "fit_model", None, "vllm: the model (name or folder) each --from_vllm run served: one "
    "for all, or one per file; default --model. Runs of two sizes tell the weights' rate "
    "from the fixed costs.")
ACCELERATOR_FILE = flags.DEFINE_string(
    "accelerator_file", None, "vllm: your own accelerator as JSON in the shipped schema "
    "(e.g. OUT/accelerator.json of experiments.vllm_bench), instead of --accelerator.")
REQUEST_COST = flags.DEFINE_bool(
    "request_cost", False, "vllm: also fit a fixed cost per request (HTTP, API server, "
    "tokenisation) that delays when the engine sees it (0 at the bound).")
ENGINE_REQUEST_MS = flags.DEFINE_float(
    "engine_request_ms", None, "vllm: the fixed cost per request (HTTP, API server, "
    "tokenisation) held at this measured value in ms instead of fitted (--request_cost): "
    "the client's time to a one-token response less vLLM's own prefill time, isolated "
    "requests (results/vllm_cpu/engine_prefill_lengths.py; 3-4 ms on the AMX Xeon of issue "
    "25). Unset: 0, or fitted with --request_cost.", lower_bound=0.0, upper_bound=1e5)
ENGINE_WAKE_MS = flags.DEFINE_float(
    "engine_wake_ms", None, "vllm: what an iteration on an idle engine pays, held at this "
    "measured value in ms instead of fitted (--wake_cost): a short prompt's served prefill "
    "after 0.2 s idle less the same beside a running decode (results/vllm_cpu/"
    "engine_idle_probe.json: 0-3.8 ms over six shapes, median 2.3). Unset: 0, or fitted with "
    "--wake_cost.", lower_bound=0.0, upper_bound=1e5)
WAKE_COST = flags.DEFINE_bool(
    "wake_cost", False, "vllm: also fit what an iteration pays when the engine was idle "
    "before it (t_wake: the engine waking from its wait; vLLM CPU's served prefills of 16 "
    "tokens took 2-4 ms longer after an idle gap than beside a running decode, "
    "results/vllm_cpu/engine_idle_probe.py). Only requests that find the engine idle pay it; "
    "with it, hold the per-request cost at its measured value (--engine_request_ms).")
LAYER_COST = flags.DEFINE_bool(
    "layer_cost", False, "vllm: also fit a fixed cost per layer per iteration (the engine's "
    "per-layer kernels); needs --fit_model runs of two depths.")
ENGINE_OVERLAP = flags.DEFINE_float(
    "engine_overlap", 1.0, "vllm: r_ovl held in the fit: how the engine's GEMMs overlap "
    "weight reads and FLOPs (p = 1 + r_ovl; 0 adds them). vLLM's bf16 GEMMs on this CPU "
    "measured 0-0.06 (results/vllm_cpu/engine_token_rates*.json). In [0, 100]: at 100 the "
    "larger of the two already stands within 1%.", upper_bound=100.0)
ENGINE_M_PASS = flags.DEFINE_integer(
    "engine_m_pass", 0, "vllm: rows the engine's GEMM multiplies in one pass over the "
    "weights, held in the fit: a step of more tokens reads the linear weights again per "
    "m_pass tokens. vLLM's bf16 oneDNN path: 256 on the EPYC, 320 on the AMX Xeon "
    "(results/vllm_cpu/engine_gemm_blocks.py --m_pass). 0: no limit.", lower_bound=0,
    upper_bound=1_000_000)
ENGINE_ETA_KV = flags.DEFINE_float(
    "engine_eta_kv", None, "vllm: eta_kv held in the fit: the engine's attention kernel's "
    "K/V read rate as a share of the device's read bandwidth. vLLM's CPU kernel on this CPU: "
    "about 9 GB/s of 38-41, net of its FLOPs at --engine_eta_attn "
    "(results/vllm_cpu/engine_attention_rates*.json): 0.23. In (0, 1]; unset: tied to eta_w.",
    lower_bound=1e-6, upper_bound=1.0)
ENGINE_ETA_W = flags.DEFINE_float(
    "engine_eta_w", None, "vllm: eta_w held in the fit, not searched: the engine's GEMMs' "
    "weight read rate beyond the held cache as a share of the device's read bandwidth "
    "(a pass's engine_cache.json: bw_rest over the read ceiling; the EPYC of issue 25: "
    "0.39-0.45). In (0, 1]; unset: searched.", lower_bound=1e-6, upper_bound=1.0)
ENGINE_ETA_ATTN = flags.DEFINE_float(
    "engine_eta_attn", None, "vllm: eta_attn held in the fit: the engine's attention "
    "kernel's FLOP rate as a share of the device's F, its FLOPs timed on top of the linear "
    "layers'. vLLM's CPU kernel on this CPU: 114-121 GFLOP/s of 446 on prompts of 128-512 "
    "tokens (results/vllm_cpu/engine_attention_rates*.json): 0.26. In (0, 1]; unset: "
    "attention FLOPs with the linear layers' at eta_f.", lower_bound=1e-6, upper_bound=1.0)
ENGINE_CACHE_MB = flags.DEFINE_float(
    "engine_cache_mb", 0.0, "vllm: MB (1e6 bytes) of a step's weights the engine finds in "
    "the CPU's last-level cache, held in the fit with --engine_cache_gbps: read at that rate, "
    "the rest at eta_w x the read ceiling. vLLM's GEMMs on the AMX Xeon of issue 25: 51-106 "
    "MB at about 22 GB/s (results/vllm_cpu/passIN/engine_cache.json, "
    "results/vllm_cpu/engine_cache_fit.py). 0: no cache.", lower_bound=0.0, upper_bound=1e7)
ENGINE_CACHE_GBPS = flags.DEFINE_float(
    "engine_cache_gbps", 0.0, "vllm: GB/s at which the engine reads the weights in the "
    "cache (--engine_cache_mb); needed with it.", lower_bound=0.0, upper_bound=1e6)
ENGINE_CACHE_LRU = flags.DEFINE_float(
    "engine_cache_lru", 0.0, "vllm: the share of the cache (--engine_cache_mb) lost per byte "
    "a step's weights exceed it, held in the fit: 1 an LRU under the steps' cyclic scan over "
    "the weights (none cached past twice the cache); 0 keeps the cache's bytes of any larger "
    "set. The EPYC of issue 25, with the cache engine_cache_fit.py gives for 1: each pass's "
    "fit loss 12-34% lower, held-out rows better on two passes of three, worse carried to "
    "another pass (results/vllm_cpu/README.md). In [0, 1].", lower_bound=0.0, upper_bound=1.0)
ENGINE_BUILD_US = flags.DEFINE_float(
    "engine_build_us", 0.0, "vllm: microseconds per decoder layer and per token a step spends "
    "building the engine's GEMM kernels when its token count is not among the last 32 the "
    "engine ran, held in the fit (vLLM's oneDNN primitives, one per row count; "
    "results/vllm_cpu/engine_cold_rows.py). 0: none.", lower_bound=0.0, upper_bound=1e6)
ENGINE_ACT_NS = flags.DEFINE_float(
    "engine_act_ns", 0.0, "vllm: nanoseconds per token and per activation element (each "
    "block's hidden size and active MLP width) the engine's elementwise kernels take (norms, "
    "rotary, SiLU-and-multiply, residual adds), held in the fit (vLLM's inductor code on the "
    "AMX Xeon: 1.2-1.9; results/vllm_cpu/engine_forward_ops.py). 0: none.", lower_bound=0.0,
    upper_bound=1e6)
ENGINE_COLD_SHARE = flags.DEFINE_float(
    "engine_cold_share", 0.0, "vllm: the share of the cached weight bytes (--engine_cache_mb) "
    "an idle gap evicts, held in the fit: an iteration on an idle engine reads that share from "
    "memory again, on top of its wake (the AMX Xeon of issue 25: 1, "
    "results/vllm_cpu/wake_split.py). In [0, 1]; 0: none.", lower_bound=0.0, upper_bound=1.0)


@flags.multi_flags_validator(
    (ENGINE_CACHE_MB.name, ENGINE_CACHE_GBPS.name),
    message="--engine_cache_mb and --engine_cache_gbps go together: give both above 0 (the "
    "cached weight bytes and their read rate, engine_cache_fit.py), or neither")
def _cache_pair(values: dict) -> bool:
  return (values[ENGINE_CACHE_MB.name] > 0) == (values[ENGINE_CACHE_GBPS.name] > 0)


ENGINE_FACTORS = flags.DEFINE_string(
    "engine_factors", None, "vllm: an earlier engine calibration (the --json_out of "
    "--source=vllm): predict the --heldout_vllm runs with its factors on this "
    "--accelerator_file's ceilings, fitting nothing (factors carried to another device or "
    "day; --from_vllm not used). --engine_eta_w, --engine_eta_kv, --engine_eta_attn, "
    "--engine_overlap, --engine_m_pass, --engine_cache_mb/gbps/lru, --engine_build_us, "
    "--engine_act_ns, --engine_cold_share, --engine_request_ms and "
    "--engine_wake_ms, where given, replace what it held (the new device's own kernel rates, "
    "front end and wake).")


@flags.multi_flags_validator(
    (ENGINE_CACHE_LRU.name, ENGINE_CACHE_MB.name, ENGINE_FACTORS.name),
    message="--engine_cache_lru needs a cache: give --engine_cache_mb and --engine_cache_gbps "
    "(or --engine_factors from a fit that held one)")
def _lru_has_cache(values: dict) -> bool:
  return (not values[ENGINE_CACHE_LRU.name] or values[ENGINE_CACHE_MB.name] > 0 or
          bool(values[ENGINE_FACTORS.name]))


SEQUENCE_COST = flags.DEFINE_bool(
    "sequence_cost", False, "vllm: also fit a fixed cost per sequence per iteration (the "
    "engine's Python and sampling work; 0 at the bound).")
SCHEDULER = flags.DEFINE_enum(
    "scheduler", "chunked", list(simulator.SCHEDULERS),
    "vllm: the server's scheduler (vllm: vLLM V1's own; chunked: "
    "Sarathi's).")
MAX_RUNNING = flags.DEFINE_integer("max_running", 256, "vllm: vLLM --max-num-seqs.", lower_bound=1)
TOKEN_BUDGET = flags.DEFINE_integer("token_budget", 2048, "vllm: vLLM "
                                    "--max-num-batched-tokens (chunked prefill).", lower_bound=1)
MAX_SIMULATIONS = flags.DEFINE_integer(
    "max_simulations", engine_fit.MAX_EVALUATIONS, "vllm: loss evaluations per search "
    "(each simulates every run once).", lower_bound=10)
FIT_STARTS = flags.DEFINE_integer(
    "fit_starts", 1, "vllm: the searches' starts: 1 (from the usual start) or 2 (also from "
    "every fitted fixed cost at its lower bound, keeping the lower loss; about twice the "
    "time). The loss can hold two minima where fixed costs trade against each other.",
    lower_bound=1, upper_bound=2)

# Output.
PROFILE_OUT = flags.DEFINE_string("profile_out", None, "Write the fitted profile here.")
JSON_OUT = flags.DEFINE_string("json_out", None, "Write the result JSON here.")
PLOT_OUT = flags.DEFINE_string("plot_out", None, "ops, toy: write a PNG of measured vs "
                               "predicted step time here.")

_cli.require_positive(BUDGET_S, "s")
_cli.require_positive_int_list(BATCH_SIZES, "sequences")
_cli.require_positive_int_list(CONTEXTS, "tokens")


@flags.multi_flags_validator((VALIDATE.name, PROFILE.name),
                             message="--validate needs --profile=PATH (a profile JSON)")
def _profile_given(values: dict) -> bool:
  return not values[VALIDATE.name] or bool(values[PROFILE.name])


_TOY = ("budget_s", "dtype", "rounds", "repeats", "seed", "fit", "compare_profile", "validate",
        "profile", "validate_model", "batch_sizes", "contexts", "plot_out")
_VLLM_SETUP = ("from_vllm", "model", "accelerator", "served_tp", "weight_dtype", "kv_dtype")
# The flags each source reads (beyond --source, --json_out and --profile_out).
USED: dict[str, tuple[str, ...]] = {
    "ops": _TOY,
    "toy": _TOY,
    "csv": ("from_csv", *_VLLM_SETUP, "carry_over", "rows_out", "drop_suspicious", "fit_steps"),
    "layouts": ("from_csv", "accelerator", "carry_over", "fit_steps"),
    "vllm": (*_VLLM_SETUP, "heldout_vllm", "heldout_model", "fit_model", "accelerator_file",
             "request_cost", "sequence_cost", "layer_cost", "wake_cost", "engine_request_ms",
             "engine_wake_ms", "engine_overlap", "engine_m_pass", "engine_eta_w", "engine_eta_kv",
             "engine_eta_attn", "engine_cache_mb", "engine_cache_gbps", "engine_cache_lru",
             "engine_build_us", "engine_act_ns", "engine_cold_share", "scheduler", "max_running",
             "token_budget", "max_simulations", "fit_starts", "seed", "engine_factors"),
}
_EVERY_SOURCE = ("source", "json_out", "profile_out")


def check_used(chosen: str) -> None:
  """Refuses a flag given on the command line that the chosen source never reads."""
  for name in USED:
    for flag in USED[name]:
      if flags.FLAGS[flag].present and flag not in USED[chosen] + _EVERY_SOURCE:
        owners = ", ".join(s for s in SOURCES if flag in USED[s])
        raise errors.InputError(f"--{flag} is not read with --source={chosen}: it is for "
                                f"--source={owners}.")


def source() -> str:
  """The source to fit: --source, else what the older flags meant."""
  if not flags.FLAGS[SOURCE.name].using_default_value:
    return SOURCE.value
  if ENGINE_FACTORS.value:
    return "vllm"
  if FROM_CSV.value or FROM_VLLM.value:
    return "csv"
  return "toy" if FIT.value == "steps" else "ops"
