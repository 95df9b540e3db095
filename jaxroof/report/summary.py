"""The report's first screen: can these accelerators serve this model, and how?

For one model, one context and a list of accelerators (one chip each), the
summary answers the serving question with the library's own decision
(`jaxroof.serving.decision.decide`): whether the weights and one sequence's
K/V fit in memory, the largest decode batch whose mean token gap meets the
target and that fits, the token gap, TTFT and aggregate rate there, what binds
it (memory capacity, the token-gap target with a bandwidth- or compute-bound
step, or TTFT), and what would move it (the step's elasticities, and the same
decision with fp8 K/V or fp8 weights). Every figure is an analytic bound from
datasheet figures; where the repository ships a profile fitted to measured step
times of the same accelerator (`results/profile_<slug>_trtllm_0.9.0.json`),
the calibrated prediction of the batch, gap and rate stands beside it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

from jaxroof.errors import InputError
from jaxroof.measure import profiles
from jaxroof.serving import decision as decision_lib
from jaxroof.serving import requests
from jaxroof.specs.accelerators import known_accelerators, load_accelerator
from jaxroof.specs.models import load_model, shipped_models
from jaxroof.symbolic.step_model import StepModel

DEFAULT_MODEL = "llama-3-8b"
DEFAULT_CONTEXT = 4096
DEFAULT_ACCELERATORS = ("l40s", "a100-80gb", "h100-sxm", "h200", "b200", "mi300x",
                        "tpu-v5e", "tpu-v6e")
PROFILE_PATTERN = "profile_{slug}_trtllm_0.9.0.json"  # Under the results folder.
BINDS = {
    "memory": "memory capacity (K/V fills HBM)",
    "token_gap": "token-gap target (bandwidth-bound step)",
    "compute": "token-gap target (compute-bound step)",
    "communication": "token-gap target (communication)",
    "ttft": "TTFT target",
    "search_limit": "nothing up to the search limit",
}


@dataclasses.dataclass(frozen=True)
class Subject:
  """What the summary is about: a model, its context, devices and targets.

  Attributes:
    model: a shipped model name.
    context: tokens each sequence holds at its end (prompt + outputs).
    accelerators: shipped accelerator slugs, one chip each.
    output_tokens: outputs per request; the prompt is the rest of the context.
    token_gap_s: mean gap between one user's tokens, the target (s).
    ttft_s: mean time-to-first-token target (s).
    weight_dtype, kv_dtype: storage dtypes.
    arrival_rate: requests/s (Poisson) for TTFT; 0 is an idle prefill.
  """

  model: str = DEFAULT_MODEL
  context: int = DEFAULT_CONTEXT
  accelerators: tuple[str, ...] = DEFAULT_ACCELERATORS
  output_tokens: int = 256
  token_gap_s: float = 0.03
  ttft_s: float = 0.5
  weight_dtype: str = "bf16"
  kv_dtype: str = "bf16"
  arrival_rate: float = 0.0

  @property
  def prompt_tokens(self) -> int:
    return self.context - self.output_tokens

  def check(self) -> None:
    """Refuses an unknown model or accelerator, or a context that leaves no prompt or
    passes the model's, each as one line naming the flag, the value and what is allowed."""
    shipped = shipped_models()
    if self.model not in shipped:
      raise InputError(f"--model={self.model} is not allowed: give a shipped model, one of "
                       f"{', '.join(shipped)}.")
    known = known_accelerators()
    bad = [a for a in self.accelerators if a not in known]
    if not self.accelerators or bad:
      raise InputError(f"--accelerators={','.join(self.accelerators)} is not allowed: "
                       f"{', '.join(bad) or 'none given'}; give slugs of {', '.join(known)} "
                       "(comma-separated), or all.")
    limit = load_model(self.model).max_position_embeddings
    top = limit + 1 if isinstance(limit, int) else None  # Positions: prompt + outputs - 1.
    if self.prompt_tokens < 1 or (top is not None and self.context > top):
      raise InputError(
          f"--context={self.context} is not allowed: it must exceed --output_tokens="
          f"{self.output_tokens} (the prompt is the rest)"
          + (f" and be at most {top:,} ({self.model}'s max_position_embeddings + 1)"
             if top is not None else "") + ".")

  def describe(self) -> str:
    return (f"{self.model}, context {self.context:,} tokens ({self.prompt_tokens:,} prompt + "
            f"{self.output_tokens} outputs), {self.weight_dtype} weights, {self.kv_dtype} K/V")


def accelerator_list(values: list[str]) -> tuple[str, ...]:
  """Slugs of a comma-list flag's values, lower-cased, in order, once each; 'all' is
  every shipped accelerator (unknown ones are left for `Subject.check`)."""
  names = [v.strip().lower() for v in values if v.strip()]
  return known_accelerators() if names == ["all"] else tuple(dict.fromkeys(names))


