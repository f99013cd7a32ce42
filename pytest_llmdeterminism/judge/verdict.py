"""What one golden check found, and the facts every tool reads about it (no list of verdict names
elsewhere). Pure data: no I/O."""

from __future__ import annotations

import enum

__all__ = ["Verdict"]

_FLIP = "flip"  # a verdict's facts, as its definition below names them
_DECIDED = "decided by judge.decision, not compare()"
_NOT_A_CASE = "no candidate file holds it"


class Verdict(enum.Enum):
    """What one golden check found; the tolerance profile decides whether it passes.

    Each verdict carries its facts, and every tool reads them here (no list of verdict names
    elsewhere): ``risk``, the order a reviewer meets it in (0: the riskiest); ``flip``, a changed
    decision at a near tie, judged like TIE_FLIP (a profile that passes near ties passes it, an
    update re-records it); ``compared``, whether ``compare()`` can return it (MISSING,
    FIELDS_CHANGED and NONDETERMINISTIC are decided outside it); ``reviewed``, whether a candidate
    case of ``llm-golden diff``/``review``/``accept`` can have it."""

    risk: int
    flip: bool
    compared: bool
    reviewed: bool

    def __new__(cls, value: str, risk: int, *facts: str) -> Verdict:
        member = object.__new__(cls)
        member._value_ = value
        member.risk, member.flip, member.compared = risk, _FLIP in facts, _DECIDED not in facts
        member.reviewed = _NOT_A_CASE not in facts
        return member

    # no golden to compare with
    MISSING = "MISSING", 4, _DECIDED
    INPUT_CHANGED = "INPUT_CHANGED", 2
    # Same token ids and logits, but a field the comparison does not read differs: a candidate's
    # fingerprint, text, pieces or margins against the golden it would replace (``llm-golden diff``),
    # or a golden's text or pieces against what its own ids decode to (a check). A later check reads
    # those fields (the fingerprint picks the tolerance; the text is what a failure shows), and no
    # run writes such a change for its own variant: a forged or edited golden, never kept silently.
    FIELDS_CHANGED = "FIELDS_CHANGED", 3, _DECIDED
    IDENTICAL = "IDENTICAL", 9
    LOGIT_DRIFT = "LOGIT_DRIFT", 8
    TIE_FLIP = "TIE_FLIP", 6, _FLIP
    # A sampled golden (do_sample=True) whose token changed where its draw was a near tie: the
    # recorded draw margin is below what the tie margin's logit drift moves a perturbed score (tie
    # margin / temperature).
    SAMPLE_FLIP = "SAMPLE_FLIP", 5, _FLIP
    # A score whose given token's rank changed at a position where it was a near tie with its
    # neighbour in rank (the golden's rank margin below the tie margin).
    RANK_FLIP = "RANK_FLIP", 7, _FLIP
    REGRESSION = "REGRESSION", 0
    # Not from compare() either: a rerun of a test (pytest-rerunfailures) in the same process whose
    # output for a key differs from an earlier attempt's (judge.decision.decide), so a rerun never passes.
    NONDETERMINISTIC = "NONDETERMINISTIC", 1, _DECIDED, _NOT_A_CASE

    @property
    def confident_change(self) -> bool:
        """Compared, and changed where no near tie or drift explains it (a token the golden was sure
        of, or the input itself): an update written over it needs a reviewer."""
        return self.compared and self is not Verdict.IDENTICAL and not self.tolerable

    @property
    def tolerable(self) -> bool:
        """A profile may pass it by its thresholds: drift, or a flip at a near tie."""
        return self is Verdict.LOGIT_DRIFT or self.flip

    @classmethod
    def by_risk(cls) -> tuple[Verdict, ...]:
        """Every verdict, the riskiest first."""
        return tuple(sorted(cls, key=lambda verdict: verdict.risk))

    @classmethod
    def named(cls, name: str) -> Verdict | None:
        """The verdict spelt ``name`` (as a report writes it), or None."""
        member = cls._value2member_map_.get(name)
        return member if isinstance(member, Verdict) else None

    @classmethod
    def risk_of(cls, name: str) -> int:
        """The risk of the verdict spelt ``name``; a name no verdict has comes after them all."""
        member = cls.named(name)
        return member.risk if member is not None else len(cls)

    @classmethod
    def is_confident_change(cls, name: str) -> bool:
        member = cls.named(name)
        return member is not None and member.confident_change

    @classmethod
    def is_flip(cls, name: str) -> bool:
        member = cls.named(name)
        return member is not None and member.flip
