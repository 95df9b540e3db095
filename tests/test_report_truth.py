"""The report tells the truth about its own calibration.

- An efficiency outside (0, 1] is flagged, never shown as an achieved fraction.
- Under the per-operation bound, the text and the table name what binds each row the same way.
- "Held out" says what was held out: whole models the fit never saw, or other runs of the
  models it fitted; a profile applied to a model its error was not measured on says so.
- The real-engine section reads its two files and points at the CPU engine's page.
"""

from __future__ import annotations

import json
import re
import types

from jaxroof.report import accuracy
from jaxroof.report import calibration
from jaxroof.report import document
from jaxroof.report import real_engine
from jaxroof.report import simulate_lines
from jaxroof.report import sweep_table
from jaxroof.report import table
from jaxroof.symbolic.sweep import decode_sweep

FACTORS = {
    "eta_w": 0.9, "eta_kv": 57.7, "eta_f": 1.03, "t0_step": 1e-5, "t0_layer": 1e-4, "r_ovl": 0.5
}


def test_an_efficiency_outside_0_1_is_flagged_never_a_fraction():
  rows = {row[0].strip("`"): row for row in calibration.factor_rows(FACTORS)}
  for name in ("eta_kv", "eta_f"):
    assert "outside (0, 1]" in rows[name][1] and "achieved fraction" not in rows[name][2], rows[
        name]
  assert rows["eta_w"][1] == "0.900" and "achieved fraction" in rows["eta_w"][2]
  words = calibration.flagged_factors(FACTORS)
  assert "`eta_kv` = 57.7" in words and "`eta_f` = 1.03" in words and "eta_w" not in words
  assert calibration.flagged_factors({"eta_w": 1.0, "eta_f": 0.5}) == ""
  fit = {
      "factors": {"eta_f": 1.03, "eta_w": 0.5}, "free_factors": ["eta_f", "eta_w"],
      "fixed_factors": {}
  }
  lines = table.factor_table(fit).splitlines()
  assert "outside (0, 1]" in next(line for line in lines if line.startswith("eta_f"))
  assert "outside" not in next(line for line in lines if line.startswith("eta_w"))


def _claims(text: str) -> tuple[int | None, int | None]:
  """The batches from which the text says compute binds the step, and the linear layers."""
  whole = re.search(r"[Cc]ompute binds (?:the whole step )?from B = ([\d,]+)", text)
  linear = re.search(r"linear layers are compute-bound from B = ([\d,]+)", text)
  return tuple(None if m is None else int(m[1].replace(",", "")) for m in (whole, linear))


def test_the_sweep_text_and_table_name_what_binds_each_row_the_same_way(tmp_path):
  text = document.sweep_section(types.SimpleNamespace(out_dir=str(tmp_path)))
  whole, linear = _claims(text)
  rows = [line.split("|")[1:-1] for line in text.splitlines() if re.match(r"\| \d", line)]
  assert len(rows) == 13 and linear == 300  # The lesson's ridge: 600 TFLOP/s over 2 TB/s.
  for batch, *_, binds in rows:
    batch, binds = int(batch), binds.strip()
    assert binds.startswith("compute") == (whole is not None and batch >= whole), (batch, binds)
    assert ("linear layers compute-bound" in binds) == (batch >= linear and
                                                        not binds.startswith("compute"))


def test_the_fused_bound_keeps_one_roofline_per_row():
  sweep = decode_sweep([1, 64, 512, 4096], form="fused", N=8e9, q=2, T=1, k=2.5e8, BW=2e12, F=6e14)
  assert table.linear_compute_from(sweep) is None
  cells = table.sweep_rows(sweep["rows"], table.linear_compute_from(sweep))
  assert all("linear" not in c[-1] for c in cells)
  lines = sweep_table.summary_lines(sweep["summary"], linear=False)
  assert not any("linear layers" in line for line in lines)


