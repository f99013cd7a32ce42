"""What one golden check decides, as a pure function of the golden, the generation and the run's
settings: the verdict and its evidence, the tolerance profile that judged it, whether it passes,
whether an update re-records it, whether the reviewer gets a candidate, and the notes for the run's
summary. :class:`~pytest_llmdeterminism.run.golden_tokens.GoldenTokens` only applies it (records,
writes, builds the failure message). A new verdict is one case in ``compare``; a new rule for what
happens to it, one line here.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_llmdeterminism.compare import Comparison, Verdict, compare
from pytest_llmdeterminism.generation import Generation
from pytest_llmdeterminism.goldens.fingerprint import numerics_changes
from pytest_llmdeterminism.reporting import hints
from pytest_llmdeterminism.tolerance import Profile, default_profile


@dataclass(frozen=True)
class Decision:
    """One check's outcome before anything is recorded or raised."""

    comparison: Comparison
    passed: bool
    profile: Profile
    dtype: str
    environment: tuple[tuple[str, object, object], ...]  # fields that decide the bits and differ
    across: str  # the "compared across environments" line, or ""
    rerecord: bool  # an update writes this run's generation over the golden
    candidate: bool  # the reviewer gets this run's generation as a candidate
    budget_note: str  # a note on unequal token budgets, for a passing check, or ""


def judge(expected: Generation, actual: Generation, profile: Profile) -> tuple[Comparison, bool]:
    """The one comparison every check goes through: the verdict, and whether ``profile`` passes it."""
    # Defaults follow the run's dtype: a bf16 run against an fp32 golden is judged with bf16 noise.
    dtype = str(actual.fingerprint.get("dtype", expected.fingerprint.get("dtype", "float32")))
    comparison = compare(expected, actual, tie_margin=profile.tie_margin(dtype))
    return comparison, profile.accepts(comparison, dtype)


def decide(expected: Generation, actual: Generation, *, explicit: Profile | None, update: str | None,
           compared_variant: str, accept_command: str) -> Decision:
    """The decision for ``actual`` against its golden ``expected`` (the variant ``compared_variant``).
    ``explicit``: the profile the test or the run set, else the environment's default."""
    dtype = str(actual.fingerprint.get("dtype", "float32"))
    environment = tuple(numerics_changes(expected.fingerprint, actual.fingerprint))
    profile = explicit or default_profile(dtype, same_environment=not environment)
    across = hints.across_environments(list(environment), tolerance=profile.describe(dtype),
                                       explicit=explicit is not None,
                                       run_variant=actual.variant) if environment else ""
    comparison, passed = judge(expected, actual, profile)
    # A flip at a near tie may pass, but the golden's continuation after it no longer describes the
    # model: updating re-records it, as it does every failing check. A golden its smaller budget cut
    # short is incomplete: updating records the steps it lacks.
    flipped = comparison.verdict in (Verdict.TIE_FLIP, Verdict.SAMPLE_FLIP)
    rerecord = update == "all" and (not passed or flipped or bool(comparison.new_steps))
    # A check judged against another variant leaves this run's own variant missing: the reviewer gets
    # it as a candidate, passing or not.
    candidate = not rerecord and (not passed or compared_variant != actual.variant)
    budget = hints.budget_note(comparison, accept_command) if passed and not rerecord else ""
    return Decision(comparison, passed, profile, dtype, environment, across, rerecord, candidate, budget)
