"""Decode on a real model and accelerator: the step model's inputs, and fit.

`decode_step_inputs` turns a `ModelSpec`, an `Accelerator`, a context and
dtypes into the numbers `evaluate.step_model` takes (one entry per batch size
where they vary, as MoE weight traffic does), plus whether each batch fits in
device memory. `crossover_batches` solves the same model for the batch where
compute time reaches memory time, and where K/V traffic reaches the weights.
Everything is an analytic bound from datasheet figures.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from jaxroof import errors
from jaxroof.specs import kv_sizing
from jaxroof.symbolic import architecture
from jaxroof.specs import parameters as params
from jaxroof.specs.accelerators import ATTENTION_DTYPE, Accelerator, load_accelerator
from jaxroof.specs.iteration_model import IterationModel
from jaxroof.symbolic.evaluate import step_model
from jaxroof.specs.model_spec import LINEAR_ATTENTION, MAMBA2, ModelSpec
from jaxroof.specs.models import load_model
from jaxroof.specs.parameters import parameter_counts

__all__ = [
    "DecodeInputs", "Crossovers", "decode_step_inputs", "crossover_batches", "load_model",
    "load_accelerator"
]

DEFAULT_WORKSPACE_FRACTION = 0.1  # Kept free for activations and workspace.


@dataclasses.dataclass(frozen=True, eq=False)
class DecodeInputs:
  """Step-model inputs (SI units) for one model on one accelerator.

  Arrays run over `batch_sizes`; scalars are shared by every batch.
  """

  model: str
  accelerator: str
  context: int  # Tokens each sequence retains (T).
  batch_sizes: np.ndarray  # Sequences per step, int.
  weight_dtype: str  # The stored format's dtype (the quantized parts' for a mixed one).
  kv_dtype: str
  compute_dtype: str  # The dtype whose FLOP rate F is.
  N: np.ndarray  # Weights read per step, per batch size.
  N_act: float  # Weights multiplied per token.
  q: float | np.ndarray  # Bytes per weight read, scales included; per batch if mixed.
  k: float  # K/V (or state) bytes read per retained token per sequence.
  BW: float  # Datasheet memory bandwidth, B/s.
  F: float  # Datasheet dense FLOP/s of `compute_dtype`.
  fits: np.ndarray  # Per batch: weights + allocated K/V + workspace fit.
  max_batch_in_memory: int
  memory_capacity_bytes: float
  usable_memory_bytes: float  # Capacity less workspace less weights.
  resident_weight_bytes: float  # Every stored weight (all experts).
  kv_payload_bytes_per_sequence: float
  kv_allocated_bytes_per_sequence: float
  workspace_fraction: float
  block_size: int
  assumptions: tuple[str, ...]
  weight_format: params.WeightFormat | None = None  # How the weights are stored.
  A_t: float = 0.0  # Decode attention FLOPs per retained token and sequence (cost model).

  def step_kwargs(self) -> dict[str, object]:
    """Keyword arguments for `evaluate.step_model("numpy")`."""
    return {
        "B": self.batch_sizes.astype(float), "T": float(self.context), "N": self.N, "q": self.q,
        "k": self.k, "BW": self.BW, "F": self.F, "N_act": self.N_act, "A_t": self.A_t
    }


def _build(model: ModelSpec, accelerator: Accelerator, *, context: int, batch: np.ndarray,
           weight_dtype: str, kv_dtype: str, block_size: int, workspace_fraction: float,
           max_new_tokens: int = 0, group_size: int | None = None,
           state_dtype: str | None = None) -> DecodeInputs:
  counts = parameter_counts(model)
  fmt = params.weight_format(model, weight_dtype, group_size)
  weight_dtype = fmt.dtype
  q = fmt.read_bytes_per_weight(counts, batch)
  sizing = kv_sizing.size_kv(model, context=context, kv_dtype=kv_dtype, block_size=block_size,
                             max_new_tokens=max_new_tokens, state_dtype=state_dtype)
  resident = fmt.resident_bytes(counts)
  fit = kv_sizing.capacity(sizing, weight_bytes=resident,
                           memory_capacity_bytes=accelerator.memory_capacity_bytes,
                           workspace_fraction=workspace_fraction)
  compute_dtype = accelerator.compute_dtype(weight_dtype)
  cost = IterationModel.from_spec(model, BW=accelerator.memory_bandwidth_bytes_per_s,
                                  F=accelerator.flops(weight_dtype),
                                  F_attn=accelerator.flops(ATTENTION_DTYPE),
                                  weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                                  group_size=group_size, state_dtype=state_dtype)
  assumptions = [
      "analytic bound: weights read once per step and shared by the batch; each "
      "sequence's K/V read once per step; decode attention FLOPs per layer kind (MLA "
      "absorbed); activations, KV writes, launches and communication omitted",
      "the whole model on one device (no tensor or expert parallelism)",
      f"datasheet figures of {accelerator.name} as sustained rates: "
      f"{accelerator.memory_bandwidth_bytes_per_s / 1e12:g} TB/s, "
      f"{accelerator.flops(weight_dtype) / 1e12:g} dense {compute_dtype} TFLOP/s",
      fmt.describe(),
      f"K/V as {kv_dtype}; the step reads the payload: sliding-window blocks at most "
      "their window, recurrent state once per sequence",
      f"memory fit: all {counts.total / 1e9:.3g}B weights + batch x allocated K/V "
      f"(pages of {block_size} tokens) <= capacity x (1 - {workspace_fraction:g})",
  ]
  states = [k for k in sizing.kinds if k.state_dtype]
  if states and any(k.kind in (LINEAR_ATTENTION, MAMBA2) for k in states):
    held = ", ".join(f"{k.layers} {k.kind} blocks {k.state_bytes / 1e6:,.1f} MB "
                     f"({k.state_dtype} state)" for k in states)
    assumptions.append(f"each sequence's recurrent state read once per step and held "
                       f"in memory whatever its length: {held} (in k = payload / T)")
  if compute_dtype != weight_dtype:
    assumptions.append(accelerator.compute_note(weight_dtype))
  if fmt.mixed and compute_dtype != params.COMPUTE_REST:
    assumptions.append(f"the {fmt.rest_dtype} weights multiplied at the {compute_dtype} "
                       "rate too (optimistic where they are a large share of N_act)")
  if not counts.tied:
    assumptions.append("the embedding lookup reads one row per sequence, not the table")
  assumptions += model.default_assumptions
  warning = model.context_warning(context + max_new_tokens)
  if warning:
    assumptions.append(warning)
  if model.is_moe:
    assumptions.append("uniform routing (assumption): each MoE block reads "
                       f"{architecture.expected_distinct_experts()} distinct experts of E = "
                       f"{counts.num_experts}, top-K = {counts.experts_per_token}")
  return DecodeInputs(
      model=model.name, accelerator=accelerator.name, context=context, batch_sizes=batch,
      weight_dtype=weight_dtype, kv_dtype=kv_dtype, compute_dtype=compute_dtype,
      N=params.weights_read_per_step(counts, batch), N_act=float(counts.active_matmul), q=q,
      k=sizing.payload_bytes_per_sequence / context, BW=accelerator.memory_bandwidth_bytes_per_s,
      F=accelerator.flops(weight_dtype), fits=batch <= fit.max_batch,
      max_batch_in_memory=fit.max_batch, memory_capacity_bytes=accelerator.memory_capacity_bytes,
      usable_memory_bytes=fit.usable_bytes, resident_weight_bytes=resident,
      kv_payload_bytes_per_sequence=sizing.payload_bytes_per_sequence,
      kv_allocated_bytes_per_sequence=sizing.allocated_bytes_per_sequence,
      workspace_fraction=workspace_fraction, block_size=block_size, assumptions=tuple(assumptions),
      weight_format=fmt, A_t=float(cost.attention_flops_per_token(float(context))))


def decode_step_inputs(
    model: ModelSpec,
    accelerator: Accelerator,
    *,
    context: int,
    batch_sizes: Sequence[int],
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    block_size: int = kv_sizing.DEFAULT_BLOCK_SIZE,
    workspace_fraction: float = DEFAULT_WORKSPACE_FRACTION,
    max_new_tokens: int = 0,
    group_size: int | None = None,
    state_dtype: str | None = None,
) -> DecodeInputs:
  """Step-model inputs for decoding `batch_sizes` sequences of `context` tokens.

  Args:
    model: the model (`load_model`).
    accelerator: the device (`load_accelerator`).
    context: tokens each sequence retains, >= 1.
    batch_sizes: sequences per step, whole numbers >= 1.
    weight_dtype: one of `params.WEIGHT_DTYPES`, or "published": the model's
      own format (`params.published_format`), mixed where the checkpoint is.
    kv_dtype: one of `kv_sizing.KV_DTYPES`.
    block_size: tokens per KV page for the memory fit.
    workspace_fraction: share of device memory kept free, in [0, 1).
    max_new_tokens: further tokens per sequence reserved up front (fit only).
    group_size: weights per quantization scale (`params.bytes_per_weight`).
    state_dtype: recurrent-state matrix dtype (`kv_sizing.size_kv`); the
      state bytes per sequence enter the step's K/V traffic through k and
      the memory fit through the allocation.
  """
  context = errors.require_positive_int("context", context)
  batch = np.asarray(errors.require_positive_ints("batch_sizes", batch_sizes))
  params.weight_format(model, weight_dtype, group_size)  # Validates these first.
  return _build(model, accelerator, context=context, batch=batch, weight_dtype=weight_dtype,
                kv_dtype=kv_dtype, block_size=block_size, workspace_fraction=workspace_fraction,
                max_new_tokens=max_new_tokens, group_size=group_size, state_dtype=state_dtype)


@dataclasses.dataclass(frozen=True)
class Crossovers:
  """Batches (continuous) where the step model changes regime; None: never."""

  compute_crossover_batch: float | None  # Compute time reaches memory time.
  weight_kv_crossover_batch: float | None  # K/V bytes reach weight bytes.


_SEARCH = np.geomspace(1e-3, 1e9, 481)  # Batches searched for a sign change.


def _first_root(gap, lo_hi: np.ndarray = _SEARCH) -> float | None:
  """Smallest B in the search range with gap(B) >= 0 (gap rises through 0 once)."""
  values = gap(lo_hi)
  above = np.nonzero(values >= 0)[0]
  if above.size == 0:
    return None
  i = int(above[0])
  if i == 0:
    return float(lo_hi[0])
  lo, hi = float(lo_hi[i - 1]), float(lo_hi[i])
  for _ in range(60):
    mid = 0.5 * (lo + hi)
    lo, hi = (lo, mid) if gap(np.array([mid]))[0] >= 0 else (mid, hi)
  return hi


def crossover_batches(model: ModelSpec, accelerator: Accelerator, *, context: int,
                      weight_dtype: str = "bf16", kv_dtype: str = "bf16",
                      group_size: int | None = None, form: str = "per_op") -> Crossovers:
  """Solves the step model (as evaluated) for its two crossover batches.

  Found numerically because MoE weight traffic varies with B; for a dense
  model they agree with `cost_model.decode_compute_crossover_batch(form)` and
  `solved.weight_kv_crossover_batch`. Per operation, the compute crossover is
  the linear layers' (their FLOPs reach their weight reads); fused, the whole
  step's.
  """
  context = errors.require_positive_int("context", context)
  base = _build(model, accelerator, context=context, batch=np.array([1]), weight_dtype=weight_dtype,
                kv_dtype=kv_dtype, block_size=1, workspace_fraction=0.0, group_size=group_size)
  counts = parameter_counts(model)
  f = step_model("numpy", "fused")
  linear_only = form == "per_op"

  def outputs(batch: np.ndarray) -> dict:
    kwargs = dict(base.step_kwargs(), B=batch, N=params.weights_read_per_step(counts, batch),
                  q=base.weight_format.read_bytes_per_weight(counts, batch))
    return f(**kwargs)

  def compute_gap(batch: np.ndarray) -> np.ndarray:
    out = outputs(batch)
    if linear_only:  # The linear layers alone: no K/V, no attention FLOPs.
      out = f(**dict(base.step_kwargs(), B=batch, k=0.0, A_t=0.0, N=params.weights_read_per_step(
          counts, batch), q=base.weight_format.read_bytes_per_weight(counts, batch)))
    return np.asarray(out["compute_s"] - out["memory_s"], dtype=float)

  def kv_gap(batch: np.ndarray) -> np.ndarray:
    out = outputs(batch)
    return np.asarray(out["kv_bytes"] - out["weight_bytes"], dtype=float)

  return Crossovers(compute_crossover_batch=_first_root(compute_gap),
                    weight_kv_crossover_batch=_first_root(kv_gap))
