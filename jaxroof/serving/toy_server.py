"""A real continuous-batching server over the toy Transformer (CPU or any XLA device).

Iteration-level batching (Orca) over `slots` rows of a fixed-size cache with
per-row lengths (`jaxroof.toy.rows`): at each iteration's start, arrived
requests take free rows first come, first served, and each one's prompt is
prefilled into its row; then one decode call feeds the previous token of every
row that was already running. Tokens are greedy (argmax) and are returned at
the iteration's end, as a streaming server sends them, so every request's
token times are iteration end times on the wall clock (`time.perf_counter`,
after `block_until_ready`). Requests arrive on the wall clock at the
workload's `arrival_s`; while idle the loop spins on the clock (no sleep).

Timing rules: every shape is compiled and run once before the clock starts
(prompts are padded to a few bucket lengths, so there are few shapes), and
each iteration's device work is finished before its time is read. The
iteration's mix (decodes, contexts, prefill tokens) and its measured time are
kept, so the simulator's iteration model can be fitted to the server itself.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxroof.errors import InputError, require_positive_int
from jaxroof.serving.arrivals import Workload
from jaxroof.symbolic import iteration
from jaxroof.toy import rows
from jaxroof.toy.weights import Params

MIX_NAMES: tuple[str, ...] = ("n_dec", "S_dec", "n_pre", "S_pre_att", "S_pre_kv")


@dataclasses.dataclass(eq=False)
class Served:
  """What the server did: per-request times (s from the start) and outputs."""

  arrival_s: np.ndarray
  first_token_s: np.ndarray
  finish_s: np.ndarray
  output_tokens: np.ndarray
  itl_s: np.ndarray
  outputs: list[list[int]]  # Generated token IDs per request.
  prompts: list[np.ndarray]
  iteration_s: np.ndarray  # Measured wall time per iteration.
  mix: dict[str, np.ndarray]  # `MIX_NAMES` per iteration, logical tokens.
  computed_mix: dict[str, np.ndarray]  # As computed: all rows, padded prompts, all slots.
  wall_s: float


def padded_prompt(length: int) -> int:
  """Padded prompt length: the next power of two >= 16."""
  return max(16, 1 << (int(length) - 1).bit_length())


def prompts_for(workload: Workload, vocab_size: int, seed: int) -> list[np.ndarray]:
  """Random prompt token IDs of the workload's lengths (seeded)."""
  rng = np.random.default_rng(seed)
  return [rng.integers(0, vocab_size, int(n), dtype=np.int32) for n in workload.prompt_tokens]


