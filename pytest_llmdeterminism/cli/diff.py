"""``llm-golden diff BASE CAND``: every case of two golden sets with its verdict, and the gate.

Pairing, verdicts and the ``--fail-on`` gate live in :mod:`~pytest_llmdeterminism.goldens.review`;
this module reads the arguments and prints one line per case.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections import Counter
from pathlib import Path

from pytest_llmdeterminism.cli import project
from pytest_llmdeterminism.errors import printable
from pytest_llmdeterminism.goldens import kinds
from pytest_llmdeterminism.goldens.acceptance import review_candidates
from pytest_llmdeterminism.goldens.files import GOLDEN_FOLDER
from pytest_llmdeterminism.goldens.review import (
    ABSENT,
    FAIL_ON_LEVELS,
    NEW,
    Case,
    aligned_folders,
    needs_review,
    review,
    review_order,
)
from pytest_llmdeterminism.judge.compare import Comparison, Recorded, Verdict
from pytest_llmdeterminism.reporting.text import short, tie_text
from pytest_llmdeterminism.sampling import settings_text

SUMMARY = "compare two golden sets case by case"
HELP = """\
Compare two golden sets case by case and list every case with its verdict.

BASE and CAND are two golden files, or two folders of them: typically the project's __golden__
and the candidates a CI run wrote with --llm-golden-artifacts (llm-candidates/__golden__).
With CAND alone, CAND is the whole --llm-golden-artifacts folder and BASE the project: the project
is found as pytest finds it (its configuration file, from here upwards; the first line of output
names it), and each golden file of CAND (in a __golden__ folder, or under llm_golden_dir) is
compared with the same path under the project's root, the file `llm-golden accept CAND` would
merge it into.
A candidate is compared with BASE's golden of the same device/dtype variant; where BASE has none
(CI ran in bfloat16, BASE holds cpu/float32) with the variant the plugin's --llm-golden-fallback
picks, and the line says so, e.g. "(vs cpu/float32)". Near ties use the tie margin of the
candidate's dtype (float32 0.05, float16 0.25, bfloat16 0.5 in logprob).

In folders, only golden files are read: those in a __golden__ folder, and those whose header
declares the golden format (goldens under llm_golden_dir). Other JSON (data/cities.json, a model's
config.json) is ignored and counted on one line; hidden folders, virtual environments,
node_modules, the plugin's own output (the --llm-repro folder, marked by its LLM-OUTPUT.txt) and
CAND where it lies inside BASE are not walked. When BASE holds no golden that a candidate pairs
with, a hint line says so.

verdicts:
  NEW            only in CAND, and BASE has no variant of that test key: nothing to compare with
  ABSENT         only in BASE: CI wrote no candidate for it, so that check passed
  IDENTICAL      same tokens, same logits
  LOGIT_DRIFT    same tokens, logits differ
  TIE_FLIP       a token changed where the golden's top two were a near tie
  SAMPLE_FLIP    a sampled golden's token changed where its draw was a near tie
  REGRESSION     a token changed where the golden was confident
  INPUT_CHANGED  prompt, batch shape or generation config differ: outputs not compared
  FIELDS_CHANGED same tokens, same logits, but another field differs (the fingerprint, the text,
                 a piece): no run writes that; a later check reads them

exit status:
  0  nothing needs review at the --fail-on level
  1  a case needs review: REGRESSION, INPUT_CHANGED, FIELDS_CHANGED or NEW (--fail-on=regression,
     the default);
     also TIE_FLIP and SAMPLE_FLIP (--fail-on=tie_flip); also LOGIT_DRIFT (--fail-on=drift).
     ABSENT never fails.
  2  usage error, a path that does not exist, or a file that is not a readable golden file"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "base", type=Path, metavar="BASE",
        help="the goldens to compare with: a golden file or a folder of them (e.g. __golden__); alone, "
             "the --llm-golden-artifacts folder, compared with the project's goldens")
    parser.add_argument(
        "candidate", type=Path, metavar="CAND", nargs="?",
        help="the candidates: a file or folder of the same kind (e.g. llm-candidates/__golden__)")
    parser.add_argument("--fail-on", dest="fail_on", choices=sorted(FAIL_ON_LEVELS), default="regression",
                        metavar="LEVEL",
                        help="which cases exit 1: regression (default), tie_flip, drift; see exit status")


def run(args: argparse.Namespace) -> int:
    if args.candidate is None:
        return diff_project(args.base, fail_on=args.fail_on)
    return diff(args.base, args.candidate, fail_on=args.fail_on)


