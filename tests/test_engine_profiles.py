"""Shipped engine profiles: what they hold, what a prediction takes from them, and the
one-line refusals (an unknown engine, a bad profile file, an accelerator with no rule)."""

import json
import math

import pytest

from jaxroof.calibrate import published_fit as fit_lib
from jaxroof.calibrate import published_profile as profile_lib
from jaxroof.engines import engine_profiles as profiles
from jaxroof.engines import published
from jaxroof.errors import InputError
from jaxroof.symbolic import calibrated
from jaxroof.symbolic import terms


@pytest.mark.parametrize("engine", profile_lib.PROFILES)
def test_a_shipped_profile_holds_its_terms_errors_and_data(engine):
  data = profiles.load(engine)
  assert data["engine"] == engine and set(data["design"]["fitted"]) == set(fit_lib.DESIGN.fitted)
  for name, value in data["terms"].items():
    assert terms.get(name).check(value) == value
  referee_sources = {p.source for p in published.read_points() if p.split == "referee"}
  assert not set(data["data"]["sources"]) & referee_sources  # Never fitted on the referee.
  if data["points_used"]:
    assert data["heldout_by_source"] and data["median_rel_error"] is not None
    for row in data["heldout_by_source"]:
      assert row["points"] >= 1 and row["median_rel_error"] <= row["p90_rel_error"]
    for name, entry in data["accelerators"].items():
      assert entry["points_used"] >= 1 and set(entry["settings"]) >= {"u_mem", "n_max"}
  else:  # No point of its own it can take: the pooled terms, and that error.
    assert data["derived"]["median_rel_error"] is not None


def test_an_entry_carries_its_engines_terms_and_error():
  entry = profiles.entry("trtllm", "h200")
  data = profiles.load("trtllm")
  # The engine's terms, with the accelerator's own (kernel-fitted) ones in their place.
  own = data["accelerators"]["h200"]["terms"]
  assert not entry.derived and dict(entry.terms) == {**data["terms"], **own}
  assert entry.heldout_error["median_rel_error"] == data["median_rel_error"]
  model = profiles.step_model(entry)
  assert model.kind == "calibrated" and set(model.factors) == set(calibrated.FACTOR_NAMES)
  assert model.provenance["engine"] == "trtllm" and "held-out" in model.provenance["label"]


def test_nim_reads_tensorrt_llms_profile():
  assert profiles.entry("nim", "h100-sxm").profile == "trtllm"


def test_an_accelerator_not_measured_takes_a_derived_entry_with_a_wider_error():
  data = profiles.load("vllm")
  assert "a100-40gb" not in data["accelerators"]
  entry = profiles.entry("vllm", "a100-40gb")
  assert entry.derived and entry.terms == {**data["terms"]}
  assert entry.heldout_error["median_rel_error"] == data["derived"]["median_rel_error"]
  assert "derived" in entry.label


def test_an_accelerator_of_a_vendor_never_measured_is_refused_in_one_line():
  with pytest.raises(InputError) as e:
    profiles.entry("trtllm", "mi300x")
  assert "no entry for accelerator='mi300x' and no rule" in str(e.value)
  assert "\n" not in str(e.value) and e.value.field == "engine"


def test_an_unknown_engine_says_did_you_mean():
  with pytest.raises(InputError, match="Did you mean 'trtllm'"):
    profiles.check_engine("trtlm")
  assert profiles.check_engine("bound") == "bound"


@pytest.mark.parametrize("change, words", [
    (lambda d: d["terms"].pop("eta_w"), "missing"),
    (lambda d: d["terms"].update(eta_f=-0.5), "negative"),
    (lambda d: d["terms"].update(t0_step=float("nan")), "not a finite number"),
    (lambda d: d["terms"].update(eta_kv=1.5), "outside its bounds"),
    (lambda d: d.update(terms={}), "missing or empty"),
    (lambda d: d["terms"].update(eta_wx=0.5), "Did you mean"),
])
def test_a_bad_profile_file_is_one_line(tmp_path, change, words):
  data = json.loads(json.dumps(profiles.load("vllm")))
  change(data)
  path = tmp_path / "bad.json"
  path.write_text(json.dumps(data).replace("NaN", "NaN"))
  with pytest.raises(InputError) as e:
    profiles.check(json.loads(path.read_text()), "bad.json")
  assert words in str(e.value) and "\n" not in str(e.value)


def test_every_engine_lists_its_measured_accelerators():
  rows = {r["engine"]: r for r in profiles.summary()}
  assert set(rows) == set(profiles.ENGINES)
  assert "mi300x" in rows["vllm"]["accelerators"] and "h200" in rows["trtllm"]["accelerators"]
  assert rows["nim"]["accelerators"] == rows["trtllm"]["accelerators"]
  assert all(isinstance(r["heldout"], str) and r["heldout"] for r in rows.values())
  assert not math.isnan(profiles.load("trtllm")["p90_rel_error"])
