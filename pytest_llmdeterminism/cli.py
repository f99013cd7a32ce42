"""``llm-golden``: inspect, compare and accept golden files outside pytest.

    llm-golden show FILE               a golden file in human form
    llm-golden diff BASE CAND          two golden files or folders, case by case, with verdicts
    llm-golden accept DIR [--root R]   import candidate goldens written by --llm-golden-artifacts
    llm-golden prune [PYTEST ARGS...]  run the suite and delete goldens no test checked

Exit status: 0 on success; ``diff`` exits 1 when any case is a REGRESSION or INPUT_CHANGED
(cases only in BASE are listed as ABSENT); 2 on a usage error or an unreadable file.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from pytest_llmdeterminism import store
from pytest_llmdeterminism.compare import Verdict, compare, default_tie_margin
from pytest_llmdeterminism.errors import GoldenFileError

ABSENT = "ABSENT"  # in BASE only: a candidate set holds just the cases that changed
NEW = "NEW"  # in CAND only: a golden that BASE lacks (a missing check's candidate, a new variant)
FAILING = {Verdict.REGRESSION.value, Verdict.INPUT_CHANGED.value, NEW}  # exit 1: needs a reviewer
_BAR = 20


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["prune"] and not {"-h", "--help"} & set(argv[1:2]):
        # Everything after `prune` belongs to pytest, options included.
        return subprocess.call([sys.executable, "-m", "pytest", "--llm-golden-prune", *argv[1:]])
    parser = argparse.ArgumentParser(prog="llm-golden", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    show = commands.add_parser("show", help="print a golden file in human form")
    show.add_argument("file", type=Path)
    diff = commands.add_parser("diff", help="compare two golden sets case by case")
    diff.add_argument("base", type=Path)
    diff.add_argument("candidate", type=Path)
    accept = commands.add_parser("accept", help="import candidate goldens from --llm-golden-artifacts DIR")
    accept.add_argument("dir", type=Path)
    accept.add_argument("--root", type=Path, default=Path("."), help="project root (pytest's rootdir)")
    prune = commands.add_parser("prune", help="run pytest --llm-golden-prune with the given arguments")
    prune.add_argument("pytest_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    assert args.command != "prune"
    try:
        if args.command == "show":
            return _show(args.file)
        if args.command == "diff":
            return _diff(args.base, args.candidate)
        return _accept(args.dir, args.root)
    except GoldenFileError as error:
        print(f"llm-golden: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `llm-golden show FILE | head`: the reader has what it wanted
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps interpreter shutdown from raising again
        return 0


def _show(path: Path) -> int:
    goldens = _read_existing(path)
    for key, variants in sorted(goldens.items()):
        for variant, entry in sorted(variants.items()):
            gen = store.from_entry(entry)
            print(f"{key} [{variant}]  shape {gen.batch_shape}, finish: {gen.finish_reason}")
            print(f"  prompt: {gen.prompt!r}")
            print(f"  output: {gen.text!r}")
            tie_margin = default_tie_margin(str(gen.fingerprint.get("dtype", "float32")))
            for step, (piece, token, margin) in enumerate(zip(gen.pieces, gen.token_ids, gen.margins)):
                bar = "#" * min(_BAR, int(margin * 2))
                tie = f"  <- near tie (< {tie_margin:g})" if margin < tie_margin else ""
                print(f"  {step:>4}  {piece!r:<16} id {token:<7} margin {margin:8.3f} {bar}{tie}")
            print()
    return 0


def _diff(base: Path, candidate: Path) -> int:
    pairs = _pair_files(base, candidate)
    verdicts: Counter[str] = Counter()
    for name, base_file, cand_file in pairs:
        base_goldens = _read_existing(base_file) if base_file.exists() or not cand_file.exists() else {}
        cand_goldens = store.read(cand_file) if cand_file.exists() else {}
        for key, variants in sorted(base_goldens.items()):
            for variant, entry in sorted(variants.items()):
                other = cand_goldens.get(key, {}).get(variant)
                if other is None:
                    verdict, detail = ABSENT, "  (not in CAND)"
                else:
                    comparison = compare(store.from_entry(entry), store.from_entry(other))
                    verdict, detail = comparison.verdict.value, _detail(comparison)
                verdicts[verdict] += 1
                print(f"{verdict:<14} {name} [{key!r}][{variant!r}]{detail}")
        for key, variants in sorted(cand_goldens.items()):
            for variant in sorted(set(variants) - set(base_goldens.get(key, {}))):
                verdicts[NEW] += 1
                print(f"{NEW:<14} {name} [{key!r}][{variant!r}]  (only in CAND: no golden to compare with)")
    print("summary: " + (", ".join(f"{n} {v}" for v, n in sorted(verdicts.items())) or "no goldens"))
    return 1 if FAILING & set(verdicts) else 0


def _detail(comparison: object) -> str:
    from pytest_llmdeterminism.compare import Comparison

    assert isinstance(comparison, Comparison)
    if comparison.divergence is not None:
        d = comparison.divergence
        return f"  step {d.step}: {d.expected_token} -> {d.actual_token}, golden margin {d.golden_margin:.3g}"
    if comparison.input_changes:
        return "  " + ", ".join(field for field, _, _ in comparison.input_changes)
    if comparison.verdict is Verdict.LOGIT_DRIFT:
        return f"  max |Δlogprob| {comparison.max_logprob_delta:.3g}"
    return ""


def _accept(folder: Path, root: Path) -> int:
    files = sorted(folder.rglob("*.json"))
    if not files:
        print(f"llm-golden: no candidate goldens (*.json) under {folder}", file=sys.stderr)
        return 2
    for candidate in files:
        relative = candidate.relative_to(folder)
        target = root / relative
        updates = store.read(candidate)
        store.merge(target, updates)
        for key, variants in sorted(updates.items()):
            print(f"accepted {relative} [{key!r}] ({', '.join(sorted(variants))})")
    return 0


def _pair_files(base: Path, candidate: Path) -> list[tuple[str, Path, Path]]:
    """(name, BASE file, CAND file) for every file in either folder (or the two files given)."""
    if base.is_dir():
        names = {p.relative_to(base) for p in base.rglob("*.json")}
        if candidate.is_dir():
            names |= {p.relative_to(candidate) for p in candidate.rglob("*.json")}
        return [(str(name), base / name, candidate / name) for name in sorted(names)]
    return [(base.name, base, candidate)]


def _read_existing(path: Path) -> store.Goldens:
    if not path.exists():
        raise GoldenFileError(path, "does not exist", "Check the path.")
    return store.read(path)


if __name__ == "__main__":
    sys.exit(main())
