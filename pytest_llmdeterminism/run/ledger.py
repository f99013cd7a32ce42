"""The run's ledger: what every test decided, collected from each test's report.

In a plain run the reports come from this process; under pytest-xdist the controller receives each
worker's test reports, so one ledger sees the whole run. Nothing here writes a file: the
end-of-run writer (``writer.py``) reads the ledger.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import msgspec

from pytest_llmdeterminism.goldens import schema
from pytest_llmdeterminism.judge.compare import Verdict
from pytest_llmdeterminism.judge.decision import Outcome, Written
from pytest_llmdeterminism.reporting.records import CheckRecord, GoldenWrite, TestRecords

FileUpdates = dict[str, dict[str, dict[str, schema.Entry]]]  # file -> key -> variant -> entry
_RANK = {"passed": 0, "skipped": 1, "failed": 2}
# An update that replaced one of these changed what the model says (or is asked): listed for review.


class Ledger:
    def __init__(self, partial: Iterable[str] = ()) -> None:
        self.recorded: dict[str, list[GoldenWrite]] = {}  # node id -> goldens its checks recorded
        self.candidates: FileUpdates = {}  # missing and failing checks' results, for artifacts
        self.candidate_tolerances: dict[str, dict[str, dict[str, str]]] = {}  # the same, the profile set
        self.counts: Counter[Outcome] = Counter()  # the checks judged (see outcome_counts for all)
        self.writes: dict[str, list[Outcome]] = {}  # node id -> its goldens recorded or updated
        self.notes: list[str] = []
        self.audits: list[tuple[str, dict[str, Any]]] = []  # (test id, AuditReport.to_json())
        self.checks: list[CheckRecord] = []  # every golden comparison, for --llm-report
        self.used: set[tuple[str, str]] = set()  # (golden file, key) some test looked up
        self.outcomes: dict[str, str] = {}  # node id -> passed / skipped / failed
        self.durations: dict[str, float] = {}  # node id -> seconds its body (the call phase) took
        self._retried: set[str] = set()  # node ids whose attempt now reporting will be run again
        self.partial_reasons: list[str] = []  # why this run did not visit every test
        self.stop_reasons: list[str] = []  # why this run ended before it ran every collected test
        self.collected: set[str] = set()  # node ids this run set out to run (under xdist: the workers')
        self.finished: set[str] = set()  # node ids whose teardown was reported
        # node ids whose test function was called, or whose setup skipped or failed it: with
        # ``finished``, the tests that ran to their end (--setup-only sets up and tears down, calls none)
        self.ran: set[str] = set()
        self.seen: set[str] = set()  # every item pytest collected, before any plugin's or conftest's filter
        self.collect_errors: set[str] = set()  # collectors (modules) that failed to collect
        self.deselected: set[str] = set()  # node ids collected, then deselected (-k, pytest-split, ...)
        self.header: dict[str, list[str]] = {}  # what the checks ran (run_header.HEADER_FIELDS): values seen
        self.accept: dict[str, str] = {}  # node id -> the command its failing checks' message gives
        self.partial(partial)

    def collect(self, payload: dict[str, Any], nodeid: str = "", duration: float | None = None) -> None:
        """Take one test's records (:meth:`TestOutcomes.to_json`, every phase's checks, from its
        teardown report), from this process or a worker; ``duration``: its body's, by default the
        one its call report gave."""
        duration = self.durations.get(nodeid, 0.0) if duration is None else duration
        records = TestRecords.from_payload(payload)
        self.recorded.setdefault(nodeid, []).extend(records.records)
        fold(self.candidates, records.candidates)
        for row in records.candidates:
            variants = self.candidate_tolerances.setdefault(row.path, {}).setdefault(row.key, {})
            variants[row.variant] = row.tolerance
        self.counts.update(outcome for outcome in records.outcomes if outcome.written is None)
        self.writes.setdefault(nodeid, []).extend(o for o in records.outcomes if o.written is not None)
        self.notes += [note for note in records.notes if note not in self.notes]
        self.audits += [(nodeid, audit) for audit in records.audits]
        self.checks += [msgspec.structs.replace(check, test=nodeid, test_duration_s=round(duration, 4))
                        for check in records.checks]
        self.used.update(records.used)
        for field, value in records.header.items():
            seen = self.header.setdefault(field, [])
            seen += [value] if value not in seen else []
        if records.accept:
            self.accept[nodeid] = records.accept

    def test_finished(self, nodeid: str, when: str, outcome: str, duration: float = 0.0) -> None:
        """Keep each test's overall outcome: failed beats skipped beats passed (and its body's duration)."""
        if when == "setup":
            self._retried.discard(nodeid)  # an attempt starts
        if outcome == "rerun":  # pytest-rerunfailures will run the test again
            self._retried.add(nodeid)
        if when == "call":
            self.durations[nodeid] = duration
        if when == "teardown":
            self.finished.add(nodeid)
        if when == "call" or (when == "setup" and outcome != "passed"):
            self.ran.add(nodeid)
        if outcome not in _RANK:  # e.g. pytest-rerunfailures' "rerun": an attempt, not the outcome
            return
        counts = when == "call" or outcome != "passed"
        if counts and _RANK[outcome] >= _RANK[self.outcomes.get(nodeid, "passed")]:
            self.outcomes[nodeid] = outcome

    def retried(self, nodeid: str) -> bool:
        """Whether the attempt of the test now reporting will be run again (pytest-rerunfailures): its
        records, carried by its teardown report, are not the test's."""
        return nodeid in self._retried

    def goldens_to_write(self) -> tuple[FileUpdates, list[str]]:
        """The recorded goldens of tests that passed, and the ids of failed or skipped tests whose
        recorded goldens are held back: a test that fails after recording must not freeze its output."""
        keep: FileUpdates = {}
        held = []
        for nodeid, rows in self.recorded.items():
            if self.outcomes.get(nodeid, "passed") == "passed":
                fold(keep, rows)
            elif rows:
                held.append(nodeid)
        return keep, held

    def outcome_counts(self) -> Counter[Outcome]:
        """Every check per outcome; a golden recorded by a test that then failed or was skipped
        counts as not recorded (it is held back), never as recorded or updated."""
        counts = Counter(self.counts)
        held_back = Outcome(None, passed=False, written=Written.NOT_RECORDED)
        for nodeid, writes in self.writes.items():
            kept = self.outcomes.get(nodeid, "passed") == "passed"
            counts.update(writes if kept else [held_back] * len(writes))
        return counts

    def overwritten(self) -> list[tuple[str, str, str]]:
        """(node id, golden key, verdict) of every golden written over a confident change (REGRESSION,
        INPUT_CHANGED: ``Verdict.confident_change``): the updates a reviewer must look at before they
        are committed."""
        return [(nodeid, row.key, row.overwrote) for nodeid, rows in sorted(self.recorded.items())
                if self.outcomes.get(nodeid, "passed") == "passed"
                for row in rows if Verdict.is_confident_change(row.overwrote)]

    def deselect(self, nodeids: Iterable[str]) -> None:
        """Tests of the suite this run collected and then left out: with the collected ones, the
        whole suite (a shard of pytest-split collects every test and deselects the other shards')."""
        nodeids = list(nodeids)
        if nodeids:
            self.deselected.update(nodeids)
            self.partial([f"{len(nodeids)} test(s) deselected"])

    def collection_finished(self, items: Iterable[str]) -> None:
        """The items pytest will run, after every filter: a collected item missing from them that no
        one deselected was dropped silently (a conftest's ``items[:] = ...``), and is left out like a
        deselected one: the run does not speak for it."""
        dropped = sorted(self.seen - set(items) - self.deselected)
        if dropped:
            self.deselected.update(dropped)
            self.partial([f"{len(dropped)} collected test(s) left out by a conftest or plugin"])

    def collection_failed(self, nodeid: str) -> None:
        """A module (or other collector) that could not be collected: its tests are unknown."""
        self.collect_errors.add(nodeid)

    def ran_to_the_end(self) -> set[str]:
        """The tests whose run pytest reported from setup to teardown, with their function called
        (or skipped or failed before it)."""
        return self.finished & self.ran

    def partial(self, reasons: Iterable[str]) -> None:
        """This run did not visit every test (for the given reasons): unused goldens are not judged."""
        self.partial_reasons += [reason for reason in reasons if reason not in self.partial_reasons]

    def stopped(self, reason: str) -> None:
        """This run ended early (interrupted, ``-x``, a crashed worker): a partial run, and one the
        summary always names, since the user may not have asked for fewer tests."""
        if reason not in self.stop_reasons:
            self.stop_reasons.append(reason)

    def why_partial(self) -> list[str]:
        """Every reason this run does not speak for the whole suite; none after a complete run. A
        collected test that never reported its teardown did not run to its end, whatever the cause."""
        not_run = len(self.collected - self.ran_to_the_end())
        unfinished = [f"{not_run} of {len(self.collected)} collected test(s) did not run"] if not_run else []
        return self.incomplete() + unfinished + self.partial_reasons

    def incomplete(self) -> list[str]:
        """Why the tests this run selected do not stand for what exists, whatever was deselected:
        it stopped early, or some module could not be collected (its tests are unknown)."""
        errors = sorted(self.collect_errors)
        shown = ", ".join(errors[:3]) + (" …" if len(errors) > 3 else "")
        return self.stop_reasons + ([f"{len(errors)} error(s) during collection ({shown})"] if errors else [])


def fold(into: FileUpdates, rows: Iterable[GoldenWrite]) -> None:
    for row in rows:
        into.setdefault(row.path, {}).setdefault(row.key, {})[row.variant] = row.entry
