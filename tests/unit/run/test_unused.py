"""The one rule that says which goldens a run proves unused (``run/unused.py``), alone: no pytest run."""

from __future__ import annotations

from pytest_llmdeterminism.run.unused import (
    ModuleRun,
    defining_name,
    defining_names,
    owner,
    uncollected_cases,
    unused_keys,
)

SOURCE = """
import pytest

def test_kept(llm_model, golden_tokens): ...

@pytest.mark.parametrize("case", load_cases())
def test_cases(llm_model, golden_tokens, case): ...

class TestGroup:
    def test_method(self, llm_model, golden_tokens): ...
"""


def test_a_key_belongs_to_its_test_its_repeats_and_its_named_checks():
    tests = ["test_a", "test_a[1]", "TestGroup::test_method"]
    assert owner("test_a", tests) == "test_a"
    assert owner("test_a#2", tests) == "test_a"
    assert owner("test_a::Paris", tests) == "test_a"
    assert owner("test_a[1]::x", tests) == "test_a[1]"
    assert owner("test_ab", tests) is None
    assert [defining_name(k) for k in ("test_a[x]#2", "TestGroup::test_method[1]", "test_b::n")] == \
        ["test_a", "TestGroup", "test_b"]


def test_a_test_that_passed_without_its_golden_and_a_deleted_test_are_unused():
    run = ModuleRun({"test_kept": "passed"}, SOURCE, frozenset({"test_kept"}))
    keys = ["test_kept", "test_kept::old name", "test_deleted", "test_deleted[3]", "test_kept_longer"]
    assert unused_keys(keys, run) == ["test_deleted", "test_deleted[3]", "test_kept::old name",
                                      "test_kept_longer"]


def test_a_test_that_did_not_pass_or_did_not_run_keeps_its_goldens():
    run = ModuleRun({"test_kept": "skipped", "TestGroup::test_method": None}, SOURCE)
    assert unused_keys(["test_kept", "test_kept#2", "TestGroup::test_method", "TestGroup::test_method::n"],
                       run) == []


def test_an_empty_parametrization_is_unknown_not_none():
    # pytest collects one skipped `[NOTSET]` case for an empty parameter list: today's cases are unknown.
    empty = ModuleRun({"test_kept": "passed", "test_cases[NOTSET]": "skipped"}, SOURCE,
                      frozenset({"test_kept"}))
    assert unused_keys(["test_cases[a]", "test_cases[b]"], empty) == []
    # The negative control: cases collected, all passed, one of them taken out of the list.
    known = ModuleRun({"test_cases[a]": "passed"}, SOURCE, frozenset({"test_cases[a]"}))
    assert unused_keys(["test_cases[a]", "test_cases[b]"], known, cases=True) == ["test_cases[b]"]


def test_a_case_the_run_did_not_collect_is_unused_only_when_cases_are_pruned():
    # Today's list is a smaller, non-empty subset (it may depend on the machine or environment).
    run = ModuleRun({"test_cases[a]": "passed", "TestGroup::test_method[1]": "passed"}, SOURCE,
                    frozenset({"test_cases[a]", "TestGroup::test_method[1]"}))
    keys = ["test_cases[a]", "test_cases[b]", "test_cases[b]::named", "TestGroup::test_method[2]#2"]
    assert unused_keys(keys, run) == []
    assert uncollected_cases(keys, run) == ["TestGroup::test_method[2]#2", "test_cases[b]",
                                            "test_cases[b]::named"]
    assert unused_keys(keys, run, cases=True) == uncollected_cases(keys, run)


def test_a_method_the_class_still_defines_keeps_its_goldens_when_its_siblings_ran():
    # A `def` under `if` in the class body, or a collection hook that dropped the method: not proof.
    source = SOURCE + "\n    if FAST:\n        def test_fast(self, llm_model, golden_tokens): ...\n"
    run = ModuleRun({"test_kept": "passed", "TestGroup::test_method": "passed"}, source,
                    frozenset({"test_kept", "TestGroup::test_method"}))
    keys = ["TestGroup::test_fast", "TestGroup::test_fast::named", "TestGroup::test_fast[1]#2"]
    assert unused_keys(keys, run) == [] and unused_keys(keys, run, cases=True) == []
    # The same for a function, as before.
    assert unused_keys(["test_cases[a]"], run, cases=True) == []
    # The negative control: a method renamed or deleted is gone from the source, and unused.
    assert unused_keys(["TestGroup::test_gone", "TestGroup::test_gone[2]::x"], run) == \
        ["TestGroup::test_gone", "TestGroup::test_gone[2]::x"]
    assert defining_names("TestGroup::test_fast::named", source) == ["TestGroup", "test_fast"]
    assert defining_names("test_kept::TestGroup", source) == ["test_kept"]  # a check's name, no definition


def test_a_test_the_source_still_defines_but_the_run_never_collected_keeps_its_goldens():
    # A conftest that drops items, a collection hook, a report that leaves tests out: not proof.
    run = ModuleRun({"test_kept": "passed"}, SOURCE, frozenset({"test_kept"}))
    assert unused_keys(["test_cases[a]", "TestGroup::test_method"], run) == []


def test_without_the_modules_source_only_tests_that_ran_can_free_a_golden():
    run = ModuleRun({"test_kept": "passed"}, None)
    assert unused_keys(["test_kept", "test_deleted"], run) == ["test_kept"]
