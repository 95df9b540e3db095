"""Copies one same-hour pass (same_hour_pass.sh's OUT_DIR) into results/vllm_cpu/passN.

Each result JSON as `<model>_vllm_rate...json` without `generated_texts` (random words of
dummy weights), each invocation's summary and accelerator file, and `accelerator.json`:
the fastest repeat of each ceiling over the pass's invocations
(`vllm_engine.accelerator_entry`). Usage (project venv, repository root):
  python results/vllm_cpu/copy_pass.py OUT_DIR results/vllm_cpu/passN
"""
import glob
import json
import os
import sys

from jaxroof import files
from jaxroof.measure import vllm_engine

FOLDERS = {
    "tiny_in128": "tiny", "tiny_in256": "tiny", "small_in256": "small", "medium": "medium",
    "nano": "nano"
}

if __name__ == "__main__":
  src, dst = sys.argv[1], sys.argv[2]
  os.makedirs(dst, exist_ok=True)
  ceilings, dates = [], []
  for folder, model in FOLDERS.items():
    base = os.path.join(src, folder)
    if not os.path.isdir(base):  # A pass of fewer models (avx2_pass.sh: tiny-llama only).
      continue
    for path in sorted(glob.glob(os.path.join(base, "vllm_rate*.json"))):
      result = json.load(open(path))
      result.pop("generated_texts", None)
      files.write_json(os.path.join(dst, f"{model}_{os.path.basename(path)}"), result)
    summary = json.load(open(os.path.join(base, "summary.json")))
    files.write_json(os.path.join(dst, f"summary_{folder}.json"), summary)
    accelerator = json.load(open(os.path.join(base, "accelerator.json")))
    files.write_json(os.path.join(dst, f"accelerator_{folder}.json"), accelerator)
    ceilings.append(next(iter(accelerator["accelerators"].values()))["measured"])
    dates.append(summary["date"])
  summary = json.load(open(os.path.join(src, "tiny_in128", "summary.json")))
  config = vllm_engine.ServerConfig(
      **{
          k: v for k, v in summary["server"]["config"].items()
          if k in vllm_engine.ServerConfig.__dataclass_fields__
      })
  entry = vllm_engine.accelerator_entry(ceilings, config)
  entry["sources"]["note"] = (
      f"merged from the {len(FOLDERS)} accelerator files of {os.path.basename(dst)} "
      f"({os.path.basename(dst)}/accelerator_*.json, {min(dates)} to {max(dates)}) by "
      "vllm_engine.accelerator_entry: the fastest repeat of each ceiling")
  files.write_json(os.path.join(dst, "accelerator.json"),
                   {"accelerators": {"cpu-vllm-engine": entry}})
  print(f"{entry['memory_bandwidth_tb_s'] * 1e3:.1f} GB/s", entry["dense_tflops"])
