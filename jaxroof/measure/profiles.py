"""`Profile`: what one device achieves, as fitted factors; predictions from it.

A profile holds a device's measured ceilings, the calibrated model's fitted
efficiency factors and fixed costs (`jaxroof.symbolic.calibrated`), any other
cost term fitted with them by its registry name (`terms`, e.g. XLA:CPU's
`r_pack`), the fit's error on held-out points, and how all of it was measured. It is JSON, written
atomically, so profiles of several machines can sit side by side.

`step_model(profile)` is how the experiments use a profile file: the
calibrated `StepModel` that `jaxroof.symbolic.sweep.sweep` evaluates.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from jaxroof import engines  # noqa: F401  (registers the engines' terms a profile may hold)
from jaxroof import errors
from jaxroof import files
from jaxroof.measure import measurement
from jaxroof.measure import profile_schema
from jaxroof.specs import accelerators
from jaxroof.specs import parameters
from jaxroof.symbolic import calibrated as calibration
from jaxroof.symbolic import terms as terms_lib
from jaxroof.symbolic.step_model import StepModel
from jaxroof.toy.config import ToyConfig

KIND = "profile"
# 2 adds accelerator, source, prefill_factors, regime_factors (all optional); 3 names
# every term beyond the six factors by its registry name under `terms` (2's
# regime_factors are read into it).
VERSION = 3
REQUIRED = ("device_kind", "factors", "ceilings", "fit", "dtype", "backend", "jax_version",
            "created")


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
    accelerator: the shipped slug the factors were fitted on (profiles from
      users' measurements), or None (toy profiles: see `device_kind`).
    source: where users' measurements came from: file, engine, date, rows.
    prefill_factors: factors of the calibrated prefill, where fitted.
    terms: every cost term beyond the six factors that the fit gave, by its
      registry name (`jaxroof.symbolic.terms`), e.g. XLA:CPU's weight re-pack
      from B = 2 (`r_pack`, `jaxroof.engines.xla_cpu`); empty: none.
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
  accelerator: str | None = None
  source: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  prefill_factors: Mapping[str, float] = dataclasses.field(default_factory=dict)
  terms: Mapping[str, float] = dataclasses.field(default_factory=dict)
  path: str | None = None

  @property
  def regime_factors(self) -> dict[str, float]:
    """The terms beyond the six factors (the calibrate JSON's `regime_factors`)."""
    return dict(self.terms)

  @property
  def heldout_median_rel_error(self) -> float | None:
    return self.fit.get("heldout_median_rel_error")

  @property
  def heldout_max_rel_error(self) -> float | None:
    return self.fit.get("heldout_max_rel_error")

  @property
  def bound_heldout_median_rel_error(self) -> float | None:
    """The analytic bound's median error on the same held-out points (None:
    not recorded, as in profiles written before it was)."""
    return self.fit.get("bound_heldout_median_rel_error")

  @property
  def heldout_by(self) -> str:
    """How the held-out points were chosen: "model" (whole models the fit never
    saw; toy profiles and users' rows of several models) or "rows" (other rows of
    the one model measured)."""
    return str(self.fit.get("heldout_by", "model"))

  @property
  def worse_than_bound(self) -> bool:
    """Whether the calibrated held-out median error exceeds the bound's."""
    cal, bound = self.heldout_median_rel_error, self.bound_heldout_median_rel_error
    return cal is not None and bound is not None and cal > bound

  def bandwidth(self) -> float | None:
    """The measured sustained bandwidth, B/s (None if not measured)."""
    return self.ceilings.get("bandwidth_Bps")

  def flop_rate(self) -> float | None:
    """The measured matmul rate at the profile's dtype (None if absent)."""
    return (self.ceilings.get("flops_per_s") or {}).get(self.dtype)

  def to_json(self) -> dict[str, Any]:
    data = dataclasses.asdict(self)
    del data["path"]
    return {
        "kind": KIND, "version": VERSION, **data, "factor_units": dict(calibration.FACTOR_UNITS),
        "expression": str(calibration.calibrated_step()),
        "readable_expression": calibration.readable_step()
    }

  @classmethod
  def from_json(cls, data: Mapping[str, Any], path: str | None = None) -> Profile:
    """Checks and reads a profile's JSON; raises InputError naming the gap."""
    where = f"profile={path!r}" if path else "profile"
    if not isinstance(data, Mapping):
      raise errors.InputError(f"{where} is not a JSON object.")
    version = data.get("version", 1)
    if not isinstance(version, int) or version > VERSION:
      raise errors.InputError(f"{where} has version {version!r}: this jaxroof reads versions up to "
                              f"{VERSION}.")
    missing = [name for name in REQUIRED if name not in data]
    if missing:
      raise errors.InputError(
          f"{where} lacks {', '.join(missing)}: give a profile written by a "
          "calibration (jaxroof.calibrate).", field="profile")
    factors = data["factors"]
    names = sorted(factors) if isinstance(factors, Mapping) else factors
    if not isinstance(factors, Mapping) or set(factors) != set(calibration.FACTOR_NAMES):
      raise errors.InputError(f"{where} has factors {names!r}: expected "
                              f"{', '.join(calibration.FACTOR_NAMES)}.")
    for name, value in factors.items():
      errors.require_positive(f"{where} factors.{name}", value)
    held = {}
    for key in ("regime_factors", "terms"):  # regime_factors: version 2's name.
      block = data.get(key, {})
      if not isinstance(block, Mapping):
        raise errors.InputError(f"{where} {key} must be an object of cost terms by name.")
      held.update(block)
    held = terms_lib.checked(held, "profile", f"{where} terms: ")
    _check_schema(data, where)
    fields = {f.name for f in dataclasses.fields(cls)} - {"path", "terms"}
    kwargs = {name: data[name] for name in fields if name in data}
    kwargs["factors"] = {n: float(v) for n, v in factors.items()}
    kwargs["terms"] = held
    kwargs.setdefault("platform", "")
    return cls(**kwargs, path=path)


_TEXT_FIELDS = ("device_kind", "platform", "backend", "dtype", "jax_version", "created")
_OBJECT_FIELDS = ("ceilings", "fit", "model")


def _check_dtype(data: Mapping[str, Any], where: str) -> None:
  """A toy profile's dtype is one jaxroof measures in; one fitted to users'
  measurements (it names an accelerator) lists weight dtypes, comma-separated.
  An unknown one would find no measured ceiling and silently fall back."""
  dtype = data["dtype"]
  users = bool(data.get("accelerator"))
  allowed = tuple(parameters.WEIGHT_DTYPES) if users else tuple(measurement.DTYPES)
  parts = [p.strip() for p in dtype.split(",")] if users else [dtype]
  for part in parts:
    if part not in allowed:
      kind = ("a profile fitted to measurements on an accelerator takes weight dtypes"
              if users else "a profile measured by jaxroof takes")
      raise errors.InputError(f"{where} dtype={dtype[:40]!r} is not a known dtype: {kind} "
                              f"{', '.join(allowed)}.")


def _check_schema(data: Mapping[str, Any], where: str) -> None:
  """Types and ranges of every field a profile's reader uses, before any use."""
  for name in _TEXT_FIELDS:
    if name in data and not isinstance(data[name], str):
      raise errors.InputError(f"{where} {name}={str(data[name])[:40]!r} is not text.")
  for name in _OBJECT_FIELDS:
    if name in data and not isinstance(data[name], Mapping):
      raise errors.InputError(f"{where} {name} is not a JSON object.")
  _check_dtype(data, where)
  ceilings = data["ceilings"]
  for name in ("bandwidth_Bps", "copy_bandwidth_Bps", "read_bandwidth_Bps"):
    if ceilings.get(name) is not None:
      errors.require_positive(f"{where} ceilings.{name}", ceilings[name])
  rates = ceilings.get("flops_per_s", {})
  if not isinstance(rates, Mapping):
    raise errors.InputError(f"{where} ceilings.flops_per_s is not a JSON object.")
  for dtype, rate in rates.items():
    errors.require_positive(f"{where} ceilings.flops_per_s.{dtype}", rate)
  for name, value in data["fit"].items():
    if name.endswith("_rel_error") and value is not None:
      errors.require_non_negative(f"{where} fit.{name}", value)
  configs = data.get("model", {}).get("configs", {})
  if not isinstance(configs, Mapping):
    raise errors.InputError(f"{where} model.configs is not a JSON object.")
  known = {f.name for f in dataclasses.fields(ToyConfig)}
  for model, config in configs.items():
    unknown = sorted(set(config) - known) if isinstance(config, Mapping) else ["(not an object)"]
    if unknown:
      raise errors.InputError(f"{where} model.configs.{model} has unknown fields "
                              f"{unknown}: allowed {sorted(known)}.")


def save_profile(profile: Profile, path: str | os.PathLike[str]) -> None:
  """Writes the profile as JSON, atomically."""
  files.write_json(path, profile.to_json())


MAX_PROFILE_BYTES = 64 * 2**20  # Profiles are kB; ones from users' rows a few MB.


def load_profile(path: str | os.PathLike[str]) -> Profile:
  """Reads a profile; a missing or malformed file is a one-line InputError."""
  path = os.fspath(path)
  if not os.path.lexists(path):
    raise errors.InputError(f"profile={path!r} does not exist: write one with "
                            "`python -m experiments.calibrate`.")
  data = files.read_json("profile", path, max_bytes=MAX_PROFILE_BYTES,
                         max_depth=profile_schema.MAX_DEPTH)
  profile = Profile.from_json(data, path=path)
  profile_schema.check(data, f"profile={path!r}")  # Every field a reader uses, typed and bounded.
  return profile


def check_applies(profile: Profile, accelerator: str, *, what_if: bool = False) -> list[str]:
  """Refuses a profile fitted on one device kind for another accelerator.

  A profile's factors are what one device and implementation achieve; on
  another accelerator they are a what-if, allowed only when asked for. A
  profile from users' measurements names its slug; a toy profile names jax's
  device kind, which matches when it contains the slug's family (e.g.
  "NVIDIA H100 80GB HBM3" and h100-sxm).

  Returns:
    Notes to show (empty when the profile is the accelerator's own).

  Raises:
    InputError: a mismatch without `what_if`.
  """
  slug = accelerator.strip().lower()
  if slug not in accelerators.known_accelerators():  # A slice (8xh100-sxm): its device's.
    try:
      slug = accelerators.parse_slice(slug)[0].name
    except errors.InputError:
      pass
  if profile.accelerator:
    same = profile.accelerator == slug
  else:
    same = accelerators.device_kind_matches(slug, profile.device_kind)
  if same:
    return []
  measured_on = profile.accelerator or profile.device_kind
  if not what_if:
    raise errors.InputError(
        f"profile={profile.path or 'profile'!r} was fitted on {measured_on!r}, not "
        f"accelerator={slug!r}: its factors belong to that device; give what_if to "
        "apply them anyway, as a what-if.", field="what_if")
  return [f"what-if: factors fitted on {measured_on} applied to {slug}"]


def accuracy_notes(profile: Profile) -> list[str]:
  """What a reader of the profile's predictions must know about their error."""
  notes = []
  cal, bound = profile.heldout_median_rel_error, profile.bound_heldout_median_rel_error
  if profile.worse_than_bound:
    notes.append(f"this profile's held-out median error ({cal:.1%}) is larger than the "
                 f"analytic bound's on the same data ({bound:.1%}): the bound is the "
                 "better estimate")
  if profile.heldout_by == "rows":
    models = ", ".join(profile.fit.get("models") or []) or "one model"
    notes.append(f"this profile was fitted to one model's rows ({models}): its held-out "
                 "error is over that model's other batches and contexts; for another "
                 "model the prediction is a carry-over whose error is not known")
  return notes


def step_model(profile: Profile, *, use_profile_ceilings: bool = True,
               notes: tuple[str, ...] = ()) -> StepModel:
  """The calibrated `StepModel` of a profile, with its provenance.

  The factors are fractions of the ceilings measured with them, so by default
  the model scales the profile's own measured BW and F; otherwise (or when the
  profile has none for its dtype) it scales the BW and F a sweep is given,
  and says so in its notes.
  """
  notes = list(notes) + accuracy_notes(profile) + [
      f"{name}={value:.3g} is above 1 (more than the measured ceiling): the fit absorbed "
      "something the model does not name; treat its predictions with care"
      for name, value in profile.factors.items() if name.startswith("eta_") and value > 1
  ]
  measured_bw, measured_f = profile.bandwidth(), profile.flop_rate()
  ceilings = None
  if use_profile_ceilings and measured_bw and measured_f:
    ceilings = (measured_bw, measured_f)
  elif profile.accelerator:
    notes.append("the given (datasheet) BW and F were scaled by the profile's "
                 "factors, which are fractions of the datasheet figures of "
                 f"{profile.accelerator}")
  elif use_profile_ceilings:
    notes.append("the profile has no measured ceilings for its dtype: the "
                 "given (datasheet) BW and F were scaled by its factors")
  else:
    notes.append("the given (datasheet) BW and F were scaled by the "
                 "profile's factors, which were fitted to measured ceilings")
  provenance = {
      "path": profile.path,
      "device_kind": profile.device_kind,
      "backend": profile.backend,
      "dtype": profile.dtype,
      "jax_version": profile.jax_version,
      "created": profile.created,
      "factors": dict(profile.factors),
      "heldout_median_rel_error": profile.heldout_median_rel_error,
      "heldout_max_rel_error": profile.heldout_max_rel_error,
      "bound_heldout_median_rel_error": profile.bound_heldout_median_rel_error,
      "heldout_by": profile.heldout_by,
      "worse_than_bound": profile.worse_than_bound,
  }
  if profile.fit.get("models"):
    provenance["models"] = list(profile.fit["models"])
  if profile.accelerator:
    provenance["accelerator"] = profile.accelerator
  if profile.source:
    provenance["source"] = dict(profile.source)
  if profile.terms:
    provenance["terms"] = dict(profile.terms)
  return StepModel.calibrated(profile.factors, ceilings=ceilings, provenance=provenance,
                              notes=tuple(notes), terms=profile.terms)
