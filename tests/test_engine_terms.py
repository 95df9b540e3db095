"""Engines as extensions of the one cost model: each engine's terms are registered once,
change the step by their formula, and the symbolic core names none of them.

The formulas are checked by hand from the models' config.json figures and the
accelerators' datasheets (`jaxroof/engines/vllm_cpu.py`, `jaxroof/engines/xla_cpu.py`).
"""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest
import sympy as sp

from jaxroof import engines
from jaxroof import errors
from jaxroof.engines import vllm_cpu, xla_cpu
from jaxroof.specs.accelerators import load_accelerator
from jaxroof.specs.iteration_model import IterationModel
from jaxroof.specs.models import load_model
from jaxroof.symbolic import calibrated, cost_model, terms
from jaxroof.symbolic import symbols as S
from jaxroof.symbolic.step_model import StepModel

ROOT = pathlib.Path(__file__).resolve().parents[1]
H100 = load_accelerator("h100-sxm")
FACTORS = {
    "eta_w": 0.7, "eta_kv": 0.6, "eta_f": 0.5, "t0_step": 1e-4, "t0_layer": 1e-6, "r_ovl": 1.3
}


def _cost(name: str, device) -> IterationModel:
  return IterationModel.on_device(load_model(name), device)


def test_every_engine_term_is_registered_once_by_its_engine_with_its_metadata():
  for name in engines.ENGINES:
    extension = terms.extension(name)
    assert extension.terms, name
    for term in extension.terms:
      assert term.owner == name and term.unit and term.meaning and term.label
      assert term.applies_to in terms.APPLIES_TO and term.obtained in terms.OBTAINED
      assert term.bounds[0] <= term.default <= term.bounds[1]
      assert term.symbol == sp.Symbol(term.name, positive=True)
  assert xla_cpu.TERM_NAMES == ("r_pack",)
  assert set(vllm_cpu.TERM_NAMES) == {
      "c_llc", "bw_llc", "s_lru", "m_pass", "t_act", "t_wake", "s_cold", "t_build"
  }
  with pytest.raises(ValueError, match="registered already"):
    terms.register("c_llc", "B", "again", applies_to="weights", default=0.0, bounds=(0, 1),
                   obtained="measured", owner="other")
  with pytest.raises(ValueError, match="registered already"):
    terms.extend(terms.Extension(vllm_cpu.NAME))


def test_the_symbolic_core_names_no_engine_term():
  """The core cost model holds only what applies to every engine: no engine's term name
  appears anywhere in jaxroof/symbolic (code or docstring), and no symbolic module imports
  an engine."""
  names = [t.name for n in engines.ENGINES for t in terms.extension(n).terms]
  for path in (ROOT / "jaxroof" / "symbolic").glob("*.py"):
    text = path.read_text()
    assert not re.search(r"^\s*(from|import) jaxroof\.engines", text, re.MULTILINE), path
    for name in names:
      assert not re.search(rf"\b{name}\b", text), (path.name, name)


def test_the_library_names_no_results_path_host_or_issue():
  """A later check holds the library to it: no results path, CPU model or issue number in
  the modules this refactor owns (symbolic, calibrate, measure, engines)."""
  pattern = re.compile(r"results/|EPYC|Xeon|[Ii]ssue [0-9]+")
  for part in ("symbolic", "calibrate", "measure", "engines"):
    for path in (ROOT / "jaxroof" / part).rglob("*"):
      if path.suffix in (".py", ".json") and "published" not in path.parts:
        found = pattern.search(path.read_text())
        assert not found, (str(path.relative_to(ROOT)), found.group(0))


def test_an_engines_term_brings_its_extension_and_absent_terms_their_defaults():
  plain = StepModel.calibrated(FACTORS)
  assert plain.extensions == () and plain.term_values() == {
      "t0_seq": 0.0, "eta_attn": 0.0, "eta_moe": 1.0, "m_moe": 0.0, "eta_comm": 1.0
  }
  held = StepModel.calibrated(FACTORS, terms={"t_act": 1e-9, "r_pack": 0.5})
  assert held.extensions == ("vllm_cpu", "xla_cpu")
  values = held.term_values()
  assert values["t_act"] == 1e-9 and values["r_pack"] == 0.5 and values["c_llc"] == 0.0
  with pytest.raises(errors.InputError, match=r"s_lru=2.0 is outside its bounds \[0, 1\]"):
    StepModel.calibrated(FACTORS, terms={"s_lru": 2.0})
  with pytest.raises(errors.InputError, match=r"c_llc=1e\+07 without bw_llc"):
    StepModel.calibrated(FACTORS, terms={"c_llc": 1e7})


