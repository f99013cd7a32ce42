"""``llm-golden merge REPORT.json...``: one review from the shards of a suite.

The merge itself lives in :mod:`~pytest_llmdeterminism.run.shards` (read, check, plan) and
:mod:`~pytest_llmdeterminism.run.merge_writer` (write, sum up); this module reads the arguments,
checks them, and prints what the merge wrote and found.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pytest_llmdeterminism.cli import project
from pytest_llmdeterminism.errors import GoldenFileError
from pytest_llmdeterminism.reporting import documents

SUMMARY = "one review from the JSON reports and candidates of a suite's shards"
HELP = """\
Merge the shards of one suite (CI jobs that each ran part of it, e.g. pytest-split's
--splits N --group i, or -k) into one review. Each REPORT is the JSON report a shard wrote
with --llm-report=PATH.json; it says which tests the shard collected and ran, which goldens it
looked up, and where its --llm-golden-artifacts folder is, relative to the report: keep each
shard's report and candidates folder together as the shard wrote them (one artifact per shard).

Writes, when asked: --candidates DIR, one candidate tree of every shard's candidates (for
`llm-golden diff` and `llm-golden accept DIR`); --report PATH (.json, .md, .html, repeatable),
one report of every shard's checks. Unused goldens are judged, against the golden files under
--root, only when the shards together ran every test of the suite (every test any shard
collected, deselected ones included), none stopped early and every test passed; otherwise the
summary says why and names every test no shard ran. --prune then deletes the unused goldens
(--prune=cases: also those of parametrized cases no shard collected, kept otherwise), and only on
reports of the commit checked out under --root (each report records the commit its shard ran at)
whose 'used' names every golden their checks looked up: any other report is named and nothing
is written.

The project is found as `llm-golden accept` finds it (its pytest configuration file, from --root
or from here upwards; the first line of output names it): its folder is the root, and its
llm_golden_dir says where each test module's golden file is. --root and --golden-dir, given, win.

A report is CI artifact input, untrusted like candidates; everything is read and checked before
anything is written or pruned. A report is refused, unread, when it is not a regular file (a FIFO,
a device) or is over 256 MiB. Each test module it names must be one of its own suite's, inside
the root, and its golden file the one the configuration gives that module (beside it in
__golden__/, or under llm_golden_dir), with no symbolic link leading out of the root; its
candidates folder must lie inside the report's own folder. Any of these, a report that is not one,
an unsafe candidates folder, or a conflict (two shards wrote one candidate golden differently) is
named and nothing is written. Every file is written atomically.

exit status: 0 a complete run, every test passed; 1 merged, but some test failed or the shards
did not cover the suite (no unused goldens judged); 2 a usage error or any problem above
(nothing was written)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("reports", type=Path, nargs="+", metavar="REPORT",
                        help="each shard's --llm-report JSON file (its candidates folder beside it)")
    parser.add_argument("--candidates", type=Path, metavar="DIR",
                        help="write every shard's candidates into DIR (a new or empty folder)")
    parser.add_argument("--report", type=Path, action="append", default=[], metavar="PATH",
                        help=f"write the merged report: {documents.suffixes()}; repeat for several")
    parser.add_argument("--root", type=Path, metavar="ROOT",
                        help="project root (pytest's rootdir), where the golden files are; default: the "
                             "folder of the project's pytest configuration file, found from here upwards")
    parser.add_argument("--golden-dir", dest="golden_dir", type=Path, metavar="D",
                        help="the shards ran with llm_golden_dir = D (relative to the root); default: the "
                             "configuration file's llm_golden_dir")
    parser.add_argument("--prune", nargs="?", const="tests", type=_prune_mode, metavar="tests|cases",
                        help="delete the unused goldens, after shards of the checked-out commit that ran the "
                             "whole suite, all passing; 'cases' also those of parametrized cases no shard "
                             "collected")


def _prune_mode(value: str) -> str:
    if value in ("tests", "cases"):
        return value
    raise argparse.ArgumentTypeError(f"expected 'tests' or 'cases', got {value!r}. To prune and name "
                                     "reports, write '--prune=tests REPORT...' (or put the reports first).")


def run(args: argparse.Namespace) -> int:
    return merge(args.reports, root=args.root, candidates=args.candidates, reports=args.report,
                 prune=args.prune, golden_dir=args.golden_dir)


def merge(report_paths: list[Path], *, root: Path | None, candidates: Path | None, reports: list[Path],
          prune: str | None, golden_dir: Path | None = None) -> int:
    """``prune``: None, ``tests`` or ``cases`` (as ``--llm-golden-prune``)."""
    from pytest_llmdeterminism.run import merge_writer, prune_trust, shards

    settled = project.settle_for('merge', root, golden_dir)
    if settled is None:
        return 2
    root = settled.root
    problem = merge_writer.report_problems(reports)
    if problem is None and not root.is_dir():
        problem = f"--root {str(root)!r} is not a folder. Check the path."
    if problem is None and candidates is not None and candidates.exists() and (
            not candidates.is_dir() or any(candidates.iterdir())):
        problem = (f"--candidates {str(candidates)!r} exists and is not an empty folder: merged candidates "
                   "never mix with older ones. Remove it, or name a new folder.")
    if problem:
        print(f"llm-golden merge: {problem}", file=sys.stderr)
        return 2
    json_report = next((path for path in reports if path.suffix == ".json"), None)
    planned = shards.plan(report_paths, root, candidates_out=candidates, json_report=json_report,
                          golden_dir=settled.golden_dir, cases=prune == "cases")
    if prune and not planned.problems and not planned.run.partial:  # it would prune, on these reports' word
        head = prune_trust.checkout_commit(root)
        planned.problems += prune_trust.prune_refusals(planned.shards, root, head)
    if planned.problems:
        for problem in planned.problems:
            print(f"llm-golden merge: {problem}", file=sys.stderr)
        print("llm-golden merge: nothing was written: every shard is checked before any file is written. "
              "Fix the problems above and run merge again.", file=sys.stderr)
        return 2
    try:
        written = merge_writer.write(planned, root=root, candidates_out=candidates, reports=reports,
                                     prune=bool(prune), display=_display)
    except (OSError, GoldenFileError) as error:
        print(f"llm-golden merge: {error}", file=sys.stderr)
        return 2
    summary = merge_writer.summary_lines(planned, root=root, prune=bool(prune), pruned=written.pruned,
                                         display=_display)
    for line in [*written.lines, *summary]:
        print(line)
    return 1 if planned.run.partial else 0


def _display(path: Path) -> str:
    """``path`` as the user gave it: relative to here, or whole where that would climb out."""
    relative = os.path.relpath(path)
    return Path(path).as_posix() if relative.startswith("..") else relative
