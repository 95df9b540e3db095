"""The lesson's worked numbers and "check yourself" answers, recomputed.

Each `Claim` pairs the lesson's printed figure (`expected`, typed from
`seed/weight-reuse-lesson.txt`) with our value (`computed`, always through
`jaxroof.symbolic.formulas`, `jaxroof.symbolic.solved` or `jaxroof.symbolic.sweep`). The tolerance is half
a unit of the lesson's last printed digit ("about 123 tokens/s" -> 0.5);
exact figures get only float-rounding slack.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxroof.symbolic import formulas
from jaxroof.symbolic import solved
from jaxroof.symbolic.sweep import decode_sweep
from jaxroof.symbolic.symbols import B

# The lesson's example: an 8-billion-weight BF16 model on 2 TB/s.
WEIGHTS = 8e9
BF16 = 2
BANDWIDTH = 2e12
KV_PER_SEQ = 0.25e9
KV_PER_SEQ_DOUBLED = 0.5e9
RIDGE = 300  # FLOP/byte, the lesson's illustrative device.
# The previous lesson's toy model and request.
TOY = dict(L=2, H_kv=2, d=2, b=2)
PROMPT = 3


@dataclasses.dataclass(frozen=True)
class Claim:
  """One checkable statement of the lesson."""

  section: str
  claim: str
  expected: float | str
  computed: float | str
  unit: str
  tolerance: float = 0.0
  formula: str = ""
  details: dict[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def agrees(self) -> bool:
    if isinstance(self.expected, str) or isinstance(self.computed, str):
      return self.expected == self.computed
    slack = max(self.tolerance, 1e-9 * abs(float(self.expected)))  # Float rounding.
    return abs(float(self.computed) - float(self.expected)) <= slack

  def to_json(self) -> dict[str, Any]:
    out = dataclasses.asdict(self)
    out["agrees"] = self.agrees
    return out


def _sweep(batch_sizes, kv_per_seq=KV_PER_SEQ, flops=None):
  return decode_sweep(batch_sizes, form="fused", N=WEIGHTS, q=BF16, T=1, k=kv_per_seq, BW=BANDWIDTH,
                      F=flops)


def _rows(sweep) -> dict[int, dict]:
  return {r["batch"]: r for r in sweep["rows"]}


def worked_numbers() -> list[Claim]:
  """The worked numbers, in the lesson's order."""
  c = []
  toy_kv = formulas.kv_bytes_per_position(**TOY)
  c.append(
      Claim("toy request", "KV per processed position (2 blocks, 2 KV heads, 2 coords, 2 B)", 32,
            float(toy_kv), "B/position", 0, str(formulas.kv_bytes_per_position())))
  positions = formulas.positions_with_kv(PROMPT, 3)
  c.append(
      Claim("toy request", "positions with K/V after the third output", 5, float(positions),
            "positions", 0, str(formulas.positions_with_kv())))
  intensity = formulas.weight_only_intensity(q=BF16)
  c.append(
      Claim("weight-only estimate", "weight-only intensity in BF16", "B", str(intensity), "FLOP/B",
            0, str(formulas.weight_only_intensity())))
  c.append(
      Claim("weight-only estimate", "weight-only intensity at batch one (BF16)", 1,
            float(intensity.subs(B, 1)), "FLOP/B", 0, "2*B/q"))
  c.append(
      Claim("weight-only estimate",
            "batch where BF16 weight-only intensity meets a 300 FLOP/B ridge", 300,
            float(solved.ridge_batch(R=RIDGE, q=BF16)), "sequences", 0, str(solved.ridge_batch())))
  c.append(
      Claim("traffic that grows", "fixed weight traffic of the 8B BF16 model", 16,
            float(formulas.weight_traffic(WEIGHTS, BF16)) / 1e9, "GB", 0,
            str(formulas.weight_traffic())))
  rows = _rows(_sweep([1, 8, 32, 64]))
  step = str(formulas.memory_time())
  c += [
      Claim("traffic that grows", "batch 32 traffic", 24, rows[32]["traffic_bytes"] / 1e9, "GB", 0,
            str(formulas.step_traffic())),
      Claim("traffic that grows", "batch 32 step estimate", 0.012, rows[32]["step_s"], "s", 0,
            step),
      Claim("traffic that grows", "batch 32 aggregate rate", 2667,
            rows[32]["aggregate_tokens_per_s"], "tokens/s", 0.5, "B/t"),
      Claim("traffic that grows", "batch 32 per-sequence rate", 83,
            rows[32]["per_sequence_tokens_per_s"], "tokens/s", 0.5, "1/t"),
      Claim("traffic that grows", "weight/KV crossover", 64,
            float(solved.weight_kv_crossover_batch(N=WEIGHTS, q=BF16, T=1, k=KV_PER_SEQ)),
            "sequences", 0, str(solved.weight_kv_crossover_batch())),
      Claim("traffic that grows", "sanity: KV bytes at batch 64 equal the weight bytes", 16,
            rows[64]["kv_bytes"] / 1e9, "GB", 0, "B*T*k"),
      Claim("read the table", "batch 1 aggregate rate", 123, rows[1]["aggregate_tokens_per_s"],
            "tokens/s", 0.5, "B/t"),
      Claim("read the table", "batch 1 step time", 8.125, rows[1]["step_s"] * 1e3, "ms", 0, step),
      Claim("read the table", "batch 32 step time", 12, rows[32]["step_s"] * 1e3, "ms", 0, step),
      Claim("read the table", "memory-only rate limit as B grows", 8000,
            float(solved.memory_limit_rate(BW=BANDWIDTH, T=1, k=KV_PER_SEQ)), "tokens/s", 0,
            str(solved.memory_limit_rate())),
  ]
  doubled = dict(TOY, L=2 * TOY["L"])
  per_position = formulas.kv_bytes_per_position(**doubled)
  c += [
      Claim("do this", "KV per position with twice the blocks", 64, float(per_position),
            "B/position", 0, str(formulas.kv_bytes_per_position())),
      Claim(
          "do this", "KV after prefill and two decode steps, twice the blocks", 320,
          float(formulas.retained_kv_bytes(1, formulas.positions_with_kv(PROMPT, 3), per_position)),
          "B", 0, "B*T*k with T = P+g-1, k = 2*L*H_kv*d*b"),
  ]
  rows2 = _rows(_sweep([32], kv_per_seq=KV_PER_SEQ_DOUBLED))
  c += [
      Claim("do this", "0.5 GB/seq: batch 32 traffic", 32, rows2[32]["traffic_bytes"] / 1e9, "GB",
            0, str(formulas.step_traffic())),
      Claim("do this", "0.5 GB/seq: batch 32 step time", 16, rows2[32]["step_s"] * 1e3, "ms", 0,
            step),
      Claim("do this", "0.5 GB/seq: batch 32 aggregate rate", 2000,
            rows2[32]["aggregate_tokens_per_s"], "tokens/s", 0, "B/t"),
      Claim("do this", "0.5 GB/seq: weight/KV crossover", 32,
            float(solved.weight_kv_crossover_batch(N=WEIGHTS, q=BF16, T=1, k=KV_PER_SEQ_DOUBLED)),
            "sequences", 0, str(solved.weight_kv_crossover_batch())),
  ]
  c.append(
      Claim(
          "serving decision (implied)",
          "largest batch whose step meets a 12 ms token gap ('batch 32 worthwhile')", 32,
          float(
              solved.max_batch_for_token_gap(t_gap=0.012, N=WEIGHTS, q=BF16, T=1, k=KV_PER_SEQ,
                                             BW=BANDWIDTH, F=RIDGE * BANDWIDTH)), "sequences", 0,
          str(solved.max_batch_for_token_gap())))
  # "Faster arithmetic alone would not improve this memory estimate."
  flops = RIDGE * BANDWIDTH
  slow = _rows(_sweep([32], KV_PER_SEQ_DOUBLED, flops))[32]["step_s"]
  fast = _rows(_sweep([32], KV_PER_SEQ_DOUBLED, 2 * flops))[32]["step_s"]
  c.append(
      Claim("do this", "0.5 GB/seq, batch 32: step time with twice the FLOP rate", 16, fast * 1e3,
            "ms", 0, "max(memory, compute)",
            {"step_ms_at_F": slow * 1e3, "step_ms_at_2F": fast * 1e3, "F_flop_per_s": flops}))
  return c


