"""Measured steps on parallel layouts: per-chip inputs, eta_comm, carry-over."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from jaxroof import errors
from jaxroof.calibrate import row_fit
from jaxroof.measure import user_measurements as um
from jaxroof.calibrate import layout_fit
from jaxroof.report import user_calibration

DATA = pathlib.Path(__file__).parent / "data"
GPTFAST = DATA / "gptfast_a100_tp_steps.csv"


def _row(line: int, **record) -> um.Row:
  base = {
      "model": "llama-2-7b", "accelerator": "h100-sxm", "phase": "decode", "batch": 1,
      "context": 512, "time_s": 0.01, "tp": 1
  }
  return um.parse_row("rows.csv", line, {**base, **record})


def test_comm_is_the_ring_allreduce_formula():
  # Independent arithmetic: Llama-2-7B (32 blocks, D 4096, V 32000) on 8 H100-SXM
  # (450 GB/s per chip in a collective, 0.6 us per hop), decode of B = 4 rows.
  row = _row(2, tp=8, batch=4)
  inputs = layout_fit.layout_inputs([row])
  # NCCL's base latency (6.6 us, ring LL) per collective; the cheaper of ring and one-shot
  # all-reduce (NVSwitch), the logits gathered directly.
  n, w, hop, base, rows = 8, 450e9, 0.6e-6, 6.6e-6, 4
  size = rows * 4096 * 2
  allreduce = base + min(2 * (n - 1) / n * size / w + 2 * (n - 1) * hop, (n - 1) * size / w + hop)
  gather = base + (n - 1) / n * rows * 32000 * 2 / w + hop
  assert inputs.decode_comm_s[0] == pytest.approx((2 * 32 + 1) * allreduce + gather, rel=1e-9)
  single = layout_fit.layout_inputs([_row(2, batch=4)])
  assert single.decode_comm_s[0] == 0
  assert inputs.decode["N"][0] == pytest.approx(single.decode["N"][0] / 8)
  # 32 K/V heads split over 8 chips.
  assert inputs.decode["k"][0] == pytest.approx(single.decode["k"][0] / 8)


def test_kv_replicated_beyond_kv_heads():
  # Llama-2-70B has 8 K/V heads: at tp 16 each chip still keeps 1/8 of the K/V.
  eight = layout_fit.layout_inputs([_row(2, model="llama-2-70b", tp=8)])
  sixteen = layout_fit.layout_inputs([_row(2, model="llama-2-70b", tp=16)])
  assert sixteen.decode["k"][0] == pytest.approx(eight.decode["k"][0])
  assert sixteen.decode["N"][0] == pytest.approx(eight.decode["N"][0] / 2)


def test_recovers_eta_comm_from_noisy_synthetic_rows():
  truth = dict(row_fit.FIXED_VALUES, eta_w=0.75, eta_kv=0.75, t0_step=3e-4, eta_comm=0.35)
  rows, line = [], 2
  for model in ("llama-2-7b", "llama-2-70b"):
    for tp in (1, 2, 4, 8):
      if model == "llama-2-70b" and tp == 1:
        continue
      for batch in (1, 16, 256):  # Large batches: communication grows unlike a fixed cost.
        rows.append(_row(line, model=model, tp=tp, batch=batch))
        line += 1
  clean = row_fit.predict_rows(rows, truth, inputs=layout_fit.layout_inputs)
  noise = np.exp(np.random.default_rng(0).normal(0, 0.01, len(rows)))
  noisy = [
      _row(r.line, model=r.model, tp=r.tp, batch=r.batch, time_s=t)
      for r, t in zip(rows, clean * noise)
  ]
  fit = row_fit.fit_rows(noisy, inputs=layout_fit.layout_inputs, steps=1200)
  assert "eta_comm" in fit.free
  assert fit.factors["eta_comm"] == pytest.approx(0.35, rel=0.15)
  assert fit.factors["eta_w"] == pytest.approx(0.75, rel=0.05)


def test_heldout_layouts_never_enter_the_fit(monkeypatch):
  seen = []

  def fake_fit(rows, **_):
    seen.append({r.line for r in rows})
    return row_fit.UserFit(factors=dict(row_fit.FIXED_VALUES), free=(), fixed={}, flags=(),
                           loss=0.0, rows=len(rows))

  monkeypatch.setattr(row_fit, "fit_rows", fake_fit)
  measurements = um.read_measurements(GPTFAST)
  result = layout_fit.layout_carry_over(measurements)
  by_line = {r.line: r for r in measurements.rows}
  for study in result["studies"].values():
    for fold in study["folds"]:
      train, held = set(fold["train_lines"]), set(fold["heldout_lines"])
      assert held and train and not train & held
      assert not set(fold["train_layouts"]) & set(fold["heldout_layouts"])
  # Each fold fits twice (with eta_comm, and the ideal split), on its training lines only.
  folds = [f for study in result["studies"].values() for f in study["folds"]]
  assert seen == [set(f["train_lines"]) for f in folds for _ in range(2)]
  leave_one_out = result["studies"]["leave_one_layout_out"]["folds"]
  assert {f["fold"] for f in leave_one_out} == {
      "hold out tp1-pp1-ep1", "hold out tp2-pp1-ep1", "hold out tp4-pp1-ep1", "hold out tp8-pp1-ep1"
  }
  single = result["studies"]["single_chip_to_layouts"]["folds"][0]
  assert all(by_line[i].tp == 1 for i in single["train_lines"])
  assert all(by_line[i].tp > 1 for i in single["heldout_lines"])


@pytest.mark.parametrize("record, column, words", [
    ({"tp": 3}, "tp", "does not divide"),
    ({"tp": 64}, "tp", "does not divide"),
    ({"accelerator": "a100-80gb", "tp": 16}, "tp", "scale-up domain"),
    ({"ep": 2}, "ep", "mixture-of-experts"),
    ({"model": "llama-2-70b", "accelerator": "a100-80gb", "tp": 1
     }, "tp", "cannot have been measured"),
])
def test_impossible_layouts_are_refused_naming_line_and_column(record, column, words):
  with pytest.raises(errors.InputError) as info:
    layout_fit.check_row("rows.csv", _row(7, **record))
  message = str(info.value)
  assert "\n" not in message
  assert f"rows.csv line 7, column {column!r}" in message and words in message


def test_pipeline_rows_need_the_layout_fit():
  row = _row(4, pp=2)
  with pytest.raises(errors.InputError, match="line 4, column 'pp'.*layout_fit"):
    um.decode_inputs([row])
  assert layout_fit.layout_inputs([row]).decode_comm_s[0] > 0  # One hand-off at least.


@pytest.mark.slow
def test_gptfast_layout_carry_over_beats_the_bound():
  # gpt-fast's A100 TP sweep (tests/data/SOURCES.md): fitted without a layout, the
  # calibrated prediction must be at least twice as accurate as the bound on it.
  result = layout_fit.layout_carry_over(um.read_measurements(GPTFAST), steps=800)
  study = result["studies"]["leave_one_layout_out"]
  assert study["calibrated"]["points"] == 17
  assert study["bound"]["median_rel_error"] >= 2 * study["calibrated"]["median_rel_error"]


def test_report_shows_the_layout_carry_over(tmp_path):
  measurements = um.read_measurements(GPTFAST)
  rows = [{
      "layout": "tp2-pp1-ep1", "measured_s": 1.0, "calibrated_s": 1.1, "bound_s": 0.5,
      "calibrated_rel_error": 0.1, "bound_rel_error": 0.5, "ideal_split_rel_error": 0.2
  }]
  summary = layout_fit._summaries(rows)
  result = {
      "file": measurements.path, "studies": {
          "leave_one_layout_out": {**summary, "by_heldout_layout": {"tp2-pp1-ep1": summary}}
      }
  }
  (tmp_path / "layout_carry_over_x.json").write_text(json.dumps(result))
  text = user_calibration.report_section(str(tmp_path))
  assert "| leave one layout out | tp2-pp1-ep1 | 1 | 10.0% | 20.0% | 50.0% |" in text
