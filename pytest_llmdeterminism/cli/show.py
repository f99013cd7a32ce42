"""``llm-golden show FILE``: a golden file in human form, one line per generated token (a score
golden: one line per continuation token, with its logprob and rank)."""

from __future__ import annotations

import argparse
from pathlib import Path

from pytest_llmdeterminism.errors import GoldenFileError
from pytest_llmdeterminism.goldens import kinds, schema, store

SUMMARY = "print a golden file in human form"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", type=Path, metavar="FILE", help="a golden file (*.json)")


def run(args: argparse.Namespace) -> int:
    return show(args.file)


def show(path: Path) -> int:
    if not path.exists():
        raise GoldenFileError(path, "does not exist", "Check the path.")
    goldens = store.read(path)
    for key, variants in sorted(goldens.items()):
        for variant, entry in sorted(variants.items()):
            record = schema.from_entry(entry)
            for line in kinds.of(record).show_lines(key, variant, record):
                print(line)
    return 0
