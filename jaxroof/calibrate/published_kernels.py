"""Kernel-level efficiencies fitted on AIConfigurator's measured kernel rows.

`kernels.csv` (`engines/data/published/`) holds measured timings of single kernels: dense
GEMMs by rows M, an MoE layer's grouped expert GEMMs by tokens, decode and prefill
attention, all-reduce by message size and GPU count, per backend and accelerator. Each
row is one iteration of the one cost model (`cost_model.calibrated_terms`) with only that
operation in it (`inputs`), no fixed cost and no layer:

  gemm          C[M,n] = A[M,k] B[k,n]: `W_b = n k q` bytes, `N_b = n k` weights, M rows;
                its time is the linear layers' p-norm of weight reads (eta_w BW) and
                FLOPs (eta_f F), p = 1 + r_ovl: its efficiency `2 M n k / (F t)` rises
                with M and saturates at eta_f;
  moe_gemm      one MoE layer's experts on one GPU: `E/ep` local experts of
                `3 h i / tp` weights, `K/ep` of them per token (uniform routing), their
                FLOPs at eta_moe of the dense rate with m_moe padding rows each;
  attention     decode (`batch` rows over `seq_len` cached tokens) and causal prefill:
                K/V bytes at eta_kv BW, attention FLOPs (`4 H d` per pair) at
                eta_attn F_attn on top;
  all_reduce    `message_bytes` over `n_chips` GPUs: the collectives' alpha-beta time
                (`collectives.allreduce_time`, the link's sourced base latency) at
                eta_comm.

The terms are fitted in that order, each family's by least squares on the log ratio of
predicted to measured time, holding what an earlier family fitted (`fit_backend`). A
profile holds them per accelerator (`held_terms`) and fits only the rest (its fixed
costs, and every term on accelerators with no kernel rows) on whole-system points.
Only the `train` rows are used; a backend's rows serve the engine profile of the same
name (NIM runs TensorRT-LLM).
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence

import numpy as np

from jaxroof.calibrate import least_squares
from jaxroof.engines import published
from jaxroof.parallel import layout as layout_lib
from jaxroof.specs import accelerators
from jaxroof.specs import kv_sizing
from jaxroof.symbolic import collectives
from jaxroof.symbolic import cost_model
from jaxroof.symbolic import prefill
from jaxroof.symbolic import terms as terms_lib
from jaxroof.symbolic.lambdify import lambdified
from jaxroof.symbolic.symbols import S_b, W_ic, h_tp, n_r, t_base, t_hop, x_os

KERNELS = published.WHOLE_SYSTEM.replace("whole_system.csv", "kernels.csv")
# Each op's family and the terms it fits, in the order they are fitted.
FAMILIES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "gemm": (("gemm",), ("eta_w", "eta_f", "r_ovl")),
    "moe": (("moe_gemm",), ("eta_moe", "m_moe")),
    "attention": (("attention_generation", "attention_context"), ("eta_kv", "eta_attn")),
    "comm": (("all_reduce",), ("eta_comm",)),
}
TERMS: tuple[str, ...] = tuple(n for _, names in FAMILIES.values() for n in names)
# The engine profile a backend's rows serve.
BACKEND_OF: dict[str, str] = {"trtllm": "trtllm", "vllm": "vllm", "sglang": "sglang"}
BOUNDS: dict[str, tuple[float, float]] = {
    "eta_w": (0.02, 1.0), "eta_f": (0.02, 1.0), "r_ovl": (0.05, 50.0), "eta_moe": (0.05, 1.0),
    "m_moe": (0.1, 2000.0), "eta_kv": (0.02, 1.0), "eta_attn": (0.01, 1.0), "eta_comm": (0.02, 1.0),
    "t0_step": (1e-8, 1e-3)
}
START: dict[str, float] = {
    "eta_w": 0.7, "eta_f": 0.6, "r_ovl": 1.0, "eta_moe": 0.7, "m_moe": 32.0, "eta_kv": 0.6,
    "eta_attn": 0.4, "eta_comm": 0.5, "t0_step": 5e-6
}
# Each family's launch latency: one kernel row is one iteration, so its fixed cost is the
# iteration's t0_step, fitted per family beside the family's terms and never held by a
# profile (a profile's fixed costs are fitted on whole-system points, launches included).
LAUNCH = "t0_step"
# One byte of weights where an operation has none, so that the linear layers' p-norm of
# two zero times stays defined (its 1/BW seconds are below any row's by 1e6).
_NO_WEIGHTS = 1.0


@dataclasses.dataclass(frozen=True)
class Row:
  """One measured kernel timing (`kernels.csv`; SI)."""

  row_id: str
  split: str
  backend: str
  accelerator: str
  op: str
  fields: Mapping[str, str]
  latency_s: float

  def number(self, name: str) -> float:
    return float(self.fields[name])


def read_rows(path: str = KERNELS) -> tuple[Row, ...]:
  """Every kernel row of the shipped file."""
  with open(path, newline="", encoding="utf-8") as f:
    return tuple(
        Row(r["row_id"], r["split"], r["backend"], r["accelerator"], r["op"], r,
            float(r["latency_s"])) for r in csv.DictReader(f))


@functools.cache
def _allreduce():
  return lambdified({"t": collectives.allreduce_time(S_b, n_r, "best", h_tp)},
                    (S_b, n_r, W_ic, t_hop, t_base, h_tp, x_os))


def _bytes(dtype: str) -> float:
  return float(kv_sizing.KV_DTYPES[dtype])


def inputs(row: Row) -> dict[str, float]:
  """The cost model's iteration inputs (`cost_model.INPUTS` by name) of one kernel row:
  that operation alone on one chip (the module docstring)."""
  device = accelerators.load_accelerator(row.accelerator)
  dtype = row.fields["dtype"]
  v = {name: 0.0 for name in cost_model.MIX_NAMES + cost_model.MODEL_NAMES}
  v.update(E=1.0, K=1.0, BW=device.memory_bandwidth_bytes_per_s, F=device.flops(dtype),
           F_attn=device.flops("bf16"), W_b=_NO_WEIGHTS, t_comm=0.0, o_ovl=0.0)
  if row.op == "gemm":
    n, k = row.number("n"), row.number("k")
    v.update(W_b=n * k * _bytes(dtype), N_b=n * k, n_dec=row.number("m"))
  elif row.op == "moe_gemm":
    ep, experts = row.number("moe_ep"), row.number("experts")
    per_expert = 3 * row.number("hidden_size") * row.number("inter_size") / row.number("moe_tp")
    k_local = row.number("topk") / ep
    v.update(W_b=0.0, W_x=experts / ep * per_expert * _bytes(dtype), E=experts / ep, K=k_local,
             N_xb=k_local * per_expert, N_b=k_local * per_expert, n_dec=row.number("tokens"))
  elif row.op in ("attention_generation", "attention_context"):
    batch, length = row.number("batch"), row.number("seq_len")
    heads, d = row.number("heads"), row.number("head_dim")
    v.update(k_full=2 * row.number("kv_heads") * d * _bytes(row.fields["kv_dtype"]),
             a_full=4 * heads * d, n_seq=batch)
    if row.op == "attention_generation":
      v.update(n_dec=batch, S_full=batch * length)
    else:
      v.update(n_pre=batch * length, V_full=batch * length,
               X_full=batch * float(prefill.attended_pairs(length)))
  elif row.op == "all_reduce":
    n = int(row.number("n_chips"))
    link = layout_lib.link_values(layout_lib.links(layout_lib.Layout(tp=n), device), n)
    v["t_comm"] = float(_allreduce()(S_b=row.number("message_bytes"), n_r=float(n), **link)["t"])
  else:
    raise ValueError(f"kernel row {row.row_id}: op={row.op!r} is not a kernel the model has")
  return v


def stack(rows: Sequence[Row]) -> dict[str, np.ndarray]:
  """The rows' inputs, one array entry per row."""
  each = [inputs(r) for r in rows]
  return {n: np.asarray([e[n] for e in each]) for n in each[0]}


