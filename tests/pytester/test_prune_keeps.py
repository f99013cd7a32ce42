"""Prune keeps what a run cannot prove unused: a method the class still defines that was not
collected (as a function), and the cases of a parametrization that today's run did not collect
unless ``--llm-golden-prune=cases`` asks for them."""

from __future__ import annotations

import pytest

from tests.helpers.projects import golden_keys

# test_b exists only where FAST is set: a `def` under `if` in a class body.
METHOD_UNDER_IF = """
import os
from pytest_llmdeterminism import deterministic

class TestC:
    @deterministic(max_new_tokens=2)
    def test_a(self, llm_model, golden_tokens):
        golden_tokens.check(llm_model.generate("The sky is"))

    if os.environ.get("FAST"):
        @deterministic(max_new_tokens=2)
        def test_b(self, llm_model, golden_tokens):
            golden_tokens.check(llm_model.generate("Count: one,"))
"""

# A collection hook drops test_b (a method, then a function) where SKIP_B is set.
DROPPING_HOOK = """
import os

def pytest_pycollect_makeitem(collector, name, obj):
    if os.environ.get("SKIP_B") and name == "test_b":
        return []
    return None
"""
TWO_METHODS = """
from pytest_llmdeterminism import deterministic

class TestC:
    @deterministic(max_new_tokens=2)
    def test_a(self, llm_model, golden_tokens):
        golden_tokens.check(llm_model.generate("The sky is"))

    @deterministic(max_new_tokens=2)
    def test_b(self, llm_model, golden_tokens):
        golden_tokens.check(llm_model.generate("Count: one,"))
"""
TWO_FUNCTIONS = """
from pytest_llmdeterminism import deterministic

@deterministic(max_new_tokens=2)
def test_a(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("The sky is"))

@deterministic(max_new_tokens=2)
def test_b(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("Count: one,"))
"""


@pytest.mark.parametrize(("module", "variable", "conftest", "keys"), [
    (METHOD_UNDER_IF, "FAST", None, ["TestC::test_a", "TestC::test_b"]),
    (TWO_METHODS, "SKIP_B", DROPPING_HOOK, ["TestC::test_a", "TestC::test_b"]),
    (TWO_FUNCTIONS, "SKIP_B", DROPPING_HOOK, ["test_a", "test_b"]),
], ids=["def under if", "hook drops a method", "hook drops a function"])
def test_a_test_the_module_still_defines_but_the_run_did_not_collect_keeps_its_golden(
        suite, monkeypatch, module, variable, conftest, keys):
    suite.makepyfile(test_m=module)
    if conftest:
        suite.makeconftest(conftest)
    recording = variable == "FAST"  # the test exists while recording, and is left out later
    monkeypatch.setenv(variable, "1" if recording else "")
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=2)
    monkeypatch.setenv(variable, "" if recording else "1")
    for prune in ("--llm-golden-prune", "--llm-golden-prune=cases"):
        result = suite.runpytest(prune)
        result.assert_outcomes(passed=1)
        assert "\npruned" not in result.stdout.str() and "unused golden" not in result.stdout.str()
        assert golden_keys(suite, "__golden__/test_m.json") == keys
    # The negative control: the method (or function) renamed away is gone from the source, and pruned.
    suite.makepyfile(test_m=module.replace("def test_b", "def test_renamed"))
    monkeypatch.setenv(variable, "1" if recording else "")
    result = suite.runpytest("--llm-golden-prune", "--llm-golden-update=new")
    result.stdout.fnmatch_lines(["pruned 1 unused golden(s):", f"  __golden__/test_m.json [[]'{keys[1]}']"])


# The cases of test_case depend on the environment: a smaller, non-empty list where GPU is unset.
CASES_FROM_THE_ENVIRONMENT = """
import os
import pytest
from pytest_llmdeterminism import deterministic

PROMPTS = ["Count: one,", "Once upon a"] if os.environ.get("GPU") else ["Count: one,"]

@pytest.mark.parametrize("prompt", PROMPTS)
@deterministic(max_new_tokens=2)
def test_case(llm_model, golden_tokens, prompt):
    golden_tokens.check(llm_model.generate(prompt))
"""


def test_cases_the_run_did_not_collect_are_kept_and_named_unless_cases_are_pruned(suite, monkeypatch):
    suite.makepyfile(test_env=CASES_FROM_THE_ENVIRONMENT)
    monkeypatch.setenv("GPU", "1")
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=2)
    monkeypatch.delenv("GPU")
    every = ["test_case[Count: one,]", "test_case[Once upon a]"]
    for args in ([], ["--llm-golden-prune"]):
        result = suite.runpytest(*args)
        result.assert_outcomes(passed=1)
        result.stdout.fnmatch_lines([
            "kept golden of a case this run did not collect in __golden__/test_env.json: "
            "'test_case[[]Once upon a]'",
            "its test still exists and its parametrization may depend on the machine or environment; "
            "delete such goldens with: pytest --llm-golden-prune=cases"])
        assert "\npruned" not in result.stdout.str() and "unused golden" not in result.stdout.str()
        assert golden_keys(suite, "__golden__/test_env.json") == every
    pruned = suite.runpytest("--llm-golden-prune=cases")
    pruned.stdout.fnmatch_lines(["pruned 1 unused golden(s):",
                                 "  __golden__/test_env.json [[]'test_case[[]Once upon a]']"])
    assert golden_keys(suite, "__golden__/test_env.json") == every[:1]


def test_a_prune_mode_that_is_not_one_names_both(suite):
    suite.makepyfile("def test_nothing(): pass")
    result = suite.runpytest("--llm-golden-prune=all")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*expected 'tests' or 'cases', got 'all'*"])
