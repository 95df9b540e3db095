"""Whole requests: prefill, decode steps with a growing context, TTFT, rates.

One row per decode batch B for requests of `prompt_tokens` (P) and
`output_tokens` (G):

  prefill_s        one iteration prefilling the batch's B prompts together (the
                   one cost model, `jaxroof.specs.iteration_model`: causal
                   attention per layer kind, the experts the tokens touch);
  decode_s         the G - 1 decode iterations at contexts P+1 .. P+G-1 of the
                   same cost model, summed step by step;
  ttft_s           M/D/1 wait for a prefill of `prefill_batch` prompts (default
                   one) + batching window + that prefill (`queueing`), the
                   mean at `arrival_rate`;
  mean_token_gap_s decode_s / (G - 1), stretched by 1/(1 - lam*D) because
                   prefills take priority on the chip;
  e2e_s            ttft_s + (G - 1) * mean_token_gap_s;
  aggregate_tokens_per_s      B / mean_token_gap_s: B sequences decoding at the
                   loaded gap (continuous batching); in every row aggregate
                   = B x per-sequence;
  static_batch_tokens_per_s  B*G / (prefill_s + decode_s): a static batch of
                   B requests served together, the "generate" view peers
                   report, named apart;
  per_sequence_tokens_per_s  1 / mean_token_gap_s: the rate one user sees
                   once tokens flow.

With raw numbers and a fixed K/V per sequence (`kv_per_sequence_bytes`,
the lesson's view) every decode step reads that K/V and the context does not
grow; the prompt's K/V writes are that amount too.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxroof import errors
from jaxroof.parallel import layout as layout_lib
from jaxroof.serving import queueing
from jaxroof.specs import step_inputs
from jaxroof.specs.accelerators import ATTENTION_DTYPE
from jaxroof.specs.iteration_model import IterationModel
from jaxroof.symbolic import collectives
from jaxroof.symbolic import prefill as prefill_formulas
from jaxroof.symbolic.evaluate import lambdified
from jaxroof.symbolic.step_model import StepModel
from jaxroof.symbolic import symbols as S
from jaxroof.symbolic.symbols import B

COMM_SYMBOLS: tuple[str, ...] = layout_lib.COMM_SYMBOLS

UNITS: dict[str, str] = {
    "batch": "sequences",
    "prefill_s": "s",
    "decode_s": "s",
    "ttft_s": "s",
    "mean_token_gap_s": "s",
    "e2e_s": "s",
    "aggregate_tokens_per_s": "tokens/s",
    "per_sequence_tokens_per_s": "tokens/s",
    "static_batch_tokens_per_s": "tokens/s",
}
LAYOUT_UNITS: dict[str, str] = {"comm_s": "s", "chips": "chips", "fleet_tokens_per_s": "tokens/s"}


@dataclasses.dataclass(frozen=True)
class ServingInputs:
  """A model on a device, in SI units, for whole requests.

  Attributes:
    N: weights read per step (dense: all; MoE: as read at the largest batch).
    N_act: weights multiplied per token.
    q: bytes per weight.
    k: K/V bytes per retained token (all blocks), for a growing context.
    BW: memory bandwidth, B/s.
    F: FLOP/s; None for memory only.
    pair_flops: prefill attention FLOPs per (query, key) pair, all blocks
      (`prefill.attention_terms`; 0 for none).
    kv_per_sequence_bytes: raw numbers: K/V each sequence reads per step, fixed
      (the context does not grow); None: `k` times the context.
    layers: blocks, for a calibrated per-layer fixed cost.
    max_batch_in_memory: sequences that fit (weights + allocated K/V +
      workspace); None when no capacity is known.
    context_limit: the model's `max_position_embeddings`, if any.
    label: what the inputs describe, for titles.
    memory: the memory fit's figures, for the JSON.
    windows: (pair_flops, window) per sliding-window kind, for prefill.
    comm: a multi-chip replica's layout and link figures (`COMM_SYMBOLS` by
      name, `jaxroof.parallel.layout.symbol_values`); None for one chip. N,
      N_act and k are then one chip's along a token's path
      (`jaxroof.symbolic.collectives.path_inputs`).
    attention_share: share of the prefill attention FLOPs one chip does
      (1/(tp*ep) on a layout, like the linear FLOPs).
    replicas: data-parallel replicas (dp): fleet rates are this many times a
      replica's.
    chips_per_replica: tp*pp*ep.
    cost: the iteration cost model of one chip of the replica (a model's:
      per layer kind, experts, head, communication); None: built from the raw
      numbers (`cost_model()`).
    comm_overlap: fraction of the communication hidden under each iteration.
  """

  N: float
  N_act: float
  q: float
  k: float
  BW: float
  F: float | None
  pair_flops: float = 0.0
  kv_per_sequence_bytes: float | None = None
  layers: int | None = None
  max_batch_in_memory: int | None = None
  context_limit: int | None = None
  label: str = ""
  memory: dict[str, Any] = dataclasses.field(default_factory=dict)
  attention_terms: tuple[prefill_formulas.AttentionTerm, ...] = ()
  comm: dict[str, float] | None = None
  attention_share: float = 1.0
  replicas: int = 1
  chips_per_replica: int = 1
  cost: IterationModel | None = None
  comm_overlap: float = 0.0

  @property
  def grows(self) -> bool:
    return self.kv_per_sequence_bytes is None

  def cost_model(self, prompt_tokens: int = 1) -> IterationModel:
    """The iteration cost model: the model's, or one built from the raw numbers
    (with a fixed K/V per sequence, a prompt writes it over its P tokens and a
    decode row reads it whole at context 1)."""
    if self.cost is not None:
      return self.cost.with_overlap(self.comm_overlap)
    k = self.k if self.grows else self.kv_per_sequence_bytes
    cost = IterationModel.from_numbers(N=self.N, q=self.q, k=k, BW=self.BW, F=self.F,
                                       N_act=self.N_act, L=float(self.layers or 0),
                                       pair_flops=self.pair_flops * self.attention_share)
    if self.comm is not None:
      comm = self.comm
      cost = cost.on_layout(weights=1.0, experts=1.0, kv=1.0, flops=1.0,
                            comm=lambda rows: pass_comm_s(comm, rows),
                            comm_overlap=self.comm_overlap)
    return cost


def comm_s(inputs: ServingInputs, rows: Any) -> np.ndarray:
  """Communication of one pass of `rows` token rows through the replica (0 on one chip).

  `jaxroof.symbolic.collectives.pass_comm_s`: a decode step passes B rows, a
  batched prefill P*B.
  """
  if inputs.comm is None:
    return np.zeros_like(np.asarray(rows, dtype=float))
  return pass_comm_s(inputs.comm, rows)


def pass_comm_s(comm: dict[str, float], rows: Any) -> np.ndarray:
  """`parallel.pass_comm_s` at `rows` for a layout's `COMM_SYMBOLS` values."""
  return layout_lib.pass_comm(comm, rows)


