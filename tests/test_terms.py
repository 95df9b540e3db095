"""The cost-term registry: each term registered once, with its metadata, and every name a
user or a file sees (a held value's key, a profile's field, a result's JSON key, a
report's label) derived from it."""

from __future__ import annotations

import json

import pytest
import sympy as sp

from jaxroof import engines
from jaxroof import errors
from jaxroof.measure import profiles
from jaxroof.report import calibration as calibration_report
from jaxroof.symbolic import calibrated, cost_model, symbols, terms

CORE = ("eta_w", "eta_kv", "eta_f", "eta_f_prefill", "eta_attn", "eta_moe", "m_moe", "eta_comm",
        "r_ovl", "t0_step", "t0_layer", "t0_seq", "t0_request", "u_mem", "m_act", "m_graph",
        "x_free")
# Held for an engine's memory reservation (`symbolic/reservation.py`), not in the iteration.
MEMORY = {"u_mem", "m_act", "m_graph", "x_free"}
SIX = {"eta_w": 0.7, "eta_kv": 0.6, "eta_f": 0.5, "t0_step": 1e-4, "t0_layer": 1e-6, "r_ovl": 1.3}


def test_the_core_registers_the_terms_every_engine_has_once_with_their_metadata():
  core = terms.owned_by(terms.CORE)
  assert tuple(t.name for t in core) == CORE
  for term in core:
    assert term.symbol == sp.Symbol(term.name, positive=True)  # One symbol everywhere.
    assert symbols.BY_NAME[term.name].unit == term.unit  # The symbol table reads the registry.
    assert term.applies_to in terms.APPLIES_TO and term.obtained in terms.OBTAINED
    assert term.meaning and term.label and term.unit
    low, high = term.bounds
    assert low <= term.default <= high and (term.default > low or not term.low_open)
  # Efficiencies are absent at 1 (a whole ceiling), fixed costs at 0; eta_attn's 0 keeps
  # attention FLOPs with the linear layers'.
  assert {t.name for t in core if t.unit == "s"} == {"t0_step", "t0_layer", "t0_seq", "t0_request"}
  assert all(t.default == 0.0 for t in core if t.unit == "s")
  assert all(t.default == 1.0 for t in core if t.name.startswith("eta_") and t.name != "eta_attn")
  with pytest.raises(ValueError, match="registered already"):
    terms.register("eta_w", "1", "again", applies_to="weights", default=1.0, bounds=(0, 1),
                   obtained="fitted")
  with pytest.raises(ValueError, match="applies_to"):
    terms.register("eta_new", "1", "a share", applies_to="everything", default=1.0, bounds=(0, 1),
                   obtained="fitted")
  # A symbol is a term or a quantity of the model, never both.
  defined = [
      str(q.symbol) for group in (symbols.QUANTITIES, symbols.ARCHITECTURE, symbols.COST,
                                  symbols.SERVING, symbols.PARALLEL, symbols.ITERATION)
      for q in group
  ]
  assert not set(defined) & set(terms.registered())
  assert len(defined) == len(set(defined))


def test_the_cost_models_calibrated_inputs_are_the_core_terms_and_the_engines():
  assert {str(s) for s in cost_model.CALIBRATED_TERMS
         } == set(CORE) - {"eta_f_prefill", "t0_request"} - MEMORY
  for name in engines.ENGINES:
    own = {str(s) for s in cost_model.extension_terms((name,))}
    assert own == {t.name for t in terms.extension(name).terms}


@pytest.mark.parametrize("name", sorted(terms.registered()))
def test_a_terms_name_is_its_held_key_profile_field_and_label(name, tmp_path):
  """Held by name (`terms.parse`, what --hold and --engine_terms read), kept under that
  name in a profile and back, and shown by a report with the registry's meaning."""
  term = terms.get(name)
  value = term.bounds[1] if term.default == 0.0 else term.default
  extra = {"bw_llc": 1e11} if name in ("c_llc", "s_lru", "s_cold") else {}
  extra |= {"c_llc": 1e8} if name in ("s_lru", "s_cold") else {}
  held = terms.parse(",".join(f"{n}={v!r}" for n, v in {name: value, **extra}.items()))
  assert held[name] == value
  if name in calibrated.FACTOR_NAMES:
    return  # The six factors are a profile's `factors`, by the same names.
  prof = profiles.Profile(device_kind="cpu", platform="cpu", backend="xla", dtype="float32",
                          jax_version="0", created="", ceilings={}, factors=SIX, fit={}, terms=held)
  path = tmp_path / "p.json"
  profiles.save_profile(prof, path)
  assert json.loads(path.read_text())["terms"][name] == value
  assert profiles.load_profile(path).terms == held
  [row] = [r for r in calibration_report.factor_rows(SIX, {name: value}) if r[0] == f"`{name}`"]
  assert row[2] == term.meaning


@pytest.mark.parametrize("text, match", [
    ("eta_w=0.5,eta_w=0.6", "'eta_w' is given twice"),
    ("eta_w", "'eta_w' is not NAME=VALUE"),
    ("eta_w=fast", "eta_w=fast is outside its bounds"),
    ("t0_step=-1", r"t0_step=-1 is outside its bounds \[0, 10\] \(s;"),
    ("t0_step=nan", "t0_step=nan is outside"),
    ("eta_kv2=0.5", "'eta_kv2' is not a cost term. Did you mean 'eta_kv'"),
])
def test_a_bad_held_value_is_one_line_naming_the_term(text, match):
  with pytest.raises(errors.InputError, match=match) as raised:
    terms.parse(text)
  assert raised.value.field == "hold" and "\n" not in str(raised.value)
