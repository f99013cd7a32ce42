"""``llm-golden compare A.json B.json [--html OUT]``: two runs' JSON reports side by side."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

SUMMARY = "two runs' JSON reports side by side: which checks changed verdict, appeared, disappeared"
HELP = """\
Compare two runs' JSON reports (each written by `pytest --llm-report=PATH.json`), check by check:
a check is a test's golden key. Prints the counts, then each check that changed verdict (or
passed in one run and failed in the other; the later run's worst verdict first), appeared (in
B only) or disappeared (in A only), with its verdict in each run, then each check that failed in
both runs with the same verdict ("still failing"). --html OUT also writes a self-contained page
with both runs' verdict, step, margin and drift side by side (a change for the better in green,
for the worse in red), filters by how each check moved and a search box; the filter and the
search are kept in the page's address.

A report is read as untrusted input (a CI artifact): one that is not a regular file, is over
256 MiB or is not a pytest-llmdeterminism JSON report is named and nothing is written.

exit status: 0 no check changed verdict, appeared or disappeared (checks still failing do not
count: nothing moved); 1 some did; 2 a usage error or an unreadable report."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("before", type=Path, metavar="A", help="the earlier run's --llm-report JSON file")
    parser.add_argument("after", type=Path, metavar="B", help="the later run's --llm-report JSON file")
    parser.add_argument("--html", type=Path, metavar="OUT", help="also write the comparison as an HTML page")


def run(args: argparse.Namespace) -> int:
    return compare(args.before, args.after, html=args.html)


def compare(before: Path, after: Path, *, html: Path | None = None) -> int:
    from pytest_llmdeterminism.goldens import atomic
    from pytest_llmdeterminism.reporting import run_comparison
    from pytest_llmdeterminism.run.shards import ShardError

    try:
        changes = run_comparison.compare_runs(read_checks(before), read_checks(after))
    except ShardError as error:
        print(f"llm-golden compare: {error}", file=sys.stderr)
        return 2
    for line in run_comparison.comparison_lines(changes, str(before), str(after)):
        print(line)
    if html is not None:
        try:
            atomic.write_text_atomic(html, run_comparison.comparison_html(changes, str(before), str(after)),
                                     homes=[atomic.output_home(html.parent, Path.cwd())], what="reports",
                                     mode=atomic.new_file_mode())
        except atomic.LinkOutError as error:
            print(f"llm-golden compare: {error}", file=sys.stderr)
            return 2
        except OSError as error:
            print(f"llm-golden compare: cannot write {str(html)!r} ({error.strerror}). Check the path.",
                  file=sys.stderr)
            return 2
        print(f"wrote {html}")
    return 1 if any(change.status in run_comparison.MOVED for change in changes) else 0


def read_checks(path: Path) -> list[dict[str, Any]]:
    """The checks of the JSON report ``path``, as plain dicts, read as ``llm-golden merge`` reads a
    shard's (a CI artifact: size limit, schema, version); ``ShardError`` when it is not one."""
    import msgspec

    from pytest_llmdeterminism.run.shards import read_shard

    return msgspec.to_builtins(read_shard(path).checks)  # type: ignore[no-any-return]
