"""Split plans: a prefill pool of one layout and a decode pool of another, per accelerator
and bytes class.

A request's first token reaches the user from the decode pool (as engines' split
deployments stream it), so its TTFT is the prefill pool's wait, the prompt's prefill, the
K/V transfer and the wait for a decode slot. The prefill pool is one queue over its
replicas (a disaggregation router keeps one), each prefilling one prompt at a time:
M/D/c (`load_pools.pool_wait`). Its decode replicas take prompts prefilled
(`replica_load.decode_pool_states`: no prefill interference). The TTFT target is split:
for each share s of `WAIT_SHARES` the decode pool's p90 slot wait stays within s x the
target (its max rate per replica by the load model) and the prefill pool's p90 wait
plus the prefill within the rest less the transfer; the pools are then independent, each
its own minimum (the fewest chips at a load; at a fixed fleet, the split of the chips
that carries the most), and the share with the best total wins.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from jaxroof.parallel import plan_grid
from jaxroof.parallel import plan_search
from jaxroof.parallel import replica_load
from jaxroof.specs import accelerators
from jaxroof.specs.accelerators import Accelerator
from jaxroof.symbolic import load_model, load_pools
from jaxroof.symbolic.step_model import StepModel

WAIT_SHARES = (0.1, 0.25, 0.5)  # Shares of the TTFT target the decode slot's p90 wait may take.
SUMMARY = ("a prefill pool of one layout, one queue over its replicas (M/D/c), and a decode pool "
           "of another whose prompts arrive prefilled; each prompt's K/V crosses the "
           "scale-out network per chip of the prefill replica; TTFT = the prefill pool's p90 "
           "wait + the prefill + the transfer + the decode slot's p90 wait, the target split "
           "between the pools")


@dataclasses.dataclass(frozen=True)
class SplitSearch:
  searched: int
  meeting: int
  plans: list[dict[str, Any]]


def _kv_link(device: Accelerator) -> tuple[float, str]:
  """Per-chip bytes/s a prompt's K/V crosses between pools (inf: free), and its label."""
  rate, label = accelerators.kv_transfer_link(device)
  return (math.inf if rate is None else rate), label


def plans(grid: plan_grid.Grid, devices: Sequence[Accelerator], model: StepModel,
          work: plan_search.Workload, cheap: plan_search.Bound, *, rate: float | None,
          chips: int | None, prices: Mapping[str, float], max_chips: int | None, keep: int,
          limit: Callable[[int], float] | None = None,
          price: np.ndarray | None = None) -> SplitSearch:
  """The best split per accelerator and bytes class (see the module docstring); a class
  whose bound cannot beat `limit(device)` (the planner's objective: chips, cost, or
  minus the rate of a fixed fleet) is not searched."""
  link = np.array([_kv_link(d)[0] for d in devices])[grid.device]
  transfer = work.prompt_tokens * grid.kv_per_token / (grid.per_replica * link)
  ttft = work.targets.ttft_s
  keys = grid.device.astype(np.int64) * (int(grid.cls.max()) + 1) + grid.cls
  live = cheap.valid & (cheap.alone + transfer < ttft)
  searched = meeting = 0
  pre_of: dict[int, np.ndarray] = {}
  searchable = np.zeros(grid.size, dtype=bool)
  for key in np.unique(keys):
    mine = keys == key
    pre_groups = np.nonzero(mine & live)[0]
    dec_live = mine & (cheap.decode_rate > 0)
    searched += int(np.sum(mine & cheap.valid)**2)
    meeting += int(pre_groups.size * np.sum(dec_live))
    if not pre_groups.size or not dec_live.any():
      continue
    if limit is not None and _optimistic(grid, cheap, pre_groups, dec_live, rate, chips,
                                         price) > limit(int(grid.device[pre_groups[0]])):
      continue
    pre_of[int(key)] = pre_groups
    searchable |= dec_live
  # Every class's decode layout with the fewest chips at the strictest share, in one
  # search; each share then re-answers that layout (a looser slot wait only lets its
  # replicas carry more).
  firsts = _decode_pools(grid, model, work, cheap, searchable, keys, WAIT_SHARES[0] * ttft, rate,
                         max_chips)
  waits = [share * ttft for share in WAIT_SHARES[1:]]
  redone = _redo(grid, model, work, cheap, firsts, waits)
  out = []
  for i, first in enumerate(firsts):
    pre_groups = pre_of[int(keys[first.group])]
    best = None
    for share, decode in zip(WAIT_SHARES, [first] + redone[i]):
      if decode is None:
        continue
      budget = (1 - share) * ttft - transfer[pre_groups]
      found = _combine(grid, pre_groups, cheap.alone[pre_groups], budget, decode, rate, chips,
                       max_chips)
      if found is not None and (best is None or found["objective"] < best["objective"]):
        best = {**found, "share": share, "decode": decode}
    if best is not None:
      out.append(_row(grid, devices, work, best, transfer, rate=rate, chips=chips, prices=prices))
  if prices:
    out = [p for p in out if p["cost_per_hour"] is not None]
  return SplitSearch(searched=searched, meeting=meeting, plans=out)