def diff_project(candidates: Path, *, fail_on: str) -> int:
    """CAND alone: the candidates folder against the goldens of the project found from here."""
    settled = project.settle_for('diff', None, None)
    if settled is None:
        return 2
    if not candidates.is_dir():
        print(f"llm-golden diff: CAND {str(candidates)!r} is not a folder: alone, CAND is the folder "
              "--llm-golden-artifacts wrote. Check the path, or give BASE and CAND.", file=sys.stderr)
        return 2
    golden_dir = settled.golden_dir
    golden_dir = None if golden_dir is None or golden_dir.is_absolute() else golden_dir  # in the root only
    cases, problems, others = review_candidates(candidates, settled.root, golden_dir=golden_dir)
    for problem in problems:
        print(f"llm-golden diff: {problem}", file=sys.stderr)
    if problems:
        return 2
    if others:
        where = f"in no {GOLDEN_FOLDER} folder{f' and not under {golden_dir}/' if golden_dir else ''}"
        print(f"llm-golden diff: ignored {_files(candidates, others)} that are not goldens ({where}; "
              "accept would refuse them)", file=sys.stderr)
    flagged = _print_cases(cases, fail_on)
    if cases and all(case.verdict == NEW for case in cases):
        print(f"hint: no goldens in the root {str(settled.root)!r} for these candidates, so every one reads "
              f"NEW: is it the project that {str(candidates)!r} came from? Run diff there (or give --root to "
              "accept), or give BASE and CAND.")
    return flagged


def diff(base: Path, candidate: Path, *, fail_on: str) -> int:
    problem = _usage_problem(base, candidate)
    if problem:
        print(f"llm-golden diff: {problem}", file=sys.stderr)
        return 2
    reviewed = review(base, candidate)
    cases = reviewed.cases
    if reviewed.ignored:
        print(f"llm-golden diff: ignored {_files(base, reviewed.ignored, candidate)} that are not goldens "
              f"(in no {GOLDEN_FOLDER} folder, and no golden format in their header)", file=sys.stderr)
    flagged = _print_cases(cases, fail_on)
    if base.is_dir() and {case.verdict for case in cases} <= {NEW, ABSENT}:
        aligned = aligned_folders(base, candidate)
        if aligned is None and cases and all(case.verdict == NEW for case in cases):
            print(f"hint: no goldens in BASE {str(base)!r}, so every candidate reads NEW: is it the "
                  f"project's root, or the {GOLDEN_FOLDER} folder that mirrors CAND? (With CAND alone, "
                  f"`llm-golden diff {shlex.quote(str(candidate))}` compares it with the project found from "
                  "here.)")
        if aligned is not None:
            moved = "BASE" if aligned[0] != base else "CAND"
            deeper = str(aligned[0] if moved == "BASE" else aligned[1])
            print(f"hint: no golden file is in both folders, but they pair up when {moved} is {deeper!r}, "
                  "a folder inside the one given: BASE and CAND must mirror each other (both a "
                  f"{GOLDEN_FOLDER} folder, or both the folder above it). Compare with: llm-golden diff "
                  f"{shlex.quote(str(aligned[0]))} {shlex.quote(str(aligned[1]))}")
    return flagged


def _files(folder: Path, names: list[Path], other: Path | None = None) -> str:
    """``2 JSON file(s) (data/cities.json, models/tiny/config.json)``: at most three named."""
    more = f", … ({len(names) - 3} more)" if len(names) > 3 else ""
    shown = ", ".join(printable(name.as_posix()) for name in names[:3]) + more
    under = f"under {folder}{f' or {other}' if other is not None else ''}"
    return f"{len(names)} JSON file(s) {under} ({shown})"


def _print_cases(cases: list[Case], fail_on: str) -> int:
    """One line per case, then the summary; the exit status of the --fail-on gate."""
    for case in cases:
        print(case_line(case))
    counts = Counter(case.verdict for case in cases)
    flagged = needs_review(cases, fail_on)
    gate = f"{len(flagged)} case(s) need review" if flagged else "nothing needs review"
    found = ", ".join(f"{counts[v]} {v}" for v in review_order() if counts[v]) or "no goldens"
    print(f"summary: {found}; {gate} (--fail-on={fail_on})")
    return 1 if flagged else 0


