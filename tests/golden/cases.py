"""Fixed experiment invocations whose JSON is the golden set.

Captured once before the package was re-layered (`python -m tests.golden.capture`)
and compared after every change by `tests/test_golden.py`: the figures and keys
of each experiment's JSON stay the same unless a fix says otherwise.
Timing fields (wall clock, dates, versions) are dropped before comparing.
"""

from __future__ import annotations

from typing import Any

# name -> (experiment module, flags). `--json_out` is added by the runner.
CASES: dict[str, tuple[str, tuple[str, ...]]] = {
    "lesson": ("lesson", ()),
    "crossovers": ("crossovers", ("--values=N=8e9,q=2,T=4096,k=131072,BW=2e12,F=6e14",)),
    "batch_sweep_raw":
        ("batch_sweep", ("--weights_gb=16", "--kv_gb_per_seq=0.25", "--bandwidth_tbps=2",
                         "--tflops=600", "--batch_sizes=1,8,32,64", "--token_gap_ms=12")),
    "batch_sweep_model":
        ("batch_sweep", ("--model=llama-3-8b", "--accelerator=h100-sxm", "--context=8192",
                         "--batch_sizes=1,8,32,128,512", "--token_gap_ms=30")),
    "batch_sweep_moe": ("batch_sweep", ("--model=mixtral-8x7b", "--accelerator=h200",
                                        "--context=4096", "--batch_sizes=1,4,16,64")),
    "kv_sizing": ("kv_sizing", ("--model=deepseek-v3", "--context=32768", "--batch=8",
                                "--accelerator=h200")),
    "kv_sizing_gemma": ("kv_sizing", ("--model=gemma-2-9b", "--context=16384", "--batch=4",
                                      "--accelerator=a100-80gb")),
    "compare_accelerators":
        ("compare_accelerators", ("--model=mixtral-8x7b", "--context=4096",
                                  "--accelerators=h100-sxm,h200,tpu-v5e", "--batch_sizes=1,8,64")),
    "decode_equivalence": ("decode_equivalence", ()),
}

# Keys whose values depend on the run (time, machine, versions), dropped anywhere.
VOLATILE = frozenset({
    "wall_s",
    "created",
    "date",
    "jax_version",
    "python",
    "platform_info",
    "elapsed_s",
    "seconds",
    "command",
    "argv",
    "hostname",
    "json_out",
    "plot_out",
})


def strip(value: Any) -> Any:
  """The JSON without volatile keys."""
  if isinstance(value, dict):
    return {k: strip(v) for k, v in value.items() if k not in VOLATILE}
  if isinstance(value, list):
    return [strip(v) for v in value]
  return value