def predict(stacked: Mapping[str, np.ndarray], values: Mapping[str, float]) -> np.ndarray:
  """Each row's time under the calibrated iteration with `values` (registry names; the
  rest at their defaults, fixed costs 0)."""
  given = {str(s): terms_lib.get(str(s)).default for s in cost_model.CALIBRATED_TERMS}
  given.update({n: values[n] for n in values if n in given})
  evaluate = cost_model.evaluator("calibrated", "per_op", "numpy", True)
  with np.errstate(divide="ignore", invalid="ignore"):
    return np.asarray(evaluate(**stacked, **given)["step_s"], dtype=float)


def fit_family(rows: Sequence[Row], names: Sequence[str], held: Mapping[str,
                                                                        float]) -> dict[str, float]:
  """`names` fitted to `rows` (log-ratio least squares), `held` terms as given."""
  stacked = stack(rows)
  measured = np.log([r.latency_s for r in rows])
  low = np.log([BOUNDS[n][0] for n in names])
  high = np.log([BOUNDS[n][1] for n in names])

  def residuals(theta: np.ndarray) -> np.ndarray:
    values = {**held, **dict(zip(names, np.exp(theta)))}
    out = np.log(predict(stacked, values)) - measured
    return np.where(np.isfinite(out), out, 10.0)

  theta = least_squares.levenberg_marquardt(residuals,
                                            np.clip(np.log([START[n] for n in names]), low,
                                                    high), lambda t: np.clip(t, low, high),
                                            max_iterations=200, fd_step=1e-5, tolerance=1e-12,
                                            max_damping=1e10, min_damping=1e-12, floor=1e-30)
  return {n: float(np.exp(t)) for n, t in zip(names, theta)}


