"""The one judgement of a golden: golden vs actual under the effective tolerance profile -> the
verdict with its evidence, the profile that judged it and whether it passes. Pure: no pytest, torch
or I/O. The run (``judge.decision.decide``) and every tool that reads candidates (``llm-golden diff``,
``review``, ``accept``) call :func:`judge`, so a check has one verdict whatever reads it; the
reports, ``compare`` and ``merge`` read the verdict the run wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytest_llmdeterminism.judge.compare import Comparison, Recorded, compare
from pytest_llmdeterminism.judge.fingerprint import numerics_changes
from pytest_llmdeterminism.judge.tolerance import Profile, default_profile

__all__ = ["Judgement", "dtype_of", "effective_profile", "judge", "judge_with"]

Changes = tuple[tuple[str, Any, Any], ...]  # fingerprint fields: (name, the golden's, this run's)


@dataclass(frozen=True)
class Judgement:
    """A golden judged: the comparison (verdict and evidence), whether ``profile`` passes it, the
    profile and dtype that judged it, and the numerics fields that differ from the golden's (which
    chose the default profile: ``exact`` where none differs)."""

    comparison: Comparison
    passed: bool
    profile: Profile
    dtype: str
    environment: Changes = ()


def effective_profile(golden: Recorded, actual: Recorded,
                      explicit: Profile | None) -> tuple[Profile, Changes]:
    """The profile that judges ``actual`` against ``golden``: ``explicit`` (the test's or the run's
    setting) or the environment's default (``exact`` where the numerics are the golden's, else the
    dtype's ``near_tie``); and the numerics fields that differ."""
    environment = tuple(numerics_changes(golden.fingerprint, actual.fingerprint))
    default = default_profile(dtype_of(golden, actual), same_environment=not environment)
    return explicit or default, environment


def judge(golden: Recorded, actual: Recorded, *, explicit: Profile | None) -> Judgement:
    """``actual`` against ``golden`` under the effective profile (see :func:`effective_profile`)."""
    profile, environment = effective_profile(golden, actual, explicit)
    comparison, passed = judge_with(golden, actual, profile)
    return Judgement(comparison, passed, profile, dtype_of(golden, actual), environment)


def dtype_of(golden: Recorded, actual: Recorded) -> str:
    """The dtype the defaults follow: the run's (a bf16 run against an fp32 golden is judged with
    bf16 noise), else the golden's."""
    return str(actual.fingerprint.get("dtype", golden.fingerprint.get("dtype", "float32")))


def judge_with(golden: Recorded, actual: Recorded, profile: Profile) -> tuple[Comparison, bool]:
    """The comparison under ``profile`` and whether it passes (generations and scores alike: the
    verdict depends on the profile's tie margin only, the pass on its thresholds)."""
    dtype = dtype_of(golden, actual)
    comparison = compare(golden, actual, tie_margin=profile.tie_margin(dtype))
    return comparison, profile.accepts(comparison, dtype)
