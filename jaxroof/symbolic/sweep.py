"""A decode batch sweep: `Estimate` rows from a step model, plus its summary.

One sweep for every kind of step model (`StepModel`): the analytic bound
(kind "bound", the lesson's assumptions, see `jaxroof.symbolic.formulas`) and
the calibrated model (kind "calibrated", fitted factors). Rows carry the
same columns either way, plus the calibrated terms when there are any.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxroof import errors
from jaxroof.symbolic import cost_model
from jaxroof.symbolic.step_model import BOUND_ASSUMPTIONS, BOUND_UNITS, StepModel

UNITS = BOUND_UNITS  # The bound's columns, for callers that print them.
ASSUMPTIONS = BOUND_ASSUMPTIONS


def check_step_inputs(batch_sizes: Sequence[int], *, N, q, T, k, BW, F=None,
                      N_act=None) -> tuple[list[int], np.ndarray]:
  """Validates a sweep's inputs; returns the batch sizes and N per batch."""
  batches = errors.require_positive_ints("batch_sizes", batch_sizes)
  for name, value in (("T", T), ("k", k), ("BW", BW)):
    errors.require_positive(name, value)
  if np.ndim(q) == 0:
    errors.require_positive("q", q)
  else:
    for i, value in enumerate(np.asarray(q, dtype=float).ravel()):
      errors.require_positive(f"q[{i}]", value)
  if F is not None:
    errors.require_positive("F", F)
  try:
    n_read = np.broadcast_to(np.asarray(N, dtype=float), (len(batches),))
  except ValueError:
    raise errors.InputError(
        f"N has shape {np.shape(N)}: give one number or one per batch size "
        f"({len(batches)}).", field="N") from None
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
    row["bound"] = ("memory" if memory_only or row["memory_s"] >= row["compute_s"] else "compute")
    if row.get("comm_s", 0.0) > max(row["memory_s"], row["compute_s"] or 0.0):
      row["bound"] = "communication"
    rows.append(row)
  return rows


