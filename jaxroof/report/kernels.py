"""Report section: the latest GPU kernel benchmark (measurements).

Reads the `summary.json` that `experiments/gpu_bench` writes (through
`jaxroof.measure.kernel_benchmark`) under a results folder given as an
argument, and renders it as Markdown; writes nothing.
"""

from __future__ import annotations

import os
from typing import Any

from jaxroof import files
from jaxroof.report import paths
from jaxroof.report import table


def latest_summary(root: str) -> tuple[str, dict[str, Any]] | None:
  """The newest `summary.json` written by experiments/gpu_bench under root.

  Summaries of dry runs (interpreted on a CPU, times meaningless) are
  skipped.
  """
  found = []
  for folder, _, names in os.walk(root):
    if "summary.json" in names:
      path = os.path.join(folder, "summary.json")
      data = files.read_json("summary", path)
      if "ceilings" in data and "cases" in data and not data.get("dry_run"):
        found.append((data.get("date", ""), path, data))
  if not found:
    return None
  _, path, data = max(found, key=lambda item: item[0])
  return path, data


def _percent(value: float | None) -> str:
  return "-" if value is None else f"{value:.0%}"


def _ceilings_text(ceilings: dict[str, Any]) -> str:
  copy = ceilings.get("copy", {}).get("bytes_per_s")
  matmul = ceilings.get("matmul", {}).get("flop_per_s")
  if not copy or not matmul:
    return ("Ceilings: not measured "
            f"({ceilings.get('error', 'missing')}), so no fractions.")
  return (f"Ceilings (measured): copy {copy / 1e12:.2f} TB/s (read + write), "
          f"bf16 matmul {matmul / 1e12:.0f} TFLOP/s.")


def report_section(out_dir: str, root: str) -> str:
  """Markdown: the latest GPU benchmark (measurements), or why there is none."""
  del out_dir  # Unused: the section has no plot.
  latest = latest_summary(root)
  title = "## Kernels on a GPU (measurements)"
  if latest is None:
    return "\n".join([
        title,
        "",
        f"No GPU benchmark under `{paths.in_repository(root)}/` yet. On a machine with a "
        "GPU run "
        "`PYTHONPATH=. bash experiments/gpu_bench.sh OUT` and commit "
        "`OUT/*.json`. On the CPU the Pallas kernels are only interpreted "
        "(correctness, never speed) and cross-lowered for Triton and Mosaic.",
    ])
  path, data = latest
  rows = []
  for name, case in data["cases"].items():
    p = case["pallas"]
    xla = case.get("xla_best_median_s")
    verdicts = ", ".join(
        f"{k}: {'pass' if t['pass'] else '**FAIL**'}" for k, t in case["targets"].items()) or "-"
    rows.append([
        name,
        f"{p['median_s'] * 1e6:.1f}",
        f"{p['bytes_per_s'] / 1e12:.2f}",
        f"{p['flop_per_s'] / 1e12:.1f}",
        _percent(p.get("fraction_of_copy_bandwidth")),
        _percent(p.get("fraction_of_matmul_rate")),
        f"{xla * 1e6:.1f}" if xla else "-",
        verdicts,
    ])
  skipped = data.get("skipped", []) + list(data.get("errors", {}))
  return "\n".join([
      title,
      "",
      f"Measured on {data['device_kind']} with jax {data['jax_version']} on "
      f"{data['date'][:10]} (`{paths.in_repository(path)}`). "
      f"{_ceilings_text(data['ceilings'])} "
      f"Times: {data['timing']}. Rates use analytic bytes and FLOPs (all "
      "lengths full).",
      "",
      table.markdown_table(("case", "Pallas us", "TB/s", "TFLOP/s", "of copy BW", "of matmul",
                            "XLA best us", "targets"), rows),
  ] + ([f"\nNot measured: {', '.join(skipped)}."] if skipped else []))
