"""The report's section on several chips (analytic bounds).

`report_section(out_dir)` returns Markdown: the fewest chips each shipped
model needs per accelerator at 8k context (bf16 weights and K/V, one
sequence fitting per-chip memory), one worked plan from the planner, and the
single-stream Llama-3.1-70B case end to end (batch one on the fewest H100s).
"""

from __future__ import annotations

from jaxroof.errors import InputError
from jaxroof.parallel import layout as layout_lib
from jaxroof.parallel import planner
from jaxroof.parallel.layout import Layout
from jaxroof.parallel.layout_sweep import layout_sweep
from jaxroof.report import table
from jaxroof.specs import step_inputs
from jaxroof.specs.accelerators import load_accelerator, load_accelerators
from jaxroof.specs.models import load_model, shipped_models

CONTEXT = 8192
TABLE_ACCELERATORS = ("a100-80gb", "h100-sxm", "h200", "b200", "mi300x", "tpu-v5e",
                      "tpu-v6e", "trainium2")
PLAN_MODEL = "llama-3.1-70b"
PLAN_TARGETS = planner.Targets(token_gap_s=0.05, ttft_s=2.0, aggregate_tokens_per_s=10000.0)
PLAN_ACCELERATORS = "h100-sxm,h200,b200,mi300x,tpu-v5e,tpu-v6e"
SINGLE_STREAM_MODEL = "llama-3.1-70b"
SINGLE_STREAM_DEVICE = "h100-sxm"


def fewest_chips(spec, device, *, context: int = CONTEXT, weight_dtype: str = "bf16",
                 kv_dtype: str = "bf16") -> Layout | None:
  """The layout with the fewest chips per replica in which one sequence fits.

  Tensor parallel first, then pipeline, then experts (planner's choices);
  None when nothing within the interconnect's reach fits.
  """
  inputs = step_inputs.decode_step_inputs(spec, device, context=context, batch_sizes=[1],
                                       weight_dtype=weight_dtype, kv_dtype=kv_dtype)
  candidates = sorted((lay for lay, _ in planner.candidate_layouts(spec, device)
                       if lay.microbatches == 1),
                      key=lambda lay: (lay.chips_per_replica, lay.pp, lay.ep))
  for lay in candidates:
    memory = layout_lib.chip_memory(
        lay, spec, device, weight_format=inputs.weight_format,
        kv_allocated_bytes_per_sequence=inputs.kv_allocated_bytes_per_sequence,
        workspace_fraction=inputs.workspace_fraction)
    if memory.max_batch_per_replica >= 1:
      return lay
  return None


def _cell(lay: Layout | None) -> str:
  if lay is None:
    return "-"
  parts = [f"tp{lay.tp}"] + ([f"pp{lay.pp}"] if lay.pp > 1 else []) + (
      [f"ep{lay.ep}"] if lay.ep > 1 else [])
  return f"{lay.chips_per_replica} ({' '.join(parts)})"


def chips_table(accelerators: tuple[str, ...] = TABLE_ACCELERATORS,
                first: str | None = None) -> str:
  """Fewest chips per shipped model (rows; `first` on top) and accelerator (columns)."""
  devices = [load_accelerator(a) for a in accelerators]
  names = ([first] if first else []) + [m for m in shipped_models() if m != first]
  rows = []
  for name in names:
    spec = load_model(name)
    rows.append([f"**{name}**" if name == first else name]
                + [_cell(fewest_chips(spec, d)) for d in devices])
  return table.markdown_table(("model",) + tuple(accelerators), rows)


def plan_table() -> tuple[str, dict]:
  result = planner.plan(load_model(PLAN_MODEL), load_accelerators(PLAN_ACCELERATORS),
                        context=CONTEXT, targets=PLAN_TARGETS, top=5)
  rows = [[p["rank"], p["accelerator"], p["chips"], p["tp"], p["pp"], p["dp"], p["batch"],
           p["weight_dtype"], p["kv_dtype"], f"{p['step_s'] * 1e3:.1f}",
           f"{p['ttft_s'] * 1e3:.0f}", f"{p['aggregate_tokens_per_s']:,.0f}", p["binds"],
           f"{p['headroom']:.2f}"] for p in result["plans"]]
  headers = ("rank", "accelerator", "chips", "tp", "pp", "dp", "batch", "weights", "K/V",
             "step ms", "TTFT ms", "fleet tok/s", "binds", "headroom")
  return table.markdown_table(headers, rows), result