def _usage_problem(base: Path, candidate: Path) -> str | None:
    for role, path in (("BASE", base), ("CAND", candidate)):
        if not path.exists():
            # A mistyped CAND must not read as "every case ABSENT, nothing to review".
            return f"{role} {str(path)!r} does not exist. Check the path."
    if base.is_dir() != candidate.is_dir():
        kinds = {True: "a folder", False: "a file"}
        return (f"BASE {str(base)!r} is {kinds[base.is_dir()]} but CAND {str(candidate)!r} is "
                f"{kinds[candidate.is_dir()]}: give two golden files or two folders of them")
    return None


def case_line(case: Case) -> str:
    """A case as diff lists it: verdict, file, key, variant and what changed."""
    against = f" (vs {case.compared_with})" if case.compared_with else ""
    return (f"{case.verdict:<14} {printable(case.file)} [{case.key!r}][{case.variant!r}]{against}"
            f"{_detail(case)}")


def _detail(case: Case) -> str:
    if case.verdict == NEW:
        return "  (only in CAND: BASE has no golden of this key to compare with)"
    comparison = case.comparison
    if comparison is None:
        return "  (not in CAND: no candidate, that check passed)"
    if case.verdict == Verdict.FIELDS_CHANGED.value:
        return "  same tokens and logit hashes, but " + fields_text(case)
    return _comparison_detail(comparison, case.expected, case.actual)


def fields_text(case: Case) -> str:
    """What a FIELDS_CHANGED candidate changes, BASE's value -> CAND's (a step field: by name)."""
    # a field of a kind's steps (steps.piece, positions.rank) comes without values (both None)
    shown = [field if old is None and new is None and "." in field
             else f"{field} {short(old, 40)} -> {short(new, 40)}" for field, old, new in case.fields]
    return (f"{', '.join(shown)}: no run writes that (a later check reads these fields: the fingerprint "
            "picks the tolerance, the text and pieces are what a failure shows); accept it only if you "
            "changed them yourself")


def _comparison_detail(comparison: Comparison, expected: Recorded | None,
                       actual: Recorded | None) -> str:
    if comparison.score is not None:
        return _score_detail(comparison, expected)
    if comparison.divergence is not None:
        d = comparison.divergence
        tokens = (f"  step {d.step}: {_token(expected, d.step, d.expected_token)} -> "
                  f"{_token(actual, d.step, d.actual_token)}")
        sampling = kinds.of(actual).sampling(actual) if actual is not None else None
        if d.draw_margin is not None and d.temperature is not None and sampling is not None:
            bound = comparison.tie_margin / d.temperature
            return (f"{tokens}, draw margin {d.draw_margin:.3g} (bound {bound:.3g} = tie margin "
                    f"{comparison.tie_margin:g} / T {d.temperature:g}); {settings_text(sampling)}")
        return f"{tokens}, {tie_text(d.golden_margin, comparison.tie_margin, comparison.max_logprob_delta)}"
    if comparison.input_changes:
        return "  " + ", ".join(field for field, _, _ in comparison.input_changes)
    if comparison.verdict is Verdict.LOGIT_DRIFT:
        return f"  max |Δlogprob| {comparison.max_logprob_delta:.3g}"
    return f"  {comparison.finding}" if comparison.finding else ""


def _score_detail(comparison: Comparison, expected: Recorded | None) -> str:
    """Two scores: the log-likelihood before and after, the position that moved most, a rank change."""
    evidence = comparison.score
    assert evidence is not None
    parts = [f"  score: log-likelihood {evidence.expected_total:.4f} -> {evidence.actual_total:.4f}"]
    if evidence.moved:
        c = evidence.moved[0]
        parts.append(f"most moved position {c.position} {_token(expected, c.position, c.token)} "
                     f"{c.expected_logprob:.4f} -> {c.actual_logprob:.4f}")
    if evidence.rank_changes:
        c = evidence.rank_changes[0]
        margin = ("rank margin unknown" if c.rank_margin is None else
                  tie_text(c.rank_margin, comparison.tie_margin, c.drift_elsewhere, name="rank margin"))
        parts.append(f"rank at position {c.position} {c.expected_rank} -> {c.actual_rank} ({margin})")
    return ", ".join(parts)


def _token(side: Recorded | None, step: int, token: int) -> str:
    """``' Paris'(29)``: the piece each golden stores with its token (no tokenizer, no model
    loaded); the bare id where the golden holds no piece for it."""
    if token < 0:
        return "end of output"
    pieces = side.pieces if side is not None else ()
    piece = pieces[step] if step < len(pieces) else ""
    return f"{piece!r}({token})" if piece else str(token)
