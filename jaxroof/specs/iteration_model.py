"""A model on an accelerator as the cost model's inputs: one iteration's time for any mix.

`IterationModel` binds the constants of `jaxroof.symbolic.cost_model` for a
`ModelSpec` (or for raw numbers): the weights' bytes by part and format, the
K/V bytes and attention FLOPs per layer-kind group, the recurrent state,
the LM head. It turns a mix (each decode row's context, each prefill chunk's
offset and length) into the cost model's aggregates through the sympy span
expressions (`cost_model.span_evaluator`), and evaluates the one lambdified
iteration expression under a `StepModel` (bound per_op or fused, or
calibrated). `on_layout` gives one chip's share of a layout (factors from
`collectives.path_inputs`) with its communication.

Every consumer's step time comes through here: the decode step
(`decode`), a prefill (`prefill`), the simulator's iterations (`step_s`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from jaxroof import errors
from jaxroof.specs import kv_sizing
from jaxroof.specs import parameters as params
from jaxroof.specs.model_spec import (CHUNKED, FULL, MLA, SLIDING, STATE_KINDS, ModelSpec)
from jaxroof.symbolic import cost_model
from jaxroof.symbolic import prefill as prefill_formulas
from jaxroof.symbolic.step_model import StepModel

# Symbol group of the cost model -> the layer kinds it holds.
_GROUP_OF = {FULL: "full", SLIDING: "win", CHUNKED: "win", MLA: "mla"}
CommFn = Callable[[Any], Any]


@dataclasses.dataclass(frozen=True)
class IterationModel:
  """One replica chip's iteration costs.

  Attributes:
    constants: `cost_model.MODEL_NAMES` -> value (SI), BW and F the datasheet's.
    window_kind: "sliding" or "chunked" for the windowed group, else None.
    window: its span (tokens), else None.
    comm: `f(rows) -> seconds` of the collectives of a pass of `rows` tokens,
      None on one chip.
    comm_overlap: fraction of the communication hidden under the step, [0, 1].
    mla_prefill: "mha" or "absorbed" (the form MLA prefill chunks use).
    assumptions: what a reader of its numbers must know.
  """

  constants: Mapping[str, float]
  window_kind: str | None = None
  window: int | None = None
  comm: CommFn | None = None
  comm_overlap: float = 0.0
  mla_prefill: str = "mha"
  assumptions: tuple[str, ...] = ()

  # Building.
  @classmethod
  def from_spec(cls, spec: ModelSpec, *, BW: float, F: float | None, weight_dtype: str = "bf16",
                kv_dtype: str = "bf16", group_size: int | None = None,
                state_dtype: str | None = None, mla_prefill: str = "mha",
                F_attn: float | None = None) -> IterationModel:
    """The constants of `spec` stored as `weight_dtype` with `kv_dtype` K/V; attention's
    FLOPs at `F_attn` (its kernels' dtype; default F)."""
    errors.require_choice("mla_prefill", mla_prefill, cost_model.MLA_PREFILL)
    counts = params.parameter_counts(spec)
    fmt = params.weight_format(spec, weight_dtype, group_size)
    head = "embeddings" if counts.tied else "lm_head"
    n_head = counts.embeddings if counts.tied else counts.lm_head
    body = ("attention", "mlp", "experts_shared", "router", "recurrent", "norms")
    c: dict[str, float] = {name: 0.0 for name in cost_model.MODEL_NAMES}
    c.update(
        W_b=float(sum(fmt.part_bytes(counts, p) for p in body)),
        W_x=float(fmt.part_bytes(counts, "experts_routed")), E=float(max(counts.num_experts, 1)),
        K=float(max(counts.experts_per_token, 1)), N_b=float(counts.active_matmul - n_head),
        N_h=float(n_head), W_h=float(fmt.part_bytes(counts, head)),
        r_e=0.0 if counts.tied else float(counts.hidden_size *
                                          fmt.part_bytes_per_weight("embeddings")),
        A_w=float(params.activation_widths(spec)), L=float(spec.num_layers), BW=float(BW),
        F=math.inf if F is None else float(F),
        N_xb=float(counts.moe_layers * counts.experts_per_token * counts.routed_expert))
    c["F_attn"] = c["F"] if F_attn is None else float(F_attn)
    sizing = kv_sizing.size_kv(spec, context=1, kv_dtype=kv_dtype, state_dtype=state_dtype)
    window_kind = window = None
    for kind in sizing.kinds:
      if kind.kind in STATE_KINDS:
        c["s_st"] += float(kind.state_bytes)
        continue
      group = _GROUP_OF.get(kind.kind)
      if group is None:
        continue  # MLP-only blocks: no mixer.
      c[f"k_{group}"] += float(kind.bytes_per_token)
      if kind.kind == MLA:
        m = spec.mla
        d_qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        c["a_mla"] += kind.layers * float(
            prefill_formulas.mla_pair_flops(m.num_heads, m.kv_lora_rank, m.qk_rope_head_dim))
        if mla_prefill == "mha":
          c["ap_mla"] += kind.layers * float(
              prefill_formulas.mla_mha_pair_flops(m.num_heads, d_qk, m.v_head_dim))
          c["u_mla"] += kind.layers * float(
              prefill_formulas.mla_upprojection_flops(m.num_heads, m.kv_lora_rank, d_qk,
                                                      m.qk_rope_head_dim, m.v_head_dim))
        continue
      a = spec.attention
      c[f"a_{group}"] += kind.layers * float(
          prefill_formulas.full_attention_pair_flops(a.num_heads, a.head_dim))
      if group == "win":
        span = a.sliding_window if kind.kind == SLIDING else a.chunk_size
        if window_kind not in (None, kind.kind):
          raise errors.InputError(
              f"model={spec.name!r} has both sliding and chunked blocks: "
              "the cost model holds one windowed group.", field="model")
        window_kind, window = kind.kind, int(span)
    if mla_prefill == "absorbed":
      c["ap_mla"] = c["a_mla"]
    notes = [cost_model.ASSUMPTIONS["omitted"]]
    if spec.is_moe:
      notes.append(cost_model.ASSUMPTIONS["routing"])
    if spec.mla is not None:
      notes.append(cost_model.ASSUMPTIONS["mla"] if mla_prefill == "mha" else
                   "MLA: absorbed form in decode and prefill (attention over the latent)")
    return cls(constants=c, window_kind=window_kind, window=window, mla_prefill=mla_prefill,
               assumptions=tuple(notes))

  @classmethod
  def on_device(cls, spec: ModelSpec, device: Any, *, weight_dtype: str = "bf16",
                **kwargs: Any) -> IterationModel:
    """`from_spec` at a device's datasheet bandwidth and the dense FLOP rate of the
    weights' stored dtype (`weight_dtype` may be "published"); attention at the rate of
    `attention_dtype` (its kernels compute in bf16 unless fp8 attention is asked)."""
    attention_dtype = kwargs.pop("attention_dtype", "bf16")
    fmt = params.weight_format(spec, weight_dtype, kwargs.get("group_size"))
    return cls.from_spec(spec, BW=device.memory_bandwidth_bytes_per_s, F=device.flops(fmt.dtype),
                         weight_dtype=weight_dtype, F_attn=device.flops(attention_dtype), **kwargs)

  @classmethod
  def from_numbers(cls, *, N: float, q: float, k: float, BW: float, F: float | None,
                   N_act: float | None = None, L: float = 0.0,
                   pair_flops: float = 0.0) -> IterationModel:
    """Raw numbers: N weights of q bytes, k K/V bytes per token in one full group,
    `pair_flops` attention FLOPs per (query, key) pair over all blocks. No widths: A_w = 0,
    so an engine's term per activation element is left out."""
    c = {name: 0.0 for name in cost_model.MODEL_NAMES}
    c.update(W_b=float(N) * float(q), E=1.0, K=1.0, N_b=float(N if N_act is None else N_act),
             k_full=float(k), a_full=float(pair_flops), L=float(L), BW=float(BW),
             F=math.inf if F is None else float(F))
    c["F_attn"] = c["F"]
    return cls(constants=c, assumptions=(cost_model.ASSUMPTIONS["omitted"],))

  def on_layout(self, *, weights: float, experts: float, kv: float, flops: float,
                comm: CommFn | None, comm_overlap: float = 0.0) -> IterationModel:
    """One chip's share: bytes and FLOPs scaled, the pass's communication added."""
    # A_w scales as FLOPs, though only its MLP part splits over tensor-parallel chips (its
    # hidden part, norms and residual adds, runs whole on each): a cost per activation
    # element is undercharged at tp > 1.
    scale = {
        "W_b": weights, "W_h": weights, "r_e": weights, "W_x": experts, "k_full": kv, "k_win": kv,
        "k_mla": kv, "s_st": kv, "N_b": flops, "N_h": flops, "a_full": flops, "a_win": flops,
        "a_mla": flops, "ap_mla": flops, "u_mla": flops, "A_w": flops, "N_xb": flops
    }
    c = {n: v * scale.get(n, 1.0) for n, v in self.constants.items()}
    return dataclasses.replace(self, constants=c, comm=comm, comm_overlap=_overlap(comm_overlap))

  def with_overlap(self, comm_overlap: float) -> IterationModel:
    return dataclasses.replace(self, comm_overlap=_overlap(comm_overlap))

  # Mixes.
  def _spans(self, group: str) -> tuple[str, float]:
    if group == "win":
      return self.window_kind or "sliding", float(self.window or 1)
    return group, 1.0

  def _groups(self) -> tuple[str, ...]:
    return tuple(g for g in ("full", "win", "mla")
                 if _positive(self.constants[f"k_{g}"]) or _positive(self.constants[f"a_{g}"]))

  def mix(
      self,
      decode_context: Any = (),
      chunk_offset: Any = (),
      chunk_tokens: Any = (),
  ) -> dict[str, Any]:
    """The cost model's mix for one iteration (sums over its rows and chunks).

    `decode_context`: each decode row's attended positions (its retained
    tokens plus the new one); `chunk_offset`, `chunk_tokens`: each prefill
    chunk's prompt tokens already done and its length.
    """
    ctx = np.asarray(decode_context, dtype=float)
    o = np.asarray(chunk_offset, dtype=float)
    c = np.asarray(chunk_tokens, dtype=float)
    out = {name: 0.0 for name in cost_model.MIX_NAMES}
    out.update(n_dec=float(ctx.size), n_pre=float(c.sum()), n_samp=float(ctx.size + c.size),
               n_seq=float(ctx.size + c.size))
    for group in self._groups():
      kind, window = self._spans(group)
      span = cost_model.span_evaluator(kind)
      suffix = group
      if ctx.size:
        out[f"S_{suffix}"] = float(np.sum(span(T=ctx, o_chunk=0.0, c_chunk=0.0, W=window)["keys"]))
      if c.size:
        chunk = span(T=1.0, o_chunk=o, c_chunk=c, W=window)
        out[f"X_{suffix}"] = float(np.sum(chunk["pairs"]))
        out[f"V_{suffix}"] = float(np.sum(chunk["kv_positions"]))
        if group == "mla":
          out["O_up"] = float(o.sum())
    return out

  def uniform_mix(self, *, decode_rows: Any = 0.0, context: Any = 1.0, prefill_sequences: Any = 0.0,
                  prompt_tokens: Any = 0.0, prefill_done: Any = 0.0) -> dict[str, Any]:
    """A mix of `decode_rows` rows at one `context` and `prefill_sequences`
    chunks of `prompt_tokens` after `prefill_done` (arrays broadcast)."""
    rows = np.asarray(decode_rows, dtype=float)
    seqs = np.asarray(prefill_sequences, dtype=float)
    c = np.asarray(prompt_tokens, dtype=float)
    out: dict[str, Any] = {name: 0.0 for name in cost_model.MIX_NAMES}
    out.update(n_dec=rows, n_pre=seqs * c, n_samp=rows + seqs, n_seq=rows + seqs)
    for group in self._groups():
      kind, window = self._spans(group)
      span = cost_model.span_evaluator(kind)(T=np.asarray(context, dtype=float),
                                             o_chunk=np.asarray(prefill_done,
                                                                dtype=float), c_chunk=c, W=window)
      out[f"S_{group}"] = rows * span["keys"]
      out[f"X_{group}"] = seqs * span["pairs"]
      out[f"V_{group}"] = seqs * span["kv_positions"]
      if group == "mla":
        out["O_up"] = seqs * np.asarray(prefill_done, dtype=float)
    return out

  # Evaluation.
  def evaluate(self, mix: Mapping[str, Any], model: StepModel | None = None, *,
               step_only: bool = False) -> dict[str, Any]:
    """Every term of the iteration(s) `mix` under `model` (default: the per_op bound)."""
    model = model or StepModel.bound()
    bw, flops = model.scaled_ceilings(self.constants["BW"], self.constants["F"])
    values = {**self.constants, "BW": bw, "F": flops, **mix}
    # Attention's rate moves with the FLOP rate a profile's ceilings give.
    values["F_attn"] = _scaled(self.constants.get("F_attn", self.constants["F"]),
                               self.constants["F"], flops)
    rows = np.asarray(mix["n_dec"], dtype=float) + np.asarray(mix["n_pre"], dtype=float)
    values["t_comm"] = 0.0 if self.comm is None else self.comm(rows)
    values["o_ovl"] = self.comm_overlap
    if model.kind == "bound":
      return cost_model.evaluator("bound", model.form, "numpy", step_only)(**values)
    return cost_model.evaluator("calibrated", "per_op", "numpy", step_only,
                                model.extensions)(**values, **model.factors, **model.term_values())

  def decode(self, batch: Any, context: Any, model: StepModel | None = None) -> dict[str, Any]:
    """A decode step of `batch` rows each attending to `context` positions."""
    return self.evaluate(self.uniform_mix(decode_rows=batch, context=context), model)

  def prefill(self, prompt_tokens: Any, batch: Any = 1.0, model: StepModel | None = None, *,
              done: Any = 0.0) -> dict[str, Any]:
    """One iteration prefilling `batch` prompts of `prompt_tokens` (after `done`)."""
    return self.evaluate(
        self.uniform_mix(prefill_sequences=batch, prompt_tokens=prompt_tokens, prefill_done=done),
        model)

  def attention_flops_per_token(self, context: Any) -> Any:
    """Decode attention FLOPs per retained token of one row at `context` (`A_t`)."""
    flops = self.evaluate(self.uniform_mix(decode_rows=1.0, context=context))
    return np.asarray(flops["attention_flops"], dtype=float) / np.asarray(context, dtype=float)


def _scaled(rate: Any, datasheet: Any, used: Any) -> Any:
  """`rate` scaled as the FLOP rate was (datasheet -> used): itself where unscaled, `used`
  where either is infinite (no compute ceiling)."""
  if isinstance(datasheet, (int, float)) and isinstance(used, (int, float)):
    if datasheet == used:
      return rate
    if not (math.isfinite(datasheet) and math.isfinite(used)):
      return used
  return rate * (np.asarray(used) / np.asarray(datasheet))


def _positive(value: Any) -> bool:
  """Whether a constant (a number, or an array of one per layout) is anywhere > 0."""
  return value > 0 if isinstance(value, (int, float)) else bool(np.any(np.asarray(value) > 0))


def _overlap(value: float) -> float:
  value = float(value)
  if not (0.0 <= value <= 1.0):
    raise errors.InputError(f"comm_overlap={value!r} is not allowed: it must be in [0, 1].",
                            field="comm_overlap")
  return value
