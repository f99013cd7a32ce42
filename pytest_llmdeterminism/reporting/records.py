"""Typed records of what one test decided, carried from the test to the run's end and into reports.

:class:`TestOutcomes` is the recorder a test's fixtures write to; it holds a :class:`TestRecords`.
Under pytest-xdist that travels to the controller on the test's report as plain JSON types
(:meth:`TestRecords.to_payload`) and is decoded back, and validated, with
:meth:`TestRecords.from_payload`: the same types on both sides, the golden entries included.
"""

from __future__ import annotations

import enum
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from pytest_llmdeterminism.compare import (
    GoldenMismatchError,
    Verdict,
    compare,
    first_token_divergence,
    id_window,
)
from pytest_llmdeterminism.goldens import schema
from pytest_llmdeterminism.goldens.schema import Entry

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pytest_llmdeterminism.compare import Comparison
    from pytest_llmdeterminism.generation import Generation


class GoldenWrite(msgspec.Struct, array_like=True, gc=False):
    """One entry to write: a recorded golden, or a candidate for ``--llm-golden-artifacts``."""

    path: str
    key: str
    variant: str
    entry: Entry

    @classmethod
    def of(cls, path: Path, key: str, generation: Generation) -> GoldenWrite:
        return cls(str(path), key, generation.variant, schema.to_struct(schema.to_entry(generation)))


class InputRecord(msgspec.Struct, kw_only=True, gc=False):
    """One side's input, for a check whose input changed: what the model saw, and a window of its
    token ids (``prompt_token_ids[i]`` is the id at position ``ids_from + i`` of ``ids_total``)."""

    prompt: str  # a chat conversation as rendered with its template
    prompt_form: str  # "text", "chat" or "token_ids"
    prompt_token_ids: list[int]
    ids_from: int
    ids_total: int

    @classmethod
    def of(cls, generation: Generation, first_difference: int | None) -> InputRecord:
        ids = generation.prompt_token_ids
        start, end = id_window(len(ids), first_difference, before=8, after=24)
        return cls(prompt=generation.prompt, prompt_form=generation.prompt_form,
                   prompt_token_ids=list(ids[start:end]), ids_from=start, ids_total=len(ids))


class CheckRecord(msgspec.Struct, kw_only=True, gc=False):
    """One golden comparison, as ``--llm-report`` lists it (its JSON form is the report's schema)."""

    test: str = ""  # node id, set when the run collects the test's records
    test_duration_s: float = 0.0
    name: str  # golden key
    variant: str  # the golden variant compared with
    run_variant: str = ""  # this run's variant, when another one was compared (--llm-golden-fallback)
    prompt: str = ""  # as the model saw it (a chat conversation rendered with its template)
    verdict: str
    passed: bool
    profile: str = ""
    first_divergence: int | None = None
    golden_margin: float | None = None  # inf where the golden had stopped; the JSON report writes null
    max_logprob_delta: float = 0.0
    tie_margin: float = 0.0  # below this golden margin a step is a near tie (the comparator's own)
    input_changes: list[str] = msgspec.field(default_factory=list)
    changed_fingerprint: dict[str, tuple[Any, Any]] = msgspec.field(default_factory=dict)
    numerics_changed: list[str] = msgspec.field(default_factory=list)  # non-empty: across environments
    # [piece, token id, margin, top-1 logprob] per step and side ("expected", "actual"), for HTML.
    steps: dict[str, list[tuple[str, int, float, float | None]]] = msgspec.field(default_factory=dict)
    # INPUT_CHANGED: both sides' inputs ("expected": the golden's, "actual": this run's), the first
    # prompt token position that differs (None: same ids), and every other input field that
    # changed (field -> [recorded, now]).
    inputs: dict[str, InputRecord] = msgspec.field(default_factory=dict)
    first_input_difference: int | None = None
    input_diff: dict[str, tuple[Any, Any]] = msgspec.field(default_factory=dict)
    # [golden's, this run's] max_new_tokens when they differ: only the steps both cover were judged;
    # ``new_steps`` of this run came after the golden's end and were not judged (the golden is
    # incomplete), ``unchecked_steps`` of the golden came after this run's end.
    max_new_tokens: tuple[int, int] | None = None
    judged_steps: int = 0  # where max_new_tokens differ: the golden's steps that were judged
    new_steps: int = 0
    unchecked_steps: int = 0


