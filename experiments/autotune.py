"""Autotunes one Pallas kernel for one shape on this machine's device.

  python -m experiments.autotune --op=decode_attention --batch=8 --heads=32 \
      --kv_heads=8 --max_len=8192 --head_dim=128 --dtype=bfloat16
  python -m experiments.autotune --op=linear --m=16 --k=8192 --n=8192

Tries the op's candidate configs (skipping those that do not fit), checks each
against the reference, times it on the device (chained calls inside one jit,
median of repeats) and caches the winner and every timing as JSON in
<cache dir>/<device kind>/<op>.json: --cache_dir, else $JAXROOF_AUTOTUNE_CACHE,
else kernels/autotune_cache if writable, else ~/.cache/jaxroof/autotune. The
cache key rounds batch, max_len and m up to powers of two, so one tuning serves
nearby sizes (and any page-pool size). On a CPU the kernels are interpreted,
and interpreted kernels are never tuned: it says so and prints the heuristic
config. The logic lives in `kernels.autotune`.
"""

from __future__ import annotations

import dataclasses

from absl import flags

from experiments._cli import run
from jaxroof.files import write_json
from kernels import _backend
from kernels import autotune
from kernels import decode_attention
from kernels import linear
from kernels import paged_attention

OPS = {
    "decode_attention": decode_attention.TUNABLE,
    "paged_decode_attention": paged_attention.TUNABLE,
    "linear": linear.TUNABLE,
}

_OP = flags.DEFINE_enum("op", "linear", list(OPS), "Which kernel to tune.")
_DTYPE = flags.DEFINE_enum(
    "dtype",
    "bfloat16",
    list(decode_attention.SUPPORTED_DTYPES),
    "Element type of every floating-point argument.",
)
# Attention shapes.
_BATCH = flags.DEFINE_integer("batch", 8, "Sequences.", lower_bound=1)
_HEADS = flags.DEFINE_integer("heads", 32, "Query heads.", lower_bound=1)
_KV_HEADS = flags.DEFINE_integer("kv_heads", 8, "KV heads (must divide heads).", lower_bound=1)
_MAX_LEN = flags.DEFINE_integer(
    "max_len",
    4096,
    "Cache positions per sequence (tuned with all full).",
    lower_bound=1,
)
_HEAD_DIM = flags.DEFINE_integer("head_dim", 128, "Head size.", lower_bound=1)
_PAGE_SIZE = flags.DEFINE_integer(
    "page_size",
    64,
    "Positions per page (paged attention; must divide "
    "--max_len).",
    lower_bound=1,
)
# Linear shapes.
_M = flags.DEFINE_integer("m", 16, "Rows of x (tokens in the step).", lower_bound=1)
_K = flags.DEFINE_integer("k", 8192, "Input features.", lower_bound=1)
_N = flags.DEFINE_integer("n", 8192, "Output features.", lower_bound=1)
# Tuning.
_MAX_CANDIDATES = flags.DEFINE_integer("max_candidates", 12, "Configs tried at most.",
                                       lower_bound=1)
_REPEATS = flags.DEFINE_integer("repeats", 10, "Timed chains per config (median taken).",
                                lower_bound=1)
_TIME_BUDGET_S = flags.DEFINE_float(
    "time_budget_s", None, "Seconds after which remaining configs are skipped. In "
    "[0.001, 1e6] (omit for no limit).", lower_bound=1e-3, upper_bound=1e6)
_CACHE_DIR = flags.DEFINE_string(
    "cache_dir", None, f"Cache root (default: ${autotune.CACHE_ENV}, else "
    "kernels/autotune_cache if writable, else ~/.cache/jaxroof/autotune).")
_JSON_OUT = flags.DEFINE_string("json_out", None,
                                "Also write the result (every trial) to this file.")


@flags.multi_flags_validator((_HEADS.name, _KV_HEADS.name),
                             message="--kv_heads must divide --heads")
def _kv_heads_divide(values):
  return values[_HEADS.name] % values[_KV_HEADS.name] == 0


@flags.multi_flags_validator(
    (_OP.name, _MAX_LEN.name, _PAGE_SIZE.name),
    message="--page_size must divide --max_len for paged_decode_attention",
)
def _page_size_divides(values):
  if values[_OP.name] != "paged_decode_attention":
    return True
  return values[_MAX_LEN.name] % values[_PAGE_SIZE.name] == 0


def problem_from_flags(op_name: str):
  """The problem the flags describe, for `op_name`."""
  if op_name == "linear":
    return linear.LinearProblem(m=_M.value, k=_K.value, n=_N.value, dtype=_DTYPE.value)
  if op_name == "decode_attention":
    return decode_attention.DecodeProblem(
        batch=_BATCH.value,
        heads=_HEADS.value,
        kv_heads=_KV_HEADS.value,
        max_len=_MAX_LEN.value,
        head_dim=_HEAD_DIM.value,
        dtype=_DTYPE.value,
    )
  pages_per_seq = _MAX_LEN.value // _PAGE_SIZE.value
  # The smallest pool that holds every sequence; the cache key ignores it.
  return paged_attention.PagedProblem(
      batch=_BATCH.value,
      heads=_HEADS.value,
      kv_heads=_KV_HEADS.value,
      head_dim=_HEAD_DIM.value,
      num_pages=_BATCH.value * pages_per_seq,
      page_size=_PAGE_SIZE.value,
      pages_per_seq=pages_per_seq,
      dtype=_DTYPE.value,
  )


def _row(trial: autotune.Trial) -> str:
  median = f"{trial.timing.median_s * 1e6:10.1f}" if trial.timing else " " * 10
  spread = f"{trial.timing.spread:6.1%}" if trial.timing else " " * 6
  config = ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(trial.config).items())
  return f"{trial.status:8s} {median} {spread}  {config}  {trial.reason}"


def main(argv: list[str]) -> None:
  del argv  # Unused.
  op = OPS[_OP.value]
  problem = problem_from_flags(_OP.value)
  target = _backend.resolve_target()
  print(f"{op.name} {problem}")
  print(f"device: {_backend.device_kind()} ({target.platform}, "
        f"{target.backend})")
  result = autotune.tune(
      op,
      problem,
      target=target,
      cache_dir=_CACHE_DIR.value,
      max_candidates=_MAX_CANDIDATES.value,
      time_budget_s=_TIME_BUDGET_S.value,
      timer=autotune.default_timer(repeats=_REPEATS.value),
  )
  if result.trials:
    print(f"{'status':8s} {'median us':>10s} {'spread':>6s}  config")
    for trial in result.trials:
      print(_row(trial))
    print(f"method: {result.entry['timing_method']}")
    print("cache: " + str(autotune.cache_path(op.name, None, _CACHE_DIR.value)))
  print(f"{result.message}: {result.config}")
  if _JSON_OUT.value:
    write_json(
        _JSON_OUT.value, {
            "op": op.name,
            "problem": dataclasses.asdict(problem),
            "device_kind": _backend.device_kind(),
            "backend": target.backend,
            "tuned": result.tuned,
            "message": result.message,
            "config": dataclasses.asdict(result.config),
            "entry": result.entry,
        })


if __name__ == "__main__":
  run(main)
