"""The flags of `experiments.calibrate`, grouped by the source they serve.

Defined at import, once per process; `calibrate_engine` and `calibrate_layouts`
run `calibrate` with these same flags. Cost terms are named by the registry
(`jaxroof.symbolic.terms`, an engine's in `jaxroof.engines`): `--hold=NAME=VALUE,...`
and `--engine_terms=FILE.json` hold them, `--search=NAME,...` searches the optional
ones; each name is the term's profile field and JSON key, its value in SI units.
"""

from __future__ import annotations

from absl import flags

from experiments import _cli
from experiments import _engine_flags
from jaxroof import errors
from jaxroof.calibrate import engine_fit
from jaxroof.calibrate import engine_replay
from jaxroof.calibrate import engine_search
from jaxroof.engines import engine_rules
from jaxroof.engines import engine_profiles
from jaxroof.measure import measurement
from jaxroof.measure import vllm_results
from jaxroof.serving import simulator
from jaxroof.specs import kv_sizing
from jaxroof.specs import parameters
from jaxroof.symbolic import terms

# What is fitted; the default is the one a bare `calibrate` always ran.
SOURCES = ("ops", "toy", "csv", "vllm", "layouts", "published")
SOURCE = flags.DEFINE_enum(
    "source", "ops", list(SOURCES),
    "ops: the toy decode step's operations timed here (linear layer, decode attention), "
    "fixed costs from its smallest steps; toy: every factor from the toy's whole steps; "
    "csv: your measured step times (--from_csv, or --from_vllm mapped to rows); vllm: "
    "serving-benchmark runs replayed through the simulator (--from_vllm); layouts: rows "
    "on parallel layouts, with eta_comm (--from_csv); published: an engine's profile "
    "refitted from the shipped published measurements (--engine). Given --from_csv or "
    "--from_vllm without --source, csv; given --engine_terms and --heldout_vllm alone, vllm.")
ENGINE = _engine_flags.define()

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
COMPARE_PROFILE = flags.DEFINE_string(
    "compare_profile", None, "An earlier calibration's profile JSON: report whether this "
    "run agrees with it (factors within 10%, held-out medians within 3 points) under "
    "`repeatability`.")
VALIDATE = flags.DEFINE_string(
    "validate", None, "A profile JSON: time the toy's calibration model afresh at "
    "--batch_sizes x --contexts and compare with the profile's prediction, instead of "
    "calibrating.")
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
WEIGHT_DTYPE = flags.DEFINE_enum("weight_dtype", "bf16", list(parameters.WEIGHT_DTYPES),
                                 "With --from_vllm: the served weights' dtype.")
DROP_SUSPICIOUS = flags.DEFINE_bool(
    "drop_suspicious", False, "csv: leave out rows faster than their analytic bound or more "
    "than 20x slower (flagged by line either way).")
FIT_STEPS = flags.DEFINE_integer("fit_steps", 3000, "Adam steps of a csv or layouts fit, "
                                 "in [10, 100000].", lower_bound=10, upper_bound=100_000)
SERVER = flags.DEFINE_list(
    "server", [], "With --from_vllm: the server the runs came from, NAME=VALUE,...: tp "
    "(tensor-parallel chips, default 1), kv_dtype (its K/V cache dtype: "
    f"{', '.join(kv_sizing.KV_DTYPES)}; default bf16), and with --source=vllm scheduler "
    "(vllm: vLLM V1's own; chunked: Sarathi's; default chunked), max_num_seqs (default 256) "
    "and max_num_batched_tokens (default 2048). A run written by experiments.vllm_bench "
    "carries its own.")

# vLLM runs through the simulator (vllm).
HELDOUT_VLLM = flags.DEFINE_list(
    "heldout_vllm", None, "vllm: result JSONs with per-request detail (--save-detailed), "
    "predicted with the terms fitted on --from_vllm (or, without --from_vllm, with "
    "--engine_terms: nothing fitted).")
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
HOLD = flags.DEFINE_string(
    "hold", None, "vllm: cost terms held as measured, NAME=VALUE,... in SI units, named as "
    "the cost-term registry names them: the core's (eta_w, eta_kv, eta_attn, r_ovl, "
    "t0_request, ...) or an engine's (vLLM CPU: c_llc, bw_llc, s_lru, m_pass, t_act, t_wake, "
    "s_cold, t_build; jaxroof/engines/data/vllm_cpu.json ships measured sets). Each value "
    "must lie in its term's bounds. A held eta_w, eta_f or t0_step is not searched; over "
    "--engine_terms.")