def check_yourself() -> list[Claim]:
  """The five questions, answered from computation."""
  c = []
  rows = _rows(_sweep([8, 32]))
  r8, r32 = rows[8]["per_sequence_tokens_per_s"], rows[32]["per_sequence_tokens_per_s"]
  c += [
      Claim("check yourself 1", "batch 8 step time", 9, rows[8]["step_s"] * 1e3, "ms", 0),
      Claim("check yourself 1", "one user's rate at batch 8", 111, r8, "tokens/s", 0.5, "1/t"),
      Claim("check yourself 1", "one user's rate at batch 32", 83, r32, "tokens/s", 0.5, "1/t"),
      Claim(
          "check yourself 1", "what happens to one active user from batch 8 to 32",
          "its output rate falls", "its output rate falls" if r32 < r8 else "it does not fall", "",
          0, "1/t", {
              "aggregate_8": rows[8]["aggregate_tokens_per_s"],
              "aggregate_32": rows[32]["aggregate_tokens_per_s"]
          }),
  ]
  c.append(
      Claim("check yourself 2", "batch where 0.5 GB/seq of KV equals 16 GB of weights", 32,
            float(solved.weight_kv_crossover_batch(N=WEIGHTS, q=BF16, T=1, k=KV_PER_SEQ_DOUBLED)),
            "sequences", 0, str(solved.weight_kv_crossover_batch())))
  # 3: a plateau while memory still binds, on the lesson's 300 FLOP/B device.
  batches = [256, 512, 1024, 2048, 4096]
  sweep = _sweep(batches, flops=RIDGE * BANDWIDTH)
  rates = [r["aggregate_tokens_per_s"] for r in sweep["rows"]]
  plateau = rates[-1] / rates[-2] < 1.05
  all_memory = all(r["bound"] == "memory" for r in sweep["rows"])
  c.append(
      Claim(
          "check yourself 3", "does a throughput plateau prove decode became compute-bound?", "no",
          "no" if plateau and all_memory else "yes", "", 0, "B/t -> BW/(T*k) while memory binds", {
              "batch": batches, "aggregate_tokens_per_s": rates, "bound": [
                  r["bound"] for r in sweep["rows"]
              ], "memory_limit_tokens_per_s": sweep["summary"]["memory_limit_tokens_per_s"],
              "compute_crossover_batch": sweep["summary"]["compute_crossover_batch"]
          }))
  c.append(
      Claim("check yourself 4", "positions with computed K/V after a 3-token prompt and 3 outputs",
            5, float(formulas.positions_with_kv(PROMPT, 3)), "positions", 0,
            str(formulas.positions_with_kv())))
  c.append(_projections_still_run())
  return c


