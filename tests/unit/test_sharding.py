"""A suite run in shards (pytest-split's --splits N --group i) and merged with `llm-golden merge` gives
the unsharded run's review: the same verdict counts, candidates and unused goldens; a missing shard or
two shards that disagree are named, and nothing is judged or written on their word."""

from __future__ import annotations

from pytest_llmdeterminism.reporting.records import RunRecord
from pytest_llmdeterminism.run.shards import coverage


def _run(suite, outcomes):
    return RunRecord(suite=suite, selected=list(outcomes), outcomes=outcomes, golden_files={}, used=[],
                     stopped=[], partial=[], failed=False)


def test_coverage_is_the_union_of_the_shards_suites_against_the_tests_that_finished():
    runs = [_run(["a::1", "a::2", "b::1"], {"a::1": "passed"}),
            _run(["a::1", "a::2", "b::1"], {"b::1": "skipped", "a::1": "passed"})]
    covered = coverage(runs)
    assert covered.suite == ["a::1", "a::2", "b::1"]
    assert covered.not_run == ["a::2"]
    assert covered.twice == ["a::1"]