ENGINE_TERMS = flags.DEFINE_string(
    "engine_terms", None, "vllm: a JSON file of cost terms to hold, by registry name: an "
    "object NAME: VALUE (or {\"terms\": {...}}), or an earlier --source=vllm result, whose "
    "factors and held terms are taken. With --heldout_vllm and no --from_vllm: predict those "
    "runs with these terms on this device's ceilings, fitting nothing.")
SEARCH = flags.DEFINE_list(
    "search", [], "vllm: optional costs searched too, by registry name: t0_request (per "
    "request, before the engine sees it), t0_seq (per sequence per iteration), t0_layer "
    "(per layer per iteration; needs --fit_model runs of two depths), t_wake (an idle "
    "engine's wake); and how: starts=1|2 (2 also descends from every searched cost at its "
    "lower bound, keeping the lower loss) and max_simulations=N (loss evaluations per "
    f"search, >= 10; default {engine_search.MAX_EVALUATIONS}).")

# Output.
PROFILE_OUT = flags.DEFINE_string("profile_out", None, "Write the fitted profile here.")
JSON_OUT = flags.DEFINE_string("json_out", None, "Write the result JSON here.")
PLOT_OUT = flags.DEFINE_string("plot_out", None, "ops, toy: write a PNG of measured vs "
                               "predicted step time here.")

_cli.require_positive(BUDGET_S, "s")
for _files in (FROM_VLLM, HELDOUT_VLLM):  # Bounded before any file is opened.
  flags.register_validator(
      _files.name, lambda v: not v or len(v) <= vllm_results.MAX_FILES,
      message=f"at most {vllm_results.MAX_FILES} result files at once "
      "(merge runs into a JSONL file, one run per line)")
_cli.require_positive_int_list(BATCH_SIZES, "sequences")
_cli.require_positive_int_list(CONTEXTS, "tokens")

_TOY = ("budget_s", "dtype", "rounds", "repeats", "seed", "compare_profile", "validate",
        "batch_sizes", "contexts", "plot_out")
