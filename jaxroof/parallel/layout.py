"""A parallel layout (tp, pp, ep, dp) of a real model on real chips, validated.

`Layout` holds the four degrees; `validate` checks them against a model and an
accelerator (every error is one line naming the field and what is allowed); `links` picks the
interconnect figures a layout's collectives run at; `model_terms` reads
the symbolic layer's architecture inputs (blocks, width, K/V split units)
from a `ModelSpec`; `per_chip` turns single-device step inputs into the
per-chip ones and the communication time of `jaxroof.symbolic.collectives`.

Chips per replica = tp x pp x ep (experts spread over ep groups of tp x pp
chips); the fleet is dp replicas. A layout stays within the scale-up domain
(an NVLink node, a TPU slice) unless a scale-out figure is recorded, then
all its collectives run at the scale-out per-chip rate (the slower link binds).
A device without a scale-up fabric (PCIe cards: L4, L40S, H100 PCIe) runs its
collectives over PCIe within one host (`PCIE_HOST_CHIPS`), labelled "pcie".
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from jaxroof import errors
from jaxroof.specs import parameters as params
from jaxroof.specs.accelerators import Accelerator
from jaxroof.specs.model_spec import ModelSpec
from jaxroof.symbolic import architecture
from jaxroof.symbolic import collectives
from jaxroof.symbolic.evaluate import lambdified
from jaxroof.symbolic import symbols as S

DEFAULT_ACTIVATION_BYTES = 2.0  # bf16 activations on the wire.
# Cards one host's PCIe tree holds (an assumption: a typical 8-slot server); a device
# without a scale-up fabric runs tensor parallelism over PCIe up to this many.
PCIE_HOST_CHIPS = 8


@dataclasses.dataclass(frozen=True)
class Layout:
  """Degrees of parallelism; `microbatches` splits a pipelined decode batch."""

  tp: int = 1
  pp: int = 1
  ep: int = 1
  dp: int = 1
  microbatches: int = 1

  def __post_init__(self):
    for name in ("tp", "pp", "ep", "dp", "microbatches"):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise errors.InputError(f"{name}={value!r} is not allowed: give a whole number >= 1.",
                                field=name)

  @property
  def chips_per_replica(self) -> int:
    return self.tp * self.pp * self.ep

  @property
  def chips(self) -> int:
    return self.chips_per_replica * self.dp

  @property
  def is_single_chip(self) -> bool:
    return self.chips == 1

  def as_dict(self) -> dict[str, int]:
    return {
        "tp": self.tp, "pp": self.pp, "ep": self.ep, "dp": self.dp,
        "microbatches": self.microbatches, "chips": self.chips,
        "chips_per_replica": self.chips_per_replica
    }


def from_slice(layout: Layout, chips: int | None) -> Layout:
  """Reconciles a slice's chip count (`chips`, as in `8xh100-sxm`) with a layout.

  A slice with the default layout is tensor parallel over all its chips; a
  slice with a layout must hold exactly tp x pp x ep x dp chips.
  """
  if chips is None:
    return layout
  if isinstance(chips, bool) or not isinstance(chips, (int, np.integer)) or chips < 1:
    raise errors.InputError(f"chips={chips!r} is not allowed: give a whole number >= 1.",
                            field="chips")
  if layout.chips == 1:
    return dataclasses.replace(layout, tp=int(chips))
  if layout.chips != chips:
    raise errors.InputError(
        f"chips={chips} does not match tp*pp*ep*dp = {layout.chips}: give a layout whose "
        "product is the slice's chips, or leave the layout out (tp = chips).", field="chips")
  return layout


@dataclasses.dataclass(frozen=True)
class ModelTerms:
  """Architecture inputs of `jaxroof.symbolic.collectives` for one model."""

  blocks: int  # n_blk: blocks with a tensor-parallel mixer and MLP.
  width: int  # D.
  vocab: int  # V.
  heads: int  # Query heads (0 for a model without attention).
  kv_units: int  # u_kv: K/V heads, 1 for MLA, channels for SSM state.
  kv_rule: str
  moe_blocks: int  # L_moe.
  experts: int
  top_k: int


def model_terms(spec: ModelSpec) -> ModelTerms:
  if spec.mla is not None:
    heads, units = spec.mla.num_heads, 1
    rule = "MLA latent shared by all heads: replicated on every tensor rank"
  elif spec.attention is not None:
    heads, units = spec.attention.num_heads, spec.attention.num_kv_heads
    rule = (f"{units} K/V heads split across tp, replicated once tp > {units}" +
            ("; sliding-window blocks split the same way" if spec.attention.sliding_window else ""))
  else:
    heads, units = 0, spec.ssm.inner_size if spec.ssm else 1
    rule = "recurrent state split by channels across tp"
  moe = spec.moe
  return ModelTerms(blocks=spec.num_layers, width=spec.hidden_size, vocab=spec.vocab_size,
                    heads=heads, kv_units=units, kv_rule=rule, moe_blocks=spec.num_moe_layers,
                    experts=moe.num_experts if moe else 0,
                    top_k=moe.experts_per_token if moe else 0)


def validate(layout: Layout, spec: ModelSpec, device: Accelerator) -> Layout:
  """Checks a layout against a model and a device; returns it.

  Raises:
    InputError: one line naming the field (tp, pp, ep) and what is allowed.
  """
  terms = model_terms(spec)
  tp = layout.tp
  if terms.heads and terms.heads % tp:
    allowed = [x for x in range(1, terms.heads + 1) if terms.heads % x == 0]
    raise errors.InputError(
        f"tp={tp} does not divide {spec.name}'s {terms.heads} query "
        f"heads: allowed tp values are {allowed}.", field="tp")
  if spec.attention is not None and spec.mla is None:
    kv = terms.kv_units
    if (tp <= kv and kv % tp) or (tp > kv and tp % kv):
      raise errors.InputError(
          f"tp={tp} neither divides nor is a multiple of {spec.name}'s "
          f"{kv} K/V heads: heads cannot be split or replicated evenly.", field="tp")
  if not terms.heads and spec.ssm is not None and spec.ssm.inner_size % tp:
    raise errors.InputError(
        f"tp={tp} does not divide {spec.name}'s {spec.ssm.inner_size} "
        "SSM channels.", field="tp")
  if layout.pp > spec.num_layers:
    raise errors.InputError(
        f"pp={layout.pp} exceeds {spec.name}'s {spec.num_layers} "
        f"blocks: allowed 1..{spec.num_layers}.", field="pp")
  if layout.ep > 1:
    if not spec.is_moe:
      raise errors.InputError(
          f"ep={layout.ep} needs a mixture-of-experts model; "
          f"{spec.name} is dense: allowed ep=1.", field="ep")
    if terms.experts % layout.ep:
      allowed = [x for x in range(1, terms.experts + 1) if terms.experts % x == 0]
      raise errors.InputError(
          f"ep={layout.ep} does not divide {spec.name}'s "
          f"{terms.experts} experts: allowed ep values are {allowed}.", field="ep")
  links(layout, device)
  return layout


@dataclasses.dataclass(frozen=True)
class LinkChoice:
  bytes_per_s: float  # W_ic.
  hop_latency_s: float  # t_hop.
  network: str  # "scale-up", "pcie" or "scale-out" (or "none" for one chip).
  note: str
  base_latency_s: float = 0.0  # t_base, per collective.
  torus: bool = False  # Rings per axis; no one-shot collectives.
  axes: int = 1  # Torus dimensions.
  peer_bytes_per_s: float | None = None  # A fully connected mesh's link to one peer.


def links(layout: Layout, device: Accelerator) -> LinkChoice:
  """The interconnect figures one replica's collectives run at.

  Raises:
    InputError: a replica larger than the scale-up domain with no scale-out
      figure recorded.
  """
  net = device.links
  if layout.chips_per_replica == 1:
    return LinkChoice(1.0, 0.0, "none", "one chip per replica: no communication")
  if net is None:
    raise errors.InputError(
        f"tp*pp*ep = {layout.chips_per_replica}: {device.name} has no "
        "interconnect figures: allowed tp = pp = ep = 1.", field="tp")
  if layout.chips_per_replica <= net.domain_chips:
    torus = "torus" in net.topology
    return LinkChoice(
        net.collective_bytes_per_s, net.hop_latency_s, "scale-up",
        f"{net.technology}: {net.collective_bytes_per_s / 1e9:g} GB/s per chip "
        f"in a collective, {net.hop_latency_s * 1e6:g} us per hop "
        f"({net.hop_latency_basis}), {net.base_latency_s * 1e6:g} us per "
        f"collective ({net.base_latency_basis})" + ("; rings per torus axis" if torus else "") +
        ("" if net.peer_bytes_per_s is None else
         f"; a fully connected mesh: a collective over n chips runs on n - 1 links of "
         f"{net.peer_bytes_per_s / 1e9:g} GB/s"), base_latency_s=net.base_latency_s, torus=torus,
        axes=3 if "3d" in net.topology.lower() else 2, peer_bytes_per_s=net.peer_bytes_per_s)
  if (net.domain_chips == 1 and "pcie" in net.technology.lower() and
      layout.chips_per_replica <= PCIE_HOST_CHIPS):
    return LinkChoice(
        net.collective_bytes_per_s, net.hop_latency_s, "pcie",
        f"no scale-up fabric on {device.name}: collectives over {net.technology} "
        f"at {net.collective_bytes_per_s / 1e9:g} GB/s per card "
        f"(the recorded PCIe rate; peer-to-peer through a shared root complex "
        f"is slower), {net.hop_latency_s * 1e6:g} us per hop "
        f"({net.hop_latency_basis}), {net.base_latency_s * 1e6:g} us per "
        f"collective; one host of up to {PCIE_HOST_CHIPS} cards (assumed)",
        base_latency_s=net.base_latency_s)
  if net.scale_out_bytes_per_s is None:
    if net.domain_chips == 1 and "pcie" in net.technology.lower():
      raise errors.InputError(
          f"tp*pp*ep = {layout.chips_per_replica} {device.name} cards exceeds one PCIe "
          f"host ({PCIE_HOST_CHIPS} cards, assumed) and no scale-out figure is recorded: "
          f"allowed tp*pp*ep <= {PCIE_HOST_CHIPS} (dp replicas for more cards).", field="tp")
    raise errors.InputError(
        f"tp*pp*ep = {layout.chips_per_replica} chips exceeds {device.name}'s scale-up "
        f"domain of {net.domain_chips} ({net.domain_unit}) and no scale-out figure is "
        f"recorded: allowed tp*pp*ep <= {net.domain_chips} (dp replicas for more chips).",
        field="tp")
  rate = min(net.scale_out_bytes_per_s, net.collective_bytes_per_s)
  return LinkChoice(
      rate, net.hop_latency_s, "scale-out",
      f"replica spans {layout.chips_per_replica} chips > the {net.domain_chips}-chip "
      f"scale-up domain: collectives at the scale-out {rate / 1e9:g} GB/s per chip "
      f"(the slower link binds), {net.hop_latency_s * 1e6:g} us per hop, "
      f"{net.base_latency_s * 1e6:g} us per collective", base_latency_s=net.base_latency_s)


@functools.cache
def _decode_evaluator(algorithm: str, bound: str):
  inputs = (S.B, S.T, S.N, S.N_x, S.q, S.k, S.BW, S.F, S.N_act, S.tp, S.pp, S.ep, S.m_mb, S.u_kv,
            S.n_blk, S.L_moe, S.K, S.D, S.V, S.a_act, S.o_ovl, S.A_t, *collectives.LINK_SYMBOLS)
  return lambdified(collectives.decode_outputs(algorithm, bound), inputs)


def decode_model(algorithm: str = "best", bound: str = "per_op"):
  """The lambdified per-chip decode step of `jaxroof.symbolic.collectives` (the cost
  model's per-operation or fused bound); `A_t` (decode attention FLOPs per
  retained token) defaults to 0."""
  evaluator = _decode_evaluator(algorithm, bound)
  return lambda **values: evaluator(**{"A_t": 0.0, **values})


@functools.cache
def _prefill_evaluator(algorithm: str, bound: str):
  inputs = (S.P, S.N, S.N_x, S.q, S.BW, S.F, S.N_act, S.tp, S.pp, S.ep, S.L_moe, S.K, S.n_blk, S.D,
            S.V, S.a_act, S.o_ovl, S.A_f, *collectives.LINK_SYMBOLS)
  return lambdified(collectives.prefill_outputs(algorithm, bound), inputs)


def prefill_model(algorithm: str = "best", bound: str = "per_op"):
  """One prompt's prefill on a layout; `A_f` (attention FLOPs per pair) defaults to 0."""
  evaluator = _prefill_evaluator(algorithm, bound)
  return lambda **values: evaluator(**{"A_f": 0.0, **values})