class RunRecord(msgspec.Struct, kw_only=True):
    """What one run checked, as the JSON report's ``run`` holds it: enough for ``llm-golden merge``
    to judge the runs of several shards as one. Node ids as pytest writes them; golden files
    relative to the rootdir (absolute when outside it), so shards on other machines agree."""

    suite: list[str]  # every test collected, deselected ones included: under pytest-split, the whole suite
    selected: list[str]  # the tests this run set out to run
    outcomes: dict[str, str]  # passed / failed / skipped, of every test that ran to its end
    golden_files: dict[str, str]  # test module (the node id before "::") -> its golden file
    used: list[tuple[str, str]]  # (golden file, key) that some check looked up
    stopped: list[str]  # why the run ended before its last test; empty when it did not
    partial: list[str]  # every reason this run alone does not speak for the whole suite
    failed: bool  # some test failed or errored
    # False when test ids on the command line kept the rest of the suite from being collected at all
    suite_collected: bool = True
    candidates: str | None = None  # the --llm-golden-artifacts folder, relative to the report's folder


class Written(enum.Enum):
    """A golden that ``--llm-golden-update`` wrote where a check would have been judged."""

    RECORDED = "recorded"  # there was none
    UPDATED = "updated"  # it failed, flipped at a near tie or lacked steps: re-recorded


class Outcome(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """How one golden check ended, the key the run counts by: its verdict and whether it passed.
    A golden written instead of checked has no verdict of its own: ``written`` says which write."""

    verdict: Verdict | None
    passed: bool
    written: Written | None = None

    def __str__(self) -> str:
        """As the terminal summary and JUnit's ``llm_verdict`` property spell it: ``REGRESSION (failed)``."""
        if self.written is not None:
            return self.written.value
        name = self.verdict.value if self.verdict is not None else "?"
        return name if self.passed else f"{name} (failed)"


class TestRecords(msgspec.Struct):
    """Everything one test's golden checks decided."""

    __test__ = False  # not a pytest test class

    records: list[GoldenWrite] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)
    audits: list[dict[str, Any]] = msgspec.field(default_factory=list)
    outcomes: list[Outcome] = msgspec.field(default_factory=list)  # each check's, in call order
    checks: list[CheckRecord] = msgspec.field(default_factory=list)
    used: list[tuple[str, str]] = msgspec.field(default_factory=list)  # (golden file, key) looked up
    candidates: list[GoldenWrite] = msgspec.field(default_factory=list)

    def is_empty(self) -> bool:
        return not (self.records or self.outcomes or self.notes or self.audits or self.used or self.candidates)

    def to_payload(self) -> dict[str, Any]:
        """Plain JSON types: what crosses the process boundary under xdist."""
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]

    @classmethod
    def from_payload(cls, payload: Any) -> TestRecords:
        return msgspec.convert(payload, cls)


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

    def record(self, path: Path, key: str, generation: Generation, *, written: Written) -> None:
        self.data.records.append(GoldenWrite.of(path, key, generation))
        outcome = Outcome(None, passed=True, written=written)
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
            name=key, variant=variant, run_variant=run_variant, verdict=verdict, passed=passed, profile=profile,
            prompt=shown.prompt if shown is not None else "",
            first_divergence=divergence.step if divergence else comparison.first_hash_step,
            golden_margin=divergence.golden_margin if divergence else None,
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
            parts = [f"{len(failures)} golden checks failed in this test (every check ran and has its candidate):"]
            for number, (failure, at) in enumerate(failures, start=1):
                lines = str(failure).splitlines()
                if lines and lines[-1].endswith(accept):
                    lines.pop()  # said once, below
                where = f" at {Path(at[0].f_code.co_filename).name}:{at[2]}" if at else ""
                parts.append(f"[{number}/{len(failures)}]{where} " + "\n".join(lines))
            parts.append(f"Accept all of them with: {accept}")
            error = GoldenMismatchError("\n".join(parts), first.comparison,
                                        failures=tuple(failure for failure, _ in failures))
        raise error.with_traceback(types.TracebackType(None, *site) if site else None) from None

    def to_json(self) -> dict[str, Any] | None:
        return None if self.data.is_empty() else self.data.to_payload()


def _steps(generation: Generation, limit: int = 64) -> list[tuple[str, int, float, float | None]]:
    """``(piece, token id, margin, top-1 logprob)`` per step, for the HTML report."""
    return [(piece, token, margin, top[0][1] if top else None)
            for piece, token, margin, top in zip(generation.pieces, generation.token_ids, generation.margins,
                                                 generation.top_logprobs)][:limit]