def check_lengths(inputs: ServingInputs, prompt_tokens: Any, output_tokens: Any) -> tuple[int, int]:
  """Validates prompt and output lengths: whole, >= 1 and >= 2, within the context."""
  if not (isinstance(prompt_tokens, (int, np.integer)) and prompt_tokens >= 1):
    raise errors.InputError(
        f"prompt_tokens={prompt_tokens!r} is not allowed: it must be a whole number >= 1.",
        field="prompt_tokens")
  if not (isinstance(output_tokens, (int, np.integer)) and output_tokens >= 2):
    raise errors.InputError(
        f"output_tokens={output_tokens!r} is not allowed: it must be a whole number >= 2 "
        "(one output has no gap between tokens).", field="output_tokens")
  limit = inputs.context_limit
  if limit is not None and prompt_tokens + output_tokens - 1 > limit:
    raise errors.InputError(
        f"prompt_tokens + output_tokens - 1 = {prompt_tokens + output_tokens - 1} is not "
        f"allowed: the model's context is max_position_embeddings = {limit} tokens.",
        field="prompt_tokens")
  return int(prompt_tokens), int(output_tokens)


def prefill(inputs: ServingInputs, prompt_tokens: int, batch: Any,
            model: StepModel | None = None) -> dict[str, np.ndarray]:
  """One iteration prefilling `batch` prompts of `prompt_tokens` together (the cost
  model: `prefill_s` with `memory_s`, `compute_s`, `comm_s` and each operation's)."""
  batch = np.asarray(batch, dtype=float)
  cost = inputs.cost_model()
  if not inputs.grows:
    cost = dataclasses.replace(
        cost, constants={**cost.constants, "k_full": inputs.kv_per_sequence_bytes / prompt_tokens})
  out = cost.prefill(float(prompt_tokens), batch, model)
  result = {
      name: np.broadcast_to(np.asarray(v, dtype=float), batch.shape) for name, v in out.items()
  }
  result["prefill_s"] = result["step_s"]
  return result


