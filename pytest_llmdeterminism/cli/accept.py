"""``llm-golden accept PATH``: candidate goldens from ``--llm-golden-artifacts`` into the project,
all of them or the cases chosen by verdict, test key, folder or file.

Every candidate is checked (:func:`~pytest_llmdeterminism.goldens.acceptance.plan_accept`) before any
file is written; this module reads the arguments, reports the problems, and merges the files.
:func:`plan` and :func:`apply` are shared with ``llm-golden review``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from pytest_llmdeterminism.cli import project
from pytest_llmdeterminism.errors import printable
from pytest_llmdeterminism.goldens import store
from pytest_llmdeterminism.goldens.acceptance import Acceptance, Selection, find_candidates_root, plan_accept
from pytest_llmdeterminism.goldens.files import GOLDEN_FOLDER
from pytest_llmdeterminism.goldens.review import ABSENT, Case, review_order
from pytest_llmdeterminism.judge.compare import Verdict

SUMMARY = "import candidate goldens from --llm-golden-artifacts DIR: all, or the cases chosen"
HELP = """\
Merge the candidate goldens that a run with --llm-golden-artifacts=DIR wrote into the project's
golden files, one variant at a time. DIR mirrors the root: DIR/tests/__golden__/test_x.json is
merged into ROOT/tests/__golden__/test_x.json, and nothing else is written.

