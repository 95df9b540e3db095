"""Served steps by the prompts in them: a step of two or three prompts against one.

From each detailed result (`start_times`, `ttfts`, `itls`, `input_lens`): the requests
whose first tokens reach the client within 2 ms of each other were prefilled in one step;
that step's length is the token gap, ending there, of the requests decoding beside them
(their median). Steps are grouped by (prompts in the step, sequences decoding); per model,
each group's count, median and range. Kind: measurement (the client's token timestamps: a
step as the client saw it, front end included). Set beside `engine_prompts_probe_amx.json`
(the offline engine, same steps) and the cost model's step, it shows what serving adds.
Usage (project venv): python results/vllm_cpu/served_prompt_steps.py OUT.json RUN.json [...]
"""
import collections
import json
import os
import sys

import numpy as np

from jaxroof import files

SAME_STEP_S = 2e-3


def prompt_steps(path: str) -> list[dict]:
  """(prompts, prompt tokens, sequences decoding, step s) of each step holding a prompt
  whose length a decoding request's token gap shows."""
  raw = json.load(open(path))
  requests = [(start + ttft + np.concatenate([[0.0], np.cumsum(itls)]), tokens) for start, ttft,
              itls, tokens in zip(raw["start_times"], raw["ttfts"], raw["itls"], raw["input_lens"])]
  steps, seen = [], set()
  for i, (times, _) in enumerate(requests):
    if i in seen:
      continue
    first = times[0]
    together = [k for k, (t, _) in enumerate(requests) if abs(t[0] - first) < SAME_STEP_S]
    seen.update(together)
    gaps = []
    for k, (t, _) in enumerate(requests):
      ends = np.flatnonzero(np.abs(t[1:] - first) < SAME_STEP_S)
      if k not in together and len(ends):
        gaps.append(t[ends[0] + 1] - t[ends[0]])
    if gaps:
      steps.append({
          "prompts": len(together), "prompt_tokens": int(sum(requests[k][1] for k in together)),
          "decoding": len(gaps), "step_s": float(np.median(gaps))
      })
  return steps


def grouped(paths: list[str]) -> dict:
  """Per model (the file name's first word) and (prompts, decoding): count, median, range."""
  groups = collections.defaultdict(list)
  for path in paths:
    model = os.path.basename(path).split("_")[0]
    for step in prompt_steps(path):
      groups[(model, step["prompts"], step["decoding"])].append(step["step_s"])
  return {
      f"{model} {prompts} prompt(s), {decoding} decoding": {
          "steps": len(v), "median_s": float(np.median(v)), "min_s": float(min(v)),
          "max_s": float(max(v))
      } for (model, prompts, decoding), v in sorted(groups.items())
  }


if __name__ == "__main__":
  out, paths = sys.argv[1], sys.argv[2:]
  rows = grouped(paths)
  files.write_json(
      out, {
          "kind": "measurement", "what": __doc__.split("\n")[0], "runs": paths,
          "same_step_s": SAME_STEP_S, "groups": rows
      })
  for name, row in rows.items():
    print(f"{name}: {row['steps']} steps, median {row['median_s'] * 1e3:.0f} ms "
          f"({row['min_s'] * 1e3:.0f}-{row['max_s'] * 1e3:.0f})")
