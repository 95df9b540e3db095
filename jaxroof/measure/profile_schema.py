"""The schema of a profile file (`measure.profiles`, written by a calibration).

Every field a profile's readers use, with what it may hold: the six factors (each
> 0 and finite: an efficiency above 1 is read, and flagged by the report), the terms
beyond them by registry name within their bounds (`terms`, version 2's
`regime_factors`), the prefill factors, the measured ceilings (B/s, FLOP/s by dtype),
the fit's errors (>= 0, or null), the toy configs a profile was measured with (the
toy `--validate` builds and times, so their size is bounded), the texts and the
accelerator. Fields no reader uses (expressions, notes, a fit's diagnostics) may hold
anything. `KIND` bounds the file's size and nesting.

The readers' own checks (`Profile.from_json`: the version, the dtype against the
kind of profile) stay where they are; this runs first, so a wrong type or a non-finite
number is one line naming the file, the field and the value.
"""

from __future__ import annotations

import functools
from typing import Any

from jaxroof import schema
from jaxroof.measure import engine_terms_schema
from jaxroof.schema import Anything, ListOf, MapOf, Number, Object, Positive, Text, Whole
from jaxroof.symbolic import calibrated

VERSION = 3  # `profiles.VERSION` (checked by the tests).
MAX_BYTES = 64 * 2**20  # `profiles.MAX_PROFILE_BYTES`: profiles are kB, from users' rows MB.
MAX_DEPTH = 12  # Shipped profiles nest at most 5 levels.
MAX_TOY_WEIGHTS = 2**30  # width x mlp_dim x num_blocks of a toy config: one that fits memory.
_TEXT = Text(empty=True, max_len=100_000)
_ERROR = Number(low=0, high=1e6, null=True)  # A relative error (1 = 100%).
_BANDWIDTH = Positive(1e16, null=True, unit="B/s")
_FACTOR_HIGH = {"r_ovl": 1e6}  # An overlap's exponent; efficiencies and fixed costs below.


def _factor(name: str) -> Number:
  unit = "s" if name.startswith("t0_") else ""
  return Positive(_FACTOR_HIGH.get(name, 1e3), unit=unit)


_TOY_CONFIG = Object(
    {
        "name": _TEXT,
        "vocab_size": Whole(1, 2**20),
        "num_blocks": Whole(1, 1024),
        "num_heads": Whole(1, 1024),
        "num_kv_heads": Whole(1, 1024),
        "head_dim": Whole(1, 4096),
        "width": Whole(1, 2**16),
        "mlp_dim": Whole(1, 2**18),
        "positions": Text(),
        "max_positions": Whole(0, 10**7),
        "rope_base": Positive(1e12),
        "norm_eps": Positive(1.0),
        "dropout_rate": Number(low=0, high=1),
    }, extra=None, rules=(schema.Rule(
        ("width", "mlp_dim", "num_blocks"), lambda w, m, n: w * m * n <= MAX_TOY_WEIGHTS,
        f"width x mlp_dim x num_blocks must be at most {MAX_TOY_WEIGHTS:,} (a toy "
        "that fits in memory)"),))


@functools.cache
def profile() -> Object:
  """The schema (built once every engine registered its terms)."""
  held = engine_terms_schema.terms_object()
  return Object(
      {
          "kind": Text(choices=("profile",)),
          "version": Whole(1, VERSION),
          "device_kind": _TEXT,
          "platform": _TEXT,
          "backend": _TEXT,
          "dtype": _TEXT,
          "jax_version": _TEXT,
          "created": _TEXT,
          "method": _TEXT,
          "accelerator": Text(null=True, max_len=256),
          "factors": Object({n: _factor(n) for n in calibrated.FACTOR_NAMES},
                            required=calibrated.FACTOR_NAMES, extra=None),
          "prefill_factors": MapOf(Positive(1e3), keys=("eta_f_prefill",)),
          "terms": held,
          "regime_factors": held,
          "ceilings": Object({
              "bandwidth_Bps": _BANDWIDTH,
              "copy_bandwidth_Bps": _BANDWIDTH,
              "read_bandwidth_Bps": _BANDWIDTH,
              "flops_per_s": MapOf(Positive(1e19, unit="FLOP/s"), max_len=64),
          }),
          "fit": Object({
              **{
                  f"{split}_{stat}_rel_error": _ERROR
                  for split in ("heldout", "train", "bound_heldout") for stat in ("median", "max")
              },
              "heldout_by": Text(null=True),
              "heldout_points": Whole(0, 10**9, null=True),
              "train_points": Whole(0, 10**9, null=True),
              "status": Text(null=True, max_len=100_000),
              "warnings": ListOf(Anything(), null=True),
          }),
          "model": Object({
              "configs": MapOf(_TOY_CONFIG, max_len=64),
              "fit_models": ListOf(Object({"name": Text()}, required=("name",)), max_len=64),
              "heldout_models": ListOf(Object({"name": Text()}, required=("name",)), max_len=64),
          }),
          "source": Object(null=True),
      }, required=("device_kind", "factors", "ceilings", "fit", "dtype", "backend", "jax_version",
                   "created"))


def _schema(data: Any) -> schema.Spec:
  del data  # Unused: one form.
  return profile()


KIND = schema.FileKind(what="profile", schema=schema.Switch(_schema), max_bytes=MAX_BYTES,
                       max_depth=MAX_DEPTH)


def check(data: Any, where: str) -> None:
  """Raises one InputError at the first field of a parsed profile the schema refuses."""
  schema.check(profile(), data, where=where, field="profile")
