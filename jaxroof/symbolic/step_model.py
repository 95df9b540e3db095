"""`StepModel`: one interface to the decode step, as an analytic bound or calibrated.

Both kinds take the same inputs (B, T, N, q, k, BW, F, N_act, L) and give the
same named outputs, so one sweep (`jaxroof.symbolic.sweep.sweep`), the
accelerator comparison and the serving layer never ask which one they hold:

  * `StepModel.bound(form)`: the cost model's decode step
    (`jaxroof.symbolic.cost_model`): by default the sum of per-operation
    rooflines (linear layers, then attention with its K/V), or `form="fused"`
    for one roofline over the step (`Max(memory, compute)`, the lesson's);
    labelled "bound";
  * `StepModel.calibrated(factors, ...)`: the cost model's calibrated
    iteration specialised to the decode step (`jaxroof.symbolic.calibrated`)
    with fitted efficiency factors and fixed costs, and any other cost terms
    held or fitted, by their registry names (`terms`: an engine's terms bring
    its extension), labelled "calibrated". A profile
    (`jaxroof.measure.profiles`) makes one, with the ceilings its factors were
    fitted against and its provenance.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from jaxroof.symbolic import calibrated as calibrated_lib
from jaxroof.symbolic import evaluate
from jaxroof.symbolic import terms as terms_lib
from jaxroof.symbolic.symbols import with_dense_default

Kind = Literal["bound", "calibrated"]

BOUND_UNITS: dict[str, str] = {
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
CALIBRATED_UNITS: dict[str, str] = {
    **BOUND_UNITS,
    "weight_s": "s",
    "kv_s": "s",
    "fixed_s": "s",
    "linear_s": "s",
    "rate_limit_tokens_per_s": "tokens/s",
}

BOUND_ASSUMPTIONS: tuple[str, ...] = (
    "weights read once per step and reused by every sequence (ideal tile reuse)",
    "each sequence's retained K/V read once per step",
    "activations, KV writes and launches omitted; attention FLOPs counted where the model "
    "gives them (raw numbers have none)",
)
FORM_ASSUMPTIONS: dict[str, str] = {
    "per_op": "per-operation rooflines summed: Max(weights/BW, linear FLOPs/F) + "
              "Max(K/V/BW, attention FLOPs/F)",
    "fused": "one roofline over the step: Max((weights + K/V)/BW, FLOPs/F) (optimistic)",
}

# Why a compute crossover is missing, per kind.
_NO_COMPUTE_CROSSOVER: dict[str, str] = {
    "bound": ("no compute crossover: each added sequence adds more memory time "
              "(T*k/BW) than compute time (2*N_act/F), so memory binds at every batch"),
    "calibrated": ("no compute crossover: with the fitted factors each added "
                   "sequence adds more memory time than compute time"),
}


@dataclasses.dataclass(frozen=True)
class StepModel:
  """A decode-step model.

  Attributes:
    kind: "bound" (analytic) or "calibrated" (fitted factors).
    factors: `calibrated.FACTOR_NAMES` -> value (SI); None for a bound.
    ceilings: (BW, F) that the factors scale, replacing the given ones (the
      ceilings measured with the factors); None scales the given BW and F.
    provenance: where the factors came from (device, backend, dtype, errors),
      carried into the sweep's JSON as "profile".
    notes: what a reader of its results must know (e.g. datasheet ceilings
      scaled by factors fitted elsewhere).
    terms: every other cost term by its registry name -> value (SI), where a
      fit or a measurement gave it (t0_seq, eta_attn, an engine's own terms such
      as XLA:CPU's weight re-pack); absent ones take their defaults. An engine's term
      brings its extension into the model (`extensions`).
  """

  kind: Kind = "bound"
  form: str = "per_op"  # The bound: "per_op" or "fused" (`cost_model.BOUNDS`).
  factors: Mapping[str, float] | None = None
  ceilings: tuple[float, float | None] | None = None
  provenance: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  notes: tuple[str, ...] = ()
  terms: Mapping[str, float] = dataclasses.field(default_factory=dict)

  @classmethod
  def bound(cls, form: str = "per_op") -> StepModel:
    if form not in ("per_op", "fused"):
      raise ValueError(f"form={form!r} is not allowed: use 'per_op' or 'fused'.")
    return cls(form=form)

  @classmethod
  def calibrated(cls, factors: Mapping[str, float], *,
                 ceilings: tuple[float, float | None] | None = None,
                 provenance: Mapping[str, Any] | None = None, notes: tuple[str, ...] = (),
                 terms: Mapping[str, float] | None = None) -> StepModel:
    missing = set(calibrated_lib.FACTOR_NAMES) - set(factors)
    if missing:
      raise ValueError(f"factors lack {sorted(missing)}")
    held = calibrated_lib.held_terms(terms or {})
    return cls("calibrated", "per_op", {n: float(factors[n]) for n in calibrated_lib.FACTOR_NAMES},
               ceilings, dict(provenance or {}), tuple(notes), held)

  @property
  def extensions(self) -> tuple[str, ...]:
    """The engine extensions its terms bring (sorted names; none for the core's)."""
    return terms_lib.owners(self.terms)

  def term_values(self) -> dict[str, float]:
    """The core terms beyond the six factors and the extensions' terms, each held value
    or its default: what the cost model's calibrated evaluator takes with `factors`."""
    names = list(calibrated_lib.CORE_TERM_NAMES) + [
        t.name for n in self.extensions for t in terms_lib.extension(n).terms
    ]
    return {n: float(self.terms.get(n, terms_lib.get(n).default)) for n in names}

  @property
  def units(self) -> dict[str, str]:
    return BOUND_UNITS if self.kind == "bound" else CALIBRATED_UNITS

  @property
  def assumptions(self) -> tuple[str, ...]:
    if self.kind == "bound":
      return BOUND_ASSUMPTIONS + (FORM_ASSUMPTIONS[self.form],)
    return calibrated_lib.ASSUMPTIONS + tuple(
        a for n in self.extensions for a in terms_lib.extension(n).assumptions)

  def no_compute_crossover_note(self) -> str:
    return _NO_COMPUTE_CROSSOVER[self.kind]

  def scaled_ceilings(self, BW: float, F: float | None) -> tuple[float, float]:
    """The (BW, F) this model evaluates with; F None or absent is `inf`."""
    if self.ceilings is not None:
      BW, F = self.ceilings
    return BW, (math.inf if F is None else F)

  def evaluate(self, backend: evaluate.Backend = "numpy", *, B, T, N, q, k, BW, F, N_act=None,
               L=None, comm_s=None, A_t=None, comm_overlap: float = 0.0,
               A_w=None) -> dict[str, Any]:
    """Outputs at the given inputs (arrays broadcast). L (layers) feeds the
    calibrated per-layer fixed cost; None leaves it out. A_w (activation elements per
    token, `symbols.A_w`) feeds an engine extension that uses it; None: 0. `comm_s`
    (several chips: communication on the step's path, s) adds to the step, hidden by
    `comm_overlap` (0: serial), and is returned as an output; None leaves the outputs
    as they were. `A_t`: attention FLOPs per retained token and sequence (the bound's
    attention roofline; the calibrated step's attention FLOPs, at eta_f with the linear
    layers' or at eta_attn on top; None: 0)."""
    if self.kind == "bound":
      out = evaluate.step_model(backend, self.form)(B=B, T=T, N=N, q=q, k=k, BW=BW, F=F,
                                                    N_act=N_act, A_t=A_t)
    else:
      values = with_dense_default({
          "B": B, "T": T, "N": N, "q": q, "k": k, "BW": BW, "F": F, "N_act": N_act,
          "L": 0.0 if L is None else L, "A_t": 0.0 if A_t is None else A_t
      })
      values["A_w"] = 0.0 if A_w is None else A_w  # Read by an extension that uses it.
      out = calibrated_lib.decode_model(backend, self.extensions)(**values, **self.factors,
                                                                  **self.term_values())
    if comm_s is None:
      return out
    out = dict(out)
    out.update(
        evaluate.communication_model(backend)(B=B, t_floor=out["step_s"], t_comm=comm_s,
                                              o_ovl=comm_overlap))
    out["comm_s"] = comm_s
    return out

  def summary(self, *, N, q, T, k, BW, F, N_act=None, L=None) -> dict[str, float]:
    """Crossovers and rate limits (solved symbolically), as floats."""
    if self.kind == "bound":
      out = evaluate.summary_model("numpy", self.form)(N=N, q=q, T=T, k=k, BW=BW, F=F, N_act=N_act)
    else:
      values = with_dense_default({
          "B": 1.0, "T": T, "N": N, "q": q, "k": k, "BW": BW, "F": F, "N_act": N_act,
          "L": 0.0 if L is None else L
      })
      out = calibrated_lib.calibrated_summary_model()(**values, **self.factors)
    return {name: float(np.asarray(v)) for name, v in out.items()}
