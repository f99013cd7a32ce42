"""Typed records of what one test decided, carried from the test to the run's end and into reports.

A golden check's :class:`Decision` (what ``judge.decision.decide`` returns: data, no words) becomes a
:class:`CheckRecord` with :meth:`CheckRecord.of`. A test's recorder
(:class:`~pytest_llmdeterminism.reporting.recorder.TestOutcomes`) holds a
:class:`TestRecords`. Under pytest-xdist that travels to the controller on the test's report as
plain JSON types (:meth:`TestRecords.to_payload`) and is decoded back, and validated, with
:meth:`TestRecords.from_payload`: the same types on both sides, the golden entries included.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from pytest_llmdeterminism.goldens import kinds, schema
from pytest_llmdeterminism.judge.compare import (
    PositionChange,
    Recorded,
    Verdict,
    first_token_divergence,
    id_window,
    kind_of,
)
from pytest_llmdeterminism.judge.decision import Decision, Outcome


class GoldenWrite(msgspec.Struct, array_like=True, gc=False):
    """One entry to write: a recorded golden, or a candidate for ``--llm-golden-artifacts``."""

    path: str
    key: str
    variant: str
    # An AnyEntry: its kind's entry type. Typed Any for msgspec, which cannot choose between untagged
    # structs: a payload's plain entry is decoded as its kind's below.
    entry: Any
    overwrote: str = ""  # the verdict of the golden an update replaced (a Verdict's value); "" for none
    # A candidate's: the profile the run set for its check (goldens.judged); "": the environment's default
    tolerance: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.entry, dict):  # decoded from a payload (xdist, the run's ledger)
            self.entry = msgspec.convert(self.entry, kinds.entry_type(self.entry.get("kind", "generation")))

    @classmethod
    def of(cls, path: Path, key: str, generation: Recorded, *,
           overwrote: Verdict | None = None, tolerance: str = "") -> GoldenWrite:
        entry = schema.to_struct(schema.to_entry(generation))
        return cls(str(path), key, generation.variant, entry,
                   overwrote.value if overwrote is not None else "", tolerance)


class InputRecord(msgspec.Struct, kw_only=True, gc=False):
    """One side's input, for a check whose input changed: what the model saw, and a window of its
    token ids (``prompt_token_ids[i]`` is the id at position ``ids_from + i`` of ``ids_total``)."""

    prompt: str  # a chat conversation as rendered with its template
    prompt_form: str  # "text", "chat" or "token_ids"
    prompt_token_ids: list[int]
    ids_from: int
    ids_total: int

    @classmethod
    def of(cls, generation: Recorded, first_difference: int | None) -> InputRecord:
        ids = generation.prompt_token_ids
        start, end = id_window(len(ids), first_difference, before=8, after=24)
        return cls(prompt=generation.prompt, prompt_form=generation.prompt_form,
                   prompt_token_ids=list(ids[start:end]), ids_from=start, ids_total=len(ids))


class MovedPosition(msgspec.Struct, kw_only=True, gc=False):
    """One position of a score check whose given token's logprob (or rank) moved."""

    position: int
    token: int
    piece: str  # the token's text as the golden recorded it
    expected_logprob: float
    actual_logprob: float
    expected_rank: int | None
    actual_rank: int | None
    rank_margin: float | None  # the golden's distance from the token to its neighbour in rank

    @classmethod
    def of(cls, change: PositionChange, expected: Recorded) -> MovedPosition:
        piece = expected.pieces[change.position] if change.position < len(expected.pieces) else ""
        return cls(position=change.position, token=change.token, piece=piece,
                   expected_logprob=change.expected_logprob, actual_logprob=change.actual_logprob,
                   expected_rank=change.expected_rank, actual_rank=change.actual_rank,
                   rank_margin=change.rank_margin)