def fit_backend(rows: Sequence[Row], families: Sequence[str] = tuple(FAMILIES)) -> dict:
  """One backend's terms on one accelerator, family by family (`FAMILIES` order), each
  holding what the earlier ones fitted; a family with no rows is left out. Returns the
  terms and, per family, the rows it used and their log-ratio error (median, max)."""
  fitted: dict[str, float] = {}
  report: dict[str, dict] = {}
  for family in families:
    ops, names = FAMILIES[family]
    mine = [r for r in rows if r.op in ops]
    if not mine:
      continue
    got = fit_family(mine, names + (LAUNCH,), fitted)
    launch = got.pop(LAUNCH)
    fitted.update(got)
    err = np.abs(
        predict(stack(mine), {**fitted, LAUNCH: launch}) / np.asarray([r.latency_s for r in mine]) -
        1.0)
    report[family] = {
        "rows": len(mine), "launch_s": launch, "median_rel_error": float(np.median(err)),
        "max_rel_error": float(np.max(err))
    }
  return {"terms": fitted, "families": report}


@functools.cache
def fitted(backend: str, families: tuple[str, ...] = tuple(FAMILIES)) -> dict[str, dict]:
  """accelerator -> `fit_backend` of the backend's `train` rows there (memoised)."""
  rows = [r for r in read_rows() if r.backend == backend and r.split == "train"]
  return {
      acc: fit_backend([r for r in rows if r.accelerator == acc], families)
      for acc in sorted({r.accelerator for r in rows})
  }


def held_terms(engine: str, families: Sequence[str]) -> dict[str, dict[str, float]]:
  """accelerator -> the kernel-fitted terms an engine profile holds there (empty where
  the engine has no `train` kernel rows)."""
  backends = [b for b, e in BACKEND_OF.items() if e == engine and families]
  out: dict[str, dict[str, float]] = {}
  for backend in backends:
    for acc, fit_ in fitted(backend, tuple(families)).items():
      out[acc] = {n: float(f"{v:.6g}") for n, v in fit_["terms"].items()}
  return out


def provenance(engine: str, families: Sequence[str]) -> dict[str, dict]:
  """accelerator -> where an engine profile's kernel-fitted terms come from: the backend,
  the file and, per family, the rows used, the launch latency fitted beside the terms and
  the fit's own error on those rows."""
  out: dict[str, dict] = {}
  for backend in [b for b, e in BACKEND_OF.items() if e == engine and families]:
    for acc, fit_ in fitted(backend, tuple(families)).items():
      out[acc] = {
          "kernels": "jaxroof/engines/data/published/kernels.csv", "backend": backend,
          "split": "train", "terms": sorted(fit_["terms"]), "families": {
              f: {k: (float(f"{v:.4g}") if isinstance(v, float) else v) for k, v in r.items()}
              for f, r in fit_["families"].items()
          }
      }
  return out


def gemm_efficiency(terms: Mapping[str, float], accelerator: str, m: float, n: float, k: float,
                    dtype: str = "bf16") -> float:
  """A GEMM's achieved share of F at M rows under `terms`: `2 M n k / (F t)`."""
  row = Row("", "", "", accelerator, "gemm",
            {"m": str(m), "n": str(n), "k": str(k), "dtype": dtype}, math.nan)
  v = inputs(row)
  t = float(predict({n_: np.asarray([x]) for n_, x in v.items()}, terms)[0])
  return 2 * m * n * k / (v["F"] * t)