def sweep(
    model: StepModel,
    batch_sizes: Sequence[int],
    *,
    N: float | np.ndarray,
    q: float | np.ndarray,
    T: float,
    k: float,
    BW: float,
    F: float | None = None,
    N_act: float | np.ndarray | None = None,
    layers: int | None = None,
    fits: Sequence[bool] | None = None,
    A_t: float | None = None,
    comm_overlap: float = 0.0,
    token_gap_s: float | None = None,
    crossovers: Mapping[str, float | None] | None = None,
    weights_read: Callable[[np.ndarray], np.ndarray] | None = None,
    max_batch_in_memory: int | None = None,
    comm_s: float | np.ndarray | None = None,
    bytes_per_weight_read: Callable[[np.ndarray], np.ndarray] | None = None,
) -> dict[str, Any]:
  """Evaluates a step model, bound or calibrated, at each batch size.

  Args:
    model: the step model (`StepModel.bound()` or a calibrated one).
    batch_sizes: sequences per step, each a whole number >= 1.
    N: weights read per step (an array over batch sizes for MoE).
    q: bytes per weight read (one per batch size for a mixed-precision
      format, whose share of quantized weights moves with the experts read).
    T: retained tokens per sequence.
    k: KV bytes per retained token.
    BW: sustained memory bandwidth, bytes/s (a calibrated model with its own
      ceilings scales those instead).
    F: sustained FLOP rate, FLOP/s; None for a memory-only model.
    N_act: weights multiplied per token; None means N (dense).
    layers: blocks of the model, for a calibrated per-layer fixed cost.
    fits: optional per-batch flag: weights, K/V and workspace fit in memory.
    token_gap_s: optional target for the gap between one user's tokens, s;
      rows say whether they meet it and the summary gives the largest batch.
    crossovers: the weight/KV and compute crossover batches when the caller
      solved them for weights that vary with batch (MoE); they replace the
      crossovers of the largest N.
    weights_read: N as a function of batch (MoE: the distinct experts read),
      for the solved answer at batches that were not swept; None: N is fixed.
    max_batch_in_memory: the most sequences whose K/V fits beside the weights,
      a limit on the answer.
    bytes_per_weight_read: q as a function of batch, where q varies (a mixed
      format), for the solved answer; None: q is fixed.
    comm_s: several chips: communication time on the step's path, s (one
      number or one per batch), added serially; rows gain `comm_s` and may
      be bound by "communication". None: one chip, rows as before.

  Returns:
    `{"kind", "units", "assumptions", "rows", "summary"}`, and for a
    calibrated model its `"profile"` and the `"ceilings"` it scaled.
  """
  batches, n_read = check_step_inputs(batch_sizes, N=N, q=q, T=T, k=k, BW=BW, F=F, N_act=N_act)
  if token_gap_s is not None:
    errors.require_positive("token_gap_s", token_gap_s)
  if layers is not None:
    layers = errors.require_positive_int("layers", layers)
  memory_only = F is None and model.ceilings is None
  bw, flop_rate = model.scaled_ceilings(BW, F)
  q_read = np.broadcast_to(np.asarray(q, dtype=float), (len(batches),))
  q = float(q_read[0]) if np.ptp(q_read) == 0 else q_read
  n_act = None if N_act is None else np.broadcast_to(np.asarray(N_act, dtype=float),
                                                     (len(batches),))
  out = model.evaluate(
      B=np.asarray(batches, dtype=float), T=T, N=n_read, q=q, k=k, BW=bw, F=flop_rate, N_act=n_act,
      L=layers, A_t=A_t, comm_overlap=comm_overlap,
      comm_s=None if comm_s is None else np.broadcast_to(np.asarray(comm_s, dtype=float),
                                                         (len(batches),)))
  rows = estimate_rows(batches, out, memory_only=memory_only and model.kind == "bound")

  widest = int(np.argmax(n_read))
  summary = model.summary(N=float(n_read[widest]), q=float(q_read[widest]), T=T, k=k, BW=bw,
                          F=flop_rate, N_act=None if n_act is None else float(np.max(n_act)),
                          L=layers)
  notes = list(model.notes)
  if model.kind == "calibrated" and layers is None:
    notes.append("layers not given: the per-layer fixed cost is left out")
  if crossovers is not None:
    summary.update(crossovers)
  cross = summary["compute_crossover_batch"]
  if memory_only and model.kind == "bound":
    summary["compute_crossover_batch"] = None
    notes.append("no FLOP rate given: memory-only model, no compute crossover")
  elif cross is None or not (math.isfinite(cross) and cross > 0):
    summary["compute_crossover_batch"] = None
    notes.append(model.no_compute_crossover_note())
  elif cross < 1 and model.kind == "bound":
    summary["compute_crossover_batch"] = None
    notes.append("compute binds at every batch (crossover below one sequence)")
  if model.kind == "calibrated" and math.isinf(flop_rate):
    # No FLOP rate: the limit past every crossover (compute-bound) is undefined, not nan.
    summary["rate_limit_tokens_per_s"] = None
    notes.append("no FLOP rate given: no rate limit past the compute crossover")
  if np.ptp(n_read) > 0 and crossovers is None:
    notes.append("weights read vary with batch (MoE experts, embedding rows): "
                 "crossovers use the largest")
  mark_targets(rows, summary, fits=fits, token_gap_s=token_gap_s)
  if comm_s is not None:
    notes.append("crossovers leave communication out; step_s and the rates include it")
  if (token_gap_s is not None and model.kind == "bound" and np.ptp(n_read) == 0 and
      np.ptp(q_read) == 0 and comm_s is None):
    # The closed form needs one N for every batch.
    gap_batch = float(
        cost_model.max_batch_for_token_gap(
            model.form, t_gap=token_gap_s, N=float(n_read[0]), q=q, T=T, k=k, BW=bw, F=flop_rate,
            N_act=float(n_read[0]) if n_act is None else float(n_act[0]),
            A_t=0.0 if A_t is None else A_t))
    summary["max_batch_for_token_gap"] = gap_batch if gap_batch >= 1 else None
  if token_gap_s is not None:
    # Several chips: the answer adds the largest swept communication time (the
    # collectives grow with batch, so this is conservative between swept batches).
    summary.update(
        _answer(
            model, token_gap_s, max_batch_in_memory, weights_read or
            (lambda batch: np.full(np.shape(batch), float(np.max(n_read)))),
            bytes_per_weight_read or
            (lambda batch: np.full(np.shape(batch), float(q_read[widest]))),
            dict(T=T, k=k, BW=bw, F=flop_rate, L=layers, A_t=A_t, comm_overlap=comm_overlap,
                 N_act=None if n_act is None else float(np.max(n_act)),
                 comm_s=None if comm_s is None else float(np.max(comm_s)))))
  summary["notes"] = notes
  result = {
      "kind": model.kind,
      "units": model.units,
      "assumptions": list(model.assumptions),
      "rows": rows,
      "summary": summary,
  }
  if model.kind == "calibrated":
    result["profile"] = dict(model.provenance)
    for row in rows:  # The error travels with every calibrated number.
      row["profile_heldout_median_rel_error"] = model.provenance.get("heldout_median_rel_error")
    result["ceilings"] = {
        "source": "given" if model.ceilings is None else "profile", "BW": bw,
        "F": None if math.isinf(flop_rate) else flop_rate, "given_BW": BW, "given_F": F
    }
  return result


