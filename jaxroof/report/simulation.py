"""Simulated serving: plots, the metrics table and the report's section.

The section renders a real model under one Poisson load with the three
schedulers (`jaxroof.serving.report_results.simulation`) and tabulates vLLM's
metrics; every number is a simulated prediction from the analytic iteration
bound.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from jaxroof.report import plots
from jaxroof.report import table


def _log_x(ax) -> None:
  """Log x axis with plain major labels and no minor labels (call after plotting).

  A range of two decades or less (ITL of 4..80 ms) is labelled 1-2-5, so that
  it gets more than one label.
  """
  from matplotlib import ticker  # pylint: disable=import-outside-toplevel  (plots.pyplot)
  ax.set_xscale("log")
  low, high = ax.get_xlim()
  if low > 0 and high / low <= 100:
    ax.xaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
  ax.xaxis.set_minor_formatter(ticker.NullFormatter())
  ax.xaxis.set_major_formatter(ticker.ScalarFormatter())


def metrics_rows(results: dict[str, dict]) -> list[list[str]]:
  """One row per run: TTFT, TPOT, ITL, E2EL (median / p90 / p99, ms) and rates."""
  rows = []
  for name, m in results.items():
    cell = lambda key: " / ".join(  # noqa: E731
        "-" if m[key][s] is None else f"{1e3 * m[key][s]:.1f}" for s in ("median", "p90", "p99"))
    good = m.get("goodput_per_s")
    rows.append([
        name,
        cell("ttft_s"),
        cell("tpot_s"),
        cell("itl_s"),
        cell("e2el_s"), f"{m['request_throughput_per_s']:.2f}",
        f"{m['output_throughput_tokens_per_s']:.0f}", "-" if good is None else f"{good:.2f}",
        str(m["completed"])
    ])
  return rows


HEADER = [
    "run", "TTFT ms (med/p90/p99)", "TPOT ms", "ITL ms", "E2EL ms", "req/s", "out tok/s",
    "goodput/s", "completed"
]


def plot_cdfs(series: dict[str, dict[str, np.ndarray]], path: str | os.PathLike[str],
              title: str) -> None:
  """TTFT and ITL CDFs, one line per named run (`{"ttft_s": ..., "itl_s": ...}`)."""
  fig, axes = plots.pyplot().subplots(1, 2, figsize=(11, 4))
  for name, values in series.items():
    for ax, key in zip(axes, ("ttft_s", "itl_s")):
      v = np.sort(np.asarray(values[key]))
      if len(v):
        ax.plot(v * 1e3,
                np.arange(1,
                          len(v) + 1) / len(v), label=name, linestyle=values.get("style", "-"),
                color=values.get("color"))
  for ax, label in zip(axes, ("TTFT (ms)", "ITL (ms)")):
    _log_x(ax)
    ax.set_xlabel(label)
    ax.set_ylabel("fraction of requests" if "TTFT" in label else "fraction of gaps")
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  fig.suptitle(title, fontsize=10)
  plots.save(fig, path)


def plot_kv_over_time(run: Any, total_pages: int, path: str | os.PathLike[str], title: str) -> None:
  """K/V pages in use and queue length against simulated time (`run`: a simulator Run)."""
  fig, left = plots.pyplot().subplots(figsize=(8, 4))
  left.step(run.history_s, run.pages_in_use / total_pages, where="post", color="tab:blue",
            label="K/V pages in use (fraction)")
  left.set_ylim(0, 1.05)
  left.set_xlabel("simulated time (s)")
  left.set_ylabel("K/V pages in use / capacity")
  right = left.twinx()
  right.step(run.history_s, run.queue_length, where="post", color="tab:orange",
             label="queue length")
  right.set_ylabel("waiting requests")
  fig.legend(loc="upper left", fontsize=8)
  fig.suptitle(title, fontsize=10)
  plots.save(fig, path)


def plot_goodput(rates: list[float], goodput: dict[str, list[float]], path: str | os.PathLike[str],
                 title: str) -> None:
  """Goodput against arrival rate, one line per scheduler."""
  fig, ax = plots.pyplot().subplots(figsize=(7, 4))
  ax.plot(rates, rates, ":", color="gray", label="arrival rate")
  for name, values in goodput.items():
    ax.plot(rates, values, "o-", label=name)
  ax.set_xlabel("arrival rate (requests/s)")
  ax.set_ylabel("goodput (requests/s meeting the targets)")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  ax.set_title(title, fontsize=10)
  plots.save(fig, path)


def plot_toy_comparison(result: dict, path: str | os.PathLike[str]) -> None:
  """Measured (solid) and simulated (dashed) TTFT and ITL CDFs at each load."""
  loads = result["loads"]
  fig, axes = plots.pyplot().subplots(2, len(loads), figsize=(4.2 * len(loads), 7))
  for col, (name, load) in enumerate(loads.items()):
    for row, key in enumerate(("ttft_s", "itl_s")):
      ax = axes[row, col]
      for source, style, label in (("measured", "-", "measured"), ("tokens_held_out", "--",
                                                                   "twin, held-out fit"),
                                   ("computed_held_out", "-.", "twin (computed), held-out"),
                                   ("tokens_own_fit", ":", "twin, fit to this run")):
        v = np.asarray(load["cdf"][f"{source}_{key}"])
        ax.plot(v * 1e3, np.arange(1, len(v) + 1) / max(len(v), 1), style, label=label)
      _log_x(ax)
      ax.set_xlabel(("TTFT" if key == "ttft_s" else "ITL") + " (ms)")
      ax.grid(alpha=0.3)
      if row == 0:
        ax.set_title(f"{name}: {load['arrival_rate_per_s']:.1f} req/s", fontsize=9)
  axes[0, 0].legend(fontsize=8)
  dev = result["device"]
  fig.suptitle(
      f"toy server ({dev['device_kind']}, {dev['backend']}) measured vs simulated twin"
      f", {result['date']}", fontsize=10)
  plots.save(fig, path)


def _scenario(sim: dict[str, Any]) -> dict[str, str]:
  """The scenario's inputs in words, for the plot's title and the section's text."""
  w, r = sim["workload"], sim["replica"]
  return {
      "requests": f"{w['num_requests']:,} {w['arrival'].capitalize()} requests at "
                  f"{w['arrival_rate']:g}/s",
      "lengths": f"{w['prompt_distribution']} prompts (mean {w['prompt_tokens']:,}) and "
                 f"outputs (mean {w['output_tokens']:,})",
      "window": f"{r['batch_window_s'] * 1e3:g} ms", "budget": f"{r['token_budget']}"
  }


