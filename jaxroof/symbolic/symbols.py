"""The one registry of named, positive symbols, with their units and meanings.

One symbol per physical quantity, shared by all formulas so that `solve`,
`limit` and `lambdify` see the same objects. All are `positive=True`, which
lets `sympy.solve` drop unphysical roots. Symbols come in groups: the decode
step's core (`QUANTITIES`), architecture terms (`ARCHITECTURE`), the cost
model's aggregates (`COST`) and more; `BY_NAME` holds them all, the core cost
terms of `terms.py` included (`FACTOR_QUANTITIES`: the calibrated decode
step's six fitted factors). A new symbol is defined here, once, with `_define`;
a new cost term is registered in `terms.py` (or by its engine).
"""

from __future__ import annotations

import dataclasses

import sympy as sp

from jaxroof.symbolic import terms
# The cost terms (efficiency factors, fixed costs, overlaps) are registered in `terms.py`
# with their default, bounds and how they are obtained; the core's are re-exported here.
from jaxroof.symbolic.terms import (
    eta_attn,
    eta_comm,
    eta_f,
    eta_f_prefill,  # noqa: F401
    eta_kv,
    eta_w,
    r_ovl,
    t0_layer,
    t0_request,
    t0_seq,
    t0_step)


@dataclasses.dataclass(frozen=True)
class Quantity:
  """A symbol with its unit and meaning, for documentation and output."""

  symbol: sp.Symbol
  unit: str
  meaning: str


_GROUPS: dict[str, list[Quantity]] = {
    "core": [], "architecture": [], "parallel": [], "iteration": [], "serving": [], "cost": []
}


def _define(name: str, unit: str, meaning: str, group: str = "core") -> sp.Symbol:
  """A positive symbol, registered with its unit and meaning."""
  symbol = sp.Symbol(name, positive=True)
  _GROUPS[group].append(Quantity(symbol, unit, meaning))
  return symbol


# The decode step: batch and lengths.
B = _define("B", "sequences", "sequences in the decode batch")
T = _define("T", "tokens", "retained tokens per sequence")
P = _define("P", "tokens", "prompt length")
g = _define("g", "tokens", "output tokens emitted so far")
# Model.
N = _define("N", "weights", "weights read in a step")
N_act = _define("N_act", "weights", "weights multiplied per token (active)")
q = _define("q", "B/weight", "bytes stored per weight")
k = _define("k", "B/token", "KV bytes per retained token")
L = _define("L", "blocks", "blocks that keep K/V")
H = _define("H", "heads", "query heads per block")
H_kv = _define("H_kv", "heads", "KV heads per block")
d = _define("d", "coordinates", "coordinates per head")
b = _define("b", "B", "bytes per stored K or V element")
# Device.
BW = _define("BW", "B/s", "sustained memory bandwidth")
F = _define("F", "FLOP/s", "sustained FLOP rate")
F_attn = _define(
    "F_attn", "FLOP/s", "FLOP rate of the attention kernels (their compute dtype, "
    "bf16 unless fp8 attention is asked; F where unset)")
R = _define("R", "FLOP/B", "ridge point")
# Times (a rate written in terms of a step time; serving targets and waits).
t = _define("t", "s", "step time")
t_gap = _define("t_gap", "s", "longest acceptable gap between one user's tokens")
t_window = _define("t_window", "s", "batching window before the first step")
t_queue = _define("t_queue", "s", "queueing wait for a slot in the batch")

# Architecture: attention variants, recurrent state, allocation, MoE, quantization.
_A = "architecture"
W = _define("W", "tokens", "sliding-window length", _A)
r_kv = _define("r_kv", "coordinates", "MLA latent K/V rank (kv_lora_rank)", _A)
d_rope = _define("d_rope", "coordinates", "MLA RoPE key coordinates (qk_rope_head_dim)", _A)
d_qk = _define("d_qk", "coordinates", "coordinates per query/key head", _A)
d_v = _define("d_v", "coordinates", "coordinates per value head", _A)
d_inner = _define("d_inner", "channels", "SSM channels (intermediate size)", _A)
d_state = _define("d_state", "states", "SSM state size per channel", _A)
d_conv = _define("d_conv", "taps", "causal-convolution taps kept per channel", _A)
p = _define("p", "tokens", "page (block) size of a paged KV cache", _A)
M_new = _define("M_new", "tokens", "tokens reserved for future output", _A)
C = _define("C", "B", "device memory capacity", _A)
w = _define("w", "1", "fraction of device memory kept as workspace", _A)
W_res = _define("W_res", "B", "resident weight bytes", _A)
s = _define("s", "B/sequence", "allocated K/V bytes per sequence", _A)
E = _define("E", "experts", "routed experts per MoE layer", _A)
K = _define("K", "experts/token", "experts each token is routed to", _A)
N_fixed = _define("N_fixed", "weights", "weights read every step, routing aside", _A)
N_exp = _define("N_exp", "weights", "weights of one routed expert in one layer", _A)
L_moe = _define("L_moe", "blocks", "blocks with routed experts", _A)
bits = _define("bits", "bit", "bits per stored weight", _A)
G = _define("G", "weights", "weights sharing one quantization scale", _A)
s_b = _define("s_b", "B", "bytes per quantization scale", _A)

