"""Candidate goldens under review: two golden sets side by side, case by case, as ``llm-golden
diff`` lists them, and what ``llm-golden accept`` would write. Reads, never prints or writes.

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

from pytest_llmdeterminism.errors import GoldenFileError, printable
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


def review_candidates(candidates: Path, root: Path, *,
                      golden_dir: Path | None = None) -> tuple[list[Case], list[str], list[Path]]:
    """Every case of a candidates folder as ``--llm-golden-artifacts`` wrote it (mirroring the root)
    against the project's goldens: each golden file of it (in a ``__golden__`` folder, or under the
    relative ``golden_dir``) paired with the same path under ``root``, as accept would merge it.
    Also what keeps the folder from being trusted (links), and the files that are no golden file."""
    names, problems = candidate_files(candidates)
    cases: list[Case] = []
    for name in names:
        if _is_golden_path(name, golden_dir):
            cases += review_goldens(name.as_posix(), store.read(root / name), store.read(candidates / name),
                                    judged.read(candidates / name))
    return cases, problems, [name for name in names if not _is_golden_path(name, golden_dir)]


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
    return (name.startswith(".") or name in _NOT_WALKED or _is_output(top, name)
            or os.path.isfile(os.path.join(top, name, "pyvenv.cfg")))


def _is_output(top: str, name: str) -> bool:
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


@dataclass(frozen=True)
class Acceptance:
    """One candidate golden file and the project's golden file that its goldens merge into."""

    name: Path  # the same relative path in the candidate folder and under the root
    target: Path
    goldens: schema.Goldens
    cases: tuple[Case, ...] = ()  # each candidate against the target, as `llm-golden diff` judges it

    def only(self, chosen: Iterable[Case]) -> Acceptance:
        """This file with the goldens of the ``chosen`` cases alone."""
        picked = {(case.key, case.variant) for case in chosen if case.file == self.name.as_posix()}
        goldens = {key: {variant: entry for variant, entry in variants.items() if (key, variant) in picked}
                   for key, variants in self.goldens.items()}
        return Acceptance(self.name, self.target, {key: v for key, v in goldens.items() if v},
                          tuple(case for case in self.cases if (case.key, case.variant) in picked))


@dataclass(frozen=True)
class Selection:
    """Which candidate cases ``llm-golden accept --only/--except/-k`` takes; the default takes all."""

    only: frozenset[str] = frozenset()  # verdicts; empty: every verdict
    excluded: frozenset[str] = frozenset()
    key_part: str = ""  # a substring of the test key

    @property
    def given(self) -> bool:
        return bool(self.only or self.excluded or self.key_part)

    def takes(self, case: Case) -> bool:
        """Whether the selection takes ``case``: FIELDS_CHANGED only where ``--only`` names it (no run
        writes one for its own variant; a plain ``accept DIR`` of a forged artifact leaves it)."""
        named = case.verdict in self.only
        if case.verdict == Verdict.FIELDS_CHANGED.value and not named:
            return False
        return ((not self.only or named) and case.verdict not in self.excluded
                and self.key_part in case.key)

    def describe(self) -> str:
        """The options as typed, e.g. ``--only REGRESSION -k capital``."""
        parts = [f"--only {','.join(sorted(self.only))}" if self.only else "",
                 f"--except {','.join(sorted(self.excluded))}" if self.excluded else "",
                 f"-k {self.key_part}" if self.key_part else ""]
        return " ".join(part for part in parts if part)


def find_candidates_root(path: Path, root: Path, *,
                         golden_dir: Path | None = None) -> tuple[Path | None, list[Path]]:
    """The folder that ``path`` (the folder ``--llm-golden-artifacts`` wrote, or a folder or file
    inside it) belongs to, the one that mirrors the root: ``path`` itself or a folder above it, below
    the root, where every golden file under ``path`` lands on a golden path, and the most of them on
    a golden file or a test module that the project has (``path`` itself wins a tie: a whole
    candidates folder maps as it always did). ``(folder, [])``; ``(None, folders)`` when several fit
    equally well; ``(None, [])`` when none does."""
    start = Path(os.path.abspath(path if path.is_dir() else path.parent))
    files = [start / name for name in candidate_files(start)[0]] if path.is_dir() else \
        [Path(os.path.abspath(path))]
    real_root = Path(os.path.realpath(root))
    scored: dict[Path, int] = {}  # nearest first
    for folder in [start, *start.parents]:
        if real_root.is_relative_to(os.path.realpath(folder)):
            break
        names = [file.relative_to(folder) for file in files]
        if names and all(_is_golden_path(name, golden_dir) for name in names):
            scored[folder] = sum(_known_to_project(name, root, golden_dir) for name in names)
    best = max(scored.values(), default=0)
    fitting = [folder for folder, known in scored.items() if known == best]
    if start in fitting:
        return start, []
    if best and len(fitting) == 1:
        return fitting[0], []
    return None, fitting


def _known_to_project(name: Path, root: Path, golden_dir: Path | None) -> bool:
    """The project has the golden file ``name`` would merge into, or the test module it belongs to."""
    if (root / name).is_file():
        return True
    if name.parent.name == GOLDEN_FOLDER:
        return (root / name.parent.parent / f"{name.stem}.py").is_file()
    assert golden_dir is not None
    return (root / name.relative_to(golden_dir)).with_suffix(".py").is_file()


