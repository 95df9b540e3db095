"""The decode-equivalence check: cached decode against a fresh forward pass.

Prefill a prompt, then feed each greedy output back one token at a time. After
every step, compare the new row's logits with a fresh causal forward pass over
the whole prefix, and count the K/V the state holds. Run it in float64
(`lesson_check` turns float64 on for the check only).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxroof import errors
from jaxroof.symbolic import formulas
from jaxroof.toy import breakers
from jaxroof.toy import cache as cache_lib
from jaxroof.toy import weights
from jaxroof.toy.config import ToyConfig
from jaxroof.toy.model import decode_step, forward, prefill
from jaxroof.toy.weights import init_params

LAYOUTS = ("fixed", "growing")
HYPOTHETICAL_BYTES = 2  # A 2-byte (e.g. bf16) K/V payload, as in the lesson.


@dataclasses.dataclass(frozen=True)
class StepRow:
  """One step of the check. Step 0 is prefill; step i feeds output i."""

  step: int
  fed: tuple[int, ...]  # Token IDs fed in this step (first sequence).
  outputs: int  # Outputs emitted after this step (g).
  next_token: int  # The greedy output of this step (first sequence).
  max_abs_diff: float  # Max |cached - fresh| over the new row's logits.
  max_rel_diff: float  # max_abs_diff / max |fresh|.
  agrees: bool  # max_rel_diff <= tolerance.
  kv: cache_lib.KVAccount  # Counted from the state after this step.
  positions_with_kv_formula: int  # formulas.positions_with_kv(P, g).


def _differences(cached: jax.Array, fresh: jax.Array) -> tuple[float, float]:
  cached, fresh = np.asarray(cached), np.asarray(fresh)
  abs_diff = float(np.max(np.abs(cached - fresh)))
  scale = float(np.max(np.abs(fresh)))
  return abs_diff, abs_diff / scale if scale > 0 else abs_diff


def _key(rng: jax.Array | None, step: int) -> jax.Array | None:
  return None if rng is None else jax.random.fold_in(rng, step)


def check_decode(
    variant: breakers.Variant,
    prompt: jax.Array,
    steps: int,
    *,
    layout: str = "fixed",
    tolerance: float = 1e-10,
) -> list[StepRow]:
  """Prefill `prompt` (b, P), decode `steps` greedy steps, compare each.

  Args:
    variant: how the cached run is done (`breakers.correct(params)` or a
      break).
    prompt: token IDs, shape (b, P).
    steps: decode steps after prefill (outputs emitted: steps + 1).
    layout: "fixed" (P + steps preallocated slots) or "growing".
    tolerance: the largest max_rel_diff that counts as agreement.

  Returns:
    One row for prefill and one per decode step.
  """
  layout = errors.require_choice("layout", layout, LAYOUTS)
  steps = int(errors.require_non_negative("steps", steps))
  params = variant.prefill_params
  batch, prompt_len = prompt.shape
  state = None
  if layout == "fixed":
    state = cache_lib.init_cache(params.config, batch, prompt_len + steps, params.embed.dtype)
  logits, state = prefill(params, prompt, state, causal=variant.prefill_causal,
                          dropout_rng=_key(variant.dropout_rng, 0))
  logits = logits[:, -1]
  fresh = forward(params, prompt)[:, -1]
  tokens = fed = prompt
  rows = []
  for step in range(steps + 1):
    if step:
      params = variant.decode_params
      logits, state = decode_step(params, state, fed[:, 0], position_offset=variant.position_offset,
                                  dropout_rng=_key(variant.dropout_rng, step))
      fresh = forward(params, tokens)[:, -1]
    abs_diff, rel_diff = _differences(logits, fresh)
    next_tokens = jnp.argmax(logits, axis=-1).astype(prompt.dtype)
    rows.append(
        StepRow(
            step=step,
            fed=tuple(int(x) for x in fed[0]),
            outputs=step + 1,
            next_token=int(next_tokens[0]),
            max_abs_diff=abs_diff,
            max_rel_diff=rel_diff,
            agrees=rel_diff <= tolerance,
            kv=cache_lib.kv_account(state),
            positions_with_kv_formula=int(formulas.positions_with_kv(prompt_len, step + 1)),
        ))
    fed = next_tokens[:, None]
    tokens = jnp.concatenate([tokens, fed], axis=1)
  return rows


@dataclasses.dataclass(frozen=True)
class CheckResult:
  """The rows of one float64 check and the symbolic K/V figures."""

  rows: list[StepRow]
  tolerance: float
  kv_bytes_per_position_formula: int  # At the state's dtype (float64).
  kv_bytes_per_position_2byte_formula: int

  @property
  def agrees(self) -> bool:
    return all(row.agrees for row in self.rows)

  @property
  def max_abs_diff(self) -> float:
    return max(row.max_abs_diff for row in self.rows)

  @property
  def max_rel_diff(self) -> float:
    return max(row.max_rel_diff for row in self.rows)

  @property
  def kv(self) -> cache_lib.KVAccount:
    """The final state's K/V accounting."""
    return self.rows[-1].kv