# Hybrid architectures: chunked attention, linear attention, Mamba-2.
W_chunk = _define("W_chunk", "tokens", "chunked-local-attention chunk (attention_chunk_size)", _A)
H_lk = _define("H_lk", "heads", "linear-attention key heads (Gated DeltaNet)", _A)
H_lv = _define("H_lv", "heads", "linear-attention value heads (Gated DeltaNet)", _A)
d_lk = _define("d_lk", "coordinates", "coordinates per linear-attention key head", _A)
d_lv = _define("d_lv", "coordinates", "coordinates per linear-attention value head", _A)
H_m = _define("H_m", "heads", "Mamba-2 heads", _A)
d_m = _define("d_m", "coordinates", "coordinates per Mamba-2 head", _A)
n_g = _define("n_g", "groups", "Mamba-2 B/C groups (n_groups)", _A)
b_s = _define("b_s", "B", "bytes per recurrent-state element (state dtype)", _A)
c_state = _define("c_state", "FLOP/element",
                  "FLOPs per state element per token (update and read-out)", _A)

L_attn = _define("L_attn", "blocks", "blocks with full attention over the "
                 "prompt", _A)

# Parallel layouts over several chips (`jaxroof.symbolic.collectives`).
_P = "parallel"
tp = _define("tp", "chips", "tensor-parallel degree (heads and MLP columns split)", _P)
pp = _define("pp", "stages", "pipeline stages (blocks split into consecutive groups)", _P)
ep = _define("ep", "groups", "expert-parallel degree (routed experts spread over groups)", _P)
dp = _define("dp", "replicas", "data-parallel replicas, each serving its own batch", _P)
m_mb = _define("m_mb", "microbatches", "microbatches a pipelined batch is split into", _P)
D = _define("D", "coordinates", "hidden width of the residual stream", _P)
V = _define("V", "tokens", "vocabulary size", _P)
a_act = _define("a_act", "B", "bytes per activation element sent between chips", _P)
n_blk = _define("n_blk", "blocks", "blocks with a tensor-parallel mixer and MLP", _P)
u_kv = _define("u_kv", "units", "K/V split units: KV heads (1 for an MLA latent)", _P)
N_x = _define("N_x", "weights", "routed-expert weights read in a step", _P)
W_ic = _define("W_ic", "B/s", "interconnect bandwidth a chip sends at in a collective", _P)
t_hop = _define("t_hop", "s", "latency per hop (step) of a collective", _P)
n_r = _define("n_r", "chips", "ranks taking part in one collective", _P)
S_b = _define("S_b", "B", "bytes of the array a collective reduces or gathers", _P)
o_ovl = _define("o_ovl", "1", "fraction of communication hidden under the step (0..1)", _P)
t_floor = _define("t_floor", "s", "step time of memory and compute alone", _P)
t_comm = _define("t_comm", "s", "communication time on a step's critical path", _P)
t_stage = _define("t_stage", "s", "one pipeline stage's time for one microbatch", _P)
t_hand = _define("t_hand", "s", "one stage-to-stage hand-off", _P)
# Mixed-precision weights (a published format quantizes some parts only,
# e.g. gpt-oss's experts in MXFP4 with attention and embeddings in bf16).
N_lp = _define("N_lp", "weights", "weights read in a step stored in the quantized format", _A)
q_lp = _define("q_lp", "B/weight", "bytes per weight of the quantized format, scales "
               "included", _A)

