"""What one golden check decides, as a pure function of this run's generation, what ``check()``
looked up (the golden, the earlier attempts' outputs) and the run's settings: every verdict
(MISSING and NONDETERMINISTIC included), its evidence, the tolerance profile that judged it,
whether it passes, whether an update writes the golden instead, whether the reviewer gets a
candidate. The result is data (:class:`~pytest_llmdeterminism.reporting.records.Decision`), no
words: ``reporting`` words it. A new verdict is one case in ``compare``; a new rule for what
happens to it, one line here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from pytest_llmdeterminism.compare import Comparison, Recorded, Verdict, compare
from pytest_llmdeterminism.goldens.fingerprint import diff
from pytest_llmdeterminism.goldens.judgement import judge
from pytest_llmdeterminism.reporting.records import Attempt, Decision, Written
from pytest_llmdeterminism.tolerance import Profile

__all__ = ["Decision", "contradicted", "decide"]


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