def test_calibrated_re_pack_is_xla_cpus_formula():
  subs = {
      **cost_model.decode_specialisation(S.B, S.T, S.N * S.q, S.N_act, S.k, 0), S.t_comm: 0,
      S.o_ovl: 0
  }
  ours = cost_model.calibrated_terms(("xla_cpu",))["repack_s"].subs(subs)
  assert sp.simplify(ours - xla_cpu.repack_time(S.B, S.N * S.q, S.eta_w * S.BW)) == 0
  # By hand: one re-pack of the weights from two rows on, none at one.
  model = StepModel.calibrated(FACTORS, terms={"r_pack": 1.5})
  values = dict(T=900.0, N=3e9, q=2.0, k=4e4, BW=2e12, F=3e14, L=30.0)
  plain = StepModel.calibrated(FACTORS)
  for batch, reads in ((1.0, 0.0), (2.0, 1.5), (64.0, 1.5)):
    extra = (model.evaluate(B=np.array([batch]), **values)["step_s"][0] -
             plain.evaluate(B=np.array([batch]), **values)["step_s"][0])
    assert extra == pytest.approx(reads * 6e9 / (0.7 * 2e12), rel=1e-9, abs=1e-15)


def test_the_shipped_measurements_are_in_bounds_and_carry_their_provenance():
  for host in vllm_cpu.hosts():
    held = vllm_cpu.measured_terms(host)
    assert held and set(held) <= set(terms.registered())
    data = vllm_cpu._data()["hosts"][host]  # pylint: disable=protected-access
    assert set(data["provenance"]) == set(held), host
  with pytest.raises(errors.InputError, match="Did you mean"):
    vllm_cpu.measured_terms("amx_16")


def test_an_engines_elementwise_kernels_cost_t_act_per_row_and_activation_element():
  """vLLM CPU's inductor kernels between its GEMMs took 1.2-1.9 ns per token per element of
  each block's hidden and MLP widths (`data/vllm_cpu.json`). With t_act
  held, an iteration pays t_act * rows * A_w on top, A_w = layers * (hidden + intermediate)
  by hand for a dense model; the decode step of StepModel, given A_w, and the iteration
  model's decode agree; t_act = 0 is the model without it."""
  factors = FACTORS
  t_act = 1.5e-9
  with_act = StepModel.calibrated(factors, terms={"t_act": t_act})
  off = StepModel.calibrated(factors, terms={"t_act": 0.0})
  plain = StepModel.calibrated(factors)
  spec = load_model("llama-3-8b")
  widths = spec.num_layers * (spec.hidden_size + spec.intermediate_size)
  cost = _cost("llama-3-8b", H100)
  assert cost.constants["A_w"] == widths
  for tokens in (1.0, 128.0, 2048.0):
    extra = (float(cost.prefill(tokens, 1.0, with_act)["step_s"]) -
             float(cost.prefill(tokens, 1.0, plain)["step_s"]))
    assert extra == pytest.approx(t_act * tokens * widths, rel=1e-9)
    assert float(cost.prefill(tokens, 1.0, off)["step_s"]) == pytest.approx(
        float(cost.prefill(tokens, 1.0, plain)["step_s"]), rel=1e-12)
  values = dict(T=900.0, N=3e9, q=2.0, k=4e4, BW=2e12, F=3e14, L=30.0)
  for batch in (1.0, 8.0, 64.0):
    iteration = (float(cost.decode(batch, 900.0, with_act)["step_s"]) -
                 float(cost.decode(batch, 900.0, plain)["step_s"]))
    step = (with_act.evaluate(B=np.array([batch]), A_w=widths, **values)["step_s"][0] -
            plain.evaluate(B=np.array([batch]), **values)["step_s"][0])
    assert iteration == pytest.approx(t_act * batch * widths, rel=1e-9)
    assert step == pytest.approx(iteration, rel=1e-9)
  assert with_act.evaluate(B=np.array([8.0]), **values)["step_s"][0] == pytest.approx(
      plain.evaluate(B=np.array([8.0]), **values)["step_s"][0], rel=1e-12)