# One scheduler iteration with a mixed batch (`iteration.py`, continuous batching).
_I = "iteration"
n_dec = _define("n_dec", "sequences", "decode sequences in the iteration (one token each)", _I)
S_dec = _define("S_dec", "tokens", "sum of the decode sequences' attended contexts", _I)
n_pre = _define("n_pre", "tokens", "prompt (prefill chunk) tokens in the iteration", _I)
S_pre_att = _define(
    "S_pre_att", "positions", "query-key pairs of the prefill chunks' "
    "causal attention over their prefixes", _I)
S_pre_kv = _define("S_pre_kv", "tokens", "positions whose K/V the prefill chunks read or "
                   "write (prefix plus chunk)", _I)
o_chunk = _define("o_chunk", "tokens", "prompt tokens already prefilled before a chunk", _I)
c_chunk = _define("c_chunk", "tokens", "prompt tokens in a prefill chunk", _I)

# The one cost model of an iteration (`cost_model.py`): per operation and layer-kind group
# (full attention, windowed attention: sliding or chunked, MLA).
_C = "cost"
n_samp = _define("n_samp", "rows", "rows that sample a token (LM-head rows)", _C)
n_seq = _define("n_seq", "sequences", "sequences in the iteration (recurrent state read once "
                "each)", _C)
S_full = _define("S_full", "positions", "keys the decode rows attend to, full-attention "
                 "blocks (per block)", _C)
S_win = _define("S_win", "positions", "keys the decode rows attend to, windowed blocks (per "
                "block)", _C)
S_mla = _define("S_mla", "positions", "keys the decode rows attend to, MLA blocks (per block)", _C)
X_full = _define("X_full", "pairs", "(query, key) pairs of the prefill chunks, full blocks", _C)
X_win = _define("X_win", "pairs", "(query, key) pairs of the prefill chunks, windowed blocks", _C)
X_mla = _define("X_mla", "pairs", "(query, key) pairs of the prefill chunks, MLA blocks", _C)
V_full = _define("V_full", "positions", "K/V positions the prefill chunks read or write, full "
                 "blocks", _C)
V_win = _define("V_win", "positions", "K/V positions the prefill chunks read or write, "
                "windowed blocks", _C)
V_mla = _define("V_mla", "positions", "latent positions the prefill chunks read or write, MLA "
                "blocks", _C)
O_up = _define("O_up", "positions", "prefix positions an MHA-form MLA prefill up-projects", _C)
k_full = _define("k_full", "B/token", "K/V bytes per token, all full-attention blocks", _C)
k_win = _define("k_win", "B/token", "K/V bytes per token, all windowed blocks", _C)
k_mla = _define("k_mla", "B/token", "latent K/V bytes per token, all MLA blocks", _C)
a_full = _define("a_full", "FLOP", "FLOPs per (query, key) pair, all full blocks", _C)
a_win = _define("a_win", "FLOP", "FLOPs per (query, key) pair, all windowed blocks", _C)
a_mla = _define("a_mla", "FLOP", "FLOPs per (query, key) pair of MLA decode (absorbed), all "
                "MLA blocks", _C)
ap_mla = _define(
    "ap_mla", "FLOP", "FLOPs per (query, key) pair of MLA prefill (MHA or "
    "absorbed form), all MLA blocks", _C)
u_mla = _define(
    "u_mla", "FLOP", "FLOPs to up-project one prefix position's latent to per-head "
    "K and V (MHA-form prefill), all MLA blocks", _C)
s_st = _define("s_st", "B/sequence", "recurrent state bytes per sequence, all state blocks", _C)
W_b = _define("W_b", "B", "bytes of the blocks' weights read every iteration (routed experts "
              "apart)", _C)
W_x = _define("W_x", "B", "bytes of every routed expert of every MoE block", _C)
N_b = _define("N_b", "weights", "block weights multiplied per token (active, LM head apart)", _C)
N_xb = _define(
    "N_xb", "weights", "routed-expert weights multiplied per token (the top-K "
    "experts of every MoE block: the grouped expert GEMMs' share of N_b)", _C)
N_h = _define("N_h", "weights", "LM-head weights, multiplied per sampled row", _C)
W_h = _define("W_h", "B", "bytes of the LM head", _C)
r_e = _define("r_e", "B/token", "embedding bytes looked up per token (0 when tied)", _C)
A_w = _define(
    "A_w", "elements/token", "activation widths a token passes through, all blocks: "
    "each block's hidden size and active MLP width", _C)
A_t = _define("A_t", "FLOP/token", "attention FLOPs per retained token of one sequence in a "
              "decode step, all blocks", _C)
