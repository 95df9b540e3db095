"""The one registry of cost terms, and the hook through which an engine extends the model.

A cost term is a number the calibrated cost model takes beyond the physics of
the model and the device: an efficiency factor (a share of a ceiling), a fixed
cost, an overlap. Each is registered once, with `register`, and everything else
derives from that one name: its sympy symbol, a profile's field, a JSON key, the
key a user holds it by in `experiments.calibrate`, the label and unit a report prints.

    name        the symbol's name, the key everywhere (`eta_w`, `t0_step`)
    unit        SI (`1` for a share, `s`, `B`, `B/s`, `s/element`)
    meaning     one sentence
    applies_to  what it scales or is paid per (`APPLIES_TO`)
    default     the value meaning "absent" (1 for an efficiency, 0 for a cost)
    bounds      the values a held term may take, `low_open` excluding the low end
    obtained    how it is usually obtained (`OBTAINED`: fitted, measured, held)
    owner       "core", or the engine that registered it from its own module

The core (this module) holds the terms that apply to every engine. A term particular
to one engine or host is registered by that engine's module (`jaxroof/engines/`) with
`owner` its name, and its formulas reach the one cost model through an `Extension`
(`extend`): named seconds added to a step, a replacement of how the weights are read,
named expressions beside the step. The symbolic layer never imports an engine; an
engine imports this module.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable, Mapping
from typing import Any

import sympy as sp

from jaxroof import errors

APPLIES_TO: tuple[str, ...] = ("weights", "kv", "flops", "linear", "attention", "experts",
                               "prefill", "iteration", "layer", "sequence", "request", "collective",
                               "idle", "memory")
OBTAINED: tuple[str, ...] = ("fitted", "measured", "held")
CORE = "core"


@dataclasses.dataclass(frozen=True)
class Term:
  """One cost term: its symbol and everything said about it (see the module docstring)."""

  name: str
  symbol: sp.Symbol
  unit: str
  meaning: str
  applies_to: str
  default: float
  bounds: tuple[float, float]
  obtained: str
  owner: str = CORE
  label: str = ""
  low_open: bool = False

  @property
  def allowed(self) -> str:
    """The bounds as an interval, e.g. `(0, 1]`."""
    low, high = self.bounds
    return f"{'(' if self.low_open else '['}{low:g}, {high:g}]"

  def check(self, value: Any, field: str = "hold", where: str = "") -> float:
    """`value` as a float within the bounds, else one clean InputError naming the term,
    the value and the bounds (`where` prefixes it, e.g. the file it came from)."""
    try:
      number = float(value)
    except (TypeError, ValueError):
      number = math.nan
    low, high = self.bounds
    inside = low < number if self.low_open else low <= number
    if isinstance(value, bool) or not math.isfinite(number) or not (inside and number <= high):
      shown = value if isinstance(value, str) else repr(value)
      raise errors.InputError(
          f"{where}{self.name}={shown} is outside its bounds {self.allowed} "
          f"({self.unit}; {self.meaning}).", field=field)
    return number


_TERMS: dict[str, Term] = {}


def register(name: str, unit: str, meaning: str, *, applies_to: str, default: float,
             bounds: tuple[float, float], obtained: str, owner: str = CORE, label: str = "",
             low_open: bool = False) -> sp.Symbol:
  """Registers a term once and returns its positive symbol.

  Raises:
    ValueError: the name is taken, or `applies_to`/`obtained` is not a known kind.
  """
  if name in _TERMS:
    raise ValueError(f"term {name!r} is registered already (by {_TERMS[name].owner})")
  if applies_to not in APPLIES_TO or obtained not in OBTAINED:
    raise ValueError(f"term {name!r}: applies_to={applies_to!r} (one of {APPLIES_TO}), "
                     f"obtained={obtained!r} (one of {OBTAINED})")
  symbol = sp.Symbol(name, positive=True)
  _TERMS[name] = Term(name, symbol, unit, meaning, applies_to, float(default),
                      (float(bounds[0]), float(bounds[1])), obtained, owner, label or meaning,
                      low_open)
  return symbol


def registered() -> dict[str, Term]:
  """Every registered term by name (the core's, and each engine's imported so far)."""
  return dict(_TERMS)


def get(name: str, field: str = "hold", where: str = "") -> Term:
  """The term of that name; an unknown one is one InputError with "did you mean"."""
  if name in _TERMS:
    return _TERMS[name]
  close = difflib.get_close_matches(name, list(_TERMS), n=1)
  hint = f" Did you mean {close[0]!r}?" if close else ""
  raise errors.InputError(
      f"{where}{name!r} is not a cost term.{hint} Known: {', '.join(sorted(_TERMS))}.", field=field)


def owned_by(owner: str) -> tuple[Term, ...]:
  """The terms one owner (CORE or an engine) registered, in order."""
  return tuple(t for t in _TERMS.values() if t.owner == owner)


def defaults(names) -> dict[str, float]:
  """Each named term's default (its "absent" value)."""
  return {n: get(n).default for n in names}


