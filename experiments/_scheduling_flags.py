"""The scheduling a serving answer assumes, fixed by the user or chosen: --scheduler and
--token_budget, shared by `serving` and `plan` (the load model's schedulings,
`jaxroof.parallel.replica_load.options`). Left out, each answer takes the scheduling
with the largest max rate.

Import this module in an experiment to define the flags; read `SCHEDULER.value` and
`TOKEN_BUDGET.value`. (`simulate` has its own --scheduler: the simulator's, which
includes static batching and vLLM's.)
"""

from __future__ import annotations

from absl import flags

from jaxroof.parallel import replica_load

SCHEDULER = flags.DEFINE_enum(
    "scheduler", None, list(replica_load.SCHEDULERS),
    "Fix the scheduling (iteration: whole prompts join an iteration; chunked: prompts in "
    "chunks of --token_budget). Default: the one with the largest max rate.")
TOKEN_BUDGET = flags.DEFINE_integer("token_budget", None,
                                    "Fix the chunked scheduler's tokens per iteration. >= 2.",
                                    lower_bound=2)
