"""The schema of a serving-benchmark result: vLLM `bench serve` JSON, SGLang JSONL.

Every field `vllm_results` (`parse_run`, `run_to_row`, `_lengths`, `_detail`)
and the engine fit (`replica_of`: the `jaxroof_engine_run` block's server
facts) read, with what it may hold, and the bounds that keep the work a file
can ask for within the machine: at most `MAX_REQUESTS` requests per run, each
at most `MAX_TOKENS` long, times in `[0, MAX_SECONDS]`. The per-request lists
are as long as each other, and `itls` holds one list of gaps per request.
Fields no code reads (texts, errors, dates, notes) may hold anything.

`RUN` is one run (a JSON file holds one; a JSONL file one per line);
`KIND` bounds the file's size and nesting.
"""

from __future__ import annotations

from jaxroof import schema
from jaxroof.schema import Anything, Flag, ListOf, Number, Object, Positive, Text, Whole

MAX_REQUESTS = 100_000  # Per run: a real bench serve run sends 10-10,000.
MAX_TOKENS = 10**7  # Per request: above any model's context.
MAX_SECONDS = 1e6  # Any one time (11.6 days), in seconds.
MAX_RATE = 1e6  # Requests per second.
MAX_DEPTH = 8  # A run nests 4 levels (jaxroof_engine_run.server.config.*).
# The same keys as `vllm_engine.DETAIL_KEYS` (checked by the tests): per request.
DETAIL_KEYS = ("start_times", "input_lens", "output_lens", "ttfts", "itls")
RUN_KEY = "jaxroof_engine_run"  # `vllm_engine.RUN_KEY`.

_MS = Number(low=0, high=MAX_SECONDS * 1e3, null=True, unit="ms")
_SECONDS = Number(low=0, high=MAX_SECONDS, unit="s")
_COUNT = Whole(0, MAX_REQUESTS, null=True)
_TOKENS_TOTAL = Whole(0, MAX_REQUESTS * MAX_TOKENS, null=True)
_RATE = Number(low=0, low_open=True, high=MAX_RATE, null=True, infinite=True, words=("inf",),
               unit="requests/s")
_PER_REQUEST = dict(min_len=1, max_len=MAX_REQUESTS, null=True)
_TEXT = Text(max_len=1000, null=True, empty=True)

# Summary metrics vLLM writes per metric (ttft, tpot, itl, e2el): the mean, the
# median, the spread and the default percentiles; other percentiles pass.
_METRICS = {
    f"{stat}_{metric}_ms": _MS for metric in ("ttft", "tpot", "itl", "e2el", "e2e_latency")
    for stat in ("mean", "median", "std", "p50", "p90", "p95", "p99")
}

SERVER = Object(
    {
        "config": Object(
            {
                "max_num_seqs": Whole(1, MAX_REQUESTS, null=True),
                "max_num_batched_tokens": Whole(1, MAX_TOKENS, null=True),
                "chunked_prefill": Flag(null=True),
                "block_size": Whole(1, MAX_TOKENS, null=True),
                "max_model_len": Whole(1, MAX_TOKENS, null=True),
                "kv_space_gib": Number(low=0, high=1e6, null=True),
            }, null=True),
        "kv_blocks": Whole(1, 10**9, null=True),
        "kv_cache_tokens": Whole(1, 10**12, null=True),
        "start_s": Number(low=0, high=MAX_SECONDS, null=True),
    }, null=True)

ENGINE_RUN = Object(
    {
        "vllm_version": _TEXT,
        "server": SERVER,
        "bench": Object(
            {
                "rate": _RATE,
                "prompt_tokens": Whole(1, MAX_TOKENS, null=True),
                "output_tokens": Whole(1, MAX_TOKENS, null=True),
                "num_prompts": Whole(1, MAX_REQUESTS, null=True),
            }, null=True),
        "device": _TEXT,
    }, null=True)

RUN = Object(
    {
        "model_id": _TEXT,
        "endpoint_type": _TEXT,
        "backend": _TEXT,
        "concurrency": Number(low=0, high=MAX_REQUESTS, null=True),
        "request_rate": _RATE,
        "burstiness": Positive(1e6, null=True),
        "max_concurrency": Whole(1, MAX_REQUESTS, null=True),
        "num_prompts": _COUNT,
        "completed": _COUNT,
        "failed": _COUNT,
        "duration": Positive(MAX_SECONDS, null=True, unit="s"),
        "total_input_tokens": _TOKENS_TOTAL,
        "total_output_tokens": _TOKENS_TOTAL,
        "request_throughput": Number(low=0, high=MAX_RATE, null=True),
        "output_throughput": Number(low=0, high=1e12, null=True),
        "total_token_throughput": Number(low=0, high=1e12, null=True),
        **_METRICS,
        "input_lens": ListOf(Whole(0, MAX_TOKENS), **_PER_REQUEST),
        "output_lens": ListOf(Whole(0, MAX_TOKENS), **_PER_REQUEST),
        "ttfts": ListOf(_SECONDS, **_PER_REQUEST),
        "itls": ListOf(ListOf(_SECONDS, max_len=MAX_TOKENS, null=True), **_PER_REQUEST),
        "latencies": ListOf(_SECONDS, **_PER_REQUEST),
        "start_times": ListOf(Number(low=-1e12, high=1e12, unit="s"), **_PER_REQUEST),
        RUN_KEY: ENGINE_RUN,
        "generated_texts": Anything(),
        "errors": Anything(),
    }, rules=(schema.same_length(*DETAIL_KEYS), schema.same_length("input_lens", "output_lens"),
              schema.at_most("failed", "num_prompts"), schema.at_most("completed", "num_prompts")))

KIND = schema.FileKind(what="serving benchmark result", schema=RUN, max_depth=MAX_DEPTH)


def check_run(run: object, where: str, line: int | None = None, field: str = "from_vllm") -> None:
  """Checks one parsed run; `line` names its line in a JSONL file; `where` names the
  file (`from_vllm='a.json'`) and `field` the parameter errors carry."""
  schema.check(RUN, run, where=where if line is None else f"{where} line {line}", field=field)
