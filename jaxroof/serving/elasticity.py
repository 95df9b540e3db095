"""What moves the step: elasticities `d ln(step) / d ln(x)` from `jax.grad`.

An elasticity says by what fraction the step time changes for a 1% change
of one input: 1 for a term that is all of the step and proportional to x,
-1 for a rate the step is inversely proportional to (bandwidth when memory
binds), 0 for an input the binding term does not contain. The derivative is
taken by `jax.grad` of the JAX-lambdified step model (`StepModel.evaluate`
with backend "jax"), in log coordinates, and vectorised over a sweep with
`jax.vmap`; bound and calibrated models alike.

A dense model multiplies every weight it reads (`N_act = N`), so its N
elasticity moves both; an MoE model (N_act given apart) also gets `N_act`.
An input at infinity (no FLOP rate given) has elasticity 0: the step does
not depend on it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxroof.symbolic.step_model import StepModel

# The inputs whose elasticities are shown, in display order.
INPUT_NAMES: tuple[str, ...] = ("BW", "F", "N", "q", "k", "T", "B")


def elasticities(model: StepModel, *, B, T, N, q, k, BW, F, N_act=None, L=None,
                 A_t=None) -> dict[str, np.ndarray]:
  """`d ln(step_s) / d ln(x)` for every input, at each point of a sweep.

  Arguments broadcast against each other (one point per batch, typically);
  F None or `inf` means memory only. Returns input name -> array of the
  broadcast shape (plus "N_act" when N_act is given apart from N, and "A_t",
  decode attention FLOPs per retained token, when given and non-zero).
  """
  import jax  # Deferred: the rest of the serving layer is numpy.
  import jax.numpy as jnp

  BW, F = model.scaled_ceilings(BW, F)
  with_attention = A_t is not None and np.any(np.asarray(A_t, dtype=float) > 0)
  names = (list(INPUT_NAMES) + (["N_act"] if N_act is not None else []) +
           (["A_t"] if with_attention else []))
  values = {"B": B, "T": T, "N": N, "q": q, "k": k, "BW": BW, "F": F}
  if N_act is not None:
    values["N_act"] = N_act
  if with_attention:
    values["A_t"] = A_t
  arrays = np.broadcast_arrays(*(np.asarray(values[n], dtype=float) for n in names))
  shape = arrays[0].shape
  flat = np.stack([a.reshape(-1) for a in arrays], axis=-1)  # (points, inputs)
  finite = np.isfinite(flat)
  logs = np.log(np.where(finite, flat, 1.0))
  factors = None if model.factors is None else tuple(sorted(model.factors.items()))
  gradient = _log_gradient(model.kind, model.form, factors, None if L is None else float(L),
                           tuple(names))
  with jax.enable_x64(True):  # float64 derivatives, without changing the process's default.
    grads = gradient(jnp.asarray(logs), jnp.asarray(finite))
    grads = np.where(finite, np.asarray(grads), 0.0)
  return {name: grads[:, i].reshape(shape) for i, name in enumerate(names)}


@functools.cache
def _log_gradient(kind: str, form: str, factors: tuple | None, L: float | None, names: tuple[str,
                                                                                             ...]):
  """`jit(vmap(grad(log step)))` in log inputs, compiled once per model and inputs."""
  import jax
  import jax.numpy as jnp

  model = StepModel.bound(form) if kind == "bound" else StepModel.calibrated(dict(factors))

  def log_step(log_x, mask):
    x = dict(zip(names, jnp.where(mask, jnp.exp(log_x), jnp.inf)))
    out = model.evaluate("jax", B=x["B"], T=x["T"], N=x["N"], q=x["q"], k=x["k"], BW=x["BW"],
                         F=x["F"], N_act=x.get("N_act"), L=L, A_t=x.get("A_t"))
    return jnp.log(out["step_s"])

  return jax.jit(jax.vmap(jax.grad(log_step)))


def row_elasticities(model: StepModel, batches: Sequence[int],
                     **inputs: Any) -> list[dict[str, float]]:
  """One `{input name: elasticity}` per batch size (`inputs` as `elasticities`)."""
  out = elasticities(model, B=np.asarray(batches, dtype=float), **inputs)
  return [{name: _clean(float(np.broadcast_to(v, (len(batches),))[i])) for name, v in out.items()}
          for i in range(len(batches))]


def _clean(value: float) -> float:
  """Rounds float noise (1e-17) to 0 so "exactly 0 where memory binds" reads so."""
  return 0.0 if abs(value) < 1e-12 or not math.isfinite(value) else value


def moved_by(elasticity: Mapping[str, float]) -> str:
  """The input with the largest |elasticity|, with its sign: e.g. "BW (-0.67)"."""
  name = max(elasticity, key=lambda n: abs(elasticity[n]))
  return f"{name} ({elasticity[name]:+.2f})"


def annotate_sweep(sweep: dict[str, Any], model: StepModel, *, layers=None,
                   **inputs: Any) -> dict[str, Any]:
  """Adds `elasticities` and `moved_by` to every row of a sweep, in place.

  `inputs` are the sweep's own (SI units: N, q, T, k, BW, F and N_act, N and
  N_act per batch where they vary); other entries (a parallel layout's
  communication terms) are not step-model inputs: the elasticities are then
  those of each chip's memory/compute step, communication left out.
  """
  names = ("N", "q", "T", "k", "BW", "F", "N_act", "A_t")
  step_inputs = {n: inputs.get(n) for n in names}
  batches = [row["batch"] for row in sweep["rows"]]
  rows = row_elasticities(model, batches, L=layers, **step_inputs)
  for row, values in zip(sweep["rows"], rows):
    row["elasticities"] = values
    row["moved_by"] = moved_by(values)
  extra = sorted(set(inputs) - set(names))
  unit = "d ln(step_s) / d ln(input)" + (
      f" of the per-chip memory/compute step ({', '.join(extra)} not included)" if extra else "")
  sweep["units"] = {**sweep.get("units", {}), "elasticities": unit}
  return sweep