def checked(values: Mapping[str, Any], field: str = "hold", where: str = "") -> dict[str, float]:
  """Values keyed by term names, each checked against its term's bounds, then by each
  engine's own check of its terms together (`Extension.check`); `where` prefixes an
  error (e.g. the file the values came from)."""
  out = {name: get(name, field, where).check(value, field, where) for name, value in values.items()}
  for owner in owners(out):
    extension = _EXTENSIONS.get(owner)
    if extension is not None and extension.check is not None:
      extension.check(out, field)
  return out


def parse(text: str, field: str = "hold") -> dict[str, float]:
  """`NAME=VALUE,...` (SI units) as checked term values; a bad item is one InputError."""
  values: dict[str, str] = {}
  for item in (part.strip() for part in text.split(",")):
    if not item:
      continue
    name, sep, value = item.partition("=")
    if not sep or not name.strip():
      raise errors.InputError(f"{item!r} is not NAME=VALUE (e.g. t0_step=2e-4).", field=field)
    if name.strip() in values:
      raise errors.InputError(f"{name.strip()!r} is given twice.", field=field)
    values[name.strip()] = value.strip()
  return checked(values, field)


# The hook: what an engine adds to the calibrated iteration.
@dataclasses.dataclass(frozen=True)
class IterationParts:
  """The pieces of a calibrated iteration an extension's formulas may use (sympy).

  tokens: the rows the linear layers multiply; linear_bytes: the linear layers'
  weight bytes read; weight_bytes: those and the LM head's; weight_rate: the rate
  the weights stream at (eta_w*BW); read: `(bytes, rate) -> seconds`, the weights'
  read time in effect (an extension's `weight_read`, else bytes/rate); A_w: the
  activation elements a token passes through, all blocks.
  """

  tokens: sp.Expr
  linear_bytes: sp.Expr
  weight_bytes: sp.Expr
  weight_rate: sp.Expr
  read: Callable[[sp.Expr, sp.Expr], sp.Expr]
  A_w: sp.Expr


def _no_terms(parts: IterationParts) -> dict[str, sp.Expr]:
  del parts  # Unused.
  return {}


@dataclasses.dataclass(frozen=True)
class Extension:
  """One engine's contribution to the calibrated cost model.

  Attributes:
    name: the engine, the owner of its terms.
    weight_read: `(bytes, rate) -> seconds` replacing `bytes / rate` for the weights'
      reads (at most one extension in a model may replace it); None keeps it.
    seconds: named seconds added to the step (each an output of the cost model).
    memory: which of `seconds` count as memory time.
    beside: named expressions reported beside the step, not added to it.
    check: `f(values, field)` refusing a combination of its terms (one InputError).
    assumptions: what a reader of its numbers must know.
  """

  name: str
  weight_read: Callable[[sp.Expr, sp.Expr], sp.Expr] | None = None
  seconds: Callable[[IterationParts], Mapping[str, sp.Expr]] = _no_terms
  memory: tuple[str, ...] = ()
  beside: Callable[[IterationParts], Mapping[str, sp.Expr]] = _no_terms
  check: Callable[[Mapping[str, float], str], None] | None = None
  assumptions: tuple[str, ...] = ()

  @property
  def terms(self) -> tuple[Term, ...]:
    return owned_by(self.name)


_EXTENSIONS: dict[str, Extension] = {}


def extend(extension: Extension) -> Extension:
  """Registers an engine's extension once (from the engine's module)."""
  if extension.name in _EXTENSIONS or extension.name == CORE:
    raise ValueError(f"extension {extension.name!r} is registered already")
  _EXTENSIONS[extension.name] = extension
  return extension


def extension(name: str) -> Extension:
  """The extension an engine registered (its module must have been imported)."""
  if name not in _EXTENSIONS:
    raise KeyError(f"no extension {name!r}: import its engine (jaxroof.engines)")
  return _EXTENSIONS[name]


def owners(names) -> tuple[str, ...]:
  """The extensions the named terms need (their non-core owners), sorted."""
  return tuple(sorted({get(n).owner for n in names} - {CORE}))


# The core: terms every engine has. Efficiencies are shares of a ceiling (absent: 1);
# fixed costs are seconds (absent: 0).
_W = dict(obtained="fitted", low_open=True, bounds=(0.0, 1.0), default=1.0)
eta_w = register("eta_w", "1", "achieved fraction of BW streaming weights", applies_to="weights",
                 label="weight reads (share of BW)", **_W)
