"""A decode batch sweep: `Estimate` rows from the step model, plus its summary.

Every number here is an analytic bound (kind "bound") under the lesson's
assumptions (see `jaxroof.symbolic.formulas`): weights read once per step, each
sequence's K/V read once, attention FLOPs and overheads omitted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxroof import errors
from jaxroof.symbolic import solved
from jaxroof.symbolic.evaluate import step_model, summary_model

UNITS: dict[str, str] = {
    "batch": "sequences",
    "weight_bytes": "B",
    "kv_bytes": "B",
    "traffic_bytes": "B",
    "memory_s": "s",
    "compute_s": "s",
    "step_s": "s",
    "aggregate_tokens_per_s": "tokens/s",
    "per_sequence_tokens_per_s": "tokens/s",
    "weight_kv_crossover_batch": "sequences",
    "memory_limit_tokens_per_s": "tokens/s",
    "compute_crossover_batch": "sequences",
}

ASSUMPTIONS: tuple[str, ...] = (
    "weights read once per step and reused by every sequence (ideal tile reuse)",
    "each sequence's retained K/V read once per step",
    "attention FLOPs, activations, KV writes, launches and communication omitted",
)


def check_step_inputs(batch_sizes: Sequence[int], *, N, q, T, k, BW, F=None,
                      N_act=None) -> tuple[list[int], np.ndarray]:
  """Validates a sweep's inputs; returns the batch sizes and N per batch."""
  batches = errors.require_positive_ints("batch_sizes", batch_sizes)
  for name, value in (("q", q), ("T", T), ("k", k), ("BW", BW)):
    errors.require_positive(name, value)
  if F is not None:
    errors.require_positive("F", F)
  try:
    n_read = np.broadcast_to(np.asarray(N, dtype=float), (len(batches),))
  except ValueError:
    raise errors.InputError(
        f"N has shape {np.shape(N)}: give one number or one per batch size "
        f"({len(batches)}).") from None
  for i, value in enumerate(n_read):
    errors.require_positive(f"N[{i}]", value)
  for i, value in enumerate(np.atleast_1d(np.asarray(N_act if N_act is not None else 1.0))):
    errors.require_positive("N_act" if np.ndim(N_act) == 0 else f"N_act[{i}]", value)
  return batches, n_read


def estimate_rows(batches: Sequence[int], outputs: dict[str, Any], *,
                  memory_only: bool = False) -> list[dict[str, Any]]:
  """One row per batch from evaluated outputs, with the term that binds.

  Shared by bound and calibrated sweeps; `memory_only` (no FLOP rate) leaves
  `compute_s` null.
  """
  outputs = {name: np.broadcast_to(v, (len(batches),)) for name, v in outputs.items()}
  rows = []
  for i, batch in enumerate(batches):
    row = {"batch": batch, **{name: float(v[i]) for name, v in outputs.items()}}
    if memory_only:
      row["compute_s"] = None
    row["bound"] = ("memory" if memory_only or row["memory_s"] >= row["compute_s"]
                    else "compute")
    rows.append(row)
  return rows


def decode_sweep(
    batch_sizes: Sequence[int],
    *,
    N: float | np.ndarray,
    q: float,
    T: float,
    k: float,
    BW: float,
    F: float | None = None,
    N_act: float | None = None,
    fits: Sequence[bool] | None = None,
    token_gap_s: float | None = None,
) -> dict[str, Any]:
  """Evaluates the step model at each batch size.

  Args:
    batch_sizes: sequences per step, each a whole number >= 1.
    N: weights read per step (an array over batch sizes for MoE).
    q: bytes per weight.
    T: retained tokens per sequence.
    k: KV bytes per retained token.
    BW: sustained memory bandwidth, bytes/s.
    F: sustained FLOP rate, FLOP/s; None for a memory-only model.
    N_act: weights multiplied per token; None means N (dense).
    fits: optional per-batch flag: weights, K/V and workspace fit in memory.
    token_gap_s: optional target for the gap between one user's tokens, s;
      rows say whether they meet it and the summary gives the largest batch.

  Returns:
    `{"kind": "bound", "units", "assumptions", "rows", "summary"}`.
  """
  batches, n_read = check_step_inputs(batch_sizes, N=N, q=q, T=T, k=k, BW=BW, F=F,
                                      N_act=N_act)
  if token_gap_s is not None:
    errors.require_positive("token_gap_s", token_gap_s)

  flop_rate = math.inf if F is None else F
  out = step_model("numpy")(
      np.asarray(batches, dtype=float), T, n_read, q, k, BW, flop_rate, N_act
  )
  rows = estimate_rows(batches, out, memory_only=F is None)

  summary = summary_model("numpy")(float(np.max(n_read)), q, T, k, BW, flop_rate, N_act)
  summary = {name: float(v) for name, v in summary.items()}
  notes = []
  if F is None:
    summary["compute_crossover_batch"] = None
    notes.append("no FLOP rate given: memory-only model, no compute crossover")
  elif not (math.isfinite(summary["compute_crossover_batch"]) and summary["compute_crossover_batch"] > 0):
    summary["compute_crossover_batch"] = None
    notes.append(
        "no compute crossover: each added sequence adds more memory time "
        "(T*k/BW) than compute time (2*N_act/F), so memory binds at every batch"
    )
  elif summary["compute_crossover_batch"] < 1:
    summary["compute_crossover_batch"] = None
    notes.append("compute binds at every batch (crossover below one sequence)")
  if np.ptp(n_read) > 0:
    notes.append("weights read vary with batch (MoE experts, embedding rows): "
                 "crossovers use the largest")
  mark_targets(rows, summary, fits=fits, token_gap_s=token_gap_s)
  if token_gap_s is not None:
    if np.ptp(n_read) == 0:  # The closed form needs one N for every batch.
      gap_batch = float(solved.max_batch_for_token_gap(
          t_gap=token_gap_s, N=float(n_read[0]), q=q, T=T, k=k, BW=BW, F=flop_rate,
          N_act=float(n_read[0]) if N_act is None else N_act))
      summary["max_batch_for_token_gap"] = gap_batch if gap_batch >= 1 else None
  summary["notes"] = notes
  return {
      "kind": "bound",
      "units": UNITS,
      "assumptions": list(ASSUMPTIONS),
      "rows": rows,
      "summary": summary,
  }


def mark_targets(rows: list[dict[str, Any]], summary: dict[str, Any], *,
                 fits: Sequence[bool] | None = None,
                 token_gap_s: float | None = None) -> None:
  """Marks, in place, rows that fit in memory and meet a token-gap target.

  Shared by bound and calibrated sweeps. With a target, the summary gains
  `token_gap_s` and `largest_swept_batch_meeting_token_gap` (among rows that
  also fit).
  """
  if fits is not None:
    if len(fits) != len(rows):
      raise errors.InputError(
          f"fits has {len(fits)} entries: give one per batch size ({len(rows)}).")
    for row, fit in zip(rows, fits):
      row["fits_in_memory"] = bool(fit)
  if token_gap_s is None:
    return
  errors.require_positive("token_gap_s", token_gap_s)
  for row in rows:
    row["meets_token_gap"] = row["step_s"] <= token_gap_s
  meeting = [r["batch"] for r in rows if r["meets_token_gap"] and r.get("fits_in_memory", True)]
  summary["token_gap_s"] = token_gap_s
  summary["largest_swept_batch_meeting_token_gap"] = max(meeting) if meeting else None

