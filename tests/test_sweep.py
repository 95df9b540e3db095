"""decode_sweep: rows, summary, labels and bad input."""

import math

import numpy as np
import pytest

from jaxroof.errors import InputError
from jaxroof.symbolic.sweep import decode_sweep

LESSON = dict(N=8e9, q=2, T=1, k=2.5e8, BW=2e12)


def test_rows_and_summary_have_the_documented_keys():
  sweep = decode_sweep([1, 32], **LESSON, F=6e14)
  assert sweep["kind"] == "bound"
  row_keys = {
      "batch", "weight_bytes", "kv_bytes", "traffic_bytes", "memory_s", "compute_s", "step_s",
      "bound", "aggregate_tokens_per_s", "per_sequence_tokens_per_s"
  }
  assert row_keys <= set(sweep["rows"][0])
  assert {"weight_kv_crossover_batch", "memory_limit_tokens_per_s",
          "compute_crossover_batch"} <= set(sweep["summary"])


def test_memory_only_sweep_has_null_compute():
  sweep = decode_sweep([1, 8], **LESSON)
  assert all(r["compute_s"] is None and r["bound"] == "memory" for r in sweep["rows"])
  assert sweep["summary"]["compute_crossover_batch"] is None


def test_compute_binds_past_the_crossover_without_kv():
  # Tiny K/V: the compute crossover approaches the ridge batch R*q/2 = 300.
  sweep = decode_sweep([256, 512], N=8e9, q=2, T=1, k=1.0, BW=2e12, F=6e14)
  crossover = sweep["summary"]["compute_crossover_batch"]
  assert crossover == pytest.approx(300, rel=1e-6)
  assert [r["bound"] for r in sweep["rows"]] == ["memory", "compute"]
  row = sweep["rows"][1]
  assert row["step_s"] == pytest.approx(2 * 8e9 * 512 / 6e14)


def test_no_nan_anywhere():
  sweep = decode_sweep(list(range(1, 200)), **LESSON, F=6e14)
  for row in sweep["rows"]:
    for value in row.values():
      assert not (isinstance(value, float) and math.isnan(value))


def test_moe_weights_varying_with_batch():
  sweep = decode_sweep([1, 2, 4], N=np.array([1e9, 2e9, 3e9]), q=2, T=1, k=1e6, BW=1e12)
  assert [r["weight_bytes"] for r in sweep["rows"]] == [2e9, 4e9, 6e9]
  assert any("MoE" in note for note in sweep["summary"]["notes"])


@pytest.mark.parametrize("kwargs, match", [
    (dict(batch_sizes=[]), "batch_sizes is empty"),
    (dict(batch_sizes=[0]), r"batch_sizes\[0\]=0"),
    (dict(batch_sizes=[-3]), r"batch_sizes\[0\]=-3"),
    (dict(batch_sizes=[1.5]), "whole number"),
    (dict(BW=0.0), "BW=0.0"),
    (dict(F=-1.0), "F=-1.0"),
    (dict(q=float("nan")), "q=nan"),
    (dict(k="abc"), "not a number"),
])
def test_bad_input_names_the_parameter(kwargs, match):
  args = dict(batch_sizes=[1], **LESSON)
  args.update(kwargs)
  with pytest.raises(InputError, match=match):
    decode_sweep(args.pop("batch_sizes"), **args)


def test_token_gap_target_marks_rows_and_solves_the_batch():
  sweep = decode_sweep([8, 32, 33, 64], **LESSON, F=6e14, token_gap_s=0.012)
  assert [r["meets_token_gap"] for r in sweep["rows"]] == [True, True, False, False]
  summary = sweep["summary"]
  assert summary["largest_swept_batch_meeting_token_gap"] == 32
  assert summary["max_batch_for_token_gap"] == pytest.approx(32)  # The lesson's 12 ms.


def test_token_gap_excludes_batches_that_do_not_fit():
  sweep = decode_sweep([8, 32], **LESSON, token_gap_s=1.0, fits=[True, False])
  assert sweep["summary"]["largest_swept_batch_meeting_token_gap"] == 8


def test_unreachable_token_gap():
  # Reading 16 GB at 2 TB/s takes 8 ms: a 5 ms gap is out of reach at any batch.
  sweep = decode_sweep([1], **LESSON, token_gap_s=0.005)
  assert sweep["summary"]["largest_swept_batch_meeting_token_gap"] is None
  assert sweep["summary"]["max_batch_for_token_gap"] is None


def test_catalogue_step_floor_agrees_with_the_sweep_for_moe():
  """An MoE step (N read, N_act multiplied): the closed form the catalogue
  prints and the swept step time are one formula, so they agree."""
  from jaxroof.symbolic import catalogue
  values = dict(N=4.7e10, N_act=1.3e10, q=2.0, T=4096.0, k=131072.0, BW=3.35e12, F=9.89e14, B=512.0)
  [floor] = [row for row in catalogue.evaluate(values) if row["name"] == "step_floor"]
  swept = decode_sweep([512], N=values["N"], N_act=values["N_act"], q=2.0, T=4096.0, k=131072.0,
                       BW=3.35e12, F=9.89e14)["rows"][0]["step_s"]
  independent = max((4.7e10 * 2 + 512 * 4096 * 131072) / 3.35e12, 2 * 1.3e10 * 512 / 9.89e14)
  assert floor["value"] == pytest.approx(independent, rel=1e-12)
  assert swept == pytest.approx(independent, rel=1e-12)


@pytest.mark.parametrize("gap_ms, batch", [(12, 32), (9, 8)])
def test_answer_is_the_lessons_decision(gap_ms, batch):
  """The lesson: a 12 ms token gap allows 32 sequences, 9 ms allows 8
  ((16 GB + B * 0.25 GB) / 2 TB/s <= gap)."""
  summary = decode_sweep([1, 2, 4], **LESSON, F=6e14, token_gap_s=gap_ms / 1e3)["summary"]
  assert summary["answer_batch"] == batch
  assert summary["answer_binds"] == "token_gap"
  assert summary["answer_step_bound"] == "memory"


def test_answer_with_weights_varying_by_batch_matches_brute_force():
  """MoE-like: N grows with B; the answer is the largest whole B whose step
  meets the gap, checked against evaluating every B."""

  def weights(batch):
    return 1e9 + 7e9 * (1 - (1 - 0.25)**np.asarray(batch, dtype=float))

  gap = 0.006
  summary = decode_sweep([1], N=np.array([weights(1)]), q=2, T=1, k=1e7, BW=2e12, F=1e15, N_act=2e9,
                         token_gap_s=gap, weights_read=weights)["summary"]
  batch = np.arange(1, 5000, dtype=float)
  step = np.maximum((weights(batch) * 2 + batch * 1e7) / 2e12, 2 * 2e9 * batch / 1e15)
  assert summary["answer_batch"] == int(batch[step <= gap].max())


def test_answer_stops_at_memory_capacity():
  summary = decode_sweep([1], **LESSON, token_gap_s=1.0, max_batch_in_memory=50)["summary"]
  assert (summary["answer_batch"], summary["answer_binds"]) == (50, "memory_capacity")
  none = decode_sweep([1], **LESSON, token_gap_s=0.001)["summary"]
  assert none["answer_batch"] is None and none["answer_binds"] == "token_gap"
