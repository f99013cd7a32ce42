"""Pure comparison: golden vs actual generation (or score) -> one frozen :class:`Comparison`. No I/O,
no torch."""

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


def compare_generations(expected: Generation, actual: Generation, *,
                        tie_margin: float | None = None) -> Comparison:
    """Two generations, step by step (the generation kind's compare)."""
    changes = input_changes(expected, actual)
    if changes:
        return Comparison(Verdict.INPUT_CHANGED, input_changes=changes)
    budgets, limit = _common_budget(expected, actual)
    streams = _streams(expected, actual)
    steps = min(len(expected.token_ids), len(actual.token_ids))
    if limit is not None:
        streams, steps = (streams[0][:limit], streams[1][:limit]), min(steps, limit)
    token_step = first_token_divergence(*streams)
    compared = steps if token_step is None else token_step
    # Steps after a token divergence see different inputs: nothing there is evidence.
    hashed = min(steps, compared + 1)
    definitions: tuple[str, str] | None = (expected.hash_definition, actual.hash_definition)
    if expected.hash_definition != actual.hash_definition:
        first_hash: int | None = 0
    else:
        definitions, first_hash = None, next(
            (t for t in range(hashed) if expected.step_hashes[t] != actual.step_hashes[t]), None)
    delta = _max_logprob_delta(expected.top_logprobs[:compared], actual.top_logprobs[:compared])
    dtype = expected.fingerprint.get("dtype", "")
    margin = tie_margin if tie_margin is not None else default_tie_margin(dtype)
    if token_step is None:
        verdict, divergence = (Verdict.IDENTICAL if first_hash is None else Verdict.LOGIT_DRIFT), None
    else:
        divergence = _divergence(expected, actual, token_step)
        verdict = _classify(divergence, margin, delta)
    beyond = [0 if limit is None else max(0, len(gen.token_ids) - limit) for gen in (actual, expected)]
    return Comparison(verdict, divergence=divergence, first_hash_step=first_hash, steps_compared=compared,
                      total_steps=len(expected.token_ids), max_logprob_delta=delta, tie_margin=margin,
                      hash_definitions=definitions, budgets=budgets, new_steps=beyond[0],
                      unchecked_steps=beyond[1])


def first_token_divergence(expected: Sequence[object], actual: Sequence[object]) -> int | None:
    """The first step whose token (or any item) differs; where one side stopped (EOS) and the other
    went on, the step after the shorter one; None when both are the same."""
    steps = min(len(expected), len(actual))
    step = next((t for t in range(steps) if expected[t] != actual[t]), None)
    return steps if step is None and len(expected) != len(actual) else step


def input_changes(expected: Generation, actual: Generation) -> tuple[tuple[str, Any, Any], ...]:
    """What went *into* the generation and differs: shown before, and instead of, an output diff."""
    changes: list[tuple[str, Any, Any]] = []
    if expected.prompt_token_ids != actual.prompt_token_ids:
        changes.append(("prompt_token_ids", expected.prompt_token_ids, actual.prompt_token_ids))
    if _batch_shape_matters(expected, actual):
        changes.append(("batch_shape", expected.batch_shape, actual.batch_shape))
    old, new = expected.generation_config, actual.generation_config
    for key in sorted(set(old) | set(new)):
        if key == BUDGET and isinstance(old.get(key), int) and isinstance(new.get(key), int):
            continue  # another budget changes how far the outputs go, not what they are: see _common_budget
        if _normalise(old.get(key)) != _normalise(new.get(key)):
            changes.append((f"generation_config.{key}", old.get(key), new.get(key)))
    return tuple(changes)


def _batch_shape_matters(expected: Recorded, actual: Recorded) -> bool:
    """The two sides ran in different batch shapes, and that could change their numbers: an engine
    that ran each prompt alone (llama.cpp, a server) was not touched by the batch shape, nor were
    both sides computed on the same batch-invariant kernels."""
    invariant = expected.fingerprint.get("batch_invariant")
    alone = (any(gen.fingerprint.get("rows_alone") for gen in (expected, actual))
             or (bool(invariant) and invariant == actual.fingerprint.get("batch_invariant")))
    return expected.batch_shape != actual.batch_shape and not alone


