"""`Profile`: what one device achieves, as fitted factors; predictions from it.

A profile holds a device's measured ceilings, the calibrated model's fitted
efficiency factors and fixed costs (`jaxroof.symbolic.calibrated`), the fit's error
on held-out points, and how all of it was measured. It is JSON, written
atomically, so profiles of several machines can sit side by side.

`calibrated_sweep` is the `--profile` hook of the experiments: it returns the
structure of `jaxroof.symbolic.sweep.decode_sweep`, labelled `"calibrated"`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxroof.symbolic import calibrated as calibration
from jaxroof import errors
from jaxroof import files as io
from jaxroof.symbolic import sweep as sweep_lib

KIND = "profile"
VERSION = 1
REQUIRED = ("device_kind", "factors", "ceilings", "fit", "dtype", "backend",
            "jax_version", "created")

UNITS: dict[str, str] = {
    "batch": "sequences",
    "weight_bytes": "B",
    "kv_bytes": "B",
    "traffic_bytes": "B",
    "weight_s": "s",
    "kv_s": "s",
    "fixed_s": "s",
    "memory_s": "s",
    "compute_s": "s",
    "linear_s": "s",
    "step_s": "s",
    "aggregate_tokens_per_s": "tokens/s",
    "per_sequence_tokens_per_s": "tokens/s",
    "weight_kv_crossover_batch": "sequences",
    "memory_limit_tokens_per_s": "tokens/s",
    "compute_crossover_batch": "sequences",
    "rate_limit_tokens_per_s": "tokens/s",
}


@dataclasses.dataclass(frozen=True)
class Profile:
  """One device's calibration.

  Attributes:
    device_kind: jax's device kind, e.g. "cpu" or "NVIDIA H200".
    platform: jax's backend (cpu, gpu, tpu).
    backend: how the timed step ran: "xla" or "pallas".
    dtype: the weights' and K/V's dtype of the timed steps.
    jax_version: of the measuring process.
    created: ISO 8601 UTC time of the calibration.
    ceilings: measured `bandwidth_Bps`, `copy_bandwidth_Bps` and
      `flops_per_s` by dtype (see `jaxroof.measure.ceilings`).
    factors: `calibration.FACTOR_NAMES` -> fitted value (SI units).
    fit: held-out and training errors, point counts, loss, statistic.
    model: what was timed (toy configs, their step-model inputs, grid).
    method: how each point was timed.
    path: the file it was loaded from (not stored).
  """

  device_kind: str
  platform: str
  backend: str
  dtype: str
  jax_version: str
  created: str
  ceilings: Mapping[str, Any]
  factors: Mapping[str, float]
  fit: Mapping[str, Any]
  model: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  method: str = ""
  path: str | None = None

  @property
  def heldout_median_rel_error(self) -> float | None:
    return self.fit.get("heldout_median_rel_error")

  @property
  def heldout_max_rel_error(self) -> float | None:
    return self.fit.get("heldout_max_rel_error")

  def bandwidth(self) -> float | None:
    """The measured sustained bandwidth, B/s (None if not measured)."""
    return self.ceilings.get("bandwidth_Bps")

  def flop_rate(self) -> float | None:
    """The measured matmul rate at the profile's dtype (None if absent)."""
    return (self.ceilings.get("flops_per_s") or {}).get(self.dtype)

  def to_json(self) -> dict[str, Any]:
    data = dataclasses.asdict(self)
    del data["path"]
    return {"kind": KIND, "version": VERSION, **data,
            "factor_units": dict(calibration.FACTOR_UNITS),
            "expression": str(calibration.calibrated_step()),
            "readable_expression": calibration.readable_step()}

  @classmethod
  def from_json(cls, data: Mapping[str, Any], path: str | None = None
                ) -> Profile:
    """Checks and reads a profile's JSON; raises InputError naming the gap."""
    where = f"profile={path!r}" if path else "profile"
    if not isinstance(data, Mapping):
      raise errors.InputError(f"{where} is not a JSON object.")
    missing = [name for name in REQUIRED if name not in data]
    if missing:
      raise errors.InputError(
          f"{where} lacks {', '.join(missing)}: give a profile written by "
          "`python -m experiments.calibrate --profile_out=PATH`.")
    factors = data["factors"]
    names = sorted(factors) if isinstance(factors, Mapping) else factors
    if not isinstance(factors, Mapping) or set(factors) != set(
        calibration.FACTOR_NAMES):
      raise errors.InputError(
          f"{where} has factors {names!r}: expected "
          f"{', '.join(calibration.FACTOR_NAMES)}.")
    for name, value in factors.items():
      errors.require_positive(f"{where} factors.{name}", value)
    fields = {f.name for f in dataclasses.fields(cls)} - {"path"}
    kwargs = {name: data[name] for name in fields if name in data}
    kwargs["factors"] = {n: float(v) for n, v in factors.items()}
    kwargs.setdefault("platform", "")
    return cls(**kwargs, path=path)


def save_profile(profile: Profile, path: str | os.PathLike[str]) -> None:
  """Writes the profile as JSON, atomically."""
  io.write_json(path, profile.to_json())


