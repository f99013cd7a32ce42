"""The recorder of one test's golden checks: what they decided, the failures that wait for the
test's end, and what each attempt of a rerun test generated."""

from __future__ import annotations

import types
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from pytest_llmdeterminism.compare import GoldenMismatchError, Verdict, compare, first_token_divergence
from pytest_llmdeterminism.reporting.records import (
    CheckRecord,
    GoldenWrite,
    InputRecord,
    Outcome,
    TestRecords,
    Written,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pytest_llmdeterminism.compare import Comparison
    from pytest_llmdeterminism.generation import Generation


Site = tuple[types.FrameType, int, int]  # the frame that called check(), its instruction and line


class Attempt(NamedTuple):
    """What one earlier attempt of a test (pytest-rerunfailures runs a failed test again in the same
    process) generated for one golden key, and how its check ended."""

    number: int
    output: Generation
    outcome: Outcome


class TestOutcomes:
    """The recorder of one test (kept in its ``item.stash``): what its checks decided, and the
    failures that wait for the test's end.

    While the test's body runs (``deferring``) a failing check is recorded and the test goes on, so
    every check is judged and gets its candidate; the plugin raises them together when the body
    returns (:meth:`raise_failures`). Outside the body a failing check raises at once.

    A test run again in the same process (pytest-rerunfailures) is one recorder over several
    attempts: :meth:`end_attempt` starts the next one afresh, so only the last attempt's records
    reach the run, and keeps what each key generated, so a later attempt that generates something
    else is told (:meth:`other_output`): a rerun never turns a failing golden check into a pass.
    """

    __test__ = False  # not a pytest test class

    def __init__(self) -> None:
        self.data = TestRecords()
        self.deferring = False
        self.attempt = 1
        self._failures: list[tuple[GoldenMismatchError, Site | None]] = []
        self._accept = ""
        self._outputs: dict[str, Attempt] = {}  # this attempt's output per golden key
        self._earlier: dict[str, list[Attempt]] = {}  # earlier attempts' outputs per key

    def end_attempt(self) -> None:
        """The test's attempt ended (its teardown was reported): the next one, if any, starts clean."""
        for key, attempt in self._outputs.items():
            self._earlier.setdefault(key, []).append(attempt)
        self.data, self._outputs = TestRecords(), {}
        self.clear_failures()
        self.attempt += 1

    def other_output(self, key: str, generation: Generation) -> tuple[Attempt, Comparison] | None:
        """An earlier attempt of this test whose output for ``key`` differs from ``generation``
        (inputs, tokens or logit hashes), with how it differs; None on a first attempt."""
        for attempt in self._earlier.get(key, []):
            comparison = compare(attempt.output, generation)
            if comparison.verdict is not Verdict.IDENTICAL:
                return attempt, comparison
        return None

    def record(self, path: Path, key: str, generation: Generation, *, written: Written,
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

    def candidate(self, path: Path, key: str, generation: Generation) -> None:
        """A missing or failing check's actual result, for ``--llm-golden-artifacts``."""
        self.data.candidates.append(GoldenWrite.of(path, key, generation))

    def used(self, path: Path, key: str) -> None:
        self.data.used.append((str(path), key))

    def checked(self, key: str, variant: str, comparison: Comparison, *, passed: bool, profile: str = "",
                changed: Sequence[tuple[str, Any, Any]] = (), numerics_changed: Sequence[str] = (),
                expected: Generation | None = None, actual: Generation | None = None) -> None:
        """One golden comparison's result, as the machine-readable report lists it."""
        verdict = comparison.verdict.value
        outcome = Outcome(comparison.verdict, passed=passed)
        self.data.outcomes.append(outcome)
        if actual is not None:
            self._outputs[key] = Attempt(self.attempt, actual, outcome)
        divergence = comparison.divergence
        run_variant = actual.variant if actual is not None and actual.variant != variant else ""
        shown = actual or expected
        inputs: dict[str, InputRecord] = {}
        first_input = None
        if comparison.verdict is Verdict.INPUT_CHANGED and expected is not None and actual is not None:
            first_input = first_token_divergence(expected.prompt_token_ids, actual.prompt_token_ids)
            inputs = {side: InputRecord.of(gen, first_input) for side, gen in (("expected", expected),
                                                                               ("actual", actual))}
        self.data.checks.append(CheckRecord(
            name=key, variant=variant, run_variant=run_variant, verdict=verdict, passed=passed,
            profile=profile,
            prompt=shown.prompt if shown is not None else "",
            expected_text=expected.text if expected is not None else None,
            actual_text=actual.text if actual is not None else None,
            first_divergence=divergence.step if divergence else comparison.first_hash_step,
            golden_margin=divergence.golden_margin if divergence else None,
            sampling=shown.sampling if shown is not None else {},
            draw_margin=divergence.draw_margin if divergence else None,
            max_logprob_delta=comparison.max_logprob_delta, tie_margin=comparison.tie_margin,
            input_changes=[field for field, _, _ in comparison.input_changes],
            changed_fingerprint={field: (old, new) for field, old, new in changed},
            numerics_changed=list(numerics_changed),
            steps={side: _steps(gen) for side, gen in (("expected", expected), ("actual", actual)) if gen},
            inputs=inputs, first_input_difference=first_input,
            input_diff={field: (old, new) for field, old, new in comparison.input_changes
                        if field != "prompt_token_ids"},
            max_new_tokens=comparison.budgets, new_steps=comparison.new_steps,
            judged_steps=comparison.total_steps - comparison.unchecked_steps if comparison.budgets else 0,
            unchecked_steps=comparison.unchecked_steps,
        ))

    def fail(self, error: GoldenMismatchError, site: Site | None, *, accept: str) -> None:
        """A failing check: kept for the end of the test's body, or raised now outside it.
        ``accept`` is the command that records or accepts the test's goldens."""
        __tracebackhide__ = True
        if not self.deferring:
            raise error
        self._failures.append((error, site))
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


def _steps(generation: Generation, limit: int = 64) -> list[tuple[str, int, float, float | None]]:
    """``(piece, token id, margin, top-1 logprob)`` per step, for the HTML report."""
    return [(piece, token, margin, top[0][1] if top else None)
            for piece, token, margin, top in zip(generation.pieces, generation.token_ids, generation.margins,
                                                 generation.top_logprobs, strict=False)][:limit]
