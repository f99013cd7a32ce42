"""The recorder of one test's golden checks: what they decided, the failures that wait for the
test's end, and what each attempt of a rerun test generated."""

from __future__ import annotations

import time
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_llmdeterminism.judge.compare import GoldenMismatchError, Verdict
from pytest_llmdeterminism.judge.decision import Attempt, Decision, Outcome, Written
from pytest_llmdeterminism.reporting.records import CheckRecord, GoldenWrite, TestRecords
from pytest_llmdeterminism.reporting.run_header import header_of

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pytest_llmdeterminism.judge.compare import Recorded


Site = tuple[types.FrameType, int, int]  # the frame that called check(), its instruction and line


class TestOutcomes:
    """The recorder of one test (kept in its ``item.stash``): what its checks decided, and the
    failures that wait for the test's end.

    A check runs in any phase of its test (``phase``: setup, call or teardown, so a fixture's setup,
    the body, a fixture's teardown or a finalizer): a failing check is recorded and the phase goes
    on, so every check is judged and gets its candidate; the plugin raises them together when the
    phase ends (:meth:`raise_failures`), and every phase's records reach the run with the test's
    teardown report. Outside its test's phases a check is refused (nothing would record it).

    A test run again in the same process (pytest-rerunfailures) is one recorder over several
    attempts: :meth:`end_attempt` starts the next one afresh, so only the last attempt's records
    reach the run, and keeps what each key generated (:meth:`earlier`), so the decision of a later
    attempt that generates something else says so: a rerun never turns a failing golden check into a pass.
    """

    __test__ = False  # not a pytest test class

    def __init__(self) -> None:
        self.data = TestRecords()
        self.phase: str | None = None  # the phase of the test now running; None between and after them
        self.attempt = 1
        self._failures: list[tuple[GoldenMismatchError, Site | None]] = []
        self._accept = ""
        self._outputs: dict[str, Attempt] = {}  # this attempt's output per golden key
        self._earlier: dict[str, list[Attempt]] = {}  # earlier attempts' outputs per key
        self._since = time.monotonic()  # the test's start, then its last check: what each check took

    def end_attempt(self) -> None:
        """The test's attempt ended (its teardown was reported): the next one, if any, starts clean."""
        for key, attempt in self._outputs.items():
            self._earlier.setdefault(key, []).append(attempt)
        self.data, self._outputs = TestRecords(), {}
        self._since = time.monotonic()
        self.clear_failures()
        self.attempt += 1

    def earlier(self, key: str) -> list[Attempt]:
        """What earlier attempts of this test generated for ``key``, oldest first; [] on a first attempt."""
        return list(self._earlier.get(key, ()))

    def earlier_attempts(self) -> dict[str, tuple[Attempt, ...]]:
        """What earlier attempts of this test generated, per golden key (:meth:`earlier`): fixed for
        the attempt, so its checks take it when the attempt's ``golden_tokens`` is built."""
        return {key: tuple(attempts) for key, attempts in self._earlier.items()}

    def record(self, path: Path, key: str, generation: Recorded, *, written: Written,
               overwrote: Verdict | None = None) -> None:
        """A golden to write at the end of the run; ``overwrote``: the verdict of the one it replaces."""
        self.data.records.append(GoldenWrite.of(path, key, generation, overwrote=overwrote))
        outcome = Outcome(overwrote, passed=True, written=written)
        self.data.outcomes.append(outcome)
        self._outputs[key] = Attempt(self.attempt, generation, outcome)

    def note(self, line: str) -> None:
        self.data.notes.append(line)

    def audited(self, report: dict[str, Any]) -> None:
        self.data.audits.append(report)

    def candidate(self, path: Path, key: str, generation: Recorded, *, tolerance: str = "") -> None:
        """A missing or failing check's actual result, for ``--llm-golden-artifacts``; ``tolerance``:
        the profile the test or the run set for it ("": the environment's default)."""
        self.data.candidates.append(GoldenWrite.of(path, key, generation, tolerance=tolerance))

    def used(self, path: Path, key: str) -> None:
        self.data.used.append((str(path), key))

    def decided(self, path: Path, key: str, decision: Decision, *, notes: Sequence[str] = (),
                failure: GoldenMismatchError | None = None, site: Site | None = None,
                accept: str = "") -> None:
        """Record one check of golden ``key`` of ``path`` (kept for the unused-goldens rule): the golden
        an update writes instead, or the check's record and, where it leaves one, the candidate for
        ``--llm-golden-artifacts``; and its ``notes`` for the run's summary. A failing check's
        ``failure`` then waits for the end of the test's phase (``site``: the line that called the
        check); ``accept`` is the command that records or accepts the
        test's goldens."""
        self.used(path, key)
        now = time.monotonic()
        self.data.timings.append((key, round(now - self._since, 3)))
        self._since = now
        self.data.header = header_of(decision.actual)
        if decision.write is not None:
            overwrote = decision.comparison.verdict if decision.write is Written.UPDATED else None
            self.record(path, key, decision.actual, written=decision.write, overwrote=overwrote)
        else:
            outcome = Outcome(decision.comparison.verdict, passed=decision.passed)
            self.data.outcomes.append(outcome)
            self._outputs[key] = Attempt(self.attempt, decision.actual, outcome)
            self.data.checks.append(CheckRecord.of(decision, name=key))
            if decision.candidate:
                explicit = decision.explicit and decision.profile is not None
                tolerance = str(decision.profile) if explicit else ""
                self.candidate(path, key, decision.actual, tolerance=tolerance)
        self.data.notes.extend(notes)
        if failure is None:
            return
        self.data.accept = accept
        self._failures.append((failure, site))
        self._accept = accept

    def clear_failures(self) -> str:
        """Drop the waiting failures (and the frames they hold); returns them as one text, for a
        test whose body raised something else."""
        failures, self._failures = self._failures, []
        return "\n\n".join(str(error) for error, _ in failures)

    def raise_failures(self) -> None:
        """Raise the waiting failures as one error; its traceback points at the first failing check."""
        __tracebackhide__ = True
        failures, self._failures, accept = self._failures, [], self._accept
        if not failures:
            return
        first, site = failures[0]
        error = first
        if len(failures) > 1:
            parts = [f"{len(failures)} golden checks failed in this test "
                     "(every check ran and has its candidate):"]
            for number, (failure, at) in enumerate(failures, start=1):
                lines = str(failure).splitlines()
                if lines and lines[-1].endswith(accept):
                    lines.pop()  # said once, below
                where = f" at {Path(at[0].f_code.co_filename).name}:{at[2]}" if at else ""
                parts.append(f"[{number}/{len(failures)}]{where} " + "\n".join(lines))
            parts.append(f"Accept all of them with: {accept}")
            error = GoldenMismatchError("\n".join(parts), first.comparison,
                                        failures=tuple(failure for failure, _ in failures))
        # Raised after the test body ends; a traceback of the failing check's frame (the public
        # types.TracebackType constructor; pytest has no API for this) makes pytest's `>` point there.
        raise error.with_traceback(types.TracebackType(None, *site) if site else None) from None

    def to_json(self) -> dict[str, Any] | None:
        return None if self.data.is_empty() else self.data.to_payload()