eta_kv = register("eta_kv", "1", "achieved fraction of BW per K/V byte retained", applies_to="kv",
                  label="K/V reads (share of BW)", **_W)
eta_f = register("eta_f", "1", "achieved fraction of F in the linear layers", applies_to="flops",
                 label="FLOPs (share of F)", **_W)
eta_f_prefill = register(
    "eta_f_prefill", "1", "achieved fraction of F in a prefill (linear "
    "layers and causal attention)", applies_to="prefill", label="prefill FLOPs (share of F)", **_W)
eta_attn = register(
    "eta_attn", "1", "achieved fraction of F in an engine's attention kernel, its FLOPs timed "
    "apart from the linear layers' (0: with them, at eta_f)", applies_to="attention", default=0.0,
    bounds=(0.0, 1.0), obtained="measured", label="attention FLOPs (share of F)")
eta_moe = register(
    "eta_moe", "1", "FLOP rate of the routed experts' grouped GEMMs relative to the dense "
    "linear layers' (eta_f): the experts run at eta_f*eta_moe of F (1: as the dense ones)",
    applies_to="experts", default=1.0, bounds=(0.0, 1.0), obtained="fitted", low_open=True,
    label="expert FLOPs (share of the dense layers' rate)")
m_moe = register(
    "m_moe", "tokens", "rows each routed expert's GEMM pays beyond its tokens (a tile's "
    "padding): the experts' FLOP rate falls as M_e / (M_e + m_moe), M_e = tokens*K/E their "
    "rows (0: no padding)", applies_to="experts", default=0.0, bounds=(0.0, 1e4), obtained="fitted",
    label="padding rows per expert GEMM")
eta_comm = register(
    "eta_comm", "1", "achieved fraction of the modelled collective speed (link bandwidth and "
    "per-hop latency together)", applies_to="collective", label="collectives (share of the "
    "modelled speed)", **_W)
r_ovl = register("r_ovl", "1", "overlap of weight reads and FLOPs (0: they add, oo: the larger "
                 "binds)", applies_to="linear", default=1.0, bounds=(0.0, 100.0), obtained="fitted",
                 label="overlap of weight reads and FLOPs (p = 1 + r_ovl)")
t0_step = register("t0_step", "s", "fixed cost per iteration (decode step)", applies_to="iteration",
                   default=0.0, bounds=(0.0, 10.0), obtained="fitted", label="per iteration")
t0_layer = register("t0_layer", "s", "fixed cost per layer per iteration", applies_to="layer",
                    default=0.0, bounds=(0.0, 1.0), obtained="fitted", label="per layer")
t0_seq = register(
    "t0_seq", "s", "fixed cost per sequence in an iteration (an engine's per-request work "
    "each step: input preparation, sampling, output processing)", applies_to="sequence",
    default=0.0, bounds=(0.0, 1.0), obtained="fitted", label="per sequence per iteration")
t0_request = register(
    "t0_request", "s", "fixed cost per request before the engine sees it (HTTP, API server, "
    "tokenisation)", applies_to="request", default=0.0, bounds=(0.0, 100.0), obtained="fitted",
    label="per request")

# The engine's memory reservation (`reservation.py`): how much of a chip's memory its K/V
# cache gets, which bounds the running sequences. Held from the engine's documented rule.
u_mem = register(
    "u_mem", "1", "share of memory an engine takes: of the whole device for weights, "
    "workspace and K/V (vLLM gpu_memory_utilization, SGLang mem_fraction_static), or of what "
    "the weights and workspace leave free (TensorRT-LLM, x_free = 1)", applies_to="memory",
    default=1.0, bounds=(0.0, 1.0), obtained="held", low_open=True,
    label="memory share the engine takes")
m_act = register(
    "m_act", "B", "activation workspace bytes per token of the token budget per element of "
    "the model's width (a profile run of max_num_batched_tokens tokens)", applies_to="memory",
    default=0.0, bounds=(0.0, 1e3), obtained="held", label="workspace per budget token and "
    "width element")
m_graph = register("m_graph", "B", "memory held for captured graphs and buffers outside the K/V "
                   "cache, per chip", applies_to="memory", default=0.0, bounds=(0.0, 1e12),
                   obtained="held", label="graphs and buffers")
x_free = register(
    "x_free", "1", "1 where u_mem applies to the memory left free after weights and "
    "workspace (TensorRT-LLM), 0 where it applies to the whole device", applies_to="memory",
    default=0.0, bounds=(0.0, 1.0), obtained="held", label="u_mem of the free memory (1) or "
    "of all of it (0)")
