"""A golden check runs, is recorded and counts as used in any phase of a test: the test body, a
fixture's setup, a fixture's teardown (a "collect, then check" fixture) and a finalizer."""

from __future__ import annotations

import pytest

from tests.helpers.projects import golden_keys

GOLDEN = "__golden__/test_phases.json"

# One check in each phase: a fixture's setup, the body, a fixture's teardown, a finalizer.
PHASES = """
import pytest
from pytest_llmdeterminism import deterministic

@pytest.fixture
def checked_in_setup(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("The sky is"), name="setup")

@pytest.fixture
def collected(llm_model, golden_tokens):
    generations = []
    yield generations
    for generation in generations:  # collect, then check
        golden_tokens.check(generation, name="teardown")

@deterministic(max_new_tokens=2)
def test_phases(request, checked_in_setup, collected, llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("Count: one,"), name="call")
    collected.append(llm_model.generate("Once upon a"))
    request.addfinalizer(lambda: golden_tokens.check(llm_model.generate("Hello,"), name="finalizer"))
"""
KEYS = ["test_phases::call", "test_phases::finalizer", "test_phases::setup", "test_phases::teardown"]


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.subprocess)])
def test_checks_in_setup_teardown_and_finalizers_are_recorded_counted_and_used(suite, workers):
    suite.makepyfile(test_phases=PHASES)
    args = ["-n", str(workers)] if workers else []
    run = suite.runpytest_subprocess if workers else suite.runpytest
    recorded = run("--llm-golden-update", *args)
    recorded.assert_outcomes(passed=1)
    recorded.stdout.fnmatch_lines(["golden checks: 4 recorded", f"wrote {GOLDEN} (4 goldens)"])
    assert golden_keys(suite, GOLDEN) == KEYS
    checked = run("--llm-golden-prune", *args)
    checked.assert_outcomes(passed=1)
    checked.stdout.fnmatch_lines(["golden checks: 4 IDENTICAL"])
    assert "pruned" not in checked.stdout.str() and "unused golden" not in checked.stdout.str()
    assert golden_keys(suite, GOLDEN) == KEYS


def test_a_failing_check_in_teardown_is_an_error_in_teardown_and_every_one_is_judged(suite):
    suite.makepyfile(test_phases=PHASES)
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=1)
    suite.makepyfile(test_phases=PHASES.replace('"Once upon a"', '"Once upon a time"')
                     .replace('"Hello,"', '"Hello, world"'))
    result = suite.runpytest()
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_phases*",
                                 "*2 golden checks failed in this test*",
                                 "golden checks: 2 IDENTICAL, 2 INPUT_CHANGED (failed)"])
    assert "pruned" not in result.stdout.str()


def test_a_check_after_its_test_ended_is_refused(suite):
    suite.makepyfile(test_late="""
        from pytest_llmdeterminism import deterministic

        KEPT = []

        @deterministic(max_new_tokens=2)
        def test_keeps(llm_model, golden_tokens):
            KEPT.append((llm_model, golden_tokens))

        def test_checks_later():
            llm_model, golden_tokens = KEPT[0]
            golden_tokens.check(llm_model.generate("The sky is"))
    """)
    result = suite.runpytest("--llm-golden-update", "-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*golden_tokens.check(): called after test_late.py::test_keeps ended*"])
    assert not (suite.path / "__golden__").exists()
