"""Accepting candidate goldens: which files of a candidates folder (as ``--llm-golden-artifacts``
wrote it, mirroring the root) are trusted, where each merges into the project's goldens, which of
their cases ``llm-golden accept`` takes, and every reason it must write nothing at all. Reads, never
prints or writes; the cases are :mod:`~pytest_llmdeterminism.goldens.review`'s, judged as
``llm-golden diff`` judges them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pytest_llmdeterminism.errors import GoldenFileError, printable
from pytest_llmdeterminism.goldens import judged, schema, store
from pytest_llmdeterminism.goldens.files import GOLDEN_FOLDER
from pytest_llmdeterminism.goldens.review import ABSENT, Case, is_output_folder, review_goldens
from pytest_llmdeterminism.judge.compare import Verdict


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
        folders[:] = [name for name in folders if not is_output_folder(top, name)]
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
