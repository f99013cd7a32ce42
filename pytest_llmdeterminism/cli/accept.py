"""``llm-golden accept DIR``: candidate goldens from ``--llm-golden-artifacts`` into the project.

Every candidate is checked (:func:`~pytest_llmdeterminism.goldens.review.plan_accept`) before any
file is written; this module reads the arguments, reports the problems, and merges the files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pytest_llmdeterminism.cli import project
from pytest_llmdeterminism.goldens import store
from pytest_llmdeterminism.goldens.files import GOLDEN_FOLDER
from pytest_llmdeterminism.goldens.review import plan_accept

SUMMARY = "import candidate goldens from --llm-golden-artifacts DIR"
HELP = """\
Merge the candidate goldens that a run with --llm-golden-artifacts=DIR wrote into the project's
golden files, one variant at a time. DIR mirrors the root: DIR/tests/__golden__/test_x.json is
merged into ROOT/tests/__golden__/test_x.json, and nothing else is written.

The project is found as pytest finds it: the nearest pytest.toml, pytest.ini, pyproject.toml
([tool.pytest.ini_options]), tox.ini ([pytest]) or setup.cfg ([tool:pytest]) from --root, or from
here upwards; its folder is the root and its llm_golden_dir where goldens are kept. The first line
of output names the file used. --root and --golden-dir, given, win over it.

A candidate folder is usually an artifact from CI, so it is checked before anything is written:
every *.json file in it must be a golden file directly in a __golden__ folder (or under
llm_golden_dir = D, or --golden-dir D); it holds no symbolic link; no target resolves to outside the
root; every candidate and every golden file it merges into must be valid. Any problem: each is
named, and no file is written.

exit status: 0 accepted; 2 a usage error or any problem above (nothing was written)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", type=Path, metavar="DIR", help="the folder --llm-golden-artifacts wrote")
    parser.add_argument("--root", type=Path, metavar="ROOT",
                        help="project root (pytest's rootdir); default: the folder of the project's "
                             "pytest configuration file, found from here upwards")
    parser.add_argument("--golden-dir", dest="golden_dir", type=Path, metavar="D",
                        help="also accept the files under D/ (relative to the root), as llm_golden_dir = D; "
                             "default: the configuration file's llm_golden_dir")


def run(args: argparse.Namespace) -> int:
    return accept(args.dir, args.root, args.golden_dir)


def accept(folder: Path, root: Path | None, golden_dir: Path | None) -> int:
    settled = project.settle_for('accept', root, golden_dir)
    if settled is None:
        return 2
    root, golden_dir = settled.root, settled.golden_dir
    problem = _usage_problem(folder, root, golden_dir, from_config=settled.from_config)
    if problem:
        print(f"llm-golden accept: {problem}", file=sys.stderr)
        return 2
    accepted, problems = plan_accept(folder, root, golden_dir=golden_dir)
    for problem in problems:
        print(f"llm-golden: {problem}", file=sys.stderr)
    if problems:
        print("llm-golden: nothing was accepted: every candidate is checked before any file is written. "
              "Fix the problems above and run accept again.", file=sys.stderr)
        return 2
    if not accepted:
        example = folder / "tests" / GOLDEN_FOLDER / "test_x.json"
        print(f"llm-golden: no candidate goldens (*.json) under {folder}: expected the golden files that "
              f"--llm-golden-artifacts={folder} writes, e.g. {example}", file=sys.stderr)
        return 2
    for acceptance in accepted:
        try:
            store.merge(acceptance.target, acceptance.goldens)
        except OSError as error:
            print(f"llm-golden: cannot write {acceptance.target} ({error.strerror or error}); the files "
                  "listed as accepted above were written, no other. Fix that and run accept again.",
                  file=sys.stderr)
            return 2
        for key, variants in sorted(acceptance.goldens.items()):
            print(f"accepted {acceptance.name} [{key!r}] ({', '.join(sorted(variants))})")
    return 0


def _usage_problem(folder: Path, root: Path, golden_dir: Path | None, *, from_config: bool) -> str | None:
    for role, path in (("DIR", folder), ("--root", root)):
        if not path.is_dir():
            return f"{role} {str(path)!r} is not a folder. Check the path."
    leaves_root = golden_dir is not None and (golden_dir.is_absolute() or ".." in golden_dir.parts)
    if leaves_root and from_config:
        return (f"llm_golden_dir {str(golden_dir)!r} of the configuration is not inside the root "
                f"{str(root)!r}, and accept writes only inside the root. Run accept in the project (or give "
                "--root), or copy these goldens by hand.")
    if leaves_root or golden_dir == Path():  # "." would accept every file of DIR
        return (f"--golden-dir {str(golden_dir)!r} must be a folder inside the root, relative to it, "
                "as llm_golden_dir names it (e.g. goldens)")
    return None
