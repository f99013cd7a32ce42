"""Two golden sets side by side, case by case, as ``llm-golden diff`` lists them. Reads, never prints.

A candidate is paired with what the plugin would have compared it with: the same variant in BASE,
or else BASE's fallback variant (the ``--llm-golden-fallback`` rule). Only a key with no variant
at all in BASE is NEW, and only a BASE variant that no candidate was paired with is ABSENT.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pytest_llmdeterminism import store
from pytest_llmdeterminism.compare import Comparison, Verdict, compare, default_tie_margin
from pytest_llmdeterminism.golden import fallback_variant

NEW = "NEW"  # only in CAND, and BASE has no variant of the key: nothing to compare with
ABSENT = "ABSENT"  # only in BASE: a candidate set holds just the checks that failed or were missing
ORDER = (NEW, ABSENT, Verdict.IDENTICAL.value, Verdict.LOGIT_DRIFT.value, Verdict.TIE_FLIP.value,
         Verdict.REGRESSION.value, Verdict.INPUT_CHANGED.value)

_REGRESSION = frozenset({Verdict.REGRESSION.value, Verdict.INPUT_CHANGED.value, NEW})
_TIE_FLIP = _REGRESSION | {Verdict.TIE_FLIP.value}
FAIL_ON = {  # --fail-on level -> the verdicts that need a reviewer (exit 1); ABSENT never does
    "regression": _REGRESSION,
    "tie_flip": _TIE_FLIP,
    "drift": _TIE_FLIP | {Verdict.LOGIT_DRIFT.value},
}


@dataclass(frozen=True)
class Case:
    """One golden of either set and its verdict."""

    file: str  # the golden file, relative to the folders compared
    key: str
    variant: str  # the candidate's variant; BASE's for ABSENT
    verdict: str  # a Verdict's value, NEW or ABSENT
    compared_with: str | None = None  # BASE's variant, where BASE lacks the candidate's own
    comparison: Comparison | None = None


def review(base: Path, candidate: Path) -> list[Case]:
    """Every case of two golden files, or of two folders of them, in file, key and variant order."""
    cases: list[Case] = []
    for name, base_file, cand_file in _pair_files(base, candidate):
        base_goldens = store.read(base_file) if base_file.exists() else {}
        cand_goldens = store.read(cand_file) if cand_file.exists() else {}
        cases += review_goldens(name, base_goldens, cand_goldens)
    return cases


def review_goldens(name: str, base: store.Goldens, candidate: store.Goldens) -> list[Case]:
    """The cases of one golden file's two versions."""
    cases = []
    for key in sorted(set(base) | set(candidate)):
        base_variants, paired = base.get(key, {}), set()
        for variant, entry in sorted(candidate.get(key, {}).items()):
            against = variant if variant in base_variants else fallback_variant(variant, base_variants)
            if against is None:
                cases.append(Case(name, key, variant, NEW))
                continue
            paired.add(against)
            expected, actual = store.from_entry(base_variants[against]), store.from_entry(entry)
            # Judged as the plugin judges a run: with the tie margin of the dtype that ran.
            dtype = str(actual.fingerprint.get("dtype", "float32"))
            comparison = compare(expected, actual, tie_margin=default_tie_margin(dtype))
            cases.append(Case(name, key, variant, comparison.verdict.value,
                              compared_with=None if against == variant else against, comparison=comparison))
        cases += [Case(name, key, variant, ABSENT) for variant in sorted(set(base_variants) - paired)]
    return sorted(cases, key=lambda case: (case.key, case.variant))


def needs_review(cases: Iterable[Case], fail_on: str) -> list[Case]:
    """The cases that make ``llm-golden diff --fail-on=LEVEL`` exit 1."""
    return [case for case in cases if case.verdict in FAIL_ON[fail_on]]


def _pair_files(base: Path, candidate: Path) -> list[tuple[str, Path, Path]]:
    """(name, BASE file, CAND file) for every file in either folder, or the two files given."""
    if base.is_dir():
        names = {p.relative_to(base) for p in base.rglob("*.json")}
        names |= {p.relative_to(candidate) for p in candidate.rglob("*.json")}
        return [(str(name), base / name, candidate / name) for name in sorted(names)]
    return [(base.name, base, candidate)]