def simulation_section(sim: dict[str, Any], out_dir: str) -> str:
  """Report section: the three schedulers at one load (`report_results.simulation`)."""
  words, t = _scenario(sim), sim["targets"]
  where = f"{sim['model']} on {sim['accelerator']}"
  png = os.path.join(out_dir, "simulation_cdfs.png")
  plot_cdfs({name: run["series"] for name, run in sim["runs"].items()}, png,
            f"{where}, bf16 weights and K/V, {words['lengths']}, {words['requests']}\n"
            "(simulated from the analytic iteration bound)")
  return "\n".join([
      "## Simulated serving: three schedulers at one load",
      "",
      "Simulated prediction from the analytic iteration bound (`jaxroof.serving.simulator`): "
      f"{sim['model']} (bf16) on one {sim['accelerator']}, {words['requests']}, "
      f"{words['lengths']}, spread {sim['workload']['prompt_spread']:g}; K/V paged in 16-token pages; "
      f"static batching with a {words['window']} window, iteration-level (Orca) and chunked "
      f"prefill (Sarathi, {words['budget']} tokens per iteration). Goodput targets: TTFT "
      f"{t['ttft_target_s'] * 1e3:g} ms, TPOT {t['tpot_target_s'] * 1e3:g} ms.",
      "",
      table.markdown_table(HEADER,
                           metrics_rows({name: run["metrics"] for name, run in sim["runs"].items()
                                        })),
      "",
      f"![TTFT and ITL CDFs]({os.path.basename(png)})",
      "",
  ])
