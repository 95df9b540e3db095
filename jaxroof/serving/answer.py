"""The serving answer: can these accelerators serve this model, and how?

For one model, one context and a list of accelerators (one chip each, or the
fewest chips that hold the model: `jaxroof.parallel.fewest_chips`), `summarise`
answers the serving question with the library's own decision
(`jaxroof.serving.decision.decide`): whether the weights and one sequence's
K/V fit in memory, the largest decode batch whose mean token gap meets the
target and that fits, the token gap, TTFT and aggregate rate there, what binds
it (memory capacity, the token-gap target with a bandwidth- or compute-bound
step, or TTFT), and what would move it (the step's elasticities, and the same
decision with fp8 K/V or fp8 weights). Every figure is an analytic bound from
datasheet figures; where the repository ships a profile fitted to measured step
times of the same accelerator (`PROFILE_PATTERN` in the results folder given),
the calibrated prediction of the batch, gap and rate stands beside it, with the
profile's held-out error (and the bound's on the same data) next to it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from jaxroof.engines import engine_profiles
from jaxroof.errors import InputError
from jaxroof.measure import profiles
from jaxroof.parallel import engine_drive
from jaxroof.parallel import fewest_chips
from jaxroof.parallel.layout import Layout
from jaxroof.serving import decision as decision_lib
from jaxroof.serving import engine_serving
from jaxroof.serving import multichip
from jaxroof.serving import requests
from jaxroof.specs.accelerators import known_accelerators, load_accelerator
from jaxroof.specs.models import load_model, shipped_models
from jaxroof.symbolic.step_model import StepModel

DEFAULT_MODEL = "llama-3-8b"
DEFAULT_CONTEXT = 4096
DEFAULT_ACCELERATORS = ("l40s", "a100-80gb", "h100-sxm", "h200", "b200", "mi300x", "tpu-v5e",
                        "tpu-v6e")
PROFILE_PATTERN = "profile_{slug}_trtllm_0.9.0.json"  # Under the results folder.


@dataclasses.dataclass(frozen=True)
class Subject:
  """What the summary is about: a model, its context, devices and targets.

  Attributes:
    model: a shipped model name.
    context: tokens each sequence holds at its end (prompt + outputs).
    accelerators: shipped accelerator slugs (one chip, or the fewest that hold the model).
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
  engine: str = engine_drive.BOUND  # An engine: its predictions lead, the bound beside.

  @property
  def prompt_tokens(self) -> int:
    return self.context - self.output_tokens

  def check(self) -> None:
    """Refuses an unknown model or accelerator, or a context that leaves no prompt or
    passes the model's, each as one line naming the field, the value and what is allowed."""
    engine_profiles.check_engine(self.engine)
    shipped = shipped_models()
    if self.model not in shipped:
      raise InputError(
          f"model={self.model} is not allowed: give a shipped model, one of "
          f"{', '.join(shipped)}.", field="model")
    known = known_accelerators()
    bad = [a for a in self.accelerators if a not in known]
    if not self.accelerators or bad:
      why = "unknown: " + ", ".join(bad) if bad else "none given"
      raise InputError(
          f"accelerators={','.join(self.accelerators)} is not allowed: {why}; "
          f"give slugs of {', '.join(known)} (comma-separated), or all.", field="accelerators")
    limit = load_model(self.model).max_position_embeddings
    top = limit + 1 if isinstance(limit, int) else None  # Positions: prompt + outputs - 1.
    if self.prompt_tokens < 1 or (top is not None and self.context > top):
      raise InputError(
          f"context={self.context} is not allowed: it must exceed output_tokens="
          f"{self.output_tokens} (the prompt is the rest)" +
          (f" and be at most {top:,} ({self.model}'s max_position_embeddings + 1)"
           if top is not None else "") + ".", field="context")


def accelerator_list(values: list[str]) -> tuple[str, ...]:
  """Slugs of a comma-list flag's values, lower-cased, in order, once each; 'all' is
  every shipped accelerator (unknown ones are left for `Subject.check`)."""
  names = [v.strip().lower() for v in values if v.strip()]
  return known_accelerators() if names == ["all"] else tuple(dict.fromkeys(names))


def _decide(subject: Subject, slug: str, model: StepModel, layout: Layout | None = None,
            memory_binds: bool = True,
            **dtypes: str) -> tuple[dict[str, Any], requests.ServingInputs]:
  """The serving decision on one replica of `layout` (default one chip)."""
  kinds = {"weight_dtype": subject.weight_dtype, "kv_dtype": subject.kv_dtype, **dtypes}
  inputs = multichip.model_inputs(load_model(subject.model), load_accelerator(slug), layout=layout,
                                  prompt_tokens=subject.prompt_tokens,
                                  output_tokens=subject.output_tokens, **kinds)
  if not memory_binds:
    inputs = dataclasses.replace(inputs, max_batch_in_memory=None)
  decision = decision_lib.decide(model, inputs, prompt_tokens=subject.prompt_tokens,
                                 output_tokens=subject.output_tokens,
                                 token_gap_s=subject.token_gap_s, ttft_s=subject.ttft_s,
                                 arrival_rate=subject.arrival_rate, with_elasticities=memory_binds)
  return decision, inputs


