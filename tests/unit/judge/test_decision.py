"""The pure decision of one golden check (judge/decision.py): verdict, profile, pass, re-record,
candidate, as data, from the generation, what ``check()`` looked up and the run's settings alone;
and the words ``reporting`` gives it."""

from __future__ import annotations

import dataclasses

import pytest

from pytest_llmdeterminism.judge.compare import Verdict
from pytest_llmdeterminism.judge.decision import Attempt, Outcome, Written, decide
from pytest_llmdeterminism.judge.tolerance import Profile, ProfileName
from pytest_llmdeterminism.reporting import failure, hints
from pytest_llmdeterminism.reporting.records import CheckRecord


@pytest.fixture(scope="module")
def run(tiny):
    from pytest_llmdeterminism.model.llm_model import LLMModel
    from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

    return LLMModel(tiny, GenerationSettings(BatchShape(4, 32), 6, 0)).generate("Once upon a time")


def decided(expected, actual, *, explicit=None, update=None, variant=None, earlier=()):
    return decide(actual, golden=expected, variant=variant or actual.variant, explicit=explicit,
                  update=update, earlier=earlier)


def _drifted(run):
    """The same tokens, other logits: the first step's hash changed."""
    return dataclasses.replace(run, step_hashes=("0" * 16, *run.step_hashes[1:]))


def _flipped(run, margin):
    """The golden's second token replaced by its runner-up, at a recorded top-1/top-2 margin."""
    other = next(token for token, _ in run.top_logprobs[1] if token != run.token_ids[1])
    return dataclasses.replace(run, token_ids=(run.token_ids[0], other, *run.token_ids[2:]),
                               margins=(run.margins[0], margin, *run.margins[2:]))


def test_the_same_environment_is_judged_exactly_and_passes_only_identical(run):
    same = decided(run, run)
    assert same.comparison.verdict is Verdict.IDENTICAL and same.passed
    assert same.profile.name is ProfileName.EXACT
    assert not (same.rerecord or same.candidate or hints.across(same) or same.environment)
    drift = decided(_drifted(run), run)
    assert drift.comparison.verdict is Verdict.LOGIT_DRIFT and not drift.passed and drift.candidate


def test_another_environment_gets_the_near_tie_default_and_a_note_naming_what_changed(run):
    older = dataclasses.replace(_drifted(run), fingerprint={**run.fingerprint, "torch": "2.12.0+cpu"})
    across = decided(older, run)
    assert across.profile.name is ProfileName.NEAR_TIE and across.passed
    assert [name for name, _, _ in across.environment] == ["torch"]
    assert hints.across(across).startswith("compared across environments: torch '2.12.0+cpu' →")
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
    assert hints.notes(other, "k", nodeid="t.py::t", attempt=1, accept="a") == [
        f"'k': no {run.variant!r} golden; compared with 'cpu/bfloat16' (--llm-golden-fallback)"]
    assert decided(_flipped(run, 5.0), run).comparison.verdict is Verdict.REGRESSION


def test_a_missing_golden_is_decided_as_data_a_candidate_or_under_update_a_recording(run):
    missing = decided(None, run)
    assert missing.comparison.verdict is Verdict.MISSING and not missing.passed and missing.fails
    assert missing.candidate and missing.expected is None and missing.write is None
    assert missing.profile is None
    assert decided(None, run, update="new").write is Written.RECORDED
    recorded = decided(None, run, update="all")
    assert recorded.write is Written.RECORDED and not recorded.fails and not recorded.candidate
    with_others = decide(run, golden=None, variant=run.variant, explicit=None, update=None,
                         others=["cuda/bfloat16"])
    assert with_others.others == ("cuda/bfloat16",)
    text = failure.message(with_others, "k", location="g.json", nodeid="t.py::t", attempt=1)
    assert text.startswith("no golden recorded for 'k' in g.json (this test has goldens for 'cuda/bfloat16'")
    record = CheckRecord.of(missing, name="k")
    assert (record.verdict, record.passed, record.expected_text, record.profile) == \
        ("MISSING", False, None, "")


def test_an_attempt_that_contradicts_an_earlier_one_is_nondeterministic_whatever_the_golden_says(run):
    earlier = Attempt(1, _drifted(run), Outcome(Verdict.IDENTICAL, passed=True))
    for golden, update in ((run, None), (None, None), (run, "all"), (None, "all")):
        decision = decided(golden, run, update=update, earlier=[earlier])
        assert decision.comparison.verdict is Verdict.NONDETERMINISTIC and decision.fails
        assert decision.between.verdict is Verdict.LOGIT_DRIFT  # how the two attempts differ
        assert decision.earlier is earlier and decision.expected is earlier.output
        assert not decision.candidate and decision.write is None and decision.profile is None
    same = Attempt(1, run, Outcome(Verdict.IDENTICAL, passed=True))
    # the same output as before: judged against the golden as on a first attempt
    assert decided(run, run, earlier=[same]).comparison.verdict is Verdict.IDENTICAL
    notes = hints.notes(decided(run, run, earlier=[earlier]), "k", nodeid="t.py::t", attempt=2, accept="a")
    assert notes == [hints.rerun_note("k", "t.py::t", (1, 2))]