def load_profile(path: str | os.PathLike[str]) -> Profile:
  """Reads a profile; a missing or malformed file is a one-line InputError."""
  path = os.fspath(path)
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
  except FileNotFoundError:
    raise errors.InputError(
        f"profile={path!r} does not exist: write one with "
        "`python -m experiments.calibrate --profile_out=PATH`.") from None
  except (OSError, UnicodeDecodeError) as e:
    raise errors.InputError(f"profile={path!r} cannot be read: {e}.") from None
  except json.JSONDecodeError as e:
    raise errors.InputError(
        f"profile={path!r} is not valid JSON (line {e.lineno}): give a "
        "profile written by `python -m experiments.calibrate`.") from None
  return Profile.from_json(data, path=path)


def _ceilings(profile: Profile, BW: float, F: float | None,
              use_profile_ceilings: bool) -> tuple[float, float, str, list]:
  """The BW and F the calibrated model scales, and where they came from.

  The factors are fractions of the ceilings measured with them, so the
  profile's own ceilings are used when it has them.
  """
  notes = []
  measured_bw, measured_f = profile.bandwidth(), profile.flop_rate()
  if use_profile_ceilings and measured_bw and measured_f:
    return measured_bw, measured_f, "profile", notes
  if use_profile_ceilings:
    notes.append("the profile has no measured ceilings for its dtype: the "
                 "given (datasheet) BW and F were scaled by its factors")
  else:
    notes.append("the given (datasheet) BW and F were scaled by the "
                 "profile's factors, which were fitted to measured ceilings")
  return BW, (math.inf if F is None else F), "given", notes


def calibrated_sweep(
    profile: Profile,
    batch_sizes: Sequence[int],
    *,
    N: float | np.ndarray,
    q: float,
    T: float,
    k: float,
    BW: float,
    F: float | None = None,
    N_act: float | None = None,
    layers: int | None = None,
    use_profile_ceilings: bool = True,
) -> dict[str, Any]:
  """The calibrated step model at each batch size, like `decode_sweep`.

  Args:
    profile: fitted factors and measured ceilings.
    batch_sizes: sequences per step, whole numbers >= 1.
    N, q, T, k, BW, F, N_act: as in `jaxroof.symbolic.sweep.decode_sweep` (N may be an
      array over batch sizes for MoE; F None means no datasheet FLOP rate).
    layers: blocks of the model, for the per-layer fixed cost; None leaves
      that cost out (and says so).
    use_profile_ceilings: scale the profile's measured BW and F (the ones the
      factors were fitted against) rather than the given ones.

  Returns:
    `{"kind": "calibrated", "units", "assumptions", "rows", "summary",
    "profile", "ceilings"}`; rows and summary have `decode_sweep`'s keys
    plus the calibrated terms (`weight_s`, `kv_s`, `fixed_s`) and the
    `rate_limit_tokens_per_s` as the batch grows.
  """
  batches, n_read = sweep_lib.check_step_inputs(batch_sizes, N=N, q=q, T=T, k=k, BW=BW,
                                                F=F, N_act=N_act)
  if layers is not None:
    layers = errors.require_positive_int("layers", layers)
  n_act = n_read if N_act is None else np.broadcast_to(
      np.asarray(N_act, dtype=float), (len(batches),))
  bw, flop_rate, source, notes = _ceilings(profile, BW, F,
                                           use_profile_ceilings)
  if layers is None:
    notes.append("layers not given: the per-layer fixed cost is left out")
  inputs = {"B": np.asarray(batches, dtype=float), "T": T, "N": n_read,
            "q": q, "k": k, "BW": bw, "F": flop_rate, "N_act": n_act,
            "L": 0.0 if layers is None else float(layers)}
  out = calibration.calibrated_model("numpy")(inputs, profile.factors)
  rows = sweep_lib.estimate_rows(batches, out)

  summary_inputs = {**inputs, "B": 1.0, "N": float(np.max(n_read)),
                    "N_act": float(np.max(n_act))}
  summary = calibration.calibrated_summary_model()(summary_inputs,
                                                   profile.factors)
  summary = {name: float(v) for name, v in summary.items()}
  cross = summary["compute_crossover_batch"]
  if not (math.isfinite(cross) and cross > 0):
    summary["compute_crossover_batch"] = None
    notes.append("no compute crossover: with the fitted factors each added "
                 "sequence adds more memory time than compute time")
  if np.ptp(n_read) > 0:
    notes.append("weights read vary with batch (MoE experts, embedding rows): "
                 "crossovers use the largest")
  summary["notes"] = notes
  return {
      "kind": "calibrated",
      "units": UNITS,
      "assumptions": list(calibration.ASSUMPTIONS),
      "rows": rows,
      "summary": summary,
      "profile": {
          "path": profile.path,
          "device_kind": profile.device_kind,
          "backend": profile.backend,
          "dtype": profile.dtype,
          "jax_version": profile.jax_version,
          "created": profile.created,
          "factors": dict(profile.factors),
          "heldout_median_rel_error": profile.heldout_median_rel_error,
          "heldout_max_rel_error": profile.heldout_max_rel_error,
      },
      "ceilings": {"source": source, "BW": bw,
                   "F": None if math.isinf(flop_rate) else flop_rate,
                   "given_BW": BW, "given_F": F},
  }
