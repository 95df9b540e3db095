"""What the vLLM tests share: the detailed fixture, a model folder, a device file, a run
with its server's facts (not collected: no test here)."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest

from jaxroof.engines import vllm_ceilings, vllm_model, vllm_server
from jaxroof.measure import vllm_results

DATA = pathlib.Path(__file__).parent / "data"
FIXTURE = DATA / "vllm_cpu_detailed_fixture.json"
CEILINGS = {
    "torch": "2.13.0+cpu", "threads": 1, "cpus": [1], "isa": "AVX512", "matmul_n": 2048,
    "bf16_matmul_s": [2 * 2048**3 / 4e11, 0.1], "fp32_matmul_s": [2 * 2048**3 / 1e11],
    "read_s": [512 * 2**20 / 2.5e10, 1.0], "read_mb": 512, "bf16_flops_per_s": 4e11,
    "fp32_flops_per_s": 1e11, "read_bytes_per_s": 2.5e10
}

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(name="model_dir")
def model_dir_fixture(tmp_path):
  return vllm_model.write_model_folder(str(tmp_path / "model"), "tiny-llama")["model_dir"]


@pytest.fixture(name="device_file")
def device_file_fixture(tmp_path):
  path = tmp_path / "accelerator.json"
  entry = vllm_ceilings.accelerator_entry(CEILINGS, vllm_server.ServerConfig())
  path.write_text(json.dumps({"accelerators": {"cpu-vllm-engine": entry}}))
  return str(path)


def run_with_server(kv_blocks=40, block=32, seqs=4):
  [run] = vllm_results.read_runs([FIXTURE])
  server = {
      "config": {
          "max_num_seqs": seqs, "max_num_batched_tokens": 256, "block_size": block,
          "chunked_prefill": True
      }, "kv_blocks": kv_blocks
  }
  return dataclasses.replace(run, server=server)
