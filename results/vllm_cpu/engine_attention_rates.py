"""The engine's own decode attention (vLLM's CPU kernel, `cpu_attention_with_kv_cache`, as the
CPU backend calls it: block size 128, bf16 K/V, this CPU's ISA) over a model's every layer, at
n sequences of `ctx` cached positions, on core 1 with one thread (as the served engine).

Each layer attends over its own K/V cache, so a step reads what the served step reads: the
K/V of n x ctx positions in every layer. In the served step each layer's weights stream
through the caches between two attention calls, so here a 64 MiB buffer is read before each
call (outside the timer): the K/V comes from DRAM, as in the engine, not from a warm L3.
Prints and writes, per model, n and ctx, the median of 9 passes after one warm-up, as time,
K/V GB/s, and time per sequence: whether the engine reads K/V at the rate it reads weights
(the cost model's eta_kv tied to eta_w) or slower. Then one prompt of P tokens attending
causally to itself (a prefill), as time and GFLOP/s (4 x heads x head_dim FLOPs per
(query, key) pair per layer): the rate the cost model's attention FLOPs run at (eta_attn).
`summary` holds both as the cost model holds them. Kind: measurement (time.perf_counter
around each call, summed over the layers; the kernel is synchronous).

Usage (engine venv, from results/vllm_cpu; about 20 s):
  python engine_attention_rates.py engine_attention_rates.json \
    models/tiny-llama/config.json models/small-llama/config.json models/medium-llama/config.json
  (env SEQS=1,2,...; CTXS=...; PROMPTS=...: other batches, contexts and prompts). The held
  factors are summary's rates over the pass's accelerator.json: eta_attn = prefill GFLOP/s /
  bf16 GFLOP/s, eta_kv = decode K/V GB/s net of FLOPs / read GB/s.
"""
import datetime, json, math, os, statistics, sys, time

import torch

os.sched_setaffinity(0, {1})
torch.set_num_threads(1)
# On an AMX CPU this asks Linux for the AMX tile state (arch_prctl; in the engine, oneDNN's
# first bf16 GEMM asks for it): without it the `amx` attention ISA dies of SIGILL.
torch.cpu._init_amx()
from vllm import _custom_ops as ops
from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

# The repository root, for the CPU's description (vllm_engine imports no jax).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from jaxroof.measure import vllm_engine  # noqa: E402

BLOCK = 128
SEQS = tuple(int(n) for n in os.environ.get("SEQS", "1,2,4,8,16").split(","))
CTXS = tuple(int(c) for c in os.environ.get("CTXS", "160,288,1024").split(","))
PROMPTS = tuple(int(p) for p in os.environ.get("PROMPTS", "128,256,512").split(","))
PASSES = 9