def _decide(subject: Subject, slug: str, model: StepModel, **dtypes: str) -> tuple[
    dict[str, Any], requests.ServingInputs]:
  kinds = {"weight_dtype": subject.weight_dtype, "kv_dtype": subject.kv_dtype, **dtypes}
  inputs = requests.model_inputs(load_model(subject.model), load_accelerator(slug),
                                 prompt_tokens=subject.prompt_tokens,
                                 output_tokens=subject.output_tokens, **kinds)
  decision = decision_lib.decide(model, inputs, prompt_tokens=subject.prompt_tokens,
                                 output_tokens=subject.output_tokens,
                                 token_gap_s=subject.token_gap_s, ttft_s=subject.ttft_s,
                                 arrival_rate=subject.arrival_rate)
  return decision, inputs


def _calibrated_model(slug: str, results_dir: str) -> tuple[StepModel, str] | None:
  """The shipped profile of this accelerator, if any, and its file name in the repository."""
  name = PROFILE_PATTERN.format(slug=slug)
  path = os.path.join(results_dir, name)
  if not os.path.exists(path):
    return None
  profile = profiles.load_profile(path)
  profiles.check_applies(profile, slug)
  return profiles.step_model(profile, use_profile_ceilings=False), f"results/{name}"


def _headline(decision: dict[str, Any]) -> dict[str, Any]:
  keys = ("batch", "binds", "status", "reason", "step_s", "loaded_token_gap_s", "ttft_s",
          "aggregate_tokens_per_s", "per_sequence_tokens_per_s", "max_arrival_rate_per_s",
          "token_gap_limit_batch", "memory_limit_batch", "elasticities")
  return {k: decision.get(k) for k in keys}


def accelerator_entry(subject: Subject, slug: str, results_dir: str) -> dict[str, Any]:
  """One accelerator's answer: fit, bound decision, calibrated decision if shipped."""
  decision, inputs = _decide(subject, slug, StepModel.bound())
  memory = inputs.memory
  entry = {
      "accelerator": slug,
      "memory_gb": memory["memory_capacity_bytes"] / 1e9,
      "weights_gb": memory["resident_weight_bytes"] / 1e9,
      "kv_allocated_gb_per_sequence": memory["kv_allocated_bytes_per_sequence"] / 1e9,
      "max_batch_in_memory": inputs.max_batch_in_memory,
      "fits": bool(inputs.max_batch_in_memory and inputs.max_batch_in_memory >= 1),
      "bound": _headline(decision),
      "calibrated": None,
  }
  calibrated = _calibrated_model(slug, results_dir)
  if calibrated is not None and entry["fits"]:
    model, source = calibrated
    cal, _ = _decide(subject, slug, model)
    entry["calibrated"] = {**_headline(cal), "profile": source}
  return entry


def gap_only_limit(subject: Subject, slug: str) -> int | None:
  """The largest batch the token-gap target alone allows (memory not counted)."""
  inputs = requests.model_inputs(load_model(subject.model), load_accelerator(slug),
                                 prompt_tokens=subject.prompt_tokens,
                                 output_tokens=subject.output_tokens,
                                 weight_dtype=subject.weight_dtype, kv_dtype=subject.kv_dtype)
  decision = decision_lib.decide(
      StepModel.bound(), dataclasses.replace(inputs, max_batch_in_memory=None),
      prompt_tokens=subject.prompt_tokens, output_tokens=subject.output_tokens,
      token_gap_s=subject.token_gap_s, arrival_rate=subject.arrival_rate,
      with_elasticities=False)
  return decision.get("token_gap_limit_batch")


def what_moves(subject: Subject, entry: dict[str, Any]) -> list[dict[str, Any]]:
  """The same decision with fp8 K/V and with fp8 weights (those not already fp8)."""
  out = []
  for field in ("kv_dtype", "weight_dtype"):
    if getattr(subject, field) == "fp8":
      continue
    decision, _ = _decide(subject, entry["accelerator"], StepModel.bound(), **{field: "fp8"})
    out.append({"change": f"{field}=fp8", **_headline(decision)})
  return out