def test_an_engines_gemm_reads_the_weights_once_per_rows_per_pass():
  """vLLM CPU's oneDNN GEMM multiplies up to m_pass rows in one pass over the weights:
  medium-llama's decoder GEMMs took 0.4-0.9 more passes than the line through 128-256 rows
  at M from 257 to 513, and the offline engine's steps of N 256-token prompts grew by a read
  per m_pass rows (`data/vllm_cpu.json`). By
  hand, a step of tokens pays ceil(tokens / 256) - 1 more reads of the linear weights at
  eta_w * BW, the LM head apart; m_pass = 0 is the model without the term, and the decode
  step agrees."""
  factors = FACTORS
  plain = StepModel.calibrated(factors)
  blocked = StepModel.calibrated(factors, terms={"m_pass": 256})
  off = StepModel.calibrated(factors, terms={"m_pass": 0})
  cost = _cost("llama-3-8b", H100)
  one_read = cost.constants["W_b"] / (0.7 * H100.memory_bandwidth_bytes_per_s)
  for prompt, decoding, passes in ((256, 0, 0), (255, 1, 0), (256, 1, 1), (256, 3, 1), (512, 0, 1),
                                   (512, 1, 2), (1024, 0, 3), (200, 100, 1)):
    mix = cost.mix(decode_context=[900.0] * decoding, chunk_offset=[0.0], chunk_tokens=[prompt])
    step = {
        name: float(cost.evaluate(mix, model)["step_s"])
        for name, model in (("plain", plain), ("blocked", blocked), ("off", off))
    }
    assert step["blocked"] - step["plain"] == pytest.approx(passes * one_read, rel=1e-9,
                                                            abs=1e-15), (prompt, decoding)
    assert step["off"] == pytest.approx(step["plain"], rel=1e-12)
  values = dict(T=900.0, N=3e9, q=2.0, k=4e4, BW=2e12, F=3e14, L=30.0)
  for batch, passes in ((8.0, 0), (256.0, 0), (300.0, 1), (600.0, 2)):
    b = np.array([batch])
    extra = blocked.evaluate(B=b, **values)["step_s"][0] - plain.evaluate(B=b, **
                                                                          values)["step_s"][0]
    assert extra == pytest.approx(passes * 3e9 * 2.0 / (0.7 * 2e12), rel=1e-9, abs=1e-15)
    assert float(cost.decode(batch, 900.0, blocked)["step_s"]) - float(
        cost.decode(batch, 900.0, plain)["step_s"]) == pytest.approx(passes * one_read, rel=1e-9,
                                                                     abs=1e-15)


def test_an_engines_cached_weights_read_at_the_caches_rate():
  """An engine on a CPU finds the first c_llc bytes of a step's weights in its cache and
  reads them at bw_llc, the rest at eta_w * BW (a CPU with AMX: 26-50 MB at about 22 GB/s,
  201-403 MB at 12-14). By hand, for the iteration model and the decode step:
  c_llc = 0 is the model without the term, weights that fit read wholly at bw_llc (eta_w
  no longer matters), and a cache of a third of them splits the read."""
  factors = FACTORS
  cost = _cost("llama-3-8b", H100)
  dram, cache_rate = 0.7 * H100.memory_bandwidth_bytes_per_s, 5e12
  plain = StepModel.calibrated(factors)
  for share in (0.0, 2.0, 1 / 3):
    cached = share * (cost.constants["W_b"] + cost.constants["W_h"])
    model = StepModel.calibrated(factors, terms={"c_llc": cached, "bw_llc": cache_rate})
    for batch in (1.0, 64.0):  # The linear layers, the head and the rows' embeddings.
      weights = cost.constants["W_b"] + cost.constants["W_h"] + cost.constants["r_e"] * batch
      hit = min(cached, weights)
      assert float(cost.decode(batch, 900.0, model)["weight_s"]) == pytest.approx(
          hit / cache_rate + (weights - hit) / dram, rel=1e-9)
    values = dict(B=np.array([4.0]), T=900.0, N=3e9, q=2.0, k=4e4, BW=2e12, F=3e14, L=30.0)
    by_hand = min(cached, 6e9) / cache_rate + (6e9 - min(cached, 6e9)) / (0.7 * 2e12)
    if cached == 0.0:
      by_hand = 6e9 / (0.7 * 2e12)
      assert model.evaluate(**values)["step_s"][0] == pytest.approx(
          plain.evaluate(**values)["step_s"][0], rel=1e-12)
    assert float(np.ravel(model.evaluate(**values)["weight_s"])[0]) == pytest.approx(
        by_hand, rel=1e-9)


def test_a_cold_cache_reads_the_cached_bytes_from_memory():
  """After an idle gap the cache is cold: `cold_cache_s` is what the same step pays more
  when its cached bytes come from memory at eta_w * BW instead of at bw_llc. By hand: 0
  without a cache, min(W, c_llc) * (1 / (eta_w BW) - 1 / bw_llc) with one, and the step's
  weight read at c_llc = 0 less the one with the cache; it is not in the step's time, and a
  cache held slower than memory costs nothing cold."""
  factors = FACTORS
  cost = _cost("llama-3-8b", H100)
  dram, cache_rate = 0.7 * H100.memory_bandwidth_bytes_per_s, 5e12
  weights = cost.constants["W_b"] + cost.constants["W_h"] + cost.constants["r_e"]
  cold = StepModel.calibrated(factors)
  for cached in (0.0, weights / 3, 2 * weights):
    model = StepModel.calibrated(factors, terms={"c_llc": cached, "bw_llc": cache_rate})
    terms = cost.decode(1.0, 900.0, model)
    hit = min(cached, weights)
    assert float(terms["cold_cache_s"]) == pytest.approx(hit / dram - hit / cache_rate, rel=1e-9,
                                                         abs=1e-15)
    assert float(terms["cold_cache_s"]) == pytest.approx(
        float(cost.decode(1.0, 900.0, cold)["weight_s"]) - float(terms["weight_s"]), rel=1e-9,
        abs=1e-15)
    if hit:  # The busy step keeps its cache's speed: the cold cost is charged apart.
      assert float(terms["step_s"]) < float(cost.decode(1.0, 900.0, cold)["step_s"])
  slow_cache = StepModel.calibrated(factors, terms={"c_llc": weights, "bw_llc": dram / 2})
  assert float(cost.decode(1.0, 900.0, slow_cache)["cold_cache_s"]) == 0.0


