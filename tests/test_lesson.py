"""The lesson walk-through: every claim agrees, and a wrong figure would not."""

import dataclasses

from jaxroof.serving import lesson_claims


def test_every_claim_agrees():
  bad = [c.claim for c in lesson_claims.all_claims() if not c.agrees]
  assert not bad


def test_claims_cover_the_worked_numbers_and_the_quiz():
  claims = lesson_claims.all_claims()
  sections = {c.section for c in claims}
  assert {f"check yourself {i}" for i in range(1, 6)} <= sections
  expected = {c.expected for c in claims}
  for figure in (32, 64, 320, 5, 300, 16, 24, 0.012, 2667, 83, 111, 123, 8.125, 9, 8000, 2000):
    assert figure in expected, figure


def test_a_wrong_expectation_is_caught():
  claim = lesson_claims.worked_numbers()[0]
  assert not dataclasses.replace(claim, expected=claim.expected + 1).agrees
  rounded = dataclasses.replace(claim, expected=123, computed=123.4, tolerance=0.5)
  assert rounded.agrees
  assert not dataclasses.replace(rounded, computed=123.6).agrees
  assert not dataclasses.replace(claim, expected="no", computed="yes").agrees