def check_prompt(prompt: Sequence[int], vocab_size: int) -> list[int]:
  """Checks token IDs are whole numbers in [0, vocab_size)."""
  prompt = list(prompt)
  if not prompt:
    raise errors.InputError("prompt is empty: give at least one token ID.")
  for i, token in enumerate(prompt):
    if isinstance(token, bool) or token != int(token) or not (0 <= token < vocab_size):
      raise errors.InputError(f"prompt[{i}]={token!r} is not allowed: IDs must be whole numbers"
                              f" in [0, vocab_size) = [0, {vocab_size}).")
  return [int(x) for x in prompt]


def require_feasible(config: ToyConfig, prompt_len: int, steps: int, *, layout: str = "fixed",
                     max_block_passes: int = weights.MAX_BLOCK_PASSES) -> None:
  """Refuses a check beyond this machine before anything is allocated: its
  memory (`weights.require_fits`, the fresh forward pass's attention scores
  included) and its work (blocks x compiled programs), naming the estimate."""
  # Each decode step's fresh forward pass has a new length: a new program.
  programs = (3 if layout == "growing" else 2) * (steps + 1) + 1
  weights.require_compilable(
      config, programs, what=f"prefill, a fresh forward pass at each of {steps + 1:,} "
      "lengths, decode", fewer="blocks or steps", limit=max_block_passes)
  positions = prompt_len + steps + 1  # After the work: the estimate traces every block.
  weights.require_fits(config, 8, batch=1, positions=positions, attention_positions=positions)


def lesson_check(
    config: ToyConfig,
    prompt: Sequence[int],
    steps: int,
    *,
    break_name: str | None = None,
    layout: str = "fixed",
    seed: int = 0,
    tolerance: float = 1e-10,
) -> CheckResult:
  """Runs `check_decode` in float64 on one prompt; float64 is on only inside.

  Args:
    config: model sizes.
    prompt: token IDs of one sequence, each in [0, vocab_size).
    steps: decode steps after prefill.
    break_name: None for the correct run, else one of `breakers.BREAKS`.
    layout: "fixed" or "growing".
    seed: seeds the weights and the break's random parts.
    tolerance: largest relative difference that counts as agreement.
  """
  prompt = check_prompt(prompt, config.vocab_size)
  tolerance = errors.require_positive("tolerance", tolerance)
  with jax.enable_x64(True):
    params_key, break_key = jax.random.split(jax.random.key(seed))
    params = init_params(config, params_key, jnp.float64)
    variant = (breakers.correct(params) if break_name is None else breakers.broken(
        break_name, params, break_key))
    rows = check_decode(variant, jnp.asarray([prompt], jnp.int32), steps, layout=layout,
                        tolerance=tolerance)

  def formula(bytes_per_element: int) -> int:
    return int(
        formulas.kv_bytes_per_position(config.num_blocks, config.num_kv_heads, config.head_dim,
                                       bytes_per_element))

  return CheckResult(
      rows=rows,
      tolerance=tolerance,
      kv_bytes_per_position_formula=formula(rows[-1].kv.itemsize),
      kv_bytes_per_position_2byte_formula=formula(HYPOTHETICAL_BYTES),
  )


