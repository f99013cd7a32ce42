"""Runs that do not visit every test never judge goldens unused, whoever deselected the tests."""

from __future__ import annotations

import json

import pytest

TWO_TESTS = """
from pytest_llmdeterminism import deterministic

@deterministic(max_new_tokens=2)
def test_a(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("The sky is"))

@deterministic(max_new_tokens=2)
def test_b(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("Count: one,"))
"""

DESELECTING_CONFTEST = """
def pytest_collection_modifyitems(config, items):
    dropped = [item for item in items if item.name == "test_b"]
    items[:] = [item for item in items if item.name != "test_b"]
    config.hook.pytest_deselected(items=dropped)
"""


@pytest.mark.parametrize("workers", [0, 2])
def test_tests_a_conftest_deselects_keep_their_goldens_under_prune(suite, workers):
    suite.makepyfile(test_two=TWO_TESTS)
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=2)
    suite.makeconftest(DESELECTING_CONFTEST)
    args = ["--llm-golden-prune", *(["-n", str(workers)] if workers else [])]
    result = suite.runpytest_subprocess(*args) if workers else suite.runpytest(*args)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["unused goldens not pruned: this run was partial (1 test(s) deselected)"])
    goldens = json.loads((suite.path / "__golden__" / "test_two.json").read_text())["goldens"]
    assert set(goldens) == {"test_a", "test_b"}