def symbol_values(layout: Layout, spec: ModelSpec, link: LinkChoice, *,
                  activation_bytes: float = DEFAULT_ACTIVATION_BYTES,
                  overlap: float = 0.0) -> dict[str, Any]:
  """The layout's and model's symbol values (tp, pp, ..., W_ic, t_hop) by name."""
  terms = model_terms(spec)
  return {
      "tp": float(layout.tp), "pp": float(layout.pp), "ep": float(layout.ep),
      "m_mb": float(layout.microbatches), "u_kv": float(terms.kv_units),
      "n_blk": float(terms.blocks), "L_moe": float(terms.moe_blocks),
      "K": float(max(terms.top_k, 1)), "D": float(terms.width), "V": float(terms.vocab),
      "a_act": activation_bytes, "o_ovl": overlap, **link_values(link, layout.tp, layout.ep)
  }


def ring_steps(chips: int, torus: bool, axes: int = 2) -> int:
  """Ring steps of one reduce-scatter over `chips`: chips - 1 on a switched fabric; on
  a torus, rings per axis in turn over the most nearly cubic factorisation."""
  if not torus or chips <= 1:
    return max(chips - 1, 0)
  best = None
  for a in range(1, chips + 1):
    if chips % a:
      continue
    rest = chips // a
    if axes == 2:
      sides = (a, rest)
    else:
      b = max((d for d in range(1, rest + 1) if rest % d == 0 and d * d <= rest), default=1)
      sides = (a, b, rest // b)
    steps = sum(side - 1 for side in sides)
    best = steps if best is None else min(best, steps)
  return best


def link_values(link: LinkChoice, tp: int, ep: int = 1) -> dict[str, float]:
  """`parallel.LINK_SYMBOLS` by name for a link and the tensor-parallel degree.

  On a fully connected mesh (one link to each peer, no switch) a collective over n chips
  runs on the n - 1 links to its peers, `min(whole egress, (n - 1) x a peer's link)`: n
  the tensor-parallel ranks, else the expert groups, else a pipeline's pair."""
  rate = link.bytes_per_s
  if link.peer_bytes_per_s is not None:
    n = tp if tp > 1 else ep if ep > 1 else 2
    rate = min(rate, (n - 1) * link.peer_bytes_per_s)
  return {
      "W_ic": rate, "t_hop": link.hop_latency_s, "t_base": link.base_latency_s,
      "h_tp": float(ring_steps(tp, link.torus, link.axes)), "x_os": 0.0 if link.torus else 1.0
  }


def expert_weights_read(spec: ModelSpec, batch: np.ndarray) -> np.ndarray:
  """N_x: routed-expert weights a step reads at each batch (0 for a dense model)."""
  counts = params.parameter_counts(spec)
  if not counts.moe_layers:
    return np.zeros_like(np.asarray(batch, dtype=float))
  rows = 0.0 if counts.tied else np.asarray(batch, dtype=float) * counts.hidden_size
  return params.weights_read_per_step(counts, batch) - counts.read_every_step - rows


@dataclasses.dataclass(frozen=True)
class ChipMemory:
  """Per-chip memory of a layout: resident weights, K/V per sequence, fit."""

  resident_weight_bytes: float
  kv_allocated_bytes_per_sequence: float
  usable_bytes: float
  max_batch_per_replica: int


_UNBOUNDED_BATCH = 10**9  # Sequences per ep group when a sequence keeps no K/V.


def weight_byte_values(spec: ModelSpec, weight_format: params.WeightFormat) -> dict[str, float]:
  """`W_res`, `W_x`, `W_e`, `W_h` and `x_tie` of `collectives.chip_weight_bytes` for a
  model stored in `weight_format` (`W_h`: the tied table's bytes when tied)."""
  counts = params.parameter_counts(spec)
  head = "embeddings" if counts.tied else "lm_head"
  return {
      "W_res": float(weight_format.resident_bytes(counts)),
      "W_x": float(weight_format.part_bytes(counts, "experts_routed")),
      "W_e": float(weight_format.part_bytes(counts, "embeddings")),
      "W_h": float(weight_format.part_bytes(counts, head)), "x_tie": float(counts.tied)
  }


@functools.cache
def _chip_memory_model():
  return lambdified(
      {
          "weights": collectives.chip_weight_bytes(),
          "kv": collectives.chip_kv_bytes_per_sequence(), "usable": architecture.usable_kv_memory(
              S.C, S.w, collectives.chip_weight_bytes()),
          "sequences": collectives.replica_capacity_sequences()
      }, collectives.CHIP_MEMORY_SYMBOLS)


def chip_memory(layout: Layout, spec: ModelSpec, device: Accelerator, *,
                weight_format: params.WeightFormat, kv_allocated_bytes_per_sequence: float,
                workspace_fraction: float) -> ChipMemory:
  """Weights and K/V on the busiest chip, and the batch a replica fits
  (`collectives.chip_weight_bytes`, `collectives.replica_capacity_sequences`).

  Block weights divide by tp*pp, routed experts by tp*pp*ep, the embedding
  table and LM head by tp on the end stages; each chip keeps
  `Max(1/tp, 1/u_kv) / pp` of a sequence's K/V, and a replica's sequences
  split over its ep groups.
  """
  with np.errstate(divide="ignore", invalid="ignore"):  # A sequence without K/V: s = 0.
    out = _chip_memory_model()(C=device.memory_capacity_bytes, w=workspace_fraction,
                               **weight_byte_values(spec, weight_format),
                               s=kv_allocated_bytes_per_sequence, tp=float(layout.tp),
                               pp=float(layout.pp), ep=float(layout.ep),
                               u_kv=float(model_terms(spec).kv_units))
  usable, kv = float(out["usable"]), float(out["kv"])
  if usable <= 0:
    batch = 0
  elif kv == 0:
    batch = _UNBOUNDED_BATCH * layout.ep
  else:
    batch = max(int(out["sequences"]), 0)
  return ChipMemory(float(out["weights"]), kv, usable, batch)


def layout_assumptions(layout: Layout, spec: ModelSpec, link: LinkChoice) -> list[str]:
  terms = model_terms(spec)
  return [
      f"layout tp={layout.tp} pp={layout.pp} ep={layout.ep} dp={layout.dp} "
      f"({layout.chips_per_replica} chips per replica, {layout.chips} in all)",
      "tensor parallel (Megatron): 2 all-reduces of (B, D) activations per block and 1 for "
      "the vocabulary-split embedding lookup, ring algorithm, bf16 on the wire; logits "
      "all-gathered; embedding and LM head split by vocabulary",
      f"K/V: {terms.kv_rule}",
      "pipeline: one microbatch, stages in series; each hand-off (B, D) one hop",
      "experts: routed experts over ep groups, the rest replicated; two all-to-alls per MoE "
      "block; sequences split over the groups",
      f"communication serial with memory and compute (no overlap): {link.note}",
  ]


def replica_sequences(*, capacity: Any, workspace: float, weights: dict[str, Any], kv: Any, tp: Any,
                      pp: Any, ep: Any, u_kv: Any) -> np.ndarray:
  """Sequences a replica fits, vectorised (`collectives.replica_capacity_sequences`):
  `weights` the `weight_byte_values` (arrays broadcast), `kv` allocated K/V bytes per
  sequence (whole model); 0 where none fits."""
  with np.errstate(divide="ignore", invalid="ignore"):
    out = _chip_memory_model()(C=capacity, w=workspace, **weights, s=kv, tp=tp, pp=pp, ep=ep,
                               u_kv=u_kv)
  seqs = np.floor(np.asarray(out["sequences"], dtype=float))
  usable = np.asarray(out["usable"], dtype=float)
  seqs = np.where(np.asarray(out["kv"], dtype=float) > 0, seqs, _UNBOUNDED_BATCH * ep)
  return np.where(usable > 0, np.maximum(seqs, 0.0), 0.0)


def chip_shares_of_memory(*, capacity: Any, weights: dict[str, Any], kv: Any, tp: Any, pp: Any,
                          ep: Any, u_kv: Any) -> tuple[np.ndarray, np.ndarray]:
  """(resident weight bytes, K/V bytes of one sequence) on a replica's busiest chip,
  vectorised (`collectives.chip_weight_bytes`, `chip_kv_bytes_per_sequence`): what an
  engine's own reservation rule sizes its K/V from."""
  out = _chip_memory_model()(C=capacity, w=0.0, **weights, s=kv, tp=tp, pp=pp, ep=ep, u_kv=u_kv)
  return np.asarray(out["weights"], dtype=float), np.asarray(out["kv"], dtype=float)


@functools.cache
def _path_model():
  return lambdified(collectives.path_inputs(), (S.N, S.N_x, S.k, S.N_act, S.tp, S.pp, S.ep, S.u_kv))


def chip_shares(layout: Layout, spec: ModelSpec) -> dict[str, float]:
  """One chip's share along a token's path of each cost-model quantity: `weights`,
  `experts`, `kv` and `flops` (`collectives.path_inputs` at unit inputs)."""
  terms = model_terms(spec)
  at = dict(k=1.0, N_act=1.0, tp=float(layout.tp), pp=float(layout.pp), ep=float(layout.ep),
            u_kv=float(terms.kv_units))
  dense = _path_model()(N=1.0, N_x=0.0, **at)
  routed = _path_model()(N=1.0, N_x=1.0, **at)
  return {
      "weights": float(dense["N"]), "experts": float(routed["N"]), "kv": float(dense["k"]),
      "flops": float(dense["N_act"])
  }


COMM_SYMBOLS: tuple[str, ...] = ("tp", "pp", "ep", "n_blk", "L_moe", "K", "D", "V", "a_act",
                                 *(str(s) for s in collectives.LINK_SYMBOLS))


@functools.cache
def _comm_model():
  inputs = (S.B,) + tuple(getattr(S, name) for name in COMM_SYMBOLS)
  return lambdified({"comm_s": collectives.pass_comm_s(S.B)}, inputs)


def pass_comm(comm: dict[str, Any], rows: Any) -> np.ndarray:
  """`collectives.pass_comm_s`: the collectives of one pass of `rows` token rows through
  a replica of the layout whose `COMM_SYMBOLS` values `comm` holds (arrays broadcast)."""
  rows = np.asarray(rows, dtype=float)
  out = np.asarray(_comm_model()(B=rows, **{name: comm[name] for name in COMM_SYMBOLS})["comm_s"],
                   dtype=float)
  return np.broadcast_to(out, np.broadcast_shapes(out.shape, rows.shape))


@functools.cache
def _bytes_model():
  return lambdified({"chip_bytes": collectives.chip_memory_bytes()},
                    (S.B, S.W_res, S.W_x, S.W_e, S.W_h, S.x_tie, S.s, S.tp, S.pp, S.ep, S.u_kv))


def chip_bytes(batch: Any, *, weights: dict[str, Any], kv: Any, tp: Any, pp: Any, ep: Any,
               u_kv: Any) -> np.ndarray:
  """The busiest chip's bytes with `batch` sequences per replica
  (`collectives.chip_memory_bytes`), vectorised."""
  out = _bytes_model()(B=batch, **weights, s=kv, tp=tp, pp=pp, ep=ep, u_kv=u_kv)
  return np.asarray(out["chip_bytes"], dtype=float)