def _optimistic(grid, cheap, pre_groups, dec_live, rate, chips, price) -> float:
  """A bound on a class's split objective: the decode pool at its bound with the fewest
  prefill replicas that keep up (at least rate x prefill, one at least)."""
  dec = np.nonzero(dec_live)[0]
  per_d, lam = grid.per_replica[dec], cheap.decode_rate[dec]
  if chips is not None:
    return -float(np.max(np.floor(chips / per_d) * lam))
  chips_d = np.min(np.ceil(rate / lam * (1 - 1e-12)) * per_d)
  chips_p = np.min(
      np.maximum(np.ceil(rate * cheap.alone[pre_groups] * (1 - 1e-12)), 1.0) *
      grid.per_replica[pre_groups])
  total = chips_d + chips_p
  return float(total * price[pre_groups[0]]) if price is not None else float(total)


def _decode_pools(grid, model, work, cheap, live, keys, wait_s, rate,
                  max_chips) -> list[plan_search.Found]:
  """Per class (`keys`), the decode group with the fewest chips at `rate` (or the most
  rate per chip at a fixed fleet), its slot wait's p90 within `wait_s`."""
  if not live.any():
    return []
  targets = load_model.Targets(token_gap_s=work.targets.token_gap_s, ttft_s=wait_s,
                               itl_quantile=work.targets.itl_quantile)
  sub = dataclasses.replace(work, targets=targets)

  def objective(index, lam):
    per = grid.per_replica[index]
    with np.errstate(divide="ignore", invalid="ignore"):
      if rate is None:
        value = -lam / per
      else:
        value = np.ceil(rate / np.where(lam > 0, lam, np.nan) * (1 - 1e-12)) * per
        if max_chips is not None:
          value = np.where(value <= max_chips, value, np.nan)
    return np.where(np.isfinite(value), value, np.inf)

  return plan_search.search(
      grid, model, sub, cheap, objective=objective, keep=1, buckets=keys, allowed=live,
      rates=cheap.decode_rate, evaluate=lambda index: plan_search.exact(
          grid, model, sub, index, cheap.decode_rate, decode_pool=True))


def _redo(grid, model, work, cheap, firsts: Sequence[plan_search.Found],
          waits: Sequence[float]) -> list[list[plan_search.Found | None]]:
  """Each found decode layout answered again with its slot wait's p90 within each of
  `waits` (one load-model pass, a row each)."""
  if not firsts:
    return []
  index = np.repeat([f.group for f in firsts], len(waits))
  wait = np.tile(np.asarray(waits, dtype=float), len(firsts)).reshape(-1, 1)
  targets = load_model.Targets(token_gap_s=work.targets.token_gap_s, ttft_s=wait,
                               itl_quantile=work.targets.itl_quantile)
  out = plan_search.exact(grid, model, dataclasses.replace(work, targets=targets), index,
                          cheap.decode_rate, decode_pool=True, keep_rows=True)
  return [out[i * len(waits):(i + 1) * len(waits)] for i in range(len(firsts))]


