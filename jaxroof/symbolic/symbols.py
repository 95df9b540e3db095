"""The named, positive symbols every formula is built from, with their units.

One symbol per physical quantity, shared by all formulas so that `solve`,
`limit` and `lambdify` see the same objects. All are `positive=True`, which
lets `sympy.solve` drop unphysical roots.
"""

from __future__ import annotations

import dataclasses

import sympy as sp


@dataclasses.dataclass(frozen=True)
class Quantity:
  """A symbol with its unit and meaning, for documentation and output."""

  symbol: sp.Symbol
  unit: str
  meaning: str


def _positive(name: str) -> sp.Symbol:
  return sp.Symbol(name, positive=True)


# Workload.
B = _positive("B")  # Sequences decoded together (one new token each).
T = _positive("T")  # Retained tokens (positions holding K/V) per sequence.
P = _positive("P")  # Prompt length in tokens.
g = _positive("g")  # Output tokens emitted so far.

# Model.
N = _positive("N")  # Weights read from memory in a step.
N_act = _positive("N_act")  # Weights multiplied per token (= N if dense).
q = _positive("q")  # Bytes stored per weight.
k = _positive("k")  # KV bytes per retained token (all layers).
L = _positive("L")  # Blocks (layers) that keep K/V.
H = _positive("H")  # Query heads per block.
H_kv = _positive("H_kv")  # KV heads per block.
d = _positive("d")  # Coordinates per head.
b = _positive("b")  # Bytes per stored K or V element.

# Device.
BW = _positive("BW")  # Sustained memory bandwidth.
F = _positive("F")  # Sustained FLOP rate.
R = _positive("R")  # Ridge point F/BW.

# Times (a rate written in terms of a step time; serving targets and waits).
t = _positive("t")
t_gap = _positive("t_gap")  # Longest acceptable gap between one user's tokens.
t_window = _positive("t_window")  # Batching window before a step starts.
t_queue = _positive("t_queue")  # Wait for a free slot in the running batch.

QUANTITIES: tuple[Quantity, ...] = (
    Quantity(B, "sequences", "sequences in the decode batch"),
    Quantity(T, "tokens", "retained tokens per sequence"),
    Quantity(P, "tokens", "prompt length"),
    Quantity(g, "tokens", "output tokens emitted so far"),
    Quantity(N, "weights", "weights read in a step"),
    Quantity(N_act, "weights", "weights multiplied per token (active)"),
    Quantity(q, "B/weight", "bytes stored per weight"),
    Quantity(k, "B/token", "KV bytes per retained token"),
    Quantity(L, "blocks", "blocks that keep K/V"),
    Quantity(H, "heads", "query heads per block"),
    Quantity(H_kv, "heads", "KV heads per block"),
    Quantity(d, "coordinates", "coordinates per head"),
    Quantity(b, "B", "bytes per stored K or V element"),
    Quantity(BW, "B/s", "sustained memory bandwidth"),
    Quantity(F, "FLOP/s", "sustained FLOP rate"),
    Quantity(R, "FLOP/B", "ridge point"),
    Quantity(t, "s", "step time"),
    Quantity(t_gap, "s", "longest acceptable gap between one user's tokens"),
    Quantity(t_window, "s", "batching window before the first step"),
    Quantity(t_queue, "s", "queueing wait for a slot in the batch"),
)

BY_NAME: dict[str, Quantity] = {str(x.symbol): x for x in QUANTITIES}


def unit(symbol: sp.Symbol) -> str:
  """The unit of a named symbol."""
  return BY_NAME[str(symbol)].unit