def _engine_provenance(held: list[str], fitted: list[str], applied_to: str | None = None):
  return {
      "heldout_median_rel_error": 0.007, "heldout_max_rel_error": 0.02, "heldout_by": "model",
      "applied_to": applied_to, "source": {
          "model": "m/tiny-llama", "fit_models": fitted,
          "heldout_files": [f"{m}.json" for m in held], "heldout_models": held
      }
  }


def test_a_vllm_fit_says_its_held_out_runs_were_of_models_it_fitted():
  same = _engine_provenance(["m/tiny-llama", None], ["m/tiny-llama", "m/tiny-llama"])
  words = accuracy.sentence(same)
  assert "never saw" not in words
  assert "held-out runs of models the fit also saw (tiny-llama)" in words
  mixed = _engine_provenance(["m/tiny-llama", "m/medium-llama/config.json"], ["m/tiny-llama"])
  words = accuracy.sentence(mixed)
  assert "(tiny-llama)" in words and "whole models the fit never saw (medium-llama)" in words
  assert accuracy.fields(mixed)["profile_heldout_by"] == "runs"


def test_a_profile_of_one_model_shows_no_error_on_another():
  rows_fit = {
      "heldout_median_rel_error": 0.007, "heldout_max_rel_error": 0.02, "heldout_by": "rows",
      "models": ["llama-2-7b"]
  }
  other = {**rows_fit, "applied_to": "llama-3-8b"}
  assert accuracy.cell(other) == accuracy.NOT_MEASURED and "±" not in accuracy.cell(other)
  assert "llama-3-8b is none of those models: its error was not measured" in accuracy.sentence(
      other)
  assert accuracy.row_error(other) is None
  same = {**rows_fit, "applied_to": "llama-2-7b"}
  assert accuracy.cell(same).startswith("±0.7%") and accuracy.row_error(same) == 0.007
  engine = _engine_provenance(["m/tiny-llama"], ["m/tiny-llama"], applied_to="llama-3-8b")
  assert accuracy.cell(engine) == accuracy.NOT_MEASURED
  # Leave-one-model-out measures the carry-over itself: it applies to another model.
  by_model = {**rows_fit, "heldout_by": "model", "applied_to": "llama-3-8b"}
  assert accuracy.cell(by_model).startswith("±0.7%")
  table_text = simulate_lines.metrics_table("vllm", _metrics(), other)
  assert accuracy.NOT_MEASURED in table_text and "±" not in table_text


def _metrics() -> dict:
  stats = {"mean": 0.1, "median": 0.1, "p90": 0.2, "p99": 0.3}
  return {
      "completed": 10, "duration_s": 1.0, "request_throughput_per_s": 10.0,
      "output_throughput_tokens_per_s": 100.0, "ttft_s": stats, "tpot_s": stats, "itl_s": stats,
      "e2el_s": stats, "goodput_per_s": None
  }


def test_the_real_engine_section_reads_its_two_files_and_points_at_the_page(tmp_path):
  folder = tmp_path / real_engine.FOLDER
  folder.mkdir()
  row = {
      "run": "p/tiny_vllm_rate4.json:1 (rate 4)", "metric": "tpot", "percentile": 50,
      "measured_s": 0.010, "predicted_s": 0.011, "bound_s": 0.004, "rel_error": 0.1
  }
  fit = {
      "heldout": [row], "heldout_median_rel_error": 0.1, "heldout_max_rel_error": 0.1,
      "factors": {"eta_w": 1.2, "t0_step": 1e-3}, "source": {
          "files": ["p/tiny_vllm_rate2.json"], "fit_models": ["m/tiny-llama"],
          "heldout_files": ["p/tiny_vllm_rate4.json"], "heldout_models": ["m/tiny-llama"]
      }
  }
  (folder / real_engine.FIT).write_text(json.dumps(fit))
  (folder / "calibration_pass5_engine_kernels.json").write_text("{not read")
  text = real_engine.report_section(str(tmp_path), str(tmp_path))
  assert "held-out runs of models the fit also saw (tiny-llama)" in text
  assert "never saw" not in text
  assert "eta_w = 1.2 (outside (0, 1])" in text
  assert real_engine.DOC in text and "p50 TTFT/TPOT rows within 10%: 1 of 1" in text
