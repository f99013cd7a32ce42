"""What one golden check decides, as a pure function of this run's generation, what ``check()``
looked up (the golden, the earlier attempts' outputs) and the run's settings: every verdict
(MISSING and NONDETERMINISTIC included), its evidence, the tolerance profile that judged it,
whether it passes, whether an update writes the golden instead, whether the reviewer gets a
candidate. The result is data (:class:`Decision`), no
words: ``reporting`` words it. A new verdict is one case in ``compare``; a new rule for what
happens to it, one line here.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgspec

from pytest_llmdeterminism.judge.compare import Comparison, Recorded, Verdict, compare
from pytest_llmdeterminism.judge.fingerprint import diff
from pytest_llmdeterminism.judge.judgement import judge
from pytest_llmdeterminism.judge.tolerance import Profile

__all__ = ["Attempt", "Change", "Decision", "Outcome", "Written", "contradicted", "decide"]


class Written(enum.Enum):
    """A golden that ``--llm-golden-update`` wrote where a check would have been judged."""

    RECORDED = "recorded"  # there was none
    UPDATED = "updated"  # it failed, flipped at a near tie or lacked steps: re-recorded
    # Recorded or updated by a test that then failed or was skipped: held back, nothing written.
    NOT_RECORDED = "not recorded"


class Outcome(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """How one golden check ended, the key the run counts by: its verdict and whether it passed.
    A golden written instead of checked says which write in ``written``; an update keeps the verdict
    of the golden it replaced, a first recording has none."""

    verdict: Verdict | None
    passed: bool
    written: Written | None = None

    def __str__(self) -> str:
        """As the terminal summary and JUnit's ``llm_verdict`` property spell it: ``REGRESSION (failed)``."""
        if self.written is not None:
            return self.written.value
        name = self.verdict.value if self.verdict is not None else "?"
        return name if self.passed else f"{name} (failed)"


class Attempt(NamedTuple):
    """What one earlier attempt of a test (pytest-rerunfailures runs a failed test again in the same
    process) generated for one golden key, and how its check ended."""

    number: int
    output: Recorded
    outcome: Outcome


Change = tuple[str, Any, Any]  # a fingerprint field, the golden's value, this run's


@dataclass(frozen=True)
class Decision:
    """What one golden check decided, as data (``judge.decision.decide`` builds it; ``reporting``
    words it): the verdict and its evidence, whether it passed, the golden it was judged against,
    and what happens next (a golden written instead, a candidate for the reviewer)."""

    comparison: Comparison  # the verdict and its evidence; MISSING and NONDETERMINISTIC included
    passed: bool
    actual: Recorded  # this run's generation (or score)
    # The golden it was judged against; for NONDETERMINISTIC the earlier attempt's output; None: MISSING.
    expected: Recorded | None
    variant: str  # the golden variant looked up (another than ``actual.variant`` under fallback)
    profile: Profile | None = None  # the tolerance that judged it; None where none did
    explicit: bool = False  # the profile was set (by the test or the run), not the default
    dtype: str = "float32"  # the dtype the profile's thresholds were taken for
    environment: tuple[Change, ...] = ()  # fingerprint fields that decide the bits and differ
    changed: tuple[Change, ...] = ()  # every fingerprint field that differs
    write: Written | None = None  # a golden ``--llm-golden-update`` writes instead of the check
    candidate: bool = False  # the reviewer gets this run's generation as a candidate
    # Where the golden's text or pieces contradict what this run decoded for the same ids (an edited
    # golden): what contradicts what. Such a check fails, whatever its verdict.
    contradiction: str | None = None
    others: tuple[str, ...] = ()  # MISSING: the variants the test's key does have
    earlier: Attempt | None = None  # NONDETERMINISTIC: the attempt this one contradicts,
    between: Comparison | None = None  # and how the two outputs differ

    @property
    def fails(self) -> bool:
        """The check fails its test: it did not pass, and no update writes the golden instead."""
        return not self.passed and self.write is None

    @property
    def rerecord(self) -> bool:
        """An update writes this run's generation over the golden it was judged against."""
        return self.write is Written.UPDATED


def contradicted(earlier: Sequence[Attempt], actual: Recorded) -> tuple[Attempt, Comparison] | None:
    """The first earlier attempt whose output differs from ``actual`` (inputs, tokens or logit
    hashes), with how it differs; None where every one generated the same (or there is none)."""
    for attempt in earlier:
        between = compare(attempt.output, actual)
        if between.verdict is not Verdict.IDENTICAL:
            return attempt, between
    return None


def decide(actual: Recorded, *, golden: Recorded | None, variant: str, explicit: Profile | None,
           update: str | None, earlier: Sequence[Attempt] = (), others: Sequence[str] = ()) -> Decision:
    """The decision for ``actual`` against ``golden``, the stored entry of ``variant`` (None: there is
    none; ``others``: the variants the key does have). ``earlier``: what earlier attempts of the test
    generated for the key; ``explicit``: the profile the test or the run set, else the environment's
    default; ``update``: ``--llm-golden-update``'s value, None without it."""
    contradiction = contradicted(earlier, actual)
    if contradiction is not None:  # whatever the golden says: this attempt contradicts an earlier one
        attempt, between = contradiction
        return Decision(dataclasses.replace(between, verdict=Verdict.NONDETERMINISTIC), False, actual,
                        attempt.output, variant, earlier=attempt, between=between)
    if golden is None:
        if update:
            return Decision(Comparison(Verdict.MISSING), True, actual, None, variant, write=Written.RECORDED)
        return Decision(Comparison(Verdict.MISSING), False, actual, None, variant, candidate=True,
                        others=tuple(others))
    judged = judge(golden, actual, explicit=explicit)  # the judgement every tool makes of it
    comparison, passed = judged.comparison, judged.passed
    # A flip at a near tie may pass, but the golden's continuation after it no longer describes the
    # model: updating re-records it, as it does every failing check. A golden its smaller budget cut
    # short is incomplete: updating records the steps it lacks.
    rerecord = update == "all" and (not passed or comparison.verdict.flip or bool(comparison.new_steps))
    # A check judged against another variant leaves this run's own variant missing: the reviewer gets
    # it as a candidate, passing or not.
    candidate = not rerecord and (not passed or variant != actual.variant)
    return Decision(comparison, passed, actual, golden, variant, profile=judged.profile,
                    explicit=explicit is not None, dtype=judged.dtype, environment=judged.environment,
                    changed=tuple(diff(golden.fingerprint, actual.fingerprint)),
                    write=Written.UPDATED if rerecord else None, candidate=candidate)