def test_an_lru_cache_keeps_less_as_the_weights_outgrow_it():
  """A step scans its weights in one order, so an LRU cache (s_lru = 1) that the scan
  outgrows keeps 2 c_llc - W of them, and none past twice its size; s_lru = 0 keeps c_llc of
  any larger set, and a set that fits is cached whole either way. By hand for the iteration
  model, the decode step and the cold cost, at weights of 0.5, 1.5 and 2.5 cache sizes."""
  factors = FACTORS
  cost = _cost("llama-3-8b", H100)
  dram, cache_rate = 0.7 * H100.memory_bandwidth_bytes_per_s, 5e12
  weights = cost.constants["W_b"] + cost.constants["W_h"] + cost.constants["r_e"]
  for size in (0.5, 1.5, 2.5):
    cache = weights / size
    for lru in (0.0, 0.5, 1.0):
      model = StepModel.calibrated(factors,
                                   terms={"c_llc": cache, "bw_llc": cache_rate, "s_lru": lru})
      hit = min(weights, cache) if weights <= cache else max(0.0, cache - lru * (weights - cache))
      terms = cost.decode(1.0, 900.0, model)
      assert float(terms["weight_s"]) == pytest.approx(hit / cache_rate + (weights - hit) / dram,
                                                       rel=1e-9)
      assert float(terms["cold_cache_s"]) == pytest.approx(hit / dram - hit / cache_rate, rel=1e-9,
                                                           abs=1e-15)
      values = dict(B=np.array([4.0]), T=900.0, N=3e9, q=2.0, k=4e4, BW=2e12, F=3e14, L=30.0)
      small = 6e9 / size  # The decode step's weights: N q = 6e9 bytes.
      step = StepModel.calibrated(factors,
                                  terms={"c_llc": small, "bw_llc": cache_rate, "s_lru": lru})
      by_hand = min(6e9, small) if size < 1 else max(0.0, small - lru * (6e9 - small))
      assert float(np.ravel(step.evaluate(**values)["weight_s"])[0]) == pytest.approx(
          by_hand / cache_rate + (6e9 - by_hand) / (0.7 * 2e12), rel=1e-9)
  one = StepModel.calibrated(factors, terms={"c_llc": weights / 1.5, "bw_llc": cache_rate})
  lru = StepModel.calibrated(factors,
                             terms={"c_llc": weights / 1.5, "bw_llc": cache_rate, "s_lru": 1.0})
  assert float(cost.decode(1.0, 900.0,
                           lru)["step_s"]) > float(cost.decode(1.0, 900.0, one)["step_s"])


def test_an_engines_extra_pass_over_the_weights_reads_through_its_cache():
  """The GEMM's one more read past m_pass rows re-reads the same weights, so their cached
  bytes come from the cache again: by hand, past 256 rows the step pays min(W, c_llc) /
  bw_llc + the rest at eta_w * BW once more (the linear layers' bytes, the head apart)."""
  factors = FACTORS
  cost = _cost("llama-3-8b", H100)
  dram, cache_rate = 0.7 * H100.memory_bandwidth_bytes_per_s, 5e12
  linear = cost.constants["W_b"]
  for cached in (0.0, linear / 4, 2 * linear):
    engine = {"c_llc": cached, "bw_llc": cache_rate}
    without = StepModel.calibrated(factors, terms=engine)
    blocked = StepModel.calibrated(factors, terms={**engine, "m_pass": 256})
    hit = min(cached, linear)
    one_read = hit / cache_rate + (linear - hit) / dram
    for prompt, passes in ((255, 0), (511, 1), (512, 2)):  # One decode row beside the prompt.
      mix = cost.mix(decode_context=[900.0], chunk_offset=[0.0], chunk_tokens=[prompt])
      extra = float(cost.evaluate(mix, blocked)["step_s"]) - float(
          cost.evaluate(mix, without)["step_s"])
      assert extra == pytest.approx(passes * one_read, rel=1e-9, abs=1e-15), (cached, prompt)
