"""Two runs of one eval, item by item: which items flipped, whether each flip sat at a near tie of the
model's own margin, and whether the accuracy moved by more than this eval can tell from chance. Pure:
no pytest, torch or I/O.

The test is paired, as the runs are (the same items twice): only the items that changed their
correctness carry information, so the test is the exact McNemar test, a two-sided binomial test of
the right-to-wrong count among all flips at p = 1/2, computed in integers (no approximation, no
dependency). The minimum detectable effect is the accuracy change this eval would detect with
probability ``power`` at level ``alpha``, given how often its items flip (Connor's normal
approximation for paired proportions: ``(z[1-alpha/2] + z[power]) * sqrt(flip rate / n)``).

The gate::

    ALLOW         no item flipped; or every flip sat at a near tie (numeric noise can flip those);
                  or the accuracy rose significantly
    REJECT        the accuracy fell significantly
    INCONCLUSIVE  confident flips whose net change this eval cannot resolve; it says how many items
                  would resolve a change of this size

A flip's margin is the golden's (the earlier run's): how sure the model was of the decision that
changed, as a token flip is judged by the golden's top-1/top-2 margin. A flip with no margin recorded
(an lm-eval generative task) is never called a near tie.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from fractions import Fraction
from statistics import NormalDist

from pytest_llmdeterminism.errors import LLMDeterminismError
from pytest_llmdeterminism.generation import Evaluation

__all__ = ["EvalComparison", "EvalMismatch", "Flip", "Gate", "Outcome", "compare_evals", "items_needed",
           "mcnemar_p", "minimum_detectable_effect", "outcomes"]

DEFAULT_ALPHA = 0.05
DEFAULT_POWER = 0.8
# A flip whose golden margin (a difference of summed log-probabilities, or the smallest top-1/top-2
# log-probability margin on a generated answer's path) is below this sat at a near tie.
DEFAULT_EVAL_TIE_MARGIN = 0.1
RIGHT_TO_WRONG = "right_to_wrong"
WRONG_TO_RIGHT = "wrong_to_right"


class Gate(str, enum.Enum):
    ALLOW = "ALLOW"
    REJECT = "REJECT"
    INCONCLUSIVE = "INCONCLUSIVE"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Outcome:
    """One item of one run: its decision (a choice's index or a generated answer), whether it was
    correct, the margin of the decision (None: not recorded) and a hash of its input (None: not
    recorded; two runs whose hashes of an item differ did not run the same item)."""

    id: str
    correct: bool
    margin: float | None = None
    choice: int | str | None = None
    input: str | None = None


@dataclass(frozen=True)
class Flip:
    id: str
    direction: str  # RIGHT_TO_WRONG or WRONG_TO_RIGHT
    margin_before: float | None
    margin_after: float | None
    near_tie: bool
    choice_before: int | str | None = None
    choice_after: int | str | None = None


@dataclass(frozen=True)
class EvalComparison:
    gate: Gate
    reason: str  # why the gate is what it is, one sentence
    items: int
    accuracy: tuple[float, float]  # before, after
    flips: tuple[Flip, ...]  # right-to-wrong first; in each direction the surest (or unrecorded) first
    p_value: float  # exact McNemar, two-sided
    mde: float  # the minimum detectable accuracy change (a fraction, not points)
    churn: float  # the fraction of items that flipped
    items_needed: int | None  # INCONCLUSIVE: items that would resolve the observed change; else None
    alpha: float
    tie_margin: float

    @property
    def right_to_wrong(self) -> int:
        return sum(flip.direction == RIGHT_TO_WRONG for flip in self.flips)

    @property
    def wrong_to_right(self) -> int:
        return len(self.flips) - self.right_to_wrong

    @property
    def near_ties(self) -> int:
        return sum(flip.near_tie for flip in self.flips)


class EvalMismatch(LLMDeterminismError, ValueError):
    """The two runs of an eval do not hold the same items: the message names what differs."""


def outcomes(evaluation: Evaluation) -> list[Outcome]:
    """The items of ``evaluation`` (``llm_model.evaluate``) as :func:`compare_evals` takes them."""
    return [Outcome(item.id, item.correct, margin=item.margin, choice=item.choice, input=item.input)
            for item in evaluation.items]


def mcnemar_p(right_to_wrong: int, wrong_to_right: int) -> float:
    """The exact two-sided McNemar p-value: twice the smaller binomial tail of the flips at 1/2
    (at most 1), in exact integer arithmetic."""
    flips = right_to_wrong + wrong_to_right
    if flips == 0:
        return 1.0
    tail = sum(math.comb(flips, k) for k in range(min(right_to_wrong, wrong_to_right) + 1))
    return float(min(Fraction(1), Fraction(2 * tail, 2**flips)))


def _z(alpha: float, power: float) -> float:
    normal = NormalDist()
    return normal.inv_cdf(1 - alpha / 2) + normal.inv_cdf(power)


def minimum_detectable_effect(items: int, flips: int, *, alpha: float = DEFAULT_ALPHA,
                              power: float = DEFAULT_POWER) -> float:
    """The smallest accuracy change (a fraction) an eval of ``items`` items whose runs disagree on
    ``flips`` of them detects with probability ``power`` at level ``alpha``. With no flip observed,
    the rate of one flip stands in (zero would promise any change could be seen)."""
    return _z(alpha, power) * math.sqrt(max(flips, 1) / items) / math.sqrt(items)


def items_needed(items: int, flips: int, net: int, *, alpha: float = DEFAULT_ALPHA,
                 power: float = DEFAULT_POWER) -> int | None:
    """How many items, flipping at this eval's rate, would detect a net change of ``net`` items in
    ``items`` at level ``alpha`` with probability ``power``; None when there is no net change."""
    if net == 0 or flips == 0:
        return None
    return math.ceil(_z(alpha, power) ** 2 * (flips / items) / (net / items) ** 2)


def compare_evals(before: Sequence[Outcome], after: Sequence[Outcome], *, alpha: float = DEFAULT_ALPHA,
                  tie_margin: float = DEFAULT_EVAL_TIE_MARGIN,
                  power: float = DEFAULT_POWER) -> EvalComparison:
    """Two runs of the same items (any order): their flips, the statistics and the gate.
    ``EvalMismatch`` when the runs' items differ (by id, or by input hash) or an id repeats."""
    if not 0 < alpha < 1 or not 0 < power < 1:
        raise ValueError(f"alpha and power are probabilities strictly between 0 and 1, got {alpha}, {power}")
    earlier, later = _by_id(before, "the first run"), _by_id(after, "the second run")
    _same_items(earlier, later)
    if not earlier:
        raise EvalMismatch("the runs hold no item: nothing to compare")
    flips = tuple(sorted((_flip(earlier[key], later[key], tie_margin) for key in earlier
                          if earlier[key].correct != later[key].correct), key=_flip_order))
    items = len(earlier)
    worse = sum(flip.direction == RIGHT_TO_WRONG for flip in flips)
    better = len(flips) - worse
    p_value = mcnemar_p(worse, better)
    gate, reason = _gate(flips, worse, better, p_value, alpha)
    return EvalComparison(
        gate=gate, reason=reason, items=items,
        accuracy=(_accuracy(earlier.values()), _accuracy(later.values())), flips=flips, p_value=p_value,
        mde=minimum_detectable_effect(items, len(flips), alpha=alpha, power=power),
        churn=len(flips) / items,
        items_needed=(items_needed(items, len(flips), worse - better, alpha=alpha, power=power)
                      if gate is Gate.INCONCLUSIVE else None),
        alpha=alpha, tie_margin=tie_margin)


def _gate(flips: tuple[Flip, ...], worse: int, better: int, p_value: float, alpha: float) -> tuple[Gate, str]:
    if not flips:
        return Gate.ALLOW, "no item changed its correctness"
    if all(flip.near_tie for flip in flips):
        return Gate.ALLOW, "every flip sat at a near tie, where a numeric change can flip a decision"
    if p_value < alpha and better > worse:
        return Gate.ALLOW, f"the accuracy rose significantly (p = {p_value:.3g} < {alpha:g})"
    if p_value < alpha:
        return Gate.REJECT, f"the accuracy fell significantly (p = {p_value:.3g} < {alpha:g})"
    return Gate.INCONCLUSIVE, (f"confident flips whose net change this eval cannot resolve "
                               f"(p = {p_value:.3g} >= {alpha:g})")


def _by_id(outcomes: Sequence[Outcome], run: str) -> dict[str, Outcome]:
    found: dict[str, Outcome] = {}
    for outcome in outcomes:
        if outcome.id in found:
            raise EvalMismatch(f"{run} holds item {outcome.id!r} twice: each item id must be unique")
        found[outcome.id] = outcome
    return found


def _same_items(earlier: dict[str, Outcome], later: dict[str, Outcome]) -> None:
    only_before = [key for key in earlier if key not in later]
    only_after = [key for key in later if key not in earlier]
    if only_before or only_after:
        parts = [f"{len(keys)} only in the {run} run ({_some(keys)})"
                 for keys, run in ((only_before, "first"), (only_after, "second")) if keys]
        raise EvalMismatch(f"the runs hold different items: {'; '.join(parts)}. Compare two runs of the "
                           f"same eval (the same items, by id).")
    changed = [key for key, outcome in earlier.items()
               if None not in (outcome.input, later[key].input) and outcome.input != later[key].input]
    if changed:
        raise EvalMismatch(f"{len(changed)} item(s) hold another input in the second run ({_some(changed)}): "
                           f"their prompt or document changed, so their flips say nothing of the model. "
                           f"Compare two runs of the same items.")


def _some(keys: list[str], shown: int = 5) -> str:
    listed = ", ".join(repr(key) for key in keys[:shown])
    return listed + (f", and {len(keys) - shown} more" if len(keys) > shown else "")


def _flip(before: Outcome, after: Outcome, tie_margin: float) -> Flip:
    return Flip(id=before.id, direction=RIGHT_TO_WRONG if before.correct else WRONG_TO_RIGHT,
                margin_before=before.margin, margin_after=after.margin,
                near_tie=before.margin is not None and before.margin < tie_margin,
                choice_before=before.choice, choice_after=after.choice)


def _flip_order(flip: Flip) -> tuple[bool, float, str]:
    margin = flip.margin_before if flip.margin_before is not None else math.inf
    return flip.direction != RIGHT_TO_WRONG, -margin, flip.id


def _accuracy(outcomes: Collection[Outcome]) -> float:
    return sum(outcome.correct for outcome in outcomes) / len(outcomes)