def _projections_still_run() -> Claim:
  """Check yourself 5, from the toy model's own decode step.

  Counts the matrix multiplies a cached decode step of the lesson's toy
  performs (traced, not assumed) and removes the attention over the cache:
  what is left is every projection, MLP and output-head multiply for the new
  token, 2*N*B FLOPs with N the matmul weights.
  """
  import jax  # Deferred: the rest of the lesson is symbolic.
  import jax.numpy as jnp

  from jaxroof import toy
  from jaxroof.toy import flops

  config, slots = toy.LESSON, 8
  params = toy.init_params(config, jax.random.key(0), jnp.float32)
  state = toy.init_cache(config, 1, slots, jnp.float32)
  _, state = toy.prefill(params, jnp.asarray([list(toy.LESSON_PROMPT)]), state)
  total = flops.dot_flops(toy.decode_step, params, state, jnp.asarray([2]))
  attention = config.num_blocks * formulas.attention_flops(1, slots, config.num_heads,
                                                           config.head_dim)
  linear = total - int(attention)
  weights = flops.matmul_weights(params)
  still_run = linear > 0 and linear == formulas.linear_flops(weights, 1)
  return Claim(
      "check yourself 5", "does reusing the KV cache eliminate projections and feed-forward work?",
      "no", "no" if still_run else "yes", "", 0,
      "traced decode-step matmul FLOPs - attention = 2*N*B", {
          "decode_step_matmul_flops": total, "attention_flops": int(attention),
          "projection_and_mlp_flops": linear, "matmul_weights": weights
      })


def all_claims() -> list[Claim]:
  return worked_numbers() + check_yourself()