def score_input_changes(expected: Score, actual: Score) -> tuple[tuple[str, Any, Any], ...]:
    """What went into two scores and differs: the prompt, the continuation, the batch shape (as for
    generations), the settings (whether prompt logprobs were asked for, the top-k recorded)."""
    changes: list[tuple[str, Any, Any]] = []
    if expected.prompt_token_ids != actual.prompt_token_ids:
        changes.append(("prompt_token_ids", expected.prompt_token_ids, actual.prompt_token_ids))
    if expected.token_ids != actual.token_ids:
        changes.append(("continuation", expected.token_ids, actual.token_ids))
    if _batch_shape_matters(expected, actual):
        changes.append(("batch_shape", expected.batch_shape, actual.batch_shape))
    asked = bool(expected.prompt_logprobs), bool(actual.prompt_logprobs)
    if asked[0] != asked[1]:
        changes.append(("settings.prompt_logprobs", *asked))
    if score_top_k(expected) != score_top_k(actual):
        changes.append(("settings.top_k", score_top_k(expected), score_top_k(actual)))
    return tuple(changes)


def _rank_changed(expected: int | None, actual: int | None, expected_k: int, actual_k: int) -> bool:
    """The given token's rank changed. ``None`` is a rank the engine did not say (outside its top-k,
    a server's): a change only where the other side's rank falls inside that top-k, so a rank
    known on one side only (two engines) is no change by itself."""
    if expected == actual:
        return False
    if expected is None:
        return actual is not None and actual <= expected_k
    if actual is None:
        return expected <= actual_k
    return True


def score_top_k(score: Score) -> int:
    """How many best tokens each position of ``score`` records (``llm_model.score(top_k=...)``)."""
    return max(map(len, score.top_logprobs), default=0)


def compare_scores(expected: Score, actual: Score, *, tie_margin: float | None = None) -> Comparison:
    """Two scores of the same continuation, position by position: IDENTICAL (every hash equal),
    LOGIT_DRIFT (logprobs moved, no rank changed), RANK_FLIP (a given token's rank changed at a near
    tie: its golden rank margin below ``tie_margin``, or within the drift of the score's other
    positions), REGRESSION (a rank changed where the golden was confident), INPUT_CHANGED (prompt,
    continuation or settings). As for generations, the size of the drift is the profile's to judge."""
    changes = score_input_changes(expected, actual)
    if changes:
        return Comparison(Verdict.INPUT_CHANGED, input_changes=changes)
    positions = len(expected.token_ids)
    definitions: tuple[str, str] | None = (expected.hash_definition, actual.hash_definition)
    if expected.hash_definition != actual.hash_definition:
        first_hash: int | None = 0
    else:
        definitions, first_hash = None, next(
            (t for t in range(positions) if expected.step_hashes[t] != actual.step_hashes[t]), None)
    dtype = expected.fingerprint.get("dtype", "")
    margin = tie_margin if tie_margin is not None else default_tie_margin(dtype)
    ks = score_top_k(expected), score_top_k(actual)
    reranked = {t for t in range(positions) if _rank_changed(expected.ranks[t], actual.ranks[t], *ks)}
    deltas = _position_deltas(expected, actual)
    highest = sorted(range(positions), key=lambda t: -deltas[t])[:2]  # the drift elsewhere of any position

    def elsewhere(t: int) -> float:
        return max((deltas[s] for s in highest if s != t), default=0.0)

    changed = [PositionChange(t, expected.token_ids[t], expected.logprobs[t], actual.logprobs[t],
                              expected.ranks[t], actual.ranks[t], expected.rank_margins[t], elsewhere(t))
               for t in range(positions) if expected.logprobs[t] != actual.logprobs[t] or t in reranked]
    moved = sorted((c for c in changed if c.delta > 0), key=lambda c: (-c.delta, c.position))
    ranks = tuple(c for c in changed if c.position in reranked)
    delta = max(deltas, default=0.0)
    evidence = ScoreEvidence(positions, tuple(moved[:MOVED_SHOWN]), len(moved), ranks, expected.total,
                             actual.total)
    confident = [c for c in ranks if not near_tie(c.rank_margin, margin, c.drift_elsewhere)]
    if confident:
        verdict = Verdict.REGRESSION
    elif ranks:
        verdict = Verdict.RANK_FLIP
    elif first_hash is None and not moved:
        verdict = Verdict.IDENTICAL
    else:
        verdict = Verdict.LOGIT_DRIFT
    return Comparison(verdict, first_hash_step=first_hash, steps_compared=positions, total_steps=positions,
                      max_logprob_delta=delta, tie_margin=margin, hash_definitions=definitions,
                      score=evidence)