def plan_accept(candidates: Path, root: Path, *, golden_dir: Path | None = None,
                within: Path | None = None) -> tuple[list[Acceptance], list[str]]:
    """What ``llm-golden accept`` writes, and every reason it must write nothing at all.

    A candidate folder is an artifact, untrusted: only a golden file directly in a ``__golden__``
    folder of it (or anywhere under the relative ``golden_dir``) is accepted, and only into the
    same relative path under ``root``. It holds no symbolic link, no target resolves to outside
    the root, and every candidate and every file it merges into reads as a valid golden file.
    ``within``: a folder or file inside ``candidates`` (relative to it), the only part planned.
    Each acceptance carries its cases, judged as ``llm-golden diff`` judges them.
    """
    names, problems = _files_within(candidates, within or Path())
    refused = {name for name in names if not _is_golden_path(name, golden_dir)}
    if refused:
        also = f" or under the golden dir {golden_dir.as_posix()}/" if golden_dir else ""
        listed = ", ".join(printable(candidates / name) for name in sorted(refused))
        example = f"tests/{GOLDEN_FOLDER}/test_x.json"
        problems.append(
            f"not in a {GOLDEN_FOLDER} folder{also}: {listed}. accept writes only golden files, each to its "
            f"own path under the root (DIR/{example} -> ROOT/{example}), so that an artifact cannot write "
            "anywhere else. Remove them; for goldens kept under llm_golden_dir = D, give --golden-dir D.")
    real_root = Path(os.path.realpath(root))
    accepted = []
    for name in names:
        try:
            goldens = store.read(candidates / name)  # refused ones too: every problem in one go
        except GoldenFileError as error:
            problems.append(str(error))
            continue
        if name in refused:
            continue
        problem = _target_problem(root / name, real_root)
        if problem:
            problems.append(problem)
        else:
            try:
                tolerances = judged.read(candidates / name)
            except GoldenFileError as error:
                problems.append(str(error))
                continue
            cases = review_goldens(name.as_posix(), store.read(root / name), goldens, tolerances)
            accepted.append(Acceptance(name, root / name, goldens,
                                       tuple(case for case in cases if case.verdict != ABSENT)))
    return accepted, problems


def _files_within(candidates: Path, within: Path) -> tuple[list[Path], list[str]]:
    """The ``*.json`` files of ``candidates`` under ``within`` (or ``within`` itself, a file), relative
    to ``candidates``; and what keeps them from being trusted: a link on the way down to ``within``."""
    links = [printable(candidates.joinpath(*within.parts[:n])) for n in range(1, len(within.parts) + 1)
             if candidates.joinpath(*within.parts[:n]).is_symlink()]
    if links:
        return [], [f"symbolic links in {candidates}: {', '.join(links)}. accept follows none: a link can "
                    "lead out of the candidates or onto a file elsewhere. Replace each with the file it "
                    "points to, or remove it."]
    if (candidates / within).is_dir():
        names, problems = candidate_files(candidates / within)
        return [within / name for name in names], problems
    return [within], []


def _target_problem(target: Path, real_root: Path) -> str | None:
    """Why ``target`` cannot take candidates: it resolves to outside the root, or is no valid golden file."""
    real = Path(os.path.realpath(target))
    if not real.is_relative_to(real_root):
        return (f"{printable(target)} resolves to {printable(real)}, outside the root {real_root}: a "
                "symbolic link on the way leads out, and accept writes only inside the root. Make that path "
                "a real folder or file, or copy this golden by hand.")
    try:
        store.read(target)  # a corrupt golden is never merged into
    except GoldenFileError as error:
        return str(error)
    return None


def candidate_files(folder: Path) -> tuple[list[Path], list[str]]:
    """The ``*.json`` files under ``folder`` (relative to it), and what keeps the walk from being trusted."""
    names: list[Path] = []
    links: list[str] = []
    problems: list[str] = []

    def unreadable(error: OSError) -> None:
        problems.append(f"{printable(error.filename)} cannot be read ({error.strerror}). Check its "
                        "permissions.")

    for top, folders, files in os.walk(folder, onerror=unreadable):  # a linked folder is listed, not entered
        folders[:] = [name for name in folders if not _is_output(top, name)]
        links += [printable(Path(top, name)) for name in folders + files if Path(top, name).is_symlink()]
        names += [Path(top, name).relative_to(folder) for name in files
                  if name.endswith(".json") and not Path(top, name).is_symlink()]
    if links:
        problems.append(f"symbolic links in {folder}: {', '.join(sorted(links))}. accept follows none: a "
                        "link can lead out of the candidates or onto a file elsewhere. Replace each with the "
                        "file it points to, or remove it.")
    return sorted(names), problems


def _is_golden_path(name: Path, golden_dir: Path | None) -> bool:
    if name.parent.name == GOLDEN_FOLDER:
        return True
    return golden_dir is not None and name.parts[:len(golden_dir.parts)] == golden_dir.parts
