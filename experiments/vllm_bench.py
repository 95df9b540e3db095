"""Serve a tiny model with a real vLLM engine on this CPU and measure it (loopback only).

Needs the engine's own venv (`bash experiments/vllm_setup.sh DIR`, ~3.4 GB):

  python -m experiments.vllm_bench --engine_env=/work/vllm-env --model=tiny-llama \
      --rates=1,4 --prompt_tokens=256 --output_tokens=64 --num_prompts=60 --out_dir=OUT

OUT holds one vLLM result JSON per rate (with per-request detail and a
`jaxroof_engine_run` block: server configuration, K/V blocks, load average),
the model folder (config.json + word-level tokenizer; dummy weights),
`accelerator.json` (this machine's ceilings measured through the engine's
torch, bf16, on the engine's pinned core) and `summary.json`. Labels:
measurement (device, engine version, dtype bf16, timed by vllm bench serve).
Then: `python -m experiments.calibrate_engine --from_vllm=... --heldout_vllm=...`.
"""

from __future__ import annotations

import os

from absl import flags

from experiments import _cli
from jaxroof import errors
from jaxroof import files
from jaxroof.engines import vllm_engine
from jaxroof.engines import vllm_model
from jaxroof.engines import vllm_server

_ENGINE_ENV = flags.DEFINE_string(
    "engine_env", os.environ.get("JAXROOF_VLLM_ENV"),
    "The vLLM engine's venv (bash experiments/vllm_setup.sh DIR); default $JAXROOF_VLLM_ENV.")
_MODEL = flags.DEFINE_string(
    "model", "tiny-llama", f"A preset ({', '.join(vllm_model.PRESETS)}), or a shipped model "
    "name or config.json path scaled down by the size flags.")
_SIZES = {
    name: flags.DEFINE_integer(name, None, f"Model size: {key} (default: the model's).",
                               lower_bound=1,
                               upper_bound=65536) for name, key in vllm_model.SCALABLE.items()
}
_RATES = flags.DEFINE_list("rates", ["1", "4"], "Request rates (requests/s), comma-separated.")
_PROMPT_TOKENS = flags.DEFINE_integer("prompt_tokens", 256, "Prompt tokens per request.",
                                      lower_bound=1, upper_bound=8192)
_OUTPUT_TOKENS = flags.DEFINE_integer("output_tokens", 64, "Output tokens per request.",
                                      lower_bound=2, upper_bound=8192)
_RANGE_RATIO = flags.DEFINE_float(
    "range_ratio", 0.0, "vLLM --random-range-ratio: lengths "
    "uniform in [(1-r) L, (1+r) L]; 0: fixed. In [0, 0.9].", lower_bound=0.0, upper_bound=0.9)
_NUM_PROMPTS = flags.DEFINE_integer("num_prompts", 60, "Requests per rate. In [2, 2000].",
                                    lower_bound=2, upper_bound=2000)
_OUT_DIR = flags.DEFINE_string("out_dir", None, "Output folder (created).")
_PORT = flags.DEFINE_integer("port", 0, "Loopback port of the server (0: a free one).",
                             lower_bound=0, upper_bound=65535)
_MAX_NUM_SEQS = flags.DEFINE_integer("max_num_seqs", 32, "vLLM --max-num-seqs.", lower_bound=1,
                                     upper_bound=4096)
_MAX_BATCHED = flags.DEFINE_integer("max_num_batched_tokens", 2048,
                                    "vLLM --max-num-batched-tokens (token budget per step).",
                                    lower_bound=16, upper_bound=65536)
_CHUNKED = flags.DEFINE_bool("chunked_prefill", True, "vLLM --enable-chunked-prefill.")
_BLOCK_SIZE = flags.DEFINE_integer(
    "block_size", 128, "vLLM --block-size: tokens per K/V "
    "block (the CPU backend needs a multiple of 32).", lower_bound=32, upper_bound=1024)
_KV_SPACE_GIB = flags.DEFINE_integer("kv_space_gib", 1, "VLLM_CPU_KVCACHE_SPACE: GiB of K/V.",
                                     lower_bound=1, upper_bound=1024)
_MAX_MODEL_LEN = flags.DEFINE_integer("max_model_len", 2048, "vLLM --max-model-len.",
                                      lower_bound=16, upper_bound=131072)
_ENGINE_CPUS = flags.DEFINE_string(
    "engine_cpus", "1", "VLLM_CPU_OMP_THREADS_BIND: the engine "
    "worker's cores (e.g. 1, or 0-1).")
_FRONTEND_CPUS = flags.DEFINE_string(
    "frontend_cpus", "0", "Cores of the API server and the benchmark client (\"\": unpinned): "
    "kept off --engine_cpus, so that the engine's core serves the engine only.")
_ENGINE_CORE_CPUS = flags.DEFINE_string(
    "engine_core_cpus", "", "Cores of vLLM's engine core process (its scheduler loop) once "
    "the server is up (\"\": where vLLM starts it, with the API server on --frontend_cpus).")