Accept part of them: give a folder or one golden file inside DIR (DIR/tests/__golden__, or
DIR/tests/__golden__/test_x.json), and choose cases by the verdict `llm-golden diff DIR` prints
for them (--only REGRESSION,NEW; --except INPUT_CHANGED) or by a substring of the test key (-k).
The folder that mirrors the root is found above the path given: the one where the most candidates
land on a golden file or a test module the project has (the output's second line names it); give
--candidates-root DIR where that is not the one. Each case taken and each left is listed with its
verdict; a case left stays in the candidates, for a later accept or `llm-golden review`.

The project is found as pytest finds it: the nearest pytest.toml, pytest.ini, pyproject.toml
([tool.pytest.ini_options]), tox.ini ([pytest]) or setup.cfg ([tool:pytest]) from --root, or from
here upwards; its folder is the root and its llm_golden_dir where goldens are kept. The first line
of output names the file used. --root and --golden-dir, given, win over it.

A candidate folder is usually an artifact from CI, so it is checked before anything is written:
every *.json file in the part accepted must be a golden file directly in a __golden__ folder (or
under llm_golden_dir = D, or --golden-dir D); it holds no symbolic link; no target resolves to
outside the root; every candidate and every golden file it merges into must be valid. Any problem:
each is named, and no file is written. A candidate IDENTICAL to the project's golden is never
written (the golden stays byte for byte); one identical in tokens and logits but not in its
fingerprint, text or pieces is FIELDS_CHANGED, which no run writes: `llm-golden diff` flags it, and
accept leaves it unless --only names it.

exit status: 0 every candidate case of PATH accepted (or IDENTICAL to the project's golden, which
leaves nothing to accept); 1 accepted the cases chosen, some left (or none matched); 2 a usage
error or any problem above (nothing was written)."""



def candidate_verdicts() -> tuple[str, ...]:
    """The verdicts a candidate can have, riskiest first (read at each call: a verdict added later too)."""
    return tuple(verdict for verdict in review_order() if verdict != ABSENT)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", type=Path, metavar="PATH",
                        help="the folder --llm-golden-artifacts wrote, or a folder or golden file inside it")
    parser.add_argument("--only", type=verdicts, default=frozenset(), metavar="VERDICT[,...]",
                        help=f"accept only the cases of these verdicts ({', '.join(candidate_verdicts())})")
    parser.add_argument("--except", dest="excluded", type=verdicts, default=frozenset(),
                        metavar="VERDICT[,...]", help="accept every case but those of these verdicts")
    parser.add_argument("-k", dest="key_part", default="", metavar="SUBSTRING",
                        help="accept only the cases whose test key contains SUBSTRING")
    add_project_arguments(parser)


def add_project_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", type=Path, metavar="ROOT",
                        help="project root (pytest's rootdir); default: the folder of the project's "
                             "pytest configuration file, found from here upwards")
    parser.add_argument("--golden-dir", dest="golden_dir", type=Path, metavar="D",
                        help="also accept the files under D/ (relative to the root), as llm_golden_dir = D; "
                             "default: the configuration file's llm_golden_dir")
    parser.add_argument("--candidates-root", dest="candidates_root", type=Path, metavar="DIR",
                        help="the folder --llm-golden-artifacts wrote, where PATH lies inside it; default: "
                             "found above PATH")


def verdicts(text: str) -> frozenset[str]:
    """``--only``'s value: verdicts separated by commas, in any case."""
    given = {part.strip().upper() for part in text.split(",") if part.strip()}
    known = candidate_verdicts()
    unknown = sorted(given - set(known))
    if unknown or not given:
        raise argparse.ArgumentTypeError(
            f"{', '.join(map(repr, unknown)) or repr(text)} is not a verdict: give one or more of "
            f"{','.join(known)}, separated by commas, as `llm-golden diff` prints them")
    return frozenset(given)


def run(args: argparse.Namespace) -> int:
    selection = Selection(only=args.only, excluded=args.excluded, key_part=args.key_part)
    return accept(args.dir, args.root, args.golden_dir, selection=selection,
                  candidates_root=args.candidates_root)


@dataclass(frozen=True)
class Plan:
    """The candidates of PATH, checked, with each case's verdict: what accept and review write from."""

    path: Path
    candidates: Path  # the folder that mirrors the root
    acceptances: list[Acceptance]

    @property
    def whole(self) -> bool:
        """PATH is the whole candidates folder."""
        return os.path.abspath(self.path) == os.path.abspath(self.candidates)

    @property
    def cases(self) -> list[Case]:
        return [case for acceptance in self.acceptances for case in acceptance.cases]


def accept(folder: Path, root: Path | None, golden_dir: Path | None, *, selection: Selection | None = None,
           candidates_root: Path | None = None) -> int:
    selection = selection or Selection()
    planned = plan("accept", folder, root, golden_dir, candidates_root)
    if planned is None:
        return 2
    forged = any(case.verdict == Verdict.FIELDS_CHANGED.value for case in planned.cases)
    if planned.whole and not selection.given and not forged:  # else case by case: Selection leaves those
        return _accept_all(planned.acceptances)
    taken = [case for case in planned.cases if selection.takes(case)]
    status = apply(planned, taken)
    if not taken and status != 2:
        print(f"nothing was accepted: no case of {planned.path} matches {selection.describe()}; "
              f"`llm-golden diff {planned.candidates}` lists every case with its verdict.")
    return status


def plan(command: str, path: Path, root: Path | None, golden_dir: Path | None,
         candidates_root: Path | None) -> Plan | None:
    """Every candidate of ``path`` checked and judged; or the problems printed and None (exit 2)."""
    settled = project.settle_for(command, root, golden_dir)
    if settled is None:
        return None
    root, golden_dir = settled.root, settled.golden_dir
    problem = _usage_problem(path, root, golden_dir, from_config=settled.from_config)
    candidates = None
    if problem is None:
        candidates, problem = _candidates_folder(path, root, golden_dir, candidates_root)
    if problem or candidates is None:
        print(f"llm-golden {command}: {problem}", file=sys.stderr)
        return None
    if os.path.abspath(candidates) != os.path.abspath(path):
        print(f"candidates: {candidates} (mirrors the root; {path} is inside it)")
    within = Path(os.path.relpath(os.path.abspath(path), os.path.abspath(candidates)))
    accepted, problems = plan_accept(candidates, root, golden_dir=golden_dir, within=within)
    for problem in problems:
        print(f"llm-golden: {problem}", file=sys.stderr)
    if problems:
        print(f"llm-golden: nothing was accepted: every candidate is checked before any file is written. "
              f"Fix the problems above and run {command} again.", file=sys.stderr)
        return None
    if not accepted:
        example = candidates / "tests" / GOLDEN_FOLDER / "test_x.json"
        print(f"llm-golden: no candidate goldens (*.json) under {path}: expected the golden files that "
              f"--llm-golden-artifacts={candidates} writes, e.g. {example}", file=sys.stderr)
        return None
    return Plan(path, candidates, accepted)


def apply(planned: Plan, taken: Collection[Case]) -> int:
    """Write the goldens of the ``taken`` cases, list each case taken and each left; the exit status
    (0 all taken, 1 some left, 2 a write failed)."""
    written = write(planned, taken)
    return 2 if written is None else summarize(planned, written)


def write(planned: Plan, taken: Collection[Case]) -> list[Case] | None:
    """Write the goldens of the ``taken`` cases, each file at once, and list each case written; the
    cases written, or None where a file could not be (said on stderr; the files before it were)."""
    # A case IDENTICAL to the project's golden (one accepted before, say) leaves nothing to accept:
    # never written, so the golden stays byte for byte; one that differs in another field is no such
    # case (FIELDS_CHANGED).
    taken = [case for case in taken if not case.changes_nothing]
    chosen = [acceptance.only(taken) for acceptance in planned.acceptances]
    written: list[Case] = []
    for acceptance in chosen:
        if not acceptance.goldens:
            continue
        if not _written(acceptance, "cases"):
            return None
        for case in acceptance.cases:
            print(f"accepted {case_text(case)}")
        written += acceptance.cases
    return written


def summarize(planned: Plan, written: Collection[Case]) -> int:
    """List each case of the plan left, and the summary; 0 when none is left, else 1."""
    done = {id(case) for case in written}
    same = [case for case in planned.cases if case.changes_nothing]
    left = [case for case in planned.cases if id(case) not in done and not case.changes_nothing]
    for case in left:
        print(f"left     {case_text(case)}")
    unchanged = f" ({len(same)} IDENTICAL to the project's, nothing to accept)" if same else ""
    print(f"summary: accepted {len(written)} case(s), left {len(left)} in {planned.candidates}{unchanged}")
    return 1 if left else 0


def case_text(case: Case) -> str:
    return f"{case.verdict:<14} {printable(case.file)} [{case.key!r}][{case.variant!r}]"


def _accept_all(accepted: list[Acceptance]) -> int:
    """The whole candidates folder, but for the cases IDENTICAL to the project's golden (nothing to
    accept: a file of only those is not written at all)."""
    same = 0
    for acceptance in accepted:
        changing = [case for case in acceptance.cases if not case.changes_nothing]
        same += len(acceptance.cases) - len(changing)
        acceptance = acceptance.only(changing)
        if not acceptance.goldens:
            continue
        if not _written(acceptance, "files"):
            return 2
        for key, variants in sorted(acceptance.goldens.items()):
            print(f"accepted {printable(acceptance.name)} [{key!r}] ({', '.join(sorted(variants))})")
    if same:
        print(f"{same} case(s) IDENTICAL to the project's golden: nothing to accept, left as they are")
    return 0


def _written(acceptance: Acceptance, listed: str) -> bool:
    """Merge one golden file's accepted goldens into the project; False (and why, on stderr) when it
    could not be written: what was listed as accepted before it was, nothing else."""
    try:
        store.merge(acceptance.target, acceptance.goldens)
    except OSError as error:
        print(f"llm-golden: cannot write {acceptance.target} ({error.strerror or error}); the {listed} "
              "listed as accepted above were written, no other. Fix that and run accept again.",
              file=sys.stderr)
        return False
    return True


def _candidates_folder(path: Path, root: Path, golden_dir: Path | None,
                       given: Path | None) -> tuple[Path | None, str | None]:
    """The folder that mirrors the root, for PATH; or why it cannot be told."""
    if given is not None:
        inside = os.path.abspath(path) == os.path.abspath(given) or \
            Path(os.path.abspath(path)).is_relative_to(os.path.abspath(given))
        if not given.is_dir() or not inside:
            return None, (f"--candidates-root {str(given)!r} is not a folder that holds {str(path)!r}: give "
                          "the folder --llm-golden-artifacts wrote, with PATH inside it")
        return given, None
    found, fitting = find_candidates_root(path, root, golden_dir=golden_dir)
    if found is not None:
        return _as_given(found, path), None
    if fitting:
        listed = ", ".join(repr(str(_as_given(folder, path))) for folder in fitting)
        return None, (f"{str(path)!r} lies inside a candidates folder, but which folder mirrors the root "
                      f"cannot be told ({listed} fit equally well). Give it: --candidates-root DIR.")
    if path.is_dir():
        return path, None  # accept checks it and names what is wrong
    return None, (f"{str(path)!r} is not in a {GOLDEN_FOLDER} folder (or under the golden dir) of a "
                  "candidates folder: give the folder --llm-golden-artifacts wrote, a folder inside it, or "
                  "one of its golden files (e.g. llm-candidates/tests/__golden__/test_x.json).")


def _as_given(folder: Path, path: Path) -> Path:
    """``folder`` (absolute, above ``path``) spelled as ``path`` was: relative where ``path`` is."""
    if path.is_absolute():
        return folder
    return Path(os.path.relpath(folder))


def _usage_problem(path: Path, root: Path, golden_dir: Path | None, *, from_config: bool) -> str | None:
    if not path.is_dir() and not path.is_file():
        return f"PATH {str(path)!r} is neither a folder nor a file. Check the path."
    if not path.is_dir() and path.suffix != ".json":
        return (f"PATH {str(path)!r} is no golden file (*.json): give a candidate golden file, or a folder "
                "of them.")
    if not root.is_dir():
        return f"--root {str(root)!r} is not a folder. Check the path."
    leaves_root = golden_dir is not None and (golden_dir.is_absolute() or ".." in golden_dir.parts)
    if leaves_root and from_config:
        return (f"llm_golden_dir {str(golden_dir)!r} of the configuration is not inside the root "
                f"{str(root)!r}, and accept writes only inside the root. Run accept in the project (or give "
                "--root), or copy these goldens by hand.")
    if leaves_root or golden_dir == Path():  # "." would accept every file of DIR
        return (f"--golden-dir {str(golden_dir)!r} must be a folder inside the root, relative to it, "
                "as llm_golden_dir names it (e.g. goldens)")
    return None
