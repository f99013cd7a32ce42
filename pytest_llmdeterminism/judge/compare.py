"""Pure comparison: golden vs actual record -> one frozen :class:`Comparison`. No I/O, no torch.

The comparison's data (the verdict and its evidence), the rules every kind shares (near ties, the
batch shape, the top-k drift) and the one entry point, :func:`compare`, which hands two records to
their kind's :class:`Comparer`: each kind of golden (``goldens.kinds``: a generation step by step, a
score position by position) compares its own records, and is plugged in from above."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, Union

from pytest_llmdeterminism.errors import LLMDeterminismError
from pytest_llmdeterminism.generation import Generation, Score, TopK
from pytest_llmdeterminism.judge.verdict import Verdict as Verdict  # re-exported: what compare() returns

# What a golden records and a check compares: a generation, or a score (a teacher-forced continuation).
Recorded = Union[Generation, Score]  # noqa: UP007 - an alias evaluated at run time (Python 3.10)

# Below this golden top-1/top-2 margin (in logprob) a flipped token is classed as a near tie,
# unless the tolerance profile names its own margin. fp32 run-to-run noise across kernels is
# ~1e-5..1e-4 in logprob; half precisions round at ~1e-3 (fp16) and ~1e-2 (bf16) relative on
# logits of magnitude ~10, so their margins are wider.
DEFAULT_TIE_MARGIN = {"float32": 0.05, "float16": 0.25, "bfloat16": 0.5}


@dataclass(frozen=True)
class Divergence:
    """The first step whose token differs."""

    step: int
    expected_token: int
    actual_token: int
    expected_top: TopK
    actual_top: TopK
    golden_margin: float
    # sampled goldens: the golden's draw margin at the step and the temperature (None when greedy)
    draw_margin: float | None = None
    temperature: float | None = None


@dataclass(frozen=True)
class PositionChange:
    """One position of a score where the two sides differ: the given token, both logprobs and ranks,
    and the golden's rank margin (the distance to its nearest neighbour in rank; None: unknown)."""

    position: int
    token: int
    expected_logprob: float
    actual_logprob: float
    expected_rank: int | None
    actual_rank: int | None
    rank_margin: float | None
    drift_elsewhere: float = 0.0  # the score's largest |Δlogprob| at its other positions

    @property
    def delta(self) -> float:
        return abs(self.actual_logprob - self.expected_logprob)


@dataclass(frozen=True)
class ScoreEvidence:
    """Two scores of one continuation compared position by position (teacher-forced: every position is
    comparable, whatever changed). ``moved``: the positions whose logprob moved most, largest first
    (at most :data:`MOVED_SHOWN`); ``rank_changes``: every position whose given token's rank changed;
    the totals are the continuation's log-likelihood on each side."""

    positions: int
    moved: tuple[PositionChange, ...]
    moved_positions: int  # positions whose logprob differs at all
    rank_changes: tuple[PositionChange, ...]
    expected_total: float
    actual_total: float


MOVED_SHOWN = 5


@dataclass(frozen=True)
class Comparison:
    """A golden compared with a generation: the verdict, and the evidence it was decided on."""

    verdict: Verdict
    input_changes: tuple[tuple[str, Any, Any], ...] = ()
    divergence: Divergence | None = None
    first_hash_step: int | None = None  # first step whose logit hash differs (0 when not comparable)
    steps_compared: int = 0  # steps whose tokens matched before the first divergence
    total_steps: int = 0  # the golden's length
    max_logprob_delta: float = 0.0  # over top-k ids both sides share, before any token divergence
    tie_margin: float = 0.0  # the margin that classified a divergence as TIE_FLIP or REGRESSION
    # (golden's, this run's) step-hash definitions when they differ: no hash was compared, and equal
    # tokens are at best LOGIT_DRIFT (two engines' numbers are never shown "identical").
    hash_definitions: tuple[str, str] | None = None
    # (golden's, this run's) max_new_tokens when they differ: only the steps both budgets cover
    # were compared. ``new_steps``: this run's steps past a golden its smaller budget cut short (not
    # judged: the golden is incomplete); ``unchecked_steps``: golden steps past this run's budget.
    budgets: tuple[int, int] | None = None
    new_steps: int = 0
    unchecked_steps: int = 0
    score: ScoreEvidence | None = None  # two scores: the per-position evidence
    # What a verdict's rule found, in words, where no token diverged and no other evidence above says
    # it (a kind's own verdict): a failure's headline and a review line show it after the verdict.
    finding: str = ""
    # A kind's own evidence, line by line, where the fields above cannot hold it (an eval's changed
    # items and its statistics): a failure prints them under its headline.
    lines: tuple[str, ...] = ()
    # A kind's aggregate gate, where it has one (an eval's: ALLOW, REJECT or INCONCLUSIVE): the
    # ``gate`` tolerance profile passes the check on it instead of on the verdict.
    gate: str | None = None


def near_tie(margin: float | None, tie_margin: float, drift: float) -> bool:
    """A changed decision whose golden margin was below the tie margin, or within the drift this run
    measured around it (DESIGN §14: a changed decision at a near tie, within the drift, is a flip;
    away from a tie it is a REGRESSION). An unknown margin is no near tie."""
    return margin is not None and margin < max(tie_margin, drift)


