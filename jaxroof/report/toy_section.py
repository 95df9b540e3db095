"""Markdown sections for the report, from the toy experiments' JSON."""

from __future__ import annotations

from typing import Any


def decode_equivalence_section(result: dict[str, Any]) -> str:
  """Summarises the JSON result `experiments.decode_equivalence` writes."""
  inputs = result["inputs"]
  config = inputs["config"]
  lines = [
      "## Cached decode against a fresh forward pass (check, float64)",
      "",
      f"{config['num_blocks']} blocks, {config['num_kv_heads']} KV heads,"
      f" {config['head_dim']} coordinates per head; prompt {inputs['prompt']},"
      f" {inputs['steps']} decode steps, {inputs['layout']} state, break:"
      f" {inputs['break'] or 'none'}; {result['backend']}, float64.",
      "",
      "| step | fed | max abs diff | max rel diff | agrees | positions with"
      " K/V | K/V bytes (2-byte payload) |",
      "|---|---|---|---|---|---|---|",
  ]
  for row in result["rows"]:
    lines.append(f"| {row['step']} ({row['phase']}) | {row['fed']} |"
                 f" {row['max_abs_diff']:.3g} | {row['max_rel_diff']:.3g} |"
                 f" {row['agrees']} | {row['positions_with_kv']} |"
                 f" {row['kv_bytes_2byte']} |")
  verdict = ("agrees" if result["agrees"] else "differs (detected)")
  lines += [
      "",
      f"Cached decode {verdict} within a relative tolerance of"
      f" {result['tolerance']:g} ({result['expected']} expected:"
      f" {'ok' if result['ok'] else 'UNEXPECTED'}). K/V per position:"
      f" {result['kv_bytes_per_position_2byte']} B at a hypothetical 2-byte"
      f" payload (formula 2·L·H_kv·d·b ="
      f" {result['kv_bytes_per_position_2byte_formula']} B);"
      f" {result['positions_with_kv']} positions hold K/V (P + g − 1 ="
      f" {result['positions_with_kv_formula']}).",
  ]
  return "\n".join(lines) + "\n"


def bench_decode_section(result: dict[str, Any]) -> str:
  """Summarises the JSON result `experiments.bench_decode` writes."""
  inputs = result["inputs"]
  cached, recompute = result["cached"], result["recompute"]
  return "\n".join([
      "## Generation with and without the KV cache (measurement)",
      "",
      f"{inputs['preset']} ({inputs['weights']:,} weights, {result['dtype']}),"
      f" batch {inputs['batch']}: {inputs['new_tokens']} tokens after a"
      f" {inputs['prompt_len']}-token prompt on {result['device']}"
      f" ({result['backend']}, jax {result['jax_version']}). Timing:"
      f" {result['timing']}.",
      "",
      "| path | median (s) | min (s) | max (s) | runs |",
      "|---|---|---|---|---|",
      f"| KV cache | {cached['median_s']:.3f} | {cached['min_s']:.3f} |"
      f" {cached['max_s']:.3f} | {cached['repeats']} |",
      f"| recompute prefix | {recompute['median_s']:.3f} |"
      f" {recompute['min_s']:.3f} | {recompute['max_s']:.3f} |"
      f" {recompute['repeats']} |",
      "",
      f"Speedup from caching: {result['speedup']:.1f}x (measured). Greedy"
      f" outputs {'identical' if result['outputs_match'] else 'differ'}.",
  ]) + "\n"
