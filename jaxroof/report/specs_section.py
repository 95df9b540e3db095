"""The report's section on real models and accelerators (analytic bounds).

`report_section(out_dir)` returns Markdown and writes its PNG into `out_dir`:
KV sizing of shipped models with each kind of attention (full, sliding
window, alternating, latent, recurrent) and one model compared across every
shipped accelerator.
"""

from __future__ import annotations

import os

from jaxroof.specs import comparison
from jaxroof.report import device_comparison as comparison_report
from jaxroof.specs import kv_sizing
from jaxroof.report import table
from jaxroof.specs.accelerators import load_accelerators
from jaxroof.specs.models import load_model
from jaxroof.specs.parameters import parameter_counts

KV_MODELS = ("llama-3-8b", "mistral-7b", "gemma-2-9b", "gemma-3-1b", "deepseek-v3", "mamba-2.8b")
KV_CONTEXT = 8192
COMPARE_MODEL = "llama-3-8b"
COMPARE_CONTEXT = 4096
COMPARE_BATCHES = (1, 16, 64, 256)
COMPARE_PLOT = "compare_accelerators.png"


def _schedule(spec) -> str:
  parts = []
  for k in kv_sizing.kind_expressions(spec):
    window = f" (window {k.window})" if k.window else ""
    parts.append(f"{k.layers} {k.kind}{window}")
  return " + ".join(parts)


def _any_model(command: str | None, experiment: str) -> str:
  """The closing hint: the command line the caller gave, else the experiment by name."""
  return f"`{command or 'experiments.' + experiment}` gives any model."


def kv_sizing_section(out_dir: str, *, subject_model: str | None = None, context: int = KV_CONTEXT,
                      any_model_command: str | None = None) -> str:
  """Payload and paged allocation per sequence for models of every attention kind.

  The report's subject model, when given, comes first; `any_model_command` is the
  command line that sizes any model (the caller's; None names the experiment).
  """
  del out_dir  # Unused.
  rows = []
  names = ([subject_model] if subject_model else []) + [m for m in KV_MODELS if m != subject_model]
  for name in names:
    spec = load_model(name)
    z = kv_sizing.size_kv(spec, context=context)
    rows.append([
        name,
        _schedule(spec), f"{parameter_counts(spec).total / 1e9:,.2f}B",
        f"{z.kv_bytes_per_token:,.0f}", f"{z.payload_bytes_per_sequence / 1e9:,.3f}",
        f"{z.allocated_bytes_per_sequence / 1e9:,.3f}",
        f"{z.allocated_bytes_windowed_as_full_per_sequence / 1e9:,.3f}", f"`{z.payload_formula}`"
    ])
  mla = load_model("deepseek-v3")
  latent = kv_sizing.size_kv(mla, context=1).kv_bytes_per_token
  expanded = kv_sizing.mla_expanded_bytes_per_token(mla)
  return "\n".join([
      "## KV sizing of real models (analytic bound)",
      "",
      f"Per sequence at {context:,} retained tokens, bf16 K/V, pages of "
      f"{kv_sizing.DEFAULT_BLOCK_SIZE} tokens, no output reserved (GB = 1e9 B). "
      "*B/token* counts the blocks that keep every token; sliding-window blocks keep "
      "at most their window and Mamba keeps a fixed state. *Windowed as full* is the "
      "allocation of engines that give windowed blocks full-context pages. " +
      _any_model(any_model_command, "kv_sizing"),
      "",
      table.markdown_table(("model", "blocks", "params", "B/token", "payload GB", "allocated GB",
                            "windowed as full GB", "payload (T tokens)"), rows),
      "",
      f"DeepSeek-V3's latent cache holds {latent:,.0f} B/token; caching per-head K and V "
      f"instead would take {expanded:,.0f} B/token ({expanded / latent:,.0f}x more).",
  ])


def accelerator_section(out_dir: str, *, model_name: str = COMPARE_MODEL,
                        context: int = COMPARE_CONTEXT, accelerators: tuple[str, ...] = (),
                        weight_dtype: str = "bf16", kv_dtype: str = "bf16",
                        any_model_command: str | None = None) -> str:
  """One model on the given accelerators (default: every shipped one), with a plot;
  `any_model_command` as in `kv_sizing_section`."""
  model = load_model(model_name)
  devices = load_accelerators(",".join(accelerators) if accelerators else "all")
  result = comparison.compare(model, devices, context=context, batch_sizes=COMPARE_BATCHES,
                              weight_dtype=weight_dtype, kv_dtype=kv_dtype)
  at = str(COMPARE_BATCHES[2])
  comparison_report.plot(result, os.path.join(out_dir, COMPARE_PLOT), batch=int(at))
  best = result["best"]["by_batch"][at]
  return "\n".join([
      "## Accelerators compared (analytic bound from datasheet figures)",
      "",
      f"{model_name}, {context:,} retained tokens per sequence, {weight_dtype} weights, "
      f"{kv_dtype} K/V, one device each, 10% of memory kept free. `*` marks the best of a column "
      "(lowest ridge and compute crossover, largest batch that fits). "
      f"At batch {at} the fastest step is on {', '.join(best['step_s']) or 'none'}. " +
      _any_model(any_model_command, "compare_accelerators"),
      "",
      table.markdown_table(comparison_report.SUMMARY_HEADERS,
                           comparison_report.summary_rows(result)),
      "",
      table.markdown_table(comparison_report.ROW_HEADERS,
                           [r for r in comparison_report.batch_rows(result) if r[1] == at]),
      "",
      f"![accelerators compared]({COMPARE_PLOT})",
      "",
      "Assumes: " + "; ".join(result["assumptions"]) + ".",
  ])


def report_section(out_dir: str) -> str:
  """Both sections above, as one block of Markdown."""
  return "\n\n".join([kv_sizing_section(out_dir), accelerator_section(out_dir)])
