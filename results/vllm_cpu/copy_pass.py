"""Copies one same-hour pass (same_hour_pass.sh's OUT_DIR) into results/vllm_cpu/passN.

Each result JSON as `<model>_vllm_rate...json` without `generated_texts` (random words of
dummy weights), each invocation's summary and accelerator file, and `accelerator.json`:
each invocation's fastest repeat, the median over the pass's invocations
(`merge_ceilings.py`). Usage (project venv, repository root):
  python results/vllm_cpu/copy_pass.py OUT_DIR results/vllm_cpu/passN
"""
import glob
import json
import os
import sys

from jaxroof import files
import merge_ceilings

FOLDERS = {
    "tiny_in128": "tiny", "tiny_in256": "tiny", "small_in256": "small", "medium": "medium",
    "nano": "nano"
}

if __name__ == "__main__":
  src, dst = sys.argv[1], sys.argv[2]
  os.makedirs(dst, exist_ok=True)
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
  entry = merge_ceilings.merge(dst, os.path.join(dst, "accelerator.json"))
  print(f"{entry['memory_bandwidth_tb_s'] * 1e3:.1f} GB/s", entry["dense_tflops"])