def decode_steps(model: StepModel, inputs: ServingInputs, batch: Any, prompt_tokens: int,
                 output_tokens: int) -> np.ndarray:
  """Step times (batch, G - 1), step j at context P + j (fixed K/V: context 1)."""
  batch = np.asarray(batch, dtype=float)[:, None]
  if inputs.grows:
    context = prompt_tokens + np.arange(1, output_tokens, dtype=float)[None, :]
  else:
    context = np.ones((1, output_tokens - 1))
  out = inputs.cost_model().decode(batch, context, model)
  return np.broadcast_to(np.asarray(out["step_s"], dtype=float),
                         (batch.shape[0], output_tokens - 1))


def decode_terms(model: StepModel, inputs: ServingInputs, batch: float,
                 context: float) -> dict[str, float]:
  """Every term of one decode iteration of `batch` rows at `context` (floats)."""
  ctx = context if inputs.grows else 1.0
  out = inputs.cost_model().decode(float(batch), float(ctx), model)
  return {name: float(np.asarray(v)) for name, v in out.items()}


def mixed_iteration_s(model: StepModel, inputs: ServingInputs, *, decode_rows: float,
                      context: float, prompt_tokens: int, prefill_sequences: Any = 1.0) -> Any:
  """One iteration of `decode_rows` rows at `context` beside `prefill_sequences` whole
  prompts of `prompt_tokens` (an iteration-level scheduler admitting them); an
  array of prompt counts gives an array of times."""
  cost = inputs.cost_model()
  ctx = context if inputs.grows else 1.0
  mix = cost.uniform_mix(decode_rows=decode_rows, context=ctx, prefill_sequences=prefill_sequences,
                         prompt_tokens=prompt_tokens)
  out = np.asarray(cost.evaluate(mix, model)["step_s"], dtype=float)
  return float(out) if out.ndim == 0 else out


def decode_time(model: StepModel, inputs: ServingInputs, batch: Any, prompt_tokens: int,
                output_tokens: int) -> np.ndarray:
  """Seconds of the G - 1 decode steps per batch, summed step by step."""
  return decode_steps(model, inputs, batch, prompt_tokens, output_tokens).sum(axis=1)


def evaluate(model: StepModel, inputs: ServingInputs, batch: Sequence[int] | np.ndarray, *,
             prompt_tokens: int, output_tokens: int, arrival_rate: float = 0.0,
             window_s: float = 0.0, prefill_batch: int = 1) -> dict[str, Any]:
  """Every row quantity as arrays over `batch`, plus the queue at this load.

  Returns the `UNITS` columns (None-free arrays; TTFT and loaded gaps are
  `inf` when the load is unstable), `stable`, `queue` (`QueueResult`) and
  `single_prefill_s` (the M/D/1 service time D: one prefill of
  `prefill_batch` prompts).
  """
  batch = np.asarray(batch, dtype=float)
  single = float(prefill(inputs, prompt_tokens, float(prefill_batch), model)["prefill_s"])
  queue = queueing.ttft(arrival_rate, single, window_s, prefill_batch)
  prefill_s = prefill(inputs, prompt_tokens, batch, model)["prefill_s"]
  decode_s = decode_time(model, inputs, batch, prompt_tokens, output_tokens)
  steps = output_tokens - 1
  stretch = 1.0 / (1.0 - queue.utilisation) if queue.stable else math.inf
  gap = decode_s / steps * stretch
  ttft_s = queue.ttft_s if queue.stable else math.inf
  return {
      "batch": batch,
      "prefill_s": prefill_s,
      "decode_s": decode_s,
      "unloaded_token_gap_s": decode_s / steps,
      "ttft_s": np.full(batch.shape, ttft_s),
      "mean_token_gap_s": gap,
      "e2e_s": ttft_s + steps * gap,
      "aggregate_tokens_per_s": batch / gap,
      "static_batch_tokens_per_s": batch * output_tokens / (prefill_s + decode_s),
      "per_sequence_tokens_per_s": 1.0 / gap,
      "stable": queue.stable,
      "queue": queue,
      "single_prefill_s": single,
      "prefill_batch": prefill_batch,
  }


def _value(x: float) -> float | None:
  """A finite float, or None (JSON null) for a quantity an unstable load leaves undefined."""
  return float(x) if math.isfinite(x) else None


