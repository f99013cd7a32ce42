"""``llm-golden review [DIR]``: candidate goldens case by case on a terminal, riskiest first; the
cases accepted are written at the end, all at once, through ``llm-golden accept``'s own path."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pytest_llmdeterminism.cli import accept, diff
from pytest_llmdeterminism.goldens.review import Case, case_risk
from pytest_llmdeterminism.reporting import failure

SUMMARY = "go through candidate goldens case by case on a terminal: accept or skip each"
HELP = """\
Show each candidate golden of DIR (default: llm-candidates, the folder --llm-golden-artifacts
wrote, or a folder or golden file inside it) against the project's golden, one case at a time,
riskiest first (REGRESSION, INPUT_CHANGED, NEW, SAMPLE_FLIP, TIE_FLIP, RANK_FLIP, LOGIT_DRIFT,
IDENTICAL):
the line `llm-golden diff` prints for it, then the tokens around the first change, the top
candidates at that step, and what changed in the environment. Answer each with a key and Enter:

  a  accept this case
  s  skip it (it stays in the candidates)
  d  done: write the cases accepted so far, leave the rest
  q  quit: write nothing

After the last case the cases accepted are written, all at once, exactly as `llm-golden accept`
writes them: every candidate of DIR is checked before anything is written (see accept --help),
and each case accepted and left is listed. Ctrl-C, Ctrl-D or q writes nothing.

review needs a terminal. In a script or CI, choose the cases with: llm-golden accept DIR
--only VERDICT[,...] / --except VERDICT[,...] / -k SUBSTRING.

exit status: 0 every case accepted and written; 1 some case left (skipped, not reached, or
nothing written); 2 no terminal, a usage error, or a problem accept names (nothing was written);
130 interrupted with Ctrl-C (nothing was written)."""

DEFAULT = Path("llm-candidates")
KEYS = "[a]ccept  [s]kip  [d]one: write what was accepted  [q]uit: write nothing"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", type=Path, metavar="DIR", nargs="?", default=DEFAULT,
                        help="the folder --llm-golden-artifacts wrote, or a folder or golden file inside it "
                             f"(default: {DEFAULT})")
    accept.add_project_arguments(parser)


def run(args: argparse.Namespace) -> int:
    return review(args.dir, args.root, args.golden_dir, candidates_root=args.candidates_root)


def review(path: Path, root: Path | None, golden_dir: Path | None, *,
           candidates_root: Path | None = None) -> int:
    if not sys.stdin.isatty():
        print(f"llm-golden review: needs a terminal to ask case by case, and its input is not one. Choose "
              f"the cases to accept instead with: llm-golden accept {path} --only VERDICT[,...] (or "
              "--except, or -k SUBSTRING of the test key); `llm-golden diff` lists the verdicts.",
              file=sys.stderr)
        return 2
    planned = accept.plan("review", path, root, golden_dir, candidates_root)
    if planned is None:
        return 2
    cases = sorted(planned.cases, key=lambda case: (case_risk(case.verdict), case.file, case.key,
                                                    case.variant))
    print(f"{len(cases)} case(s) to review; answer each with a key and Enter: {KEYS}")
    taken: list[Case] = []
    try:
        for number, case in enumerate(cases, 1):
            print()
            print(f"[{number}/{len(cases)}] {diff.case_line(case)}")
            for line in _detail(case):
                print(line)
            answer = _ask()
            if answer == "q":
                print("quit: nothing was written.")
                return 1
            if answer == "d":
                break
            if answer == "a":
                taken.append(case)
    except KeyboardInterrupt:
        print("\ninterrupted: nothing was written.")
        return 130
    except EOFError:
        print("\nend of input: nothing was written.")
        return 1
    print()
    if not taken:
        print("no case accepted: nothing was written.")
        return 1
    return accept.apply(planned, taken)


def _ask() -> str:
    """One of a, s, d, q; asked again until it is one."""
    while True:
        answer = input("accept? [a/s/d/q] ").strip().lower()
        if answer in {"a", "s", "d", "q"}:
            return answer
        print(KEYS)


def _detail(case: Case) -> list[str]:
    """The failure text's body for this case (tokens, top candidates, drift, environment), without
    its headline, which the diff line already gives."""
    if case.comparison is None or case.expected is None or case.actual is None:
        return []
    decode = failure.decoder_for(case.expected, case.actual)
    text = failure.mismatch(case.key, case.file, None, case.comparison, case.expected, case.actual, decode,
                            profile="review")
    return text.splitlines()[1:]