def largest_batch_within(step_s: Callable[[np.ndarray], np.ndarray], limit_s: float,
                         upper: int = 2**40) -> int:
  """The largest whole batch B >= 1 with `step_s(B) <= limit_s` (0 if none).

  The step time rises with B (more K/V, more FLOPs), so a doubling search
  then a bisection over whole numbers finds it in ~80 evaluations. A step
  equal to the limit meets it (to a relative 1e-12, for float rounding).
  """

  def within(batch: int) -> bool:
    return bool(np.asarray(step_s(np.array([float(batch)])))[0] <= limit_s * (1 + 1e-12))

  if not within(1):
    return 0
  lo, hi = 1, 2
  while hi < upper and within(hi):
    lo, hi = hi, 2 * hi
  if hi >= upper:
    return upper
  while hi - lo > 1:
    mid = (lo + hi) // 2
    lo, hi = (mid, hi) if within(mid) else (lo, mid)
  return lo


def _answer(model: StepModel, token_gap_s: float, max_batch_in_memory: int | None,
            weights_read: Callable[[np.ndarray], np.ndarray],
            bytes_per_weight_read: Callable[[np.ndarray],
                                            np.ndarray], inputs: dict[str, Any]) -> dict[str, Any]:
  """The solved answer to a token-gap target: the largest batch that meets it
  and fits, what limits it, and which term binds the step there."""

  def step_s(batch: np.ndarray) -> np.ndarray:
    return model.evaluate(B=batch, N=weights_read(batch), q=bytes_per_weight_read(batch),
                          **inputs)["step_s"]

  limits = {"token_gap": largest_batch_within(step_s, token_gap_s)}
  if max_batch_in_memory is not None:
    limits["memory_capacity"] = int(max_batch_in_memory)
  binds = min(limits, key=limits.get)  # Ties: the token gap, listed first.
  batch = limits[binds]
  if batch < 1:
    return {"answer_batch": None, "answer_binds": binds, "answer_step_bound": None}
  at = np.array([float(batch)])
  out = model.evaluate(B=at, N=weights_read(at), q=bytes_per_weight_read(at), **inputs)
  memory_s, compute_s = float(out["memory_s"][0]), float(np.asarray(out["compute_s"])[0])
  return {
      "answer_batch": batch, "answer_binds": binds,
      "answer_step_s": float(np.asarray(out["step_s"])[0]),
      "answer_step_bound": "memory" if memory_s >= compute_s else "compute"
  }


def decode_sweep(batch_sizes: Sequence[int], form: str = "per_op", **kwargs: Any) -> dict[str, Any]:
  """`sweep` of the analytic bound (kind "bound", `form` per_op or fused);
  keywords as in `sweep`."""
  return sweep(StepModel.bound(form), batch_sizes, **kwargs)


def mark_targets(rows: list[dict[str, Any]], summary: dict[str, Any], *,
                 fits: Sequence[bool] | None = None, token_gap_s: float | None = None) -> None:
  """Marks, in place, rows that fit in memory and meet a token-gap target.

  Shared by bound and calibrated sweeps. With a target, the summary gains
  `token_gap_s` and `largest_swept_batch_meeting_token_gap` (among rows that
  also fit).
  """
  if fits is not None:
    if len(fits) != len(rows):
      raise errors.InputError(
          f"fits has {len(fits)} entries: give one per batch size ({len(rows)}).", field="fits")
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