_LOADED_RATES = ("aggregate_tokens_per_s", "per_sequence_tokens_per_s")  # B and 1 over the gap.


def rows(model: StepModel, inputs: ServingInputs, batch_sizes: Sequence[int],
         **kwargs: Any) -> list[dict[str, Any]]:
  """One row per batch size (keys `UNITS`, plus `status`); `evaluate`'s keywords. Past
  the prefill queue's capacity (status "unstable") what the load leaves undefined (TTFT,
  the loaded gap, e2e and the rates over the gap) is None."""
  batches = errors.require_positive_ints("batch_sizes", batch_sizes)
  out = evaluate(model, inputs, batches, **kwargs)
  result = []
  for i, b in enumerate(batches):
    row = {"batch": b}
    for name in UNITS:
      if name != "batch":
        row[name] = _value(out[name][i])
    if not out["stable"]:  # No steady rate of tokens: the gap grows without bound.
      row.update({name: None for name in _LOADED_RATES})
    row["status"] = out["queue"].status
    row["comm_s"] = float(comm_s(inputs, float(b)))
    row["chips"] = inputs.chips_per_replica * inputs.replicas
    row["fleet_tokens_per_s"] = (None if row["aggregate_tokens_per_s"] is None else
                                 row["aggregate_tokens_per_s"] * inputs.replicas)
    if inputs.max_batch_in_memory is not None:
      row["fits_in_memory"] = b <= inputs.max_batch_in_memory
    result.append(row)
  return result


def model_inputs(spec: Any, device: Any, *, prompt_tokens: int, output_tokens: int,
                 weight_dtype: str = "bf16", kv_dtype: str = "bf16", mla_prefill: str = "mha",
                 comm_overlap: float = 0.0, **step_input_kw: Any) -> ServingInputs:
  """`ServingInputs` for a `ModelSpec` on an `Accelerator` (datasheet figures).

  K/V per token is the payload at the prompt length; the memory fit allocates
  each sequence's pages for P + G tokens (the output reserved up front), as
  `specs.kv_sizing` does. MoE weights read are taken at the largest batch that
  fits (every expert a large batch touches).
  """
  limit = spec.max_position_embeddings
  check_lengths(
      ServingInputs(N=1, N_act=1, q=1, k=1, BW=1, F=1,
                    context_limit=limit if isinstance(limit, int) else None), prompt_tokens,
      output_tokens)
  base = step_inputs.decode_step_inputs(spec, device, context=prompt_tokens, batch_sizes=[1],
                                        weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                                        max_new_tokens=output_tokens, **step_input_kw)
  fit = max(base.max_batch_in_memory, 1)
  at_fit = step_inputs.decode_step_inputs(spec, device, context=prompt_tokens, batch_sizes=[fit],
                                          weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                                          max_new_tokens=output_tokens, **step_input_kw)
  memory = {
      "memory_capacity_bytes": base.memory_capacity_bytes,
      "resident_weight_bytes": base.resident_weight_bytes,
      "usable_memory_bytes": base.usable_memory_bytes,
      "kv_payload_bytes_per_sequence": base.kv_payload_bytes_per_sequence,
      "kv_allocated_bytes_per_sequence": base.kv_allocated_bytes_per_sequence,
      "workspace_fraction": base.workspace_fraction,
      "block_size": base.block_size,
      "reserved_output_tokens": output_tokens,
  }
  return ServingInputs(
      N=float(at_fit.N[0]), N_act=float(base.N_act), q=float(np.ravel(at_fit.q)[0]), k=base.k,
      BW=base.BW, F=base.F, layers=spec.num_layers, max_batch_in_memory=base.max_batch_in_memory,
      context_limit=limit if isinstance(limit, int) else None,
      label=f"{spec.name} on {device.name}, {base.weight_format.label} weights, "
      f"{kv_dtype} K/V", memory=memory, attention_terms=prefill_formulas.attention_terms(spec),
      cost=IterationModel.from_spec(spec, BW=base.BW, F=base.F,
                                    F_attn=device.flops(ATTENTION_DTYPE), weight_dtype=weight_dtype,
                                    kv_dtype=kv_dtype, group_size=step_input_kw.get("group_size"),
                                    state_dtype=step_input_kw.get("state_dtype"),
                                    mla_prefill=mla_prefill), comm_overlap=comm_overlap)