_ENGINE_CORE_NICE = flags.DEFINE_integer(
    "engine_core_nice", 19, "Niceness of vLLM's engine core process once the server is up "
    "(0: as vLLM starts it). 19 lets the API server and the client on its core run first, so "
    "the client receives tokens as they come (README, 'Checked against a real engine').",
    lower_bound=-20, upper_bound=19)
_START_TIMEOUT_S = flags.DEFINE_float(
    "start_timeout_s", 300.0, "Most seconds for the server "
    "to become healthy. In [10, 3600].", lower_bound=10.0, upper_bound=3600.0)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the benchmark's prompts and arrivals.")
_CACHE_DIR = flags.DEFINE_string(
    "cache_dir", None, "The engine's compile caches (default "
    "OUT/work; a shared folder makes later starts warm).")


def _rates() -> list[float]:
  try:
    rates = [float(r) for r in _RATES.value]
  except ValueError:
    raise errors.InputError(f"--rates={','.join(_RATES.value)!r} is not a list of numbers.") \
        from None
  if not rates or not all(0.01 <= r <= 1000 for r in rates):
    raise errors.InputError(f"--rates={','.join(_RATES.value)!r} is not allowed: give "
                            "requests/s in [0.01, 1000], comma-separated.")
  return rates


def main(argv: list[str]) -> None:
  del argv  # Unused.
  rates = _rates()
  if not _OUT_DIR.value or not _OUT_DIR.value.strip():
    raise errors.InputError("--out_dir is required: the folder for results.")
  if _PROMPT_TOKENS.value + _OUTPUT_TOKENS.value > _MAX_MODEL_LEN.value:
    raise errors.InputError(f"--prompt_tokens + --output_tokens = "
                            f"{_PROMPT_TOKENS.value + _OUTPUT_TOKENS.value} exceeds "
                            f"--max_model_len={_MAX_MODEL_LEN.value}.")
  if _BLOCK_SIZE.value % 32:
    raise errors.InputError(f"--block_size={_BLOCK_SIZE.value} is not allowed: vLLM's CPU "
                            "backend needs a multiple of 32.")
  overrides = {name: holder.value for name, holder in _SIZES.items()}
  vllm_model.scaled_config(_MODEL.value, overrides)  # Refuse a bad model before any work.
  config = vllm_server.ServerConfig(
      max_num_seqs=_MAX_NUM_SEQS.value, max_num_batched_tokens=_MAX_BATCHED.value,
      chunked_prefill=_CHUNKED.value, block_size=_BLOCK_SIZE.value,
      kv_space_gib=_KV_SPACE_GIB.value, max_model_len=_MAX_MODEL_LEN.value,
      engine_cpus=_ENGINE_CPUS.value, frontend_cpus=_FRONTEND_CPUS.value,
      engine_core_cpus=_ENGINE_CORE_CPUS.value, engine_core_nice=_ENGINE_CORE_NICE.value,
      seed=_SEED.value)
  if config.engine_core_cpus:
    vllm_server.parse_cpus(config.engine_core_cpus, "engine_core_cpus")
  shared = set(vllm_server.parse_cpus(config.engine_cpus)) & set(
      vllm_server.parse_cpus(config.frontend_cpus, "frontend_cpus") if config.frontend_cpus else ())
  if shared:
    print(f"note: --frontend_cpus and --engine_cpus share core(s) {sorted(shared)}: the API "
          "server and the client will take time from the engine, and the timings will not "
          "repeat as well (README, 'Checked against a real engine').")
  vllm_server.engine_python(_ENGINE_ENV.value or "")
  longest = max(_NUM_PROMPTS.value / r for r in rates)
  spec = vllm_server.BenchSpec(rate=rates[0], prompt_tokens=_PROMPT_TOKENS.value,
                               output_tokens=_OUTPUT_TOKENS.value, num_prompts=_NUM_PROMPTS.value,
                               range_ratio=_RANGE_RATIO.value, seed=_SEED.value,
                               timeout_s=3 * longest + 300)
  with files.output_folder("--out_dir", _OUT_DIR.value) as out_dir:  # Removed if it fails.
    summary = vllm_engine.run_bench(env_dir=_ENGINE_ENV.value, model=_MODEL.value,
                                    overrides=overrides, rates=rates, spec=spec, config=config,
                                    out_dir=out_dir, port=_PORT.value,
                                    start_timeout_s=_START_TIMEOUT_S.value,
                                    cache_dir=_CACHE_DIR.value or None)
  print(f"measurement (vLLM {summary['engine']['vllm_version']}, {summary['device']}, bf16): "
        f"{len(summary['runs'])} runs; summary {os.path.join(_OUT_DIR.value, 'summary.json')}")
  for run in summary["runs"]:
    print(f"  rate {run['rate']:g}: {run['result_path']} (load {run['load']['before'][0]:.2f})")


if __name__ == "__main__":
  _cli.run(main)
