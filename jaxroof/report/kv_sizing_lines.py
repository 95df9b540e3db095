"""What `experiments.kv_sizing` prints: the sizing per layer kind, the notes, and the fit
on a device and per chip of a layout (analytic bounds; GB = 1e9 B)."""

from __future__ import annotations

from typing import Any

from jaxroof.report import table
from jaxroof.specs import kv_sizing
from jaxroof.specs.accelerators import Accelerator
from jaxroof.specs.model_spec import ModelSpec
from jaxroof.specs.parameters import ParamCounts, WeightFormat


def _gb(value: float) -> str:
  return f"{value / 1e9:,.4f}"


def sizing_lines(spec: ModelSpec, sizing: kv_sizing.KVSizing, counts: ParamCounts) -> list[str]:
  """The title, the parameters, the table per layer kind and the batch's totals."""
  out = [
      f"KV sizing of {spec.name} ({spec.model_type}, {spec.num_layers} blocks): "
      f"context {sizing.context} tokens, batch {sizing.batch}, K/V {sizing.kv_dtype}, "
      f"pages of {sizing.block_size} tokens, {sizing.max_new_tokens} tokens reserved "
      "(analytic bound; GB = 1e9 B)"
  ]
  if spec.assumed_llama_like:
    out.append(f"ASSUMED Llama-like: model_type {spec.model_type!r} is not supported; read as "
               "Llama as asked (assume_llama_like)")
  out.append(f"parameters: {counts.total / 1e9:,.3f}B total, {counts.active / 1e9:,.3f}B "
             f"active per token ({counts.active_matmul / 1e9:,.3f}B multiplied)")
  rows = [[
      k.kind, k.layers, k.window or "-", f"{k.bytes_per_token:,.0f}" if k.bytes_per_token else "-",
      f"{k.state_bytes:,.0f} ({k.state_dtype})" if k.state_dtype else "-",
      k.retained_tokens if not k.state_dtype else "-",
      _gb(k.payload_bytes),
      _gb(k.allocated_bytes),
      _gb(k.allocated_bytes_windowed_as_full)
  ] for k in sizing.kinds]
  rows.append([
      "total",
      sum(k.layers for k in sizing.kinds), "-", "-",
      f"{sum(k.state_bytes for k in sizing.kinds):,.0f}", "-",
      _gb(sizing.payload_bytes_per_sequence),
      _gb(sizing.allocated_bytes_per_sequence),
      _gb(sizing.allocated_bytes_windowed_as_full_per_sequence)
  ])
  out.append(
      table.format_table(
          ("kind", "blocks", "cap (tokens)", "B/token while kept", "state B/seq", "tokens kept",
           "payload GB/seq", "allocated GB/seq", "windowed-as-full GB/seq"), rows))
  for k in sizing.kinds:
    if k.window:
      out.append(f"{k.kind} blocks: {k.bytes_per_token:,.0f} B per token up to {k.window:,} "
                 f"tokens, at most {k.bytes_per_token * k.window / 1e9:,.4f} GB per sequence")
  out.append(f"payload per sequence = {sizing.payload_formula} bytes (T = retained tokens)")
  growing = (f"{sizing.kv_bytes_per_token:,.0f}" if sizing.kv_bytes_per_token else
             "0 (no block keeps every token: per-sequence bytes stop growing at the cap)")
  out.append(f"K/V bytes per token of the blocks that keep every token: {growing}")
  pages = sizing.hybrid_pages
  if pages:
    out.append(f"vLLM hybrid page policy: attention pages of {pages.block_size} tokens "
               f"({pages.page_bytes:,.0f} B per layer) hold one layer's state "
               f"({pages.state_bytes_per_layer:,.0f} B, vLLM shapes; padded "
               f"{pages.state_padding_fraction:.2%}); per sequence "
               f"{_gb(pages.allocated_bytes_per_sequence)} GB allocated vs "
               f"{_gb(pages.payload_bytes_per_sequence)} GB payload")
  out.append(f"batch of {sizing.batch}: payload {_gb(sizing.payload_bytes)} GB, allocated "
             f"{_gb(sizing.allocated_bytes)} GB, windowed-as-full "
             f"{_gb(sizing.allocated_bytes_windowed_as_full)} GB")
  return out


def note_lines(spec: ModelSpec, sizing: kv_sizing.KVSizing, warned: list[str]) -> list[str]:
  """The sizing's and the model's notes; a context limit already `warned` is not repeated."""
  return [
      f"note: {note}" for note in sizing.notes + spec.notes
      if not (warned and "max_position_embeddings" in note)
  ]


def fit_line(device: Accelerator, fmt: WeightFormat, weight_bytes: float,
             sizing: kv_sizing.KVSizing, workspace_fraction: float, fit: kv_sizing.Capacity) -> str:
  """Whether the batch fits the device, and the most sequences that would."""
  verdict = "fits" if fit.fits else "does NOT fit"
  return (f"{device.name} ({device.full_name}, {_gb(device.memory_capacity_bytes)} GB): "
          f"{fmt.label} weights {_gb(weight_bytes)} GB + allocated K/V "
          f"{_gb(sizing.allocated_bytes)} GB with {workspace_fraction:.0%} kept free: "
          f"{verdict}; at most {fit.max_batch} sequences of this context "
          f"({fit.max_batch_windowed_as_full} if windowed blocks get full-context pages)")


def chip_fit_line(device: Accelerator, chip: dict[str, Any]) -> str:
  """Whether the batch fits each chip of the layout (`chip`: the JSON's per_chip)."""
  layout = chip["layout"]
  return (f"per chip on tp={layout['tp']} pp={layout['pp']} ep={layout['ep']} "
          f"dp={layout['dp']} ({layout['chips']} chips): weights "
          f"{_gb(chip['resident_weight_bytes'])} GB + K/V {_gb(chip['kv_bytes_per_chip'])} GB "
          f"of {_gb(device.memory_capacity_bytes)} GB: "
          f"{'fits' if chip['fits'] else 'does NOT fit'}; at most "
          f"{chip['max_batch_per_replica']} sequences per replica "
          f"({chip['kv_rule']})")