UNITS = {
    "max_abs_diff": "logit units",
    "max_rel_diff": "1 (max_abs_diff / max |fresh logit|)",
    "tolerance": "1 (relative)",
    "positions_with_kv": "positions per sequence",
    "kv_bytes_per_position": "B per position per sequence (float64 state)",
    "kv_bytes_per_position_2byte": "B per position per sequence (2-byte "
                                   "payload, hypothetical)",
    "kv_bytes": "B per sequence (float64 state)",
    "kv_bytes_2byte": "B per sequence (2-byte payload, hypothetical)",
}


def row_json(row: StepRow) -> dict:
  """One step of the check as JSON."""
  return {
      "step": row.step,
      "phase": "prefill" if row.step == 0 else "decode",
      "fed": list(row.fed),
      "outputs_emitted": row.outputs,
      "next_token": row.next_token,
      "max_abs_diff": row.max_abs_diff,
      "max_rel_diff": row.max_rel_diff,
      "agrees": row.agrees,
      "positions_with_kv": row.kv.positions,
      "positions_with_kv_formula": row.positions_with_kv_formula,
      "kv_bytes": row.kv.bytes_at(row.kv.itemsize),
      "kv_bytes_2byte": row.kv.bytes_at(HYPOTHETICAL_BYTES),
  }


def result_json(result: CheckResult, *, config: ToyConfig, prompt: Sequence[int], steps: int,
                break_name: str | None, layout: str, seed: int) -> dict:
  """The check as JSON: verdicts, K/V accounting against the formulas, rows.

  `ok` is the expected outcome: agreement for the correct run, a detected
  mismatch under a break, and K/V counts equal to the symbolic formulas.
  """
  kv, last = result.kv, result.rows[-1]
  kv_matches = (all(row.kv.positions == row.positions_with_kv_formula for row in result.rows) and
                kv.bytes_per_position == result.kv_bytes_per_position_formula and
                kv.bytes_per_position_at(HYPOTHETICAL_BYTES)
                == result.kv_bytes_per_position_2byte_formula and
                kv.nbytes == kv.positions * kv.bytes_per_position)
  detected = not result.agrees
  ok = kv_matches and (detected if break_name else result.agrees)
  return {
      "experiment": "decode_equivalence",
      "kind": "check: float64 arithmetic compared on this machine (not a"
              " timing); K/V counted from the state, 2-byte figures are a"
              " hypothetical payload",
      "backend": jax.default_backend(),
      "device": str(jax.devices()[0].device_kind),
      "dtype": "float64",
      "inputs": {
          "config": dataclasses.asdict(config), "prompt": list(prompt), "steps": steps,
          "layout": layout, "break": break_name, "seed": seed
      },
      "expected": "mismatch" if break_name else "agreement",
      "ok": ok,
      "agrees": result.agrees,
      "detected": detected,
      "max_abs_diff": result.max_abs_diff,
      "max_rel_diff": result.max_rel_diff,
      "tolerance": result.tolerance,
      "positions_with_kv": kv.positions,
      "positions_with_kv_formula": last.positions_with_kv_formula,
      "kv_bytes_per_position": kv.bytes_per_position,
      "kv_bytes_per_position_formula": result.kv_bytes_per_position_formula,
      "kv_bytes_per_position_2byte": kv.bytes_per_position_at(HYPOTHETICAL_BYTES),
      "kv_bytes_per_position_2byte_formula": result.kv_bytes_per_position_2byte_formula,
      "kv_bytes": kv.bytes_at(kv.itemsize),
      "kv_bytes_2byte": kv.bytes_at(HYPOTHETICAL_BYTES),
      "kv_accounting_matches_formula": kv_matches,
      "rows": [row_json(row) for row in result.rows],
      "units": UNITS,
  }
