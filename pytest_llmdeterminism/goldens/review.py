"""Candidate goldens under review: two golden sets side by side, case by case, as ``llm-golden
diff`` lists them (what ``llm-golden accept`` would write is
:mod:`~pytest_llmdeterminism.goldens.acceptance`'s). Reads, never prints or writes.

A candidate is paired with what the plugin would have compared it with: the same variant in BASE,
or else BASE's fallback variant (the ``--llm-golden-fallback`` rule). Only a key with no variant
at all in BASE is NEW, and only a BASE variant that no candidate was paired with is ABSENT.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_llmdeterminism.generation import Generation, Score
from pytest_llmdeterminism.goldens import judged, schema, store
from pytest_llmdeterminism.goldens.codec import declares_golden_format
from pytest_llmdeterminism.goldens.consistency import unjudged_changes
from pytest_llmdeterminism.goldens.files import GOLDEN_FOLDER, OUTPUT_MARKER, fallback_variant
from pytest_llmdeterminism.judge.compare import Comparison, Verdict
from pytest_llmdeterminism.judge.judgement import judge
from pytest_llmdeterminism.judge.tolerance import Profile

NEW = "NEW"  # only in CAND, and BASE has no variant of the key: nothing to compare with
ABSENT = "ABSENT"  # only in BASE: a candidate set holds just the checks that failed or were missing


def case_verdict(name: str) -> Verdict | None:
    """The verdict a case's ``name`` stands for: NEW is a MISSING golden seen from the candidate side;
    ABSENT (nothing to accept) is none."""
    return Verdict.MISSING if name == NEW else Verdict.named(name)


def case_risk(name: str) -> int:
    """Where a case of verdict ``name`` comes in the order a reviewer meets the cases: the riskiest
    first (the verdicts' own ``risk``), ABSENT last."""
    verdict = case_verdict(name)
    return verdict.risk if verdict is not None else len(Verdict)


# Folders no walk of a BASE or CAND folder enters, as pytest collects no tests there: hidden ones
# (.git, .venv, .tox), and others that hold installed packages' JSON.
_NOT_WALKED = frozenset({"node_modules", "__pycache__", "site-packages", "venv"})
_SNIFF_LIMIT = 256 * 2**20  # a larger JSON file outside a __golden__ folder is not read to find out



def review_order() -> tuple[str, ...]:
    """Every verdict a case can have, the riskiest first (FIELDS_CHANGED: same tokens and logits, but
    a field the verdict does not compare differs), NEW and ABSENT. Read from the verdicts at each
    call, so a verdict added later (a plug-in's, a test's) has its place."""
    return tuple(NEW if verdict is Verdict.MISSING else verdict.value for verdict in Verdict.by_risk()
                 if verdict.reviewed) + (ABSENT,)


def _verdicts(takes: Callable[[Verdict], bool]) -> frozenset[str]:
    return frozenset(name for name in review_order()
                     if (verdict := case_verdict(name)) is not None and takes(verdict))


FAIL_ON_LEVELS = ("regression", "tie_flip", "drift")  # --fail-on, the least a reviewer is asked first


def fail_on(level: str) -> frozenset[str]:
    """The verdicts that need a reviewer (exit 1) at a ``--fail-on`` level; ABSENT never does."""
    changed = _verdicts(lambda verdict: verdict is not Verdict.IDENTICAL and not verdict.tolerable)
    also = {"regression": lambda verdict: False, "tie_flip": lambda verdict: verdict.flip,
            "drift": lambda verdict: verdict.tolerable}[level]
    return changed | _verdicts(also)


@dataclass(frozen=True)
class Case:
    """One golden of either set and its verdict."""

    file: str  # the golden file, relative to the folders compared
    key: str
    variant: str  # the candidate's variant; BASE's for ABSENT
    verdict: str  # a Verdict's value, NEW or ABSENT
    compared_with: str | None = None  # BASE's variant, where BASE lacks the candidate's own
    comparison: Comparison | None = None
    expected: Generation | Score | None = None  # BASE's golden and the candidate, where they were compared
    actual: Generation | Score | None = None
    fields: tuple[tuple[str, Any, Any], ...] = ()  # FIELDS_CHANGED: (field, BASE's value, CAND's)

    @property
    def changes_nothing(self) -> bool:
        """The candidate is the project's golden of its own variant, as ``diff`` reads it: accepting it
        would write nothing new, so accept never writes it (the golden stays byte for byte)."""
        return self.verdict == Verdict.IDENTICAL.value and self.compared_with is None


@dataclass(frozen=True)
class Review:
    """The cases of two golden sets, and the JSON files of two folders that are no golden files."""

    cases: list[Case]
    ignored: list[Path]  # relative to the folders compared


def review(base: Path, candidate: Path) -> Review:
    """Every case of two golden files, or of two folders of them, in file, key and variant order.

    In folders, only golden files are read: a file in a ``__golden__`` folder, or one whose header
    declares the golden format (goldens kept under ``llm_golden_dir``, a folder of ``--llm-golden-dir``
    output), on either side. Any other JSON (``data/cities.json``, a model's ``config.json``) is
    ignored and listed, never read as a golden."""
    pairs, ignored = _pair_files(base, candidate)
    cases: list[Case] = []
    for name, base_file, cand_file in pairs:
        base_goldens = store.read(base_file) if base_file.exists() else {}
        cand_goldens = store.read(cand_file) if cand_file.exists() else {}
        cases += review_goldens(name, base_goldens, cand_goldens, judged.read(cand_file))
    return Review(cases, ignored)


def review_goldens(name: str, base: schema.Goldens, candidate: schema.Goldens,
                   tolerances: Mapping[str, Mapping[str, Profile]] | None = None) -> list[Case]:
    """The cases of one golden file's two versions. ``tolerances``: key -> variant -> the profile the
    run set for that check (its test's or the run's setting); a check not named was judged by the
    environment's default, as here."""
    tolerances = tolerances or {}
    cases = []
    for key in sorted(set(base) | set(candidate)):
        base_variants, paired = base.get(key, {}), set()
        for variant, entry in sorted(candidate.get(key, {}).items()):
            against = variant if variant in base_variants else fallback_variant(variant, base_variants)
            if against is None:
                cases.append(Case(name, key, variant, NEW))
                continue
            paired.add(against)
            expected, actual = schema.from_entry(base_variants[against]), schema.from_entry(entry)
            # Judged as the run judged it: the same judgement, under the profile the run used.
            comparison = judge(expected, actual, explicit=tolerances.get(key, {}).get(variant)).comparison
            verdict, fields = comparison.verdict.value, tuple[tuple[str, Any, Any], ...]()
            if comparison.verdict is Verdict.IDENTICAL and against == variant:
                fields = unjudged_changes(base_variants[against], entry)
                verdict = Verdict.FIELDS_CHANGED.value if fields else verdict
            cases.append(Case(name, key, variant, verdict,
                              compared_with=None if against == variant else against, comparison=comparison,
                              expected=expected, actual=actual, fields=fields))
        cases += [Case(name, key, variant, ABSENT) for variant in sorted(set(base_variants) - paired)]
    return sorted(cases, key=lambda case: (case.key, case.variant))


def needs_review(cases: Iterable[Case], level: str) -> list[Case]:
    """The cases that make ``llm-golden diff --fail-on=LEVEL`` exit 1."""
    needing = fail_on(level)
    return [case for case in cases if case.verdict in needing]


def aligned_folders(base: Path, candidate: Path) -> tuple[Path, Path] | None:
    """Two folders that share no golden file name, but would if one of them were given a folder
    deeper (``tests`` vs ``llm-candidates/tests/__golden__``: BASE holds ``__golden__/test_x.json``,
    CAND ``test_x.json``): the pair to compare instead, or None. The deeper folder is the one
    chosen, so the other argument stays as it was typed."""
    names = [{p.relative_to(folder).parts for p in folder.rglob("*.json")} for folder in (base, candidate)]
    if not all(names) or names[0] & names[1]:
        return None
    best: tuple[int, int, tuple[str, ...]] | None = None  # (matches, side, prefix)
    for side in (0, 1):
        other = names[1 - side]
        prefixes = {parts[:k] for parts in names[side] for k in range(1, len(parts))}
        for prefix in sorted(prefixes):
            matches = sum(parts[:len(prefix)] == prefix and parts[len(prefix):] in other
                          for parts in names[side])
            if matches and (best is None or matches > best[0]):
                best = (matches, side, prefix)
    if best is None:
        return None
    _, side, prefix = best
    folders = [base, candidate]
    folders[side] = folders[side].joinpath(*prefix)
    return folders[0], folders[1]


def _pair_files(base: Path, candidate: Path) -> tuple[list[tuple[str, Path, Path]], list[Path]]:
    """(name, BASE file, CAND file) for every golden file in either folder, or the two files given;
    and the other JSON files of the folders."""
    if not base.is_dir():
        return [(base.name, base, candidate)], []
    names = set(_json_files(base, skip=candidate)) | set(_json_files(candidate, skip=base))
    golden = {name for name in names if _is_golden_file(base / name) or _is_golden_file(candidate / name)}
    return ([(str(name), base / name, candidate / name) for name in sorted(golden)],
            sorted(names - golden))


def _json_files(folder: Path, *, skip: Path) -> list[Path]:
    """The ``*.json`` files under ``folder``, relative to it; not those under ``skip`` (CAND inside
    BASE: the candidates are no goldens of the project), nor in folders pytest collects nothing from."""
    skip_real = os.path.realpath(skip)
    found = []
    for top, folders, files in os.walk(folder):
        folders[:] = [name for name in folders if not (
            _not_walked(top, name) or os.path.realpath(os.path.join(top, name)) == skip_real)]
        found += [Path(top, name).relative_to(folder) for name in files if name.endswith(".json")]
    return found


def _not_walked(top: str, name: str) -> bool:
    """Folder ``name`` of ``top`` is not entered by a walk of BASE or CAND: it is hidden (``.git``,
    ``.venv``), holds installed packages, is a virtual environment, or is the plugin's output."""
    return (name.startswith(".") or name in _NOT_WALKED or is_output_folder(top, name)
            or os.path.isfile(os.path.join(top, name, "pyvenv.cfg")))


def is_output_folder(top: str, name: str) -> bool:
    """Folder ``name`` of ``top`` holds the plugin's own output (``--llm-repro``: entries in the
    golden format that are no goldens of the project), as its :data:`OUTPUT_MARKER` says: no walk
    for golden files enters it, neither diff's nor accept's."""
    return os.path.isfile(os.path.join(top, name, OUTPUT_MARKER))


def _is_golden_file(path: Path) -> bool:
    """``path`` is read as a golden: it lies in a ``__golden__`` folder, or declares the golden format.

    A file that cannot be told apart (a FIFO, an unreadable one) counts as a golden, so that reading
    it names the problem instead of passing over it."""
    try:
        status = os.stat(path)
        if Path(os.path.abspath(path)).parent.name == GOLDEN_FOLDER or not stat.S_ISREG(status.st_mode):
            return True
        if status.st_size > _SNIFF_LIMIT:  # too large to be read just to find out
            return False
        data = store.read_regular_file(path)
    except FileNotFoundError:
        return False
    except (OSError, store.UnreadableFileError):
        return True
    return declares_golden_format(data)