t_base = _define("t_base", "s", "base latency of one collective (launch and protocol)", "parallel")
h_tp = _define(
    "h_tp", "steps", "ring steps of one reduce-scatter over the tp ranks: tp - 1 on "
    "a switched fabric, the sum of (axis - 1) over a torus's axes", "parallel")
W_e = _define("W_e", "B", "bytes of the embedding table", "parallel")
x_tie = _define("x_tie", "1", "1 where the LM head is the embedding table (tied), else 0",
                "parallel")
x_os = _define(
    "x_os", "1", "1 where a one-shot collective is possible (every chip reaches "
    "every other directly: a switched fabric), 0 on a torus", "parallel")

# Serving: prefill with attention, whole requests, queueing (`prefill.py`, `serving.py`).
_S = "serving"
A_f = _define("A_f", "FLOP", "attention FLOPs per (query, key) pair, all blocks", _S)
C_chunk = _define("C_chunk", "tokens", "prompt tokens per prefill chunk", _S)
n_bud = _define(
    "n_bud", "tokens", "an engine's token budget: the most tokens one iteration "
    "holds (max_num_batched_tokens)", _S)
n_max = _define("n_max", "sequences", "an engine's cap on running sequences (max_num_seqs)", _S)
x_over = _define("x_over", "1", "tolerated fractional overhead of chunked prefill", _S)
n_out = _define("n_out", "tokens", "output tokens generated per request", _S)
j = _define("j", "1", "index of a step or chunk in a sum", _S)
lam = _define("lam", "requests/s", "mean arrival rate of requests (Poisson)", _S)
D_pf = _define("D_pf", "s", "service time of one prefill (deterministic)", _S)
t_ttft = _define("t_ttft", "s", "time-to-first-token target", _S)
t_hold = _define("t_hold", "s", "time one request holds a decode slot (prefill to last token)", _S)
cv2_hold = _define("cv2_hold", "1", "squared coefficient of variation of the slot hold time", _S)
# The load model (`load_model.py`): a replica's running count as a birth-death chain.
n_run = _define("n_run", "sequences", "sequences holding decode slots (the load model's state)", _S)
t_x = _define("t_x", "s", "time one admitted prompt adds to the iterations it joins", _S)
t_m = _define("t_m", "s", "time each further prompt joining the same iteration adds", _S)
t_c = _define("t_c", "s", "an iteration carrying a prefill chunk beside the decodes", _S)
t_w = _define("t_w", "s", "mean wait of a request before its prefill starts", _S)
p_w = _define("p_w", "1", "probability that a request waits at all", _S)
p_q = _define("p_q", "1", "quantile level (0.9 for a p90)", _S)

QUANTITIES: tuple[Quantity, ...] = tuple(_GROUPS["core"])
ARCHITECTURE: tuple[Quantity, ...] = tuple(_GROUPS["architecture"])
# The calibrated decode step's six fitted factors, and every core cost term, as quantities.
FACTOR_QUANTITIES: tuple[Quantity, ...] = tuple(
    Quantity(t.symbol, t.unit, t.meaning)
    for name in ("eta_w", "eta_kv", "eta_f", "t0_step", "t0_layer", "r_ovl")
    for t in (terms.get(name),))
TERM_QUANTITIES: tuple[Quantity, ...] = tuple(
    Quantity(t.symbol, t.unit, t.meaning) for t in terms.owned_by(terms.CORE))
SERVING: tuple[Quantity, ...] = tuple(_GROUPS["serving"])
PARALLEL: tuple[Quantity, ...] = tuple(_GROUPS["parallel"])

ITERATION: tuple[Quantity, ...] = tuple(_GROUPS["iteration"])
COST: tuple[Quantity, ...] = tuple(_GROUPS["cost"])
BY_NAME: dict[str, Quantity] = {
    str(x.symbol): x for group in (*_GROUPS.values(), TERM_QUANTITIES) for x in group
}


def unit(symbol: sp.Symbol) -> str:
  """The unit of a named symbol."""
  return BY_NAME[str(symbol)].unit


def with_dense_default(values: dict[str, object]) -> dict[str, object]:
  """Values by symbol name, with `N_act = N` when N is given and N_act is not.

  The one place the rule "a dense model multiplies every weight it reads" lives.
  """
  if "N" in values and values.get("N_act") is None:
    values = {**values, "N_act": values["N"]}
  return values
