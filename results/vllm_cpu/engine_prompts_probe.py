"""A step of several prompts, timed through vLLM's offline engine: does the second prompt in
one step cost what the first does?

Served runs on the AMX Xeon put two or three 256-token prompts into one step when their
requests arrived together, and those steps took 2.3-3.1x (two) and 3.9-5.7x (three) a step
of one prompt beside the same decodes (client token times, medium-, small- and tiny-llama),
where the cost model charges about 2x and 3x. This probe times `LLM.generate` of N prompts
with one output token each (so one prefill step of N prompts, nothing decoding), N = 1-4 at
256 tokens, and one prompt of 512 and of 768 tokens (the same GEMM rows as two and three
prompts, one sequence): median of REPEATS after a warm-up, the engine pinned to core 1 as
`vllm_bench` pins the server. Then the same steps at token counts the engine has not run
(the last prompt 17-215 tokens longer; `cold`) and at that count once more (`cold_again`):
what a step pays the first time it meets a token count (its kernels built for it,
engine_cold_rows.py). Kind: measurement (wall time around generate: the step plus the
offline front end's fixed cost, which the N = 1 row holds).
Run with the engine's python (bash experiments/vllm_setup.sh DIR):
  DIR/bin/python results/vllm_cpu/engine_prompts_probe.py MODEL_DIR [MODEL_DIR ...] > OUT.jsonl
"""
import json
import os
import random
import statistics
import sys
import time

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "1")

REPEATS = int(os.environ.get("REPEATS", "7"))
SHAPES = ((1, 256), (2, 256), (3, 256), (4, 256), (1, 512), (1, 768))


def main(model_dirs: list[str]) -> None:
  from vllm import LLM, SamplingParams
  from vllm.inputs import TokensPrompt
  rng = random.Random(0)
  for model_dir in model_dirs:
    llm = LLM(model=model_dir, load_format="dummy", dtype="bfloat16", max_num_seqs=32,
              max_num_batched_tokens=2048, block_size=128, enable_chunked_prefill=True,
              max_model_len=2048, seed=0, skip_tokenizer_init=True)
    params = SamplingParams(max_tokens=1, ignore_eos=True, temperature=0, detokenize=False)

    def prompts(n: int, tokens: int) -> list:
      return [
          TokensPrompt(prompt_token_ids=[rng.randrange(3, 8000) for _ in range(tokens)])
          for _ in range(n)
      ]

    def timed(batch: list, engine=llm) -> float:
      start = time.perf_counter()
      engine.generate(batch, params, use_tqdm=False)
      return time.perf_counter() - start

    for n, tokens in SHAPES:
      timed(prompts(n, tokens))
      # Fresh ids each time (no prefix-cache hit); warm: a token count run before.
      times = [timed(prompts(n, tokens)) for _ in range(REPEATS)]
      # Cold: a token count this engine has not run (the last prompt longer by an amount no
      # other step used), then the same count again, warm.
      cold, again = [], []
      for r in range(REPEATS):
        extra = 17 + 2 * r + 40 * SHAPES.index((n, tokens))
        cold.append(timed(prompts(n - 1, tokens) + prompts(1, tokens + extra)))
        again.append(timed(prompts(n - 1, tokens) + prompts(1, tokens + extra)))
      print(
          json.dumps({
              "model": os.path.basename(model_dir.rstrip("/")), "prompts": n, "tokens": tokens,
              "median_s": statistics.median(times), "best_s": min(times), "times_s": times,
              "cold_median_s": statistics.median(cold),
              "cold_again_median_s": statistics.median(again), "cold_s": cold,
              "cold_again_s": again, "load": os.getloadavg()
          }), flush=True)
    del llm


if __name__ == "__main__":
  main(sys.argv[1:])
