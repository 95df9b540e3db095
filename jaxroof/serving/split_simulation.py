"""A split plan simulated: a prefill pool, the K/V transfer, a decode pool behind a router.

The planner's split plan (`parallel.planner`, `pools.kind == "split"`) has a prefill
pool of `prefill.replicas` replicas of one layout and a decode pool of
`decode.replicas` replicas of another at its batch. Here a seeded workload runs
through both:

  * prefill: one central first-come-first-served queue in front of the prefill
    replicas (each prefills one prompt at a time, `D(P)` from the one cost model
    on the prefill layout: the iteration of one prompt chunk);
  * transfer: the prompt's K/V crosses the link the plan costed,
    `kv_transfer_s x P / mean P`;
  * decode: the requests, in the order they arrive there, go to the decode
    replicas behind a least-outstanding router (`fleet.simulate_fleet`; with m
    microbatches, m virtual engines each, `replica.per_microbatch`), each a
    `simulator.Replica` with `prefilled=True`: admission takes pages for the
    prompt and streams the first token, then the request decodes.

TTFT is from arrival to that first token (prefill queue + prefill + transfer +
the wait for a decode slot); ITL and TPOT come from the decode pool.
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from typing import Any

import numpy as np

from jaxroof.parallel import engine_drive
from jaxroof.parallel.layout import Layout
from jaxroof.serving import fleet, replica, simulator
from jaxroof.serving.arrivals import Workload
from jaxroof.specs.accelerators import Accelerator
from jaxroof.specs.model_spec import ModelSpec
from jaxroof.symbolic.step_model import StepModel

DECODE_ROUTER = "least_outstanding"


@dataclasses.dataclass(eq=False)
class SplitRun:
  """Per-request times of the whole split plan (as `simulator.Run` names them)."""

  arrival_s: np.ndarray
  first_token_s: np.ndarray
  finish_s: np.ndarray
  output_tokens: np.ndarray
  itl_s: np.ndarray
  prefill_done_s: np.ndarray
  decode_arrival_s: np.ndarray
  preemptions: int
  wall_s: float


def _layout(pool: dict[str, Any], microbatches: int = 1) -> Layout:
  return Layout(tp=pool["tp"], pp=pool["pp"], ep=pool["ep"], microbatches=microbatches)


def prefill_times(r: simulator.Replica, prompts: np.ndarray) -> np.ndarray:
  """Seconds to prefill each prompt alone on `r` (one iteration of one whole chunk)."""
  out = np.empty(len(prompts))
  cache: dict[int, float] = {}
  for n, p in enumerate(prompts.tolist()):
    if p not in cache:
      mix = r.cost.mix((), [0.0], [float(p)])
      cache[p] = float(r.cost.evaluate(mix, r.step_model, step_only=True)["step_s"])
    out[n] = cache[p]
  return out


def _first_come_first_served(arrival: np.ndarray, service: np.ndarray, servers: int) -> np.ndarray:
  """Finish times of a FIFO queue in front of `servers` identical servers."""
  free = [0.0] * servers
  finish = np.empty(len(arrival))
  for i, (a, s) in enumerate(zip(arrival.tolist(), service.tolist())):
    start = max(a, heapq.heappop(free))
    finish[i] = start + s
    heapq.heappush(free, finish[i])
  return finish


def simulate_split(spec: ModelSpec, device: Accelerator, row: dict[str, Any], workload: Workload, *,
                   context: int, bound: str = "per_op", comm_overlap: float = 0.0,
                   scheduler: str = "iteration", seed: int = 0, stop=None,
                   engine: str = engine_drive.BOUND) -> SplitRun:
  """Runs `workload` (the fleet's arrivals) through the split plan `row` (`stop`: as
  `fleet.simulate_fleet`'s, for the decode pool; an `engine`: its step and memory rule
  in both pools)."""
  start = time.perf_counter()
  pools = row["pools"]
  common = dict(context=context, weight_dtype=published_dtype(row["weight_dtype"]),
                kv_dtype=row["kv_dtype"], comm_overlap=comm_overlap)

  def engine_of(layout: Layout) -> dict[str, Any]:
    d = engine_drive.drive(engine, device, tp=layout.tp, pp=layout.pp)
    return (dict(step_model=StepModel.bound(bound)) if d is None else dict(
        step_model=d.model, reservation=d.settings))

  pre_layout, dec_layout = _layout(pools["prefill"]), _layout(pools["decode"], row["microbatches"])
  pre = replica.from_model(spec, device, max_running=1, layout=pre_layout, **common,
                           **engine_of(pre_layout))
  dec = replica.from_model(spec, device, max_running=pools["decode"]["batch"], layout=dec_layout,
                           **common, **engine_of(dec_layout))
  micro = row["microbatches"]
  dec = dataclasses.replace(replica.per_microbatch(dec, micro), prefilled=True)
  arrival = workload.arrival_s.astype(float)
  prompts = workload.prompt_tokens.astype(np.int64)
  prefill_done = _first_come_first_served(arrival, prefill_times(pre, prompts),
                                          pools["prefill"]["replicas"])
  mean_prompt = float(np.mean(prompts))
  handoff = prefill_done + pools["kv_transfer_s"] * prompts / mean_prompt
  order = np.argsort(handoff, kind="stable")
  moved = Workload(arrival_s=handoff[order], prompt_tokens=prompts[order],
                   output_tokens=workload.output_tokens[order], description=workload.description)
  run = fleet.simulate_fleet(moved, dec, pools["decode"]["replicas"] * micro, scheduler=scheduler,
                             router=DECODE_ROUTER, seed=seed, pipeline=micro, stop=stop).fleet
  first, finish = np.empty(len(arrival)), np.empty(len(arrival))
  first[order], finish[order] = run.first_token_s, run.finish_s
  return SplitRun(arrival_s=arrival, first_token_s=first, finish_s=finish,
                  output_tokens=workload.output_tokens, itl_s=run.itl_s,
                  prefill_done_s=prefill_done, decode_arrival_s=handoff,
                  preemptions=int(run.preemptions), wall_s=time.perf_counter() - start)


def published_dtype(name: str) -> str:
  """A plan's weight dtype as `replica.from_model` takes it ("bf16 (published)" ->
  "published")."""
  return "published" if name.endswith("(published)") else name