def _combine(grid, pre_groups, alone, budget, decode: plan_search.Found, rate, chips,
             max_chips) -> dict[str, Any] | None:
  """The prefill layout and pool size that go with `decode`: at a load the fewest prefill
  chips; at a fixed fleet the split of its chips that carries the most."""
  per_p = grid.per_replica[pre_groups]
  per_d = float(grid.per_replica[decode.group])
  if rate is not None:
    servers = load_pools.fewest_servers(rate, alone, budget)
    chips_p = np.where(servers > 0, servers * per_p, np.inf)
    i = int(np.argmin(chips_p))
    if not np.isfinite(chips_p[i]):
      return None
    n_d = math.ceil(rate / decode.rate * (1 - 1e-12))
    total = chips_p[i] + n_d * per_d
    if max_chips is not None and total > max_chips:
      return None
    return {
        "objective": total, "prefill": int(pre_groups[i]), "prefill_replicas": int(servers[i]),
        "decode_replicas": n_d, "fleet_rate": rate, "alone": float(alone[i])
    }
  best = None
  for i, g in enumerate(pre_groups):
    counts = np.arange(1, int(chips // per_p[i]) + 1, dtype=float)
    n_d = np.floor((chips - counts * per_p[i]) / per_d)
    exact = (counts * per_p[i] + n_d * per_d == chips) & (n_d >= 1)
    if not exact.any():
      continue
    carried = np.minimum(load_pools.pool_rate(counts, alone[i], budget[i]), n_d * decode.rate)
    carried = np.where(exact, carried, 0.0)
    j = int(np.argmax(carried))
    if carried[j] > 0 and (best is None or -carried[j] < best["objective"]):
      best = {
          "objective": -float(carried[j]), "prefill": int(g), "prefill_replicas": int(counts[j]),
          "decode_replicas": int(n_d[j]), "fleet_rate": float(carried[j]), "alone": float(alone[i])
      }
  return best


def _row(grid, devices, work, best, transfer, *, rate, chips, prices) -> dict[str, Any]:
  """One split plan, as the shared rows are (the decode pool's layout and batch)."""
  dec: plan_search.Found = best["decode"]
  g, gp = dec.group, best["prefill"]
  G = work.output_tokens
  device = devices[int(grid.device[g])]
  n_p, n_d, fleet = best["prefill_replicas"], best["decode_replicas"], best["fleet_rate"]
  cp, cd = int(n_p * grid.per_replica[gp]), int(n_d * grid.per_replica[g])
  total = cp + cd
  alone = best["alone"]
  queue = load_pools.pool_wait(fleet, alone, n_p)
  lam = min(fleet / n_d, dec.rate)
  decode_targets = load_model.Targets(token_gap_s=work.targets.token_gap_s,
                                      itl_quantile=work.targets.itl_quantile)
  at = load_model.at(dec.states, [lam], np.array([dec.column]), G, decode_targets, work.cv2)
  at = {k: float(v[0]) for k, v in at.items()}
  ttft = float(queue["wait_s"]) + alone + float(transfer[gp]) + at["ttft_s"]
  ttft_p90 = float(queue["wait_p90_s"]) + alone + float(transfer[gp]) + at["ttft_q_s"]
  per_hour = total * prices[device.name] if prices else None
  wname, kname = grid.class_members[int(grid.cls[g])][0]
  served = fleet * G
  return {
      "rank": 0, "rank_within_accelerator": 0, "accelerator": device.name, "chips": total,
      "tp": int(grid.tp[g]), "pp": int(grid.pp[g]), "ep": int(grid.ep[g]), "dp": n_d,
      "microbatches": int(grid.microbatches[g]), "batch": dec.B, "max_running": dec.B,
      "scheduler": "iteration", "token_budget": None, "weight_dtype": wname, "kv_dtype": kname,
      "merged": [
          {"weight_dtype": w, "kv_dtype": k} for w, k in grid.class_members[int(grid.cls[g])][1:]
      ], "step_s": dec.step_s, "loaded_token_gap_s": at["token_gap_s"], "prefill_s": alone,
      "ttft_s": ttft, "ttft_p90_s": ttft_p90, "itl_p99_s": load_model.itl_quantile(
          dec.states, lam, dec.column,
          G), "slot_wait_s": at["slot_wait_s"], "prefill_wait_s": float(queue["wait_s"]),
      "slot_utilisation": at["slot_utilisation"], "running": at["mean_running"],
      "arrival_rate_per_replica_per_s": lam, "max_rate_per_replica_s": dec.rate,
      "capacity_per_replica_per_s": dec.rate, "load_binds": "split", "comm_s": 0.0,
      "aggregate_tokens_per_s": min(dec.rate * n_d, fleet) * G,
      "replica_tokens_per_s": dec.B / dec.step_s, "per_sequence_tokens_per_s": 1 / dec.step_s,
      "tokens_per_s_per_chip": served / total, "chip_memory_bytes": float(
          plan_grid.chip_bytes(grid, np.array([g]), float(dec.B))[0]), "binds": "split pools",
      "headroom": dec.rate / lam, "cost_per_hour": per_hour, "cost_per_million_tokens":
          (None if per_hour is None else per_hour / (served * 3600 / 1e6)), "pools": {
              "kind": "split", "prefill_chips": cp, "decode_chips": cd,
              "slot_wait_share": best["share"], "prefill": {
                  "tp": int(grid.tp[gp]), "pp": int(grid.pp[gp]), "ep": int(grid.ep[gp]),
                  "replicas": n_p, "utilisation": fleet * alone / n_p,
                  "wait_p90_s": float(queue["wait_p90_s"]), "prefill_s": alone
              }, "decode": {
                  "tp": int(grid.tp[g]), "pp": int(grid.pp[g]), "ep": int(grid.ep[g]),
                  "replicas": n_d, "batch": dec.B, "max_running": dec.B,
                  "microbatches": int(grid.microbatches[g]),
                  "slot_utilisation": at["slot_utilisation"], "max_rate_per_replica_s": dec.rate
              }, "kv_transfer_s": float(transfer[gp]), "kv_link": _kv_link(device)[1]
          }, "network": grid.links[g].network, "fleet_rate_per_s": fleet,
      "fixed_fleet": chips is not None, "simulated": None
  }
