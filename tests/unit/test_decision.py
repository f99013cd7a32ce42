"""The pure decision of one golden check (run/decision.py): verdict, profile, pass, re-record,
candidate and notes, from the golden, the generation and the run's settings alone."""

from __future__ import annotations

import dataclasses

import pytest

from pytest_llmdeterminism.compare import Verdict
from pytest_llmdeterminism.run.decision import decide
from pytest_llmdeterminism.tolerance import Profile, ProfileName


@pytest.fixture(scope="module")
def run(tiny):
    from pytest_llmdeterminism.engines.model import LLMModel
    from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

    return LLMModel(tiny, GenerationSettings(BatchShape(4, 32), 6, 0)).generate("Once upon a time")


def decided(expected, actual, *, explicit=None, update=None, variant=None):
    return decide(expected, actual, explicit=explicit, update=update,
                  compared_variant=variant or actual.variant,
                  accept_command="pytest t.py --llm-golden-update")


def _drifted(run):
    """The same tokens, other logits: the first step's hash changed."""
    return dataclasses.replace(run, logit_hashes=("0" * 16, *run.logit_hashes[1:]))


def _flipped(run, margin):
    """The golden's second token replaced by its runner-up, at a recorded top-1/top-2 margin."""
    other = next(token for token, _ in run.top_logprobs[1] if token != run.token_ids[1])
    return dataclasses.replace(run, token_ids=(run.token_ids[0], other, *run.token_ids[2:]),
                               margins=(run.margins[0], margin, *run.margins[2:]))


def test_the_same_environment_is_judged_exactly_and_passes_only_identical(run):
    same = decided(run, run)
    assert same.comparison.verdict is Verdict.IDENTICAL and same.passed
    assert same.profile.name is ProfileName.EXACT
    assert not (same.rerecord or same.candidate or same.across or same.environment)
    drift = decided(_drifted(run), run)
    assert drift.comparison.verdict is Verdict.LOGIT_DRIFT and not drift.passed and drift.candidate


def test_another_environment_gets_the_near_tie_default_and_a_note_naming_what_changed(run):
    older = dataclasses.replace(_drifted(run), fingerprint={**run.fingerprint, "torch": "2.12.0+cpu"})
    across = decided(older, run)
    assert across.profile.name is ProfileName.NEAR_TIE and across.passed
    assert [name for name, _, _ in across.environment] == ["torch"]
    assert across.across.startswith("compared across environments: torch '2.12.0+cpu' →")
    assert not decided(older, run, explicit=Profile(ProfileName.EXACT)).passed  # a set profile wins


def test_an_update_rerecords_failures_and_passing_flips_and_nothing_else(run):
    assert decided(_drifted(run), run, update="all").rerecord  # failing under exact
    assert not decided(_drifted(run), run, update="new").rerecord  # 'new' records missing goldens only
    flip = decided(_flipped(run, 0.01), run, update="all", explicit=Profile(ProfileName.NEAR_TIE))
    assert flip.comparison.verdict is Verdict.TIE_FLIP and flip.passed and flip.rerecord
    assert not flip.candidate  # re-recorded, not left for a reviewer
    assert not decided(run, run, update="all").rerecord


def test_a_check_against_another_variant_leaves_a_candidate_even_when_it_passes(run):
    other = decided(run, run, variant="cpu/bfloat16")
    assert other.passed and other.candidate
    assert decided(_flipped(run, 5.0), run).comparison.verdict is Verdict.REGRESSION