class ToyServer:
  """A compiled, warmed-up server of `slots` rows of `max_len` positions."""

  def __init__(self, params: Params, *, slots: int, max_len: int, prompt_lengths: np.ndarray):
    self.params = params
    self.slots = require_positive_int("slots", slots)
    self.max_len = require_positive_int("max_len", max_len)
    self.dtype = params.embed.dtype
    self.buckets = sorted({padded_prompt(n) for n in np.asarray(prompt_lengths).tolist()})
    self._warm_up()

  def _empty(self) -> rows.RowCache:
    return rows.init_rows(self.params.config, self.slots, self.max_len, self.dtype)

  def _warm_up(self) -> None:
    cache = self._empty()
    for _ in range(2):
      for bucket in self.buckets:
        last, cache = rows.prefill_row(self.params, cache, jnp.int32(0),
                                       jnp.zeros((1, bucket), jnp.int32), jnp.int32(1))
        last.block_until_ready()
      logits, cache = rows.decode_rows(self.params, cache, jnp.zeros(self.slots, jnp.int32),
                                       jnp.ones(self.slots, bool))
      logits.block_until_ready()

  def serve(self, workload: Workload, prompts: list[np.ndarray]) -> Served:
    """Serves the workload on the wall clock; see the module docstring."""
    n = len(workload)
    need = workload.prompt_tokens + workload.output_tokens
    if int(need.max()) > self.max_len:
      raise InputError(f"prompt_tokens + output_tokens = {int(need.max())} is not allowed: "
                       f"the server's rows hold max_len={self.max_len} positions.")
    arrival = workload.arrival_s.tolist()
    output = workload.output_tokens.tolist()
    first = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    last_s = np.zeros(n)
    outputs: list[list[int]] = [[] for _ in range(n)]
    itl: list[float] = []
    iteration_s: list[float] = []
    mix: dict[str, list[float]] = {name: [] for name in MIX_NAMES}
    computed: dict[str, list[float]] = {name: [] for name in MIX_NAMES}
    row_of = [-1] * self.slots  # Request in each row, or -1.
    tokens = np.zeros(self.slots, np.int32)
    lengths = np.zeros(self.slots, np.int64)
    cache = self._empty()
    waiting: list[int] = []
    next_arrival = done = 0
    start = time.perf_counter()
    while done < n:
      now = time.perf_counter() - start
      while next_arrival < n and arrival[next_arrival] <= now:
        waiting.append(next_arrival)
        next_arrival += 1
      running = [r for r in range(self.slots) if row_of[r] >= 0]
      if not running and not waiting:
        # Spin, as a serving loop polls: a sleep would add the OS's wake-up
        # latency (milliseconds on a loaded machine) to the next TTFT.
        while time.perf_counter() - start < arrival[next_arrival]:
          pass
        continue
      began = time.perf_counter()
      decoding = np.zeros(self.slots, bool)
      decoding[running] = True
      n_dec, S_dec = len(running), float(np.sum(lengths[running] + 1))
      emitted: list[tuple[int, int]] = []  # (row, token) at the iteration's end.
      n_pre = S_att = S_kv = 0.0
      padded_rows = prefills = 0
      free = [r for r in range(self.slots) if row_of[r] < 0]
      while waiting and free:
        i, r = waiting.pop(0), free.pop(0)
        p = prompts[i]
        padded = np.zeros((1, padded_prompt(len(p))), np.int32)
        padded[0, :len(p)] = p
        last, cache = rows.prefill_row(self.params, cache, jnp.int32(r), jnp.asarray(padded),
                                       jnp.int32(len(p)))
        emitted.append((r, int(jnp.argmax(last))))  # Blocks: the token is on the host.
        row_of[r], lengths[r] = i, len(p)
        pairs = iteration.chunk_model()(o_chunk=0.0, c_chunk=float(len(p)))
        n_pre += len(p)
        S_att += float(pairs["attended"])
        S_kv += float(pairs["kv_positions"])
        padded_rows += padded.shape[1]
        prefills += 1
      if n_dec:
        logits, cache = rows.decode_rows(self.params, cache, jnp.asarray(tokens),
                                         jnp.asarray(decoding))
        nxt = np.asarray(jnp.argmax(logits, axis=-1))  # Blocks until ready.
        lengths[decoding] += 1
        emitted.extend((r, int(nxt[r])) for r in running)
      end = time.perf_counter()
      iteration_s.append(end - began)
      for name, value in zip(MIX_NAMES, (n_dec, S_dec, n_pre, S_att, S_kv)):
        mix[name].append(float(value))
      as_computed = (self.slots if n_dec else 0, self.slots * self.max_len if n_dec else 0,
                     padded_rows, padded_rows * self.max_len, self.max_len * prefills)
      for name, value in zip(MIX_NAMES, as_computed):
        computed[name].append(float(value))
      t = end - start
      for r, token in emitted:
        i = row_of[r]
        if outputs[i]:
          itl.append(t - last_s[i])
        else:
          first[i] = t
        outputs[i].append(token)
        last_s[i] = t
        tokens[r] = token
        if len(outputs[i]) >= output[i]:
          finish[i] = t
          row_of[r] = -1
          lengths[r] = 0
          done += 1
    return Served(arrival_s=workload.arrival_s.copy(), first_token_s=first, finish_s=finish,
                  output_tokens=workload.output_tokens.copy(), itl_s=np.asarray(itl),
                  outputs=outputs, prompts=prompts, iteration_s=np.asarray(iteration_s),
                  mix={k: np.asarray(v) for k, v in mix.items()
                      }, computed_mix={k: np.asarray(v) for k, v in computed.items()},
                  wall_s=time.perf_counter() - start)


def device_description() -> dict:
  """The device the server ran on, for the JSON."""
  d = jax.devices()[0]
  return {
      "platform": d.platform, "device_kind": d.device_kind, "jax_version": jax.__version__,
      "backend": "xla"
  }