def layout_name(layout: Layout) -> str:
  """"tp4", "tp8 pp2", "tp2 ep4": the parallel degrees above one."""
  parts = [f"{n}{getattr(layout, n)}" for n in ("tp", "pp", "ep") if getattr(layout, n) > 1]
  return " ".join(parts) or "1 chip"


def _fewest_chips(subject: Subject, slug: str) -> Layout | None:
  return fewest_chips.fewest_chips(load_model(subject.model), load_accelerator(slug),
                                   context=subject.context, weight_dtype=subject.weight_dtype,
                                   kv_dtype=subject.kv_dtype)


def _shipped_profile(slug: str, results_dir: str) -> tuple[profiles.Profile, str] | None:
  """The shipped profile of this accelerator, if any, and its file name in the repository."""
  name = PROFILE_PATTERN.format(slug=slug)
  path = os.path.join(results_dir, name)
  if not os.path.exists(path):
    return None
  profile = profiles.load_profile(path)
  profiles.check_applies(profile, slug)
  return profile, os.path.join(os.path.basename(os.path.normpath(results_dir)), name)


def _profile_errors(profile: profiles.Profile) -> dict[str, Any]:
  """The held-out errors a calibrated entry carries beside its figures."""
  return {
      "profile_heldout_median_rel_error": profile.heldout_median_rel_error,
      "profile_heldout_max_rel_error": profile.heldout_max_rel_error,
      "profile_heldout_by": profile.heldout_by,
      "bound_heldout_median_rel_error": profile.bound_heldout_median_rel_error,
      "worse_than_bound": profile.worse_than_bound
  }


def _headline(decision: dict[str, Any]) -> dict[str, Any]:
  keys = ("batch", "binds", "status", "reason", "step_s", "loaded_token_gap_s", "ttft_s",
          "aggregate_tokens_per_s", "per_sequence_tokens_per_s", "max_arrival_rate_per_s",
          "token_gap_limit_batch", "memory_limit_batch", "utilisation", "elasticities")
  return {k: decision.get(k) for k in keys}


def accelerator_entry(subject: Subject, slug: str, results_dir: str) -> dict[str, Any]:
  """One accelerator's answer: fit, bound decision, calibrated decision if shipped.

  A model that does not fit one chip is placed on the fewest chips whose
  memory holds it (tensor parallel first: `jaxroof.parallel.fewest_chips`).
  """
  decision, inputs = _decide(subject, slug, StepModel.bound())
  layout = Layout()
  if not inputs.max_batch_in_memory:
    wider = _fewest_chips(subject, slug)
    if wider is not None:
      layout = wider
      decision, inputs = _decide(subject, slug, StepModel.bound(), layout)
  memory = inputs.memory
  chips = layout.chips_per_replica
  entry = {
      "accelerator": slug,
      "layout": {"tp": layout.tp, "pp": layout.pp, "ep": layout.ep},
      "layout_name": layout_name(layout),
      "chips": chips,
      "memory_gb": memory["memory_capacity_bytes"] / 1e9,
      "weights_gb": memory["resident_weight_bytes"] / 1e9,
      "kv_allocated_gb_per_sequence": memory["kv_allocated_bytes_per_sequence"] / 1e9,
      "max_batch_in_memory": inputs.max_batch_in_memory,
      "fits": bool(inputs.max_batch_in_memory and inputs.max_batch_in_memory >= 1),
      "bound": _headline(decision),
      "calibrated": None,
  }
  rate = entry["bound"]["aggregate_tokens_per_s"]
  entry["aggregate_tokens_per_s_per_chip"] = None if rate is None else rate / chips
  if subject.engine != engine_drive.BOUND:
    entry.update(_engine_entry(subject, slug, layout, inputs) if entry["fits"] else {})
    return entry
  shipped = _shipped_profile(slug, results_dir)
  if shipped is not None and entry["fits"] and chips == 1:
    profile, source = shipped
    cal, _ = _decide(subject, slug, profiles.step_model(profile, use_profile_ceilings=False))
    entry["calibrated"] = {**_headline(cal), "profile": source, **_profile_errors(profile)}
  return entry