_VLLM_SETUP = ("from_vllm", "model", "accelerator", "server", "weight_dtype")
# The flags each source reads (beyond --source, --json_out and --profile_out).
USED: dict[str, tuple[str, ...]] = {
    "ops": _TOY,
    "toy": _TOY,
    "csv": ("from_csv", *_VLLM_SETUP, "carry_over", "drop_suspicious", "fit_steps"),
    "layouts": ("from_csv", "accelerator", "carry_over", "fit_steps"),
    "vllm": (*_VLLM_SETUP, "heldout_vllm", "heldout_model", "fit_model", "accelerator_file", "hold",
             "engine_terms", "search", "seed"),
    "published": ("engine",),
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
  """The source to fit: --source, else what the other flags mean."""
  if not flags.FLAGS[SOURCE.name].using_default_value:
    return SOURCE.value
  if FROM_CSV.value or FROM_VLLM.value:
    return "csv"
  if ENGINE_TERMS.value or HELDOUT_VLLM.value:
    return "vllm"
  return "ops"


# The server's settings (--server) and the search's (--search), by key.
SERVER_KEYS = {
    "tp": 1, "scheduler": "chunked", "max_num_seqs": 256, "max_num_batched_tokens": 2048,
    "kv_dtype": "bf16"
}
_SEARCH_SETTINGS = {"starts": (1, 2), "max_simulations": (10, 10**6)}


def _pairs(flag: str, items: list[str]) -> dict[str, str]:
  out: dict[str, str] = {}
  for item in items:
    name, sep, value = item.partition("=")
    if not sep or not value.strip():
      raise errors.InputError(f"--{flag}={','.join(items)[:80]}: {item!r} is not NAME=VALUE.")
    out[name.strip()] = value.strip()
  return out


def server() -> dict:
  """--server as typed values over `SERVER_KEYS`; a bad item is one InputError."""
  given = _pairs("server", SERVER.value or [])
  out = dict(SERVER_KEYS)
  for name, value in given.items():
    errors_at = f"--server={','.join(SERVER.value)[:80]}: {name}={value!r}"
    if name not in SERVER_KEYS:
      errors.require_choice("server", name, tuple(SERVER_KEYS))
    if name in ("scheduler", "kv_dtype"):
      allowed = simulator.SCHEDULERS if name == "scheduler" else tuple(kv_sizing.KV_DTYPES)
      if value not in allowed:
        raise errors.InputError(f"{errors_at} is not allowed: use one of {', '.join(allowed)}.")
      out[name] = value
      continue
    if not value.isdigit() or not 1 <= int(value) <= _cli.MAX_INT_FLAG:
      raise errors.InputError(f"{errors_at} is not allowed: give a whole number >= 1.")
    out[name] = int(value)
  return out


def search() -> tuple[tuple[str, ...], dict[str, int]]:
  """--search as (the optional costs searched, the search's settings)."""
  names, settings = [], {"starts": 1, "max_simulations": engine_search.MAX_EVALUATIONS}
  for item in SEARCH.value or []:
    name, sep, value = item.partition("=")
    if not sep:
      errors.require_choice("search", item.strip(), engine_replay.OPTIONAL)
      names.append(item.strip())
      continue
    if name not in _SEARCH_SETTINGS:
      errors.require_choice("search", name, tuple(_SEARCH_SETTINGS))
    low, high = _SEARCH_SETTINGS[name]
    if not value.isdigit() or not low <= int(value) <= high:
      raise errors.InputError(f"--search={','.join(SEARCH.value)[:80]}: {name}={value!r} is "
                              f"not allowed: give a whole number in [{low}, {high}].")
    settings[name] = int(value)
  return tuple(names), settings


def held() -> dict[str, float]:
  """The terms held: --engine_terms's, then --hold's over them (registry names)."""
  given = engine_fit.read_terms(ENGINE_TERMS.value) if ENGINE_TERMS.value else {}
  return {**given, **(terms.parse(HOLD.value) if HOLD.value else {})}


def serving_setup(held_terms: dict[str, float]) -> engine_replay.ServingSetup:
  """The vLLM runs' model, device and server, and the terms searched and held."""
  if bool(ACCELERATOR.value) == bool(ACCELERATOR_FILE.value):
    raise errors.InputError("give one of --accelerator (a shipped name) and "
                            "--accelerator_file (your device's JSON).")
  given = server()
  return engine_replay.ServingSetup(model=MODEL.value, accelerator=ACCELERATOR.value or "",
                                    tp=given["tp"], weight_dtype=WEIGHT_DTYPE.value,
                                    kv_dtype=given["kv_dtype"], scheduler=given["scheduler"],
                                    max_running=given["max_num_seqs"],
                                    token_budget=given["max_num_batched_tokens"], seed=SEED.value,
                                    accelerator_file=ACCELERATOR_FILE.value or None,
                                    search=search()[0], held=held_terms)


def check_vllm() -> None:
  """--source=vllm's cross-flag rules, one line each."""
  if HELDOUT_MODEL.value and not HELDOUT_VLLM.value:
    raise errors.InputError(f"--heldout_model={','.join(HELDOUT_MODEL.value)[:60]} without "
                            "--heldout_vllm: give the held-out runs it belongs to.")
  if not MODEL.value:
    raise errors.InputError("--model is required: the model the runs served.")
  if FROM_VLLM.value:
    return
  for flag in (ENGINE_TERMS, HELDOUT_VLLM):  # A prediction: an earlier fit's terms.
    if not flag.value:
      raise errors.InputError(f"--{flag.name} is required without --from_vllm: the runs to "
                              "predict and the terms to predict them with (or give "
                              "--from_vllm to fit).")
  for flag in (FIT_MODEL, SEARCH, PROFILE_OUT):
    if flag.present:
      raise errors.InputError(f"--{flag.name} without --from_vllm: it shapes a fit, and a "
                              "prediction fits nothing.")


def published_engine() -> str:
  """--engine for --source=published: the profile to refit (NIM: TensorRT-LLM's)."""
  name = engine_profiles.check_engine(ENGINE.value)
  if name == engine_profiles.BOUND:
    raise errors.InputError("--engine is required with --source=published: the engine whose "
                            "profile to refit (" + ", ".join(engine_profiles.ENGINES) + ").")
  return engine_rules.canonical(name)