@functools.lru_cache(maxsize=4)
def summarise(subject: Subject, results_dir: str) -> dict[str, Any]:
  """The summary as JSON: one entry per accelerator, the best, and what moves it.

  Cached: the report's sections share one answer (do not modify the result).
  """
  subject.check()
  entries = [accelerator_entry(subject, slug, results_dir) for slug in subject.accelerators]
  serving = [e for e in entries if e["fits"] and e["bound"]["status"] == "ok"]
  best = max(serving, key=lambda e: e["bound"]["aggregate_tokens_per_s"], default=None)
  return {
      "kind": "report_summary",
      "subject": {**dataclasses.asdict(subject), "prompt_tokens": subject.prompt_tokens},
      "label": "analytic bound from datasheet figures (one chip); calibrated prediction "
               "where a profile fitted to this accelerator's measured step times ships",
      "accelerators": entries,
      "serving": [e["accelerator"] for e in serving],
      "best": None if best is None else best["accelerator"],
      "what_moves_best": [] if best is None else what_moves(subject, best),
      "best_token_gap_only_batch": None if best is None
      else gap_only_limit(subject, best["accelerator"]),
      "units": {"memory_gb": "GB (1e9 B)", "step_s": "s", "loaded_token_gap_s": "s",
                "ttft_s": "s (M/D/1 mean)", "aggregate_tokens_per_s": "tokens/s",
                "max_arrival_rate_per_s": "requests/s",
                "elasticities": "d ln(step_s) / d ln(input)"},
  }


def _ms(value: float | None) -> str:
  return "-" if value is None else f"{value * 1e3:,.1f}"


def _rate(value: float | None) -> str:
  return "-" if value is None else f"{value:,.0f}"


def _top_two(values: dict[str, float]) -> str:
  """The two inputs that move the step most, e.g. "BW -1.00, k +0.90"."""
  names = sorted(values, key=lambda n: -abs(values[n]))[:2]
  return ", ".join(f"{n} {values[n]:+.2f}" for n in names)


def table_rows(summary: dict[str, Any]) -> list[list[str]]:
  """Display rows: one per accelerator, the best first among those that serve."""
  rows = []
  for e in summary["accelerators"]:
    b, c = e["bound"], e["calibrated"]
    if not e["fits"]:
      rows.append([e["accelerator"], f"no ({e['weights_gb']:,.1f} GB weights, "
                   f"{e['memory_gb']:,.0f} GB)", "-", "-", "-", "-", "-", "-", "-"])
      continue
    served = b["status"] == "ok"
    rows.append([
        e["accelerator"] + (" **best**" if e["accelerator"] == summary["best"] else ""),
        f"yes, B <= {e['max_batch_in_memory']:,}" if served else f"no: {b['binds']}",
        f"{b['batch']}" if b["batch"] is not None else "-",
        _ms(b["loaded_token_gap_s"]), _ms(b["ttft_s"]), _rate(b["aggregate_tokens_per_s"]),
        BINDS.get(b["binds"], b["binds"]) if served else (b["reason"] or "-"),
        _top_two(b["elasticities"]) if b.get("elasticities") else "-",
        "-" if c is None or c["batch"] is None else
        f"B {c['batch']}, {_ms(c['loaded_token_gap_s'])} ms, {_rate(c['aggregate_tokens_per_s'])}"
        f" tok/s ({BINDS.get(c['binds'], c['binds']).split(' (')[0]})"])
  return rows


HEADERS = ("accelerator", "serves it? (fits in memory)", "batch", "token gap ms", "TTFT ms",
           "aggregate tok/s", "binds", "step moved by", "calibrated prediction")


def what_moves_lines(summary: dict[str, Any]) -> list[str]:
  """Bullets: the best accelerator's limits, elasticities and dtype what-ifs."""
  best = next((e for e in summary["accelerators"] if e["accelerator"] == summary["best"]), None)
  if best is None:
    return ["No listed accelerator serves it on one chip at these targets: see the multi-chip "
            "section (`python -m experiments.plan`)."]
  b = best["bound"]
  gap_limit, memory_limit = summary["best_token_gap_only_batch"], b["memory_limit_batch"]
  lines = [
      f"- On {best['accelerator']}: the token gap alone would allow B <= {gap_limit:,}, memory "
      f"alone B <= {memory_limit:,} ({best['weights_gb']:,.1f} GB weights, "
      f"{best['kv_allocated_gb_per_sequence']:,.3f} GB allocated K/V per sequence, "
      f"{best['memory_gb']:,.0f} GB less 10% workspace); the smaller is the answer.",
      "- The step's elasticities d ln(step)/d ln(x) at that batch: "
      + ", ".join(f"{k} {v:+.2f}" for k, v in b["elasticities"].items() if abs(v) >= 0.005)
      + " (BW -1: bandwidth moves it one for one; F 0: faster arithmetic would not).",
  ]
  for alt in summary["what_moves_best"]:
    if alt["batch"] is None:
      lines.append(f"- With {alt['change']}: {alt['status']} ({alt['binds']}).")
      continue
    lines.append(
        f"- With {alt['change']}: batch {alt['batch']:,} "
        f"({BINDS.get(alt['binds'], alt['binds'])}), "
        f"{_ms(alt['loaded_token_gap_s'])} ms token gap, {_rate(alt['aggregate_tokens_per_s'])} "
        f"tokens/s (x{alt['aggregate_tokens_per_s'] / b['aggregate_tokens_per_s']:.2f}).")
  return lines