def single_stream() -> tuple[str, list[dict]]:
  """Batch one of Llama-3.1-70B (bf16) at 8k on 1..8 H100s: step, communication, rate."""
  spec, device = load_model(SINGLE_STREAM_MODEL), load_accelerator(SINGLE_STREAM_DEVICE)
  rows, found = [], []
  for tp in (1, 2, 4, 8):
    try:
      swept = layout_sweep(spec, device, context=CONTEXT, batch_sizes=[1],
                           layout=Layout(tp=tp))
    except InputError:
      continue
    row = swept["rows"][0]
    found.append({"tp": tp, **row})
    rows.append([tp, "yes" if row["fits_in_memory"] else "no",
                 f"{row['memory_s'] * 1e3:.2f}", f"{row['comm_s'] * 1e3:.2f}",
                 f"{row['step_s'] * 1e3:.2f}", f"{row['per_sequence_tokens_per_s']:.1f}",
                 row["bound"]])
  return table.markdown_table(("H100s (tp)", "fits", "memory ms", "comm ms", "step ms",
                               "tokens/s", "binds"), rows), found


def report_section(out_dir: str, *, accelerators: tuple[str, ...] = TABLE_ACCELERATORS,
                   model_name: str | None = None) -> str:
  """Markdown of the multi-chip section (analytic bounds); the table's columns are
  `accelerators`, and `model_name` (the report's subject) heads its rows."""
  del out_dir  # Unused: no plot.
  plan_md, plan = plan_table()
  stream_md, stream = single_stream()
  fitting = [r for r in stream if r["fits_in_memory"]]
  fewest = fitting[0] if fitting else None
  lines = [
      "## Several chips: tensor, pipeline and expert parallel (analytic bound)",
      "",
      f"Fewest chips per replica in which one {CONTEXT}-token sequence fits (bf16 weights "
      "and K/V, 10% of memory kept free; tensor parallel first, pipeline and experts when "
      "heads or the interconnect stop it; '-' = no layout within the recorded "
      "interconnect fits):",
      "",
      chips_table(tuple(accelerators) or TABLE_ACCELERATORS, model_name),
      "",
      f"Worked plan: {PLAN_MODEL} at {CONTEXT} tokens, token gap <= "
      f"{PLAN_TARGETS.token_gap_s * 1e3:g} ms, TTFT <= {PLAN_TARGETS.ttft_s * 1e3:g} ms, "
      f"{PLAN_TARGETS.aggregate_tokens_per_s:,.0f} tokens/s; {plan['searched']:,} "
      f"configurations searched, {plan['meeting']:,} meet the targets "
      f"(`python -m experiments.plan --model={PLAN_MODEL} --context={CONTEXT} "
      "--token_gap_ms=50 --ttft_ms=2000 --aggregate_tokens_per_s=10000 "
      f"--accelerators={PLAN_ACCELERATORS}`):",
      "",
      plan_md,
      "",
      f"Single stream: {SINGLE_STREAM_MODEL} (bf16) at batch one, {CONTEXT} tokens, on "
      f"{SINGLE_STREAM_DEVICE} with NVLink all-reduces (450 GB/s per chip, 0.6 us per ring "
      "step from NCCL's model constants; serial with memory):",
      "",
      stream_md,
      "",
  ]
  if fewest is not None:
    allreduces = 2 * layout_lib.model_terms(load_model(SINGLE_STREAM_MODEL)).blocks + 1
    lines.append(
        f"The fewest H100s that hold it are {fewest['tp']}: "
        f"{fewest['per_sequence_tokens_per_s']:.1f} tokens/s for one user "
        f"({fewest['step_s'] * 1e3:.2f} ms a token, {fewest['comm_s'] * 1e3:.2f} ms of it "
        "communication). More chips cut the weight-streaming time per chip, while the "
        f"{allreduces} all-reduces per token cost latency that does not shrink.")
  lines += ["", "Assumptions: " + "; ".join(planner.ASSUMPTIONS[:3]) + "."]
  return "\n".join(lines) + "\n"
