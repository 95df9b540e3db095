"""Cached decode equals a fresh causal forward pass; some changes break that.

Prefills a prompt in the toy Transformer (float64, turned on for the check
only), feeds each greedy output back one token at a time, and compares every
decode step's one-row logits with a fresh forward pass over the whole prefix.
Counts the positions holding computed K/V and their bytes from the state and
checks them against the symbolic formulas. `--break=...` runs one change that
invalidates reuse; then a mismatch is the expected outcome (exit 0).

  python -m experiments.decode_equivalence
  python -m experiments.decode_equivalence --blocks=4 --json_out=/tmp/d.json
  python -m experiments.decode_equivalence --break=revision
"""

from __future__ import annotations

from absl import flags

from experiments import _cli
from jaxroof import errors
from jaxroof import files
from jaxroof.toy import breakers, check
from jaxroof.toy.config import LESSON, LESSON_PROMPT, POSITION_KINDS, ToyConfig

# Model (defaults: the lesson's toy).
_BLOCKS = flags.DEFINE_integer("blocks", LESSON.num_blocks, "Transformer blocks (>= 1).",
                               lower_bound=1)
_KV_HEADS = flags.DEFINE_integer("kv_heads", LESSON.num_kv_heads, "K/V heads per block (>= 1).",
                                 lower_bound=1)
_HEADS = flags.DEFINE_integer(
    "heads", None, "Query heads per block, a multiple of --kv_heads "
    "(default: --kv_heads, no grouping).", lower_bound=1)
_HEAD_DIM = flags.DEFINE_integer("head_dim", LESSON.head_dim,
                                 "Coordinates per head (>= 1; even for RoPE).", lower_bound=1)
_WIDTH = flags.DEFINE_integer("width", None, "Residual width (default: heads * head_dim).",
                              lower_bound=1)
_MLP_DIM = flags.DEFINE_integer("mlp_dim", LESSON.mlp_dim, "MLP hidden units (>= 1).",
                                lower_bound=1)
_VOCAB = flags.DEFINE_integer("vocab", LESSON.vocab_size, "Vocabulary size (> every prompt ID).",
                              lower_bound=1)
_POSITIONS = flags.DEFINE_enum("positions", "rope", list(POSITION_KINDS), "Position encoding.")

# Request.
_PROMPT = flags.DEFINE_list("prompt", [str(x) for x in LESSON_PROMPT],
                            "Prompt token IDs, comma-separated, each in [0, --vocab).")
_STEPS = flags.DEFINE_integer("steps", 2, "Decode steps after prefill (>= 0); outputs = steps + 1.",
                              lower_bound=0)
_LAYOUT = flags.DEFINE_enum("layout", "fixed", list(check.LAYOUTS), "KV state layout.")

# Check.
_BREAK = flags.DEFINE_enum("break", None, list(breakers.BREAKS),
                           "Change that breaks reuse; omit for the correct run.")
_TOLERANCE = flags.DEFINE_float(
    "tolerance", 1e-10, "Largest max|cached - fresh| / max|fresh| that "
    "counts as agreement, in [1e-15, 1] (float64 resolves ~1e-16).", lower_bound=1e-15,
    upper_bound=1.0)
_SEED = flags.DEFINE_integer("seed", 0, "Seeds the weights and the break. In [0, 2**32).",
                             lower_bound=0, upper_bound=2**32 - 1)
_JSON_OUT = flags.DEFINE_string("json_out", None,
                                "Write inputs, results and units as JSON to this path.")


def _config() -> ToyConfig:
  heads = _HEADS.value or _KV_HEADS.value
  positions = errors.require_choice("positions", _POSITIONS.value, POSITION_KINDS)
  max_positions = 0
  if positions == "learned":  # Room for the position_offset break.
    max_positions = (len(_PROMPT.value) + _STEPS.value + breakers.POSITION_OFFSET)
  return ToyConfig(
      vocab_size=_VOCAB.value,
      num_blocks=_BLOCKS.value,
      num_heads=heads,
      num_kv_heads=_KV_HEADS.value,
      head_dim=_HEAD_DIM.value,
      width=_WIDTH.value or heads * _HEAD_DIM.value,
      mlp_dim=_MLP_DIM.value,
      positions=positions,
      max_positions=max_positions,
  )


def _prompt() -> list[int]:
  ids = []
  for i, text in enumerate(_PROMPT.value):
    try:
      ids.append(int(text))
    except ValueError:
      raise errors.InputError(f"prompt[{i}]={text!r} is not a whole number: give token IDs like"
                              " --prompt=1,4,6.") from None
  return ids


def _print_table(result: check.CheckResult) -> None:
  print(f"{'step':>4} {'phase':>7} {'fed':>12} {'out':>4} {'next':>5}"
        f" {'max|diff|':>10} {'rel':>10} {'agree':>5} {'KV pos':>6}"
        f" {'KV B f64':>8} {'KV B 2B':>7}")
  for row in result.rows:
    r = check.row_json(row)
    print(f"{r['step']:>4} {r['phase']:>7} {str(r['fed']):>12}"
          f" {r['outputs_emitted']:>4} {r['next_token']:>5}"
          f" {r['max_abs_diff']:>10.3g} {r['max_rel_diff']:>10.3g}"
          f" {str(r['agrees']):>5} {r['positions_with_kv']:>6}"
          f" {r['kv_bytes']:>8} {r['kv_bytes_2byte']:>7}")


def main(argv: list[str]) -> int:
  del argv  # Unused.
  break_name = _BREAK.value or None
  if break_name is not None:
    errors.require_choice("break", break_name, breakers.BREAKS)
  layout = errors.require_choice("layout", _LAYOUT.value, check.LAYOUTS)
  config = _config()
  prompt = check.check_prompt(_prompt(), config.vocab_size)
  check.require_feasible(config, len(prompt), _STEPS.value, layout=layout)
  result = check.lesson_check(config, prompt, _STEPS.value, break_name=break_name, layout=layout,
                              seed=_SEED.value, tolerance=_TOLERANCE.value)

  report = check.result_json(result, config=config, prompt=prompt, steps=_STEPS.value,
                             break_name=break_name, layout=layout, seed=_SEED.value)
  kv, last = result.kv, result.rows[-1]
  kv_matches, expected, ok = (report["kv_accounting_matches_formula"], report["expected"],
                              report["ok"])
  _print_table(result)
  print(f"\nbreak: {break_name or 'none'}; tolerance {result.tolerance:g}"
        f" (relative); max|diff| {result.max_abs_diff:.3g},"
        f" relative {result.max_rel_diff:.3g}")
  print(f"cached decode {'agrees with' if result.agrees else 'DIFFERS from'}"
        f" the fresh forward pass ({expected} expected:"
        f" {'ok' if ok else 'UNEXPECTED'}).")
  print(f"K/V after {last.outputs} outputs: {kv.positions} positions x"
        f" {kv.bytes_per_position} B (float64 state) ="
        f" {kv.bytes_at(kv.itemsize)} B; at a 2-byte payload"
        f" {kv.bytes_per_position_at(check.HYPOTHETICAL_BYTES)} B/position,"
        f" {kv.bytes_at(check.HYPOTHETICAL_BYTES)} B"
        f" (formulas: P+g-1 = {last.positions_with_kv_formula},"
        f" 2*L*H_kv*d*b = {result.kv_bytes_per_position_2byte_formula} B;"
        f" {'match' if kv_matches else 'MISMATCH'}).")

  if _JSON_OUT.value:
    files.write_json(_JSON_OUT.value, report)
  return 0 if ok else 1


if __name__ == "__main__":
  _cli.run(main)
