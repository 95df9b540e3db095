"""Merges a copied pass's per-invocation accelerator files into one accelerator file.

`passN/accelerator_<folder>.json` (one per `vllm_bench` invocation) into OUT (default
`passN/accelerator.json`): each invocation's fastest repeat, the median over invocations
(`vllm_engine.ceiling_rates`). `copy_pass.py` calls it; passes copied before that merge
(the fastest repeat over invocations) are re-merged with an explicit OUT. Usage (project
venv, repository root):
  python results/vllm_cpu/merge_ceilings.py results/vllm_cpu/passN [OUT]
"""
import json
import os
import sys

from jaxroof import files
from jaxroof.measure import vllm_engine

FOLDERS = ("tiny_in128", "tiny_in256", "small_in256", "medium", "nano")


def merge(pass_dir: str, out: str) -> dict:
  """Writes OUT from the pass's accelerator files and returns its entry."""
  ceilings, dates, used = [], [], []
  for folder in FOLDERS:
    path = os.path.join(pass_dir, f"accelerator_{folder}.json")
    if not os.path.exists(path):  # A pass of fewer models (avx2_pass.sh: tiny-llama only).
      continue
    accelerator = json.load(open(path))
    ceilings.append(next(iter(accelerator["accelerators"].values()))["measured"])
    dates.append(json.load(open(os.path.join(pass_dir, f"summary_{folder}.json")))["date"])
    used.append(path)
  first = used[0].replace("accelerator_", "summary_")  # The server configuration: the first's.
  summary = json.load(open(first))
  fields = vllm_engine.ServerConfig.__dataclass_fields__
  config = vllm_engine.ServerConfig(
      **{k: v for k, v in summary["server"]["config"].items() if k in fields})
  entry = vllm_engine.accelerator_entry(ceilings, config, measured_at=max(dates))
  entry["sources"]["note"] = (
      f"merged from the {len(used)} accelerator files of {pass_dir} ({min(dates)} to "
      f"{max(dates)}) by results/vllm_cpu/merge_ceilings.py: each invocation's fastest repeat, "
      "the median over invocations (vllm_engine.ceiling_rates)")
  files.write_json(out, {"accelerators": {"cpu-vllm-engine": entry}})
  return entry


if __name__ == "__main__":
  pass_dir = sys.argv[1].rstrip("/")
  entry = merge(pass_dir,
                sys.argv[2] if len(sys.argv) > 2 else os.path.join(pass_dir, "accelerator.json"))
  print(f"{entry['memory_bandwidth_tb_s'] * 1e3:.1f} GB/s", entry["dense_tflops"])