FLUSH = torch.ones(64 * 2**20 // 4)  # Read before each call: evicts the K/V from the L3.


def layer_caches(layers: int, blocks: int, kv_heads: int, head_dim: int):
  """One (key, value) cache view per layer, laid out as the CPU backend's forward makes them."""
  caches = []
  for _ in range(layers):
    kv = torch.randn(blocks, kv_heads, BLOCK, 2 * head_dim).to(torch.bfloat16)
    caches.append(kv.view(blocks, kv_heads, BLOCK * 2, head_dim).chunk(2, dim=2))
  return caches


def time_step(config: dict, n: int, ctx: int, prompt: bool = False) -> dict:
  """n decode rows over ctx cached positions each, or (`prompt`) one prompt of ctx tokens."""
  h, heads = config["hidden_size"], config["num_attention_heads"]
  kv_heads = config.get("num_key_value_heads") or heads
  head_dim = config.get("head_dim") or h // heads
  layers = config["num_hidden_layers"]
  per_seq = math.ceil(ctx / BLOCK)
  caches = layer_caches(layers, n * per_seq, kv_heads, head_dim)
  block_table = torch.arange(n * per_seq, dtype=torch.int32).view(n, per_seq)
  seq_lens = torch.full((n,), ctx, dtype=torch.int32)
  queries = ctx if prompt else 1
  starts = torch.arange(n + 1, dtype=torch.int32) * queries
  isa = _get_attn_isa(torch.bfloat16, BLOCK, head_dim, "auto")
  meta = ops.cpu_attn_get_scheduler_metadata(num_reqs=n, num_heads=heads, num_kv_heads=kv_heads,
                                             head_dim=head_dim, seq_lens=seq_lens,
                                             dtype=torch.bfloat16, query_start_loc=starts,
                                             causal=True, sliding_window_size=-1, isa=isa,
                                             enable_kv_split=True)
  query = torch.randn(n * queries, heads, head_dim).to(torch.bfloat16)
  out = torch.empty_like(query)

  def step() -> float:
    total = 0.0
    for key, value in caches:
      FLUSH.sum()
      t = time.perf_counter()
      ops.cpu_attention_with_kv_cache(query=query, key_cache=key, value_cache=value, output=out,
                                      query_start_loc=starts, seq_lens=seq_lens,
                                      scale=head_dim**-0.5, causal=True, alibi_slopes=None,
                                      sliding_window=-1, block_table=block_table, softcap=0.0,
                                      scheduler_metadata=meta, s_aux=None)
      total += time.perf_counter() - t
    return total

  step()
  times = sorted(step() for _ in range(PASSES))
  median = times[len(times) // 2]
  kv_bytes = layers * n * ctx * kv_heads * head_dim * 2 * 2
  pairs = n * (ctx * (ctx + 1) // 2 if prompt else ctx)
  flops = layers * 4 * heads * head_dim * pairs
  return {
      "model": config.get("_name"), "layers": layers, "heads": heads, "kv_heads": kv_heads,
      "head_dim": head_dim, "isa": isa, "phase": "prefill" if prompt else "decode", "sequences": n,
      "context": ctx, "median_s": median, "best_s": times[0], "GFLOPs": flops / median / 1e9,
      "spread": (times[-1] - times[0]) / median, "kv_bytes": kv_bytes,
      "kv_GBps": kv_bytes / median / 1e9, "per_sequence_s": median / n
  }


def summarise(rows: list[dict]) -> dict:
  """The kernel's rates as the cost model holds them: FLOPs at the prompts' median rate
  (eta_attn x F), and the K/V of decode rows of 2 or more sequences (one adds the kernel's
  fixed cost per call) at what is left of their time once those FLOPs are paid
  (eta_kv x BW); the gross K/V rate beside it."""
  decode = [r for r in rows if r["phase"] == "decode" and r["sequences"] >= 2]
  flop_rate = statistics.median(r["GFLOPs"] for r in rows if r["phase"] == "prefill") * 1e9
  net = [
      r["kv_bytes"] / (r["median_s"] - r["GFLOPs"] * 1e9 * r["median_s"] / flop_rate) / 1e9
      for r in decode
  ]
  models = dict.fromkeys(r["model"] for r in decode)
  return {
      "prefill_GFLOPs_median": flop_rate / 1e9,
      "decode_kv_GBps_net_of_flops_median": statistics.median(net),
      "decode_kv_GBps_net_of_flops_by_model": {
          m: statistics.median(v for v, r in zip(net, decode) if r["model"] == m) for m in models
      }, "decode_kv_GBps_median": statistics.median(r["kv_GBps"] for r in decode),
      "what": " ".join(summarise.__doc__.split())
  }


if __name__ == "__main__":
  out_path, *configs = sys.argv[1:]
  rows = []
  for path in configs:
    config = {**json.load(open(path)), "_name": os.path.basename(os.path.dirname(path))}
    for ctx in CTXS:
      for n in SEQS:
        row = time_step(config, n, ctx)
        rows.append(row)
        print(
            f"{row['model']:>13} ctx {ctx:5d} n {n:3d}: {row['median_s'] * 1e3:7.3f} ms "
            f"({row['spread']:.0%} spread), K/V {row['kv_GBps']:5.1f} GB/s, "
            f"{row['per_sequence_s'] * 1e3:.3f} ms/sequence", flush=True)
    for tokens in PROMPTS:
      row = time_step(config, 1, tokens, prompt=True)
      rows.append(row)
      print(
          f"{row['model']:>13} prompt {tokens:5d}: {row['median_s'] * 1e3:7.3f} ms "
          f"({row['spread']:.0%} spread), {row['GFLOPs']:5.1f} GFLOP/s", flush=True)
  summary = summarise(rows)
  print(json.dumps(summary))
  result = {
      "kind": "measurement", "what": __doc__.split("\n\n")[0].replace("\n", " "),
      "timing": f"time.perf_counter around each layer's call (64 MiB read before it, untimed), "
                f"summed over the layers; median of {PASSES} passes after one warm-up",
      "device": f"this VM's core 1 ({vllm_engine.cpu_model()}), one thread", "dtype": "bf16",
      "block_size": BLOCK, "date": datetime.datetime.now(datetime.timezone.utc
                                                        ).isoformat(timespec="seconds"),
      "load_average": os.getloadavg(), "torch": torch.__version__, "summary": summary, "rows": rows
  }
  tmp = out_path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(result, f, indent=1)
  os.replace(tmp, out_path)
