"""A Llama config's decoder GEMMs as vLLM runs them (qkv and gate_up fused): the probes' shapes.

Plain Python (no torch), so the engine-side probes in this folder import it from their own
directory: `from engine_shapes import decoder_gemms`.
"""
import json


def decoder_gemms(config_path: str) -> tuple[list[tuple[int, int]], int]:
  """((K, N) of each linear layer of one decoder block, the number of blocks)."""
  c = json.load(open(config_path))
  h, heads = c["hidden_size"], c["num_attention_heads"]
  kv = c.get("num_key_value_heads") or heads
  hd = c.get("head_dim") or h // heads
  inter = c["intermediate_size"]
  shapes = [(h, (heads + 2 * kv) * hd), (heads * hd, h), (h, 2 * inter), (inter, h)]
  return shapes, c["num_hidden_layers"]