class CheckRecord(msgspec.Struct, kw_only=True, gc=False):
    """One golden comparison, as ``--llm-report`` lists it (its JSON form is the report's schema)."""

    test: str = ""  # node id, set when the run collects the test's records
    test_duration_s: float = 0.0
    name: str  # golden key
    variant: str  # the golden variant compared with
    run_variant: str = ""  # this run's variant, when another one was compared (--llm-golden-fallback)
    prompt: str = ""  # as the model saw it (a chat conversation rendered with its template)
    expected_text: str | None = None  # the golden's output text (None: no golden, MISSING)
    actual_text: str | None = None  # this run's output text
    verdict: str
    passed: bool
    profile: str = ""
    first_divergence: int | None = None
    golden_margin: float | None = None  # inf where the golden had stopped; the JSON report writes null
    max_logprob_delta: float = 0.0
    tie_margin: float = 0.0  # below this golden margin a step is a near tie (the comparator's own)
    # A sampled generation (do_sample=True): how it was drawn (sampler, temperature, top_k, top_p,
    # min_p, seed: this run's, else the golden's), and the golden's draw margin where the tokens
    # first differ. Empty and None for a greedy one.
    sampling: dict[str, Any] = msgspec.field(default_factory=dict)
    draw_margin: float | None = None
    input_changes: list[str] = msgspec.field(default_factory=list)
    changed_fingerprint: dict[str, tuple[Any, Any]] = msgspec.field(default_factory=dict)
    numerics_changed: list[str] = msgspec.field(default_factory=list)  # non-empty: across environments
    # [piece, token id, margin, top-1 logprob] per step and side ("expected", "actual"), for HTML.
    steps: dict[str, list[tuple[str, int, float, float | None]]] = msgspec.field(default_factory=dict)
    # the top 5 [token id, logprob] per step (a score's per position) and side, as ``steps``
    top_steps: dict[str, list[list[tuple[int, float]]]] = msgspec.field(default_factory=dict)
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
    # A score check (golden_tokens.check(score)): "score" (its texts are the continuation); the
    # positions that moved most and every rank change; the continuation's log-likelihood
    # [golden's, this run's] (None: a generation, or no golden).
    kind: str = "generation"
    moved_positions: list[MovedPosition] = msgspec.field(default_factory=list)
    rank_changes: list[MovedPosition] = msgspec.field(default_factory=list)
    log_likelihood: tuple[float, float] | None = None
    # What a kind's own rule found, where its verdict names no token (an eval's accuracy, flips and
    # gate), and its evidence line by line (an eval's statistics, changed items and forecast).
    finding: str = ""
    evidence: list[str] = msgspec.field(default_factory=list)

    @classmethod
    def of(cls, decision: Decision, *, name: str) -> CheckRecord:
        """The record of one judged check (not of a golden written instead): its golden key ``name``."""
        comparison, expected, actual = decision.comparison, decision.expected, decision.actual
        divergence = comparison.divergence
        inputs: dict[str, InputRecord] = {}
        first_input = None
        if comparison.verdict is Verdict.INPUT_CHANGED and expected is not None:
            first_input = first_token_divergence(expected.prompt_token_ids, actual.prompt_token_ids)
            inputs = {side: InputRecord.of(gen, first_input) for side, gen in (("expected", expected),
                                                                               ("actual", actual))}
        evidence = comparison.score
        moved: list[MovedPosition] = []
        ranks: list[MovedPosition] = []
        if evidence is not None and expected is not None:  # two scores, compared position by position
            moved = [MovedPosition.of(change, expected) for change in evidence.moved]
            ranks = [MovedPosition.of(change, expected) for change in evidence.rank_changes]
        return cls(
            kind=kind_of(actual), moved_positions=moved, rank_changes=ranks,
            log_likelihood=(evidence.expected_total, evidence.actual_total) if evidence is not None else None,
            name=name, variant=decision.variant,
            run_variant=actual.variant if actual.variant != decision.variant else "",
            verdict=comparison.verdict.value, passed=decision.passed,
            profile=str(decision.profile) if decision.profile is not None else "",
            prompt=actual.prompt,
            expected_text=text_of(expected) if expected is not None else None,
            actual_text=text_of(actual),
            first_divergence=divergence.step if divergence else comparison.first_hash_step,
            golden_margin=divergence.golden_margin if divergence else None,
            sampling=kinds.of(actual).sampling(actual),
            draw_margin=divergence.draw_margin if divergence else None,
            max_logprob_delta=comparison.max_logprob_delta, tie_margin=comparison.tie_margin,
            input_changes=[field for field, _, _ in comparison.input_changes],
            changed_fingerprint={field: (old, new) for field, old, new in decision.changed},
            numerics_changed=[field for field, _, _ in decision.environment],
            steps={side: _steps(gen) for side, gen in (("expected", expected), ("actual", actual)) if gen},
            top_steps={side: [[(int(token), float(logprob)) for token, logprob in top[:_TOP_SHOWN]]
                              for top in gen.top_logprobs[:_STEPS_SHOWN]]
                       for side, gen in (("expected", expected), ("actual", actual)) if gen},
            inputs=inputs, first_input_difference=first_input,
            input_diff={field: (old, new) for field, old, new in comparison.input_changes
                        if field != "prompt_token_ids"},
            max_new_tokens=comparison.budgets, new_steps=comparison.new_steps,
            judged_steps=comparison.total_steps - comparison.unchecked_steps if comparison.budgets else 0,
            unchecked_steps=comparison.unchecked_steps,
            finding=comparison.finding, evidence=list(comparison.lines),
        )


