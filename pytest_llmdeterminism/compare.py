"""Pure comparison: golden vs actual generation -> one frozen :class:`Comparison`. No I/O, no torch."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_llmdeterminism.errors import LLMDeterminismError
from pytest_llmdeterminism.generation import Generation, TopK

# Below this golden top-1/top-2 margin (in logprob) a flipped token is classed as a near tie,
# unless the tolerance profile names its own margin. fp32 run-to-run noise across kernels is
# ~1e-5..1e-4 in logprob; half precisions round at ~1e-3 (fp16) and ~1e-2 (bf16) relative on
# logits of magnitude ~10, so their margins are wider.
DEFAULT_TIE_MARGIN = {"float32": 0.05, "float16": 0.25, "bfloat16": 0.5}


class Verdict(enum.Enum):
    """What one golden check found; the tolerance profile decides whether it passes."""

    MISSING = "MISSING"  # no golden to compare with: decided by run.decision.decide, not compare()
    INPUT_CHANGED = "INPUT_CHANGED"
    IDENTICAL = "IDENTICAL"
    LOGIT_DRIFT = "LOGIT_DRIFT"
    TIE_FLIP = "TIE_FLIP"
    # A sampled golden (do_sample=True) whose token changed where its draw was a near tie: the
    # recorded draw margin is below what the tie margin's logit drift moves a perturbed score (tie
    # margin / temperature). Judged like TIE_FLIP.
    SAMPLE_FLIP = "SAMPLE_FLIP"
    REGRESSION = "REGRESSION"
    # Not from compare() either: a rerun of a test (pytest-rerunfailures) in the same process whose
    # output for a key differs from an earlier attempt's (run.decision.decide), so a rerun never passes.
    NONDETERMINISTIC = "NONDETERMINISTIC"


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


def default_tie_margin(dtype: str) -> float:
    return DEFAULT_TIE_MARGIN.get(dtype, DEFAULT_TIE_MARGIN["float32"])


def compare(expected: Generation, actual: Generation, *, tie_margin: float | None = None) -> Comparison:
    """Golden ``expected`` vs ``actual``. ``tie_margin`` defaults to the one for the golden's dtype."""
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
        verdict = _classify(divergence, margin)
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
    # An engine that ran each prompt alone (llama.cpp, a server) was not touched by the batch shape,
    # nor were both sides computed on the same batch-invariant kernels.
    invariant = expected.fingerprint.get("batch_invariant")
    alone = (any(gen.fingerprint.get("rows_alone") for gen in (expected, actual))
             or (bool(invariant) and invariant == actual.fingerprint.get("batch_invariant")))
    if expected.batch_shape != actual.batch_shape and not alone:
        changes.append(("batch_shape", expected.batch_shape, actual.batch_shape))
    old, new = expected.generation_config, actual.generation_config
    for key in sorted(set(old) | set(new)):
        if key == BUDGET and isinstance(old.get(key), int) and isinstance(new.get(key), int):
            continue  # another budget changes how far the outputs go, not what they are: see _common_budget
        if _normalise(old.get(key)) != _normalise(new.get(key)):
            changes.append((f"generation_config.{key}", old.get(key), new.get(key)))
    return tuple(changes)


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


def _classify(divergence: Divergence, tie_margin: float) -> Verdict:
    if divergence.draw_margin is not None and divergence.temperature is not None:
        # A draw: both tokens' perturbed scores move by the logit drift over T. Neither side stopped.
        drawn = divergence.expected_token >= 0 and divergence.actual_token >= 0
        near = divergence.draw_margin < tie_margin / divergence.temperature
        return Verdict.SAMPLE_FLIP if drawn and near else Verdict.REGRESSION
    in_top = any(token == divergence.actual_token for token, _ in divergence.expected_top)
    return Verdict.TIE_FLIP if divergence.golden_margin < tie_margin and in_top else Verdict.REGRESSION


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