def _position_deltas(expected: Score, actual: Score) -> list[float]:
    """Per position: the largest |Δlogprob| of the given token and the top-k ids both sides share."""
    if expected.logprobs == actual.logprobs and expected.top_logprobs == actual.top_logprobs:
        return [0.0] * len(expected.token_ids)  # the common case, compared at C speed
    return [max(abs(expected.logprobs[t] - actual.logprobs[t]),
                _max_logprob_delta(expected.top_logprobs[t:t + 1], actual.top_logprobs[t:t + 1]))
            for t in range(len(expected.token_ids))]


STOPPED = "<stopped at EOS>"
BUDGET = "max_new_tokens"


def _common_budget(expected: Generation, actual: Generation) -> tuple[tuple[int, int] | None, int | None]:
    """Two budgets (max_new_tokens) and the number of steps both sides can be judged on, or
    ``(None, None)`` when the budgets are equal. A side that ran out of budget (finish "length") says
    nothing about the steps after it; a side that stopped at EOS is complete, whatever the budget,
    so the other side must stop there too."""
    old, new = expected.generation_config.get(BUDGET), actual.generation_config.get(BUDGET)
    if old == new or not isinstance(old, int) or not isinstance(new, int):
        return None, None
    cut = [len(gen.token_ids) for gen in (expected, actual) if gen.finish_reason == "length"]
    return (old, new), (min(cut) if cut else None)


def _streams(expected: Generation, actual: Generation) -> tuple[list[object], list[object]]:
    """The tokens as compared. An engine that stops at EOS without returning the token (a server)
    and one that returns it stopped at the same step: against such a side, the other's final EOS
    token reads as the same stop. Two sides that both returned their EOS compare the ids as they are."""
    streams: tuple[list[object], list[object]] = (list(expected.token_ids), list(actual.token_ids))
    bare = [_stopped_without_token(gen) for gen in (expected, actual)]
    if bare[0] != bare[1]:
        for tokens, gen, without in zip(streams, (expected, actual), bare, strict=True):
            if without:
                tokens.append(STOPPED)
            elif gen.finish_reason == "eos" and tokens:
                tokens[-1] = STOPPED
    return streams


def _stopped_without_token(gen: Generation) -> bool:
    eos = gen.generation_config.get("eos_token_id") or ()
    ids = eos if isinstance(eos, (list, tuple)) else (eos,)
    return gen.finish_reason == "eos" and not (gen.token_ids and gen.token_ids[-1] in ids)


def _normalise(value: Any) -> Any:
    return list(value) if isinstance(value, (list, tuple)) else value


def _divergence(expected: Generation, actual: Generation, step: int) -> Divergence:
    def at(gen: Generation) -> tuple[int, TopK]:
        if step < len(gen.token_ids):
            return gen.token_ids[step], gen.top_logprobs[step]
        return -1, ()  # this side had already stopped

    (expected_token, expected_top), (actual_token, actual_top) = at(expected), at(actual)
    margin = expected.margins[step] if step < len(expected.margins) else float("inf")
    temperature = expected.generation_config.get("temperature") if expected.draw_margins else None
    if isinstance(temperature, (int, float)) and temperature > 0 and step < len(expected.draw_margins):
        return Divergence(step, expected_token, actual_token, expected_top, actual_top, margin,
                          draw_margin=expected.draw_margins[step], temperature=float(temperature))
    return Divergence(step, expected_token, actual_token, expected_top, actual_top, margin)


def _classify(divergence: Divergence, tie_margin: float, drift: float) -> Verdict:
    """TIE_FLIP (SAMPLE_FLIP for a draw) where the golden's margin at the divergence was a near tie
    (:func:`near_tie`: ``drift`` is what this run measured before it), else REGRESSION."""
    if divergence.draw_margin is not None and divergence.temperature is not None:
        # A draw: both tokens' perturbed scores move by the logit drift over T. Neither side stopped.
        drawn = divergence.expected_token >= 0 and divergence.actual_token >= 0
        t = divergence.temperature
        near = near_tie(divergence.draw_margin, tie_margin / t, drift / t)
        return Verdict.SAMPLE_FLIP if drawn and near else Verdict.REGRESSION
    in_top = any(token == divergence.actual_token for token, _ in divergence.expected_top)
    near = near_tie(divergence.golden_margin, tie_margin, drift)
    return Verdict.TIE_FLIP if near and in_top else Verdict.REGRESSION


def _max_logprob_delta(expected: tuple[TopK, ...], actual: tuple[TopK, ...]) -> float:
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