class RunRecord(msgspec.Struct, kw_only=True):
    """What one run checked, as the JSON report's ``run`` holds it: enough for ``llm-golden merge``
    to judge the runs of several shards as one. Node ids as pytest writes them; golden files
    relative to the rootdir (absolute when outside it), so shards on other machines agree."""

    suite: list[str]  # every test collected, deselected ones included: under pytest-split, the whole suite
    selected: list[str]  # the tests this run set out to run
    outcomes: dict[str, str]  # passed / failed / skipped, of every test that ran to its end
    golden_files: dict[str, str]  # test module (the node id before "::") -> its golden file
    used: list[tuple[str, str]]  # (golden file, key) that some check looked up
    stopped: list[str]  # why the run ended early or could not collect a module; empty when neither
    partial: list[str]  # every reason this run alone does not speak for the whole suite
    failed: bool  # some test failed or errored
    # False when test ids on the command line kept the rest of the suite from being collected at all
    suite_collected: bool = True
    candidates: str | None = None  # the --llm-golden-artifacts folder, relative to the report's folder
    commit: str | None = None  # the git commit the run's checkout was at (None: not a git checkout)


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
    # (golden key, seconds from the test's start or its previous check), per check, for progress lines
    timings: list[tuple[str, float]] = msgspec.field(default_factory=list)
    header: dict[str, str] = msgspec.field(default_factory=dict)  # what its checks ran, for reports' header
    accept: str = ""  # the command its failing checks' message gives (records or accepts its goldens)

    def is_empty(self) -> bool:
        return not (self.records or self.outcomes or self.notes or self.audits or self.used
                    or self.candidates)

    def to_payload(self) -> dict[str, Any]:
        """Plain JSON types: what crosses the process boundary under xdist."""
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]

    @classmethod
    def from_payload(cls, payload: Any) -> TestRecords:
        return msgspec.convert(payload, cls)



def text_of(recorded: Recorded) -> str:
    """A generation's text, a score's continuation: what its kind shows of it."""
    return kinds.of(recorded).text(recorded)


_STEPS_SHOWN = 64  # steps (a score's positions) per side in the HTML report
_TOP_SHOWN = 5


def _steps(generation: Recorded, limit: int = _STEPS_SHOWN) -> list[tuple[str, int, float, float | None]]:
    """``(piece, token id, margin, top-1 logprob)`` per step, for the HTML report; a score's
    ``(piece, token id, rank margin, the given token's logprob)`` per position."""
    return kinds.of(generation).report_steps(generation)[:limit]


# What a CI log reads as a command of its own: GitHub Actions' ``::set-output`` (at a line's start),
# Azure Pipelines' ``##vso[`` and ``##[`` (anywhere in a line).
_LOG_COMMANDS = ("##vso[", "##[")
_OUTCOMES = ("passed", "skipped", "failed")


def report_strings_problem(checks: list[CheckRecord], run: RunRecord | None) -> str | None:
    """What in a JSON report read back (a CI artifact, untrusted) no run of the plugin writes, in the
    strings ``llm-golden compare`` and ``merge`` print: a verdict that is no :class:`Verdict`, an
    outcome that is none of passed, skipped, failed, or a test id, golden key or variant holding a
    control character (an escape sequence, a line break, a bidi override) or a CI log command. None
    where every one is as a run writes it."""
    verdicts = {verdict.value for verdict in Verdict}
    for check in checks:
        if check.verdict not in verdicts:
            return (f"check {check.name!r} of {check.test!r} has verdict {check.verdict!r}, which is none "
                    f"of {', '.join(sorted(verdicts))}")
    strings = [(f"a check's {field}", value) for check in checks
               for field, value in (("test id", check.test), ("golden key", check.name),
                                    ("variant", check.variant), ("variant", check.run_variant))]
    if run is not None:
        strings += [("a test id of its run", nodeid) for nodeid in
                    (*run.suite, *run.selected, *run.outcomes, *run.golden_files)]
        strings += [("a reason its run gives", reason) for reason in (*run.stopped, *run.partial)]
        strings += [("a golden file of its run", name) for name in run.golden_files.values()]
        strings += [("a golden key of its run", key) for _, key in run.used]
        wrong = sorted({outcome for outcome in run.outcomes.values() if outcome not in _OUTCOMES})
        if wrong:
            return f"its run has the test outcome {wrong[0]!r}, which is none of {', '.join(_OUTCOMES)}"
    for what, value in strings:
        if not value.isprintable() or value.startswith("::") or any(c in value for c in _LOG_COMMANDS):
            return (f"{what} {value!r} holds a control character or a CI log command, which no test id, "
                    "golden key or variant that pytest writes holds")
    return None