def within_drift(margin: float | None, tie_margin: float, drift: float) -> bool:
    """A near tie only by the run's own drift: its margin was at or above the tie margin."""
    return margin is not None and tie_margin <= margin < drift


def default_tie_margin(dtype: str) -> float:
    return DEFAULT_TIE_MARGIN.get(dtype, DEFAULT_TIE_MARGIN["float32"])


class Comparer(Protocol):
    """What the judgement needs of a kind of golden (dependency inversion: the kinds, which also own
    their golden fields and live above the judgement in ``goldens.kinds``, plug in here): its name (a
    golden entry's ``kind``) and how two of its records compare."""

    name: str

    def compare(self, expected: Any, actual: Any, *, tie_margin: float | None) -> Comparison: ...


# record type -> its kind's comparer; filled by goldens.kinds' registry, one line per kind
_COMPARERS: dict[type, Comparer] = {}


def plug_in(record_type: type, comparer: Comparer) -> None:
    """Let :func:`compare` judge records of ``record_type`` with ``comparer`` (goldens.kinds' registry)."""
    _COMPARERS[record_type] = comparer


def unplug(record_type: type) -> None:
    _COMPARERS.pop(record_type, None)


def knows(recorded: object) -> bool:
    """Whether ``recorded`` is a record of a kind plugged in."""
    return type(recorded) in _COMPARERS


def comparer_of(recorded: object) -> Comparer:
    """The comparer of ``recorded``'s kind (a record of no registered kind is a TypeError)."""
    comparer = _COMPARERS.get(type(recorded))
    if comparer is None:
        raise TypeError(f"{type(recorded).__name__} is no kind of golden this run knows (one of "
                        f"{', '.join(sorted(c.name for c in _COMPARERS.values()))})")
    return comparer


def kind_of(recorded: Recorded) -> str:
    """A golden entry's ``kind`` for ``recorded``: ``"generation"``, ``"score"``, or a plugged-in one's."""
    return comparer_of(recorded).name


def compare(expected: Recorded, actual: Recorded, *, tie_margin: float | None = None) -> Comparison:
    """Golden ``expected`` vs ``actual``. ``tie_margin`` defaults to the one for the golden's dtype.
    The verdict says what happened, whatever the tolerance: drift (of a generation's or a score's
    logprobs) is LOGIT_DRIFT, and the profile decides whether its size passes. Two records of
    different kinds (a generation and a score) are INPUT_CHANGED (``kind``); two of one kind are
    compared by that kind."""
    golden, now = comparer_of(expected), comparer_of(actual)
    if golden is not now:
        return Comparison(Verdict.INPUT_CHANGED, input_changes=(("kind", golden.name, now.name),))
    return golden.compare(expected, actual, tie_margin=tie_margin)


def first_token_divergence(expected: Sequence[object], actual: Sequence[object]) -> int | None:
    """The first step whose token (or any item) differs; where one side stopped (EOS) and the other
    went on, the step after the shorter one; None when both are the same."""
    steps = min(len(expected), len(actual))
    step = next((t for t in range(steps) if expected[t] != actual[t]), None)
    return steps if step is None and len(expected) != len(actual) else step


def batch_shape_matters(expected: Recorded, actual: Recorded) -> bool:
    """The two sides ran in different batch shapes, and that could change their numbers: an engine
    that ran each prompt alone (llama.cpp, a server) was not touched by the batch shape, nor were
    both sides computed on the same batch-invariant kernels."""
    invariant = expected.fingerprint.get("batch_invariant")
    alone = (any(gen.fingerprint.get("rows_alone") for gen in (expected, actual))
             or (bool(invariant) and invariant == actual.fingerprint.get("batch_invariant")))
    return expected.batch_shape != actual.batch_shape and not alone


def max_logprob_delta(expected: tuple[TopK, ...], actual: tuple[TopK, ...]) -> float:
    if expected == actual:  # the common case, compared at C speed
        return 0.0
    delta = 0.0
    for exp_top, act_top in zip(expected, actual, strict=True):  # both cut to the steps compared
        act = dict(act_top)
        for token, logprob in exp_top:
            if token in act:
                delta = max(delta, abs(logprob - act[token]))
    return delta


class GoldenMismatchError(LLMDeterminismError, AssertionError):
    """A golden check failed. ``comparison`` carries the verdict and the first divergence;
    ``failures`` every failing check of the test when there were several."""

    def __init__(self, message: str, comparison: Comparison, *,
                 failures: tuple[GoldenMismatchError, ...] = (), **details: Any) -> None:
        self.comparison = comparison
        self.failures = failures or (self,)
        self.details = details
        super().__init__(message)


def id_window(total: int, first: int | None, *, before: int = 3, after: int = 6) -> tuple[int, int]:
    """``(start, end)`` of the ids to show out of ``total``: around the first differing position,
    or the first ones when none differs."""
    start = 0 if first is None else max(0, first - before)
    return start, min(total, (first or 0) + after if first is not None else before + after)