def _engine_entry(subject: Subject, slug: str, layout: Layout,
                  inputs: requests.ServingInputs) -> dict[str, Any]:
  """The subject's engine on this accelerator and layout (`engine_serving`): its decision
  as the calibrated entry, labelled with its held-out error; or the line refusing it."""
  try:
    d = engine_drive.drive(subject.engine, load_accelerator(slug), tp=layout.tp, pp=layout.pp)
  except InputError as e:
    return {"engine_note": str(e)}
  t0 = engine_serving.t0_request(d)
  decision = decision_lib.decide(d.model, engine_serving.inputs(d, inputs,
                                                                load_model(subject.model)),
                                 prompt_tokens=subject.prompt_tokens,
                                 output_tokens=subject.output_tokens,
                                 token_gap_s=subject.token_gap_s,
                                 ttft_s=max(subject.ttft_s - t0,
                                            1e-9), arrival_rate=subject.arrival_rate,
                                 scheduler=d.scheduler, token_budget=d.token_budget)
  head = _headline(decision)
  head["ttft_s"] = None if head["ttft_s"] is None else head["ttft_s"] + t0
  errors = d.entry.heldout_error
  return {
      "calibrated": {
          **head, "profile": d.entry.label, "engine": d.entry.engine, "heldout_error": dict(errors),
          "profile_heldout_by": "source",
          "profile_heldout_median_rel_error": errors.get("median_rel_error"),
          "profile_heldout_max_rel_error": errors.get("max_rel_error"), "t0_request_s": t0
      }
  }


def _layout(entry: dict[str, Any]) -> Layout:
  return Layout(**entry["layout"])


def best_load_limit(summary: dict[str, Any]) -> float:
  """Requests/s the best accelerator sustains at its answer (0 when nothing serves)."""
  best = next((e for e in summary["accelerators"] if e["accelerator"] == summary["best"]), None)
  return 0.0 if best is None else float(best["bound"]["max_arrival_rate_per_s"] or 0.0)


def best_layout(summary: dict[str, Any]) -> Layout | None:
  """The layout of the summary's best accelerator (None when nothing serves)."""
  best = next((e for e in summary["accelerators"] if e["accelerator"] == summary["best"]), None)
  return None if best is None else _layout(best)


def gap_only_limit(subject: Subject, entry: dict[str, Any]) -> int | None:
  """The largest batch the token-gap target alone allows (memory not counted)."""
  decision, _ = _decide(subject, entry["accelerator"], StepModel.bound(), _layout(entry),
                        memory_binds=False)
  return decision.get("token_gap_limit_batch")


def what_moves(subject: Subject, entry: dict[str, Any]) -> list[dict[str, Any]]:
  """The same decision with fp8 K/V and with fp8 weights (those not already fp8),
  on the same chips."""
  out = []
  for field in ("kv_dtype", "weight_dtype"):
    if getattr(subject, field) == "fp8":
      continue
    decision, _ = _decide(subject, entry["accelerator"], StepModel.bound(), _layout(entry),
                          **{field: "fp8"})
    out.append({"change": f"{field}=fp8", **_headline(decision)})
  return out


def summarise(subject: Subject, results_dir: str) -> dict[str, Any]:
  """The answer as JSON: one entry per accelerator, the best, and what moves it.

  `results_dir` is where shipped profiles are looked for; the best entry's
  `layout` and `max_arrival_rate_per_s` say where and at what load to look closer.
  """
  subject.check()
  entries = [accelerator_entry(subject, slug, results_dir) for slug in subject.accelerators]
  serving = [e for e in entries if e["fits"] and e["bound"]["status"] == "ok"]
  best = max(serving, key=lambda e: e["aggregate_tokens_per_s_per_chip"], default=None)
  return {
      "kind": "report_summary",
      "subject": {**dataclasses.asdict(subject), "prompt_tokens": subject.prompt_tokens},
      "label": "analytic bound from datasheet figures (one chip, or the fewest chips that "
               "hold the model); calibrated prediction " +
               ("where a profile fitted to this accelerator's measured step times ships"
                if subject.engine == engine_drive.BOUND else
                f"of {subject.engine} (its engine profile, scheduler defaults and memory rule)"),
      "engine": subject.engine,
      "accelerators": entries,
      "serving": [e["accelerator"] for e in serving],
      "best": None if best is None else best["accelerator"],
      "what_moves_best": [] if best is None else what_moves(subject, best),
      "best_token_gap_only_batch": None if best is None else gap_only_limit(subject, best),
      "units": {
          "memory_gb": "GB (1e9 B)", "step_s": "s", "loaded_token_gap_s": "s",
          "ttft_s": "s (M/D/1 mean)", "aggregate_tokens_per_s": "tokens/s",
          "max_arrival_rate_per_s": "requests/s", "elasticities": "d ln(step_s) / d ln(input)"
      },
  }
