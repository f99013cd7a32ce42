"""What the shards of a run covered (run/shards.py): the union of their suites against the tests that
finished, a test no shard ran and one run twice (the merge of real shards:
tests/pytester/test_sharding.py)."""

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
