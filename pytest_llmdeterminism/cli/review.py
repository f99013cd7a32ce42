"""``llm-golden review [DIR]``: candidate goldens case by case on a terminal, riskiest first; each
case accepted is written as it is answered, through ``llm-golden accept``'s own path, so no answer
is lost to a later crash, Ctrl-C or a closed terminal."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pytest_llmdeterminism.cli import accept, diff, project, tokenizer
from pytest_llmdeterminism.goldens.review import ABSENT, Case, case_risk, review_order
from pytest_llmdeterminism.judge.compare import Verdict
from pytest_llmdeterminism.reporting import failure

SUMMARY = "go through candidate goldens case by case on a terminal: accept or skip each"
_ASKED = ", ".join(name for name in review_order() if name not in (Verdict.IDENTICAL.value, ABSENT))
HELP = f"""\
Show each candidate golden of DIR (default: llm-candidates, the folder --llm-golden-artifacts
wrote, or a folder or golden file inside it) against the project's golden, one case at a time,
riskiest first ({_ASKED}):
the line `llm-golden diff` prints for it, then the tokens around the first change, the top
candidates at that step, and what changed in the environment. A candidate IDENTICAL to the
project's golden is not asked about: there is nothing to accept. Answer each with a key and
Enter:

  a  accept this case: its golden is written now
  s  skip it (it stays in the candidates)
  q  quit: leave this case and the rest

Every candidate of DIR is checked before the first question (see accept --help). Each case
accepted is written at once, exactly as `llm-golden accept` writes it, so an answer given is
never lost: quitting, Ctrl-C, Ctrl-D or an error keeps every case accepted before it. At the end
each case accepted and left is listed.

review needs a terminal. In a script or CI, choose the cases with: llm-golden accept DIR
--only VERDICT[,...] / --except VERDICT[,...] / -k SUBSTRING.

exit status: 0 every case accepted; 1 some case left (skipped, or not reached); 2 no terminal, a
usage error, a problem accept names (nothing was written), or a golden file that could not be
written (the cases accepted before it were); 130 interrupted with Ctrl-C (the cases accepted
before it were written)."""

DEFAULT = Path("llm-candidates")
KEYS = "[a]ccept: write it now  [s]kip  [q]uit: leave the rest"


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
    asked = sorted((case for case in planned.cases if not case.changes_nothing),
                   key=lambda case: (case_risk(case.verdict), case.file, case.key, case.variant))
    same = len(planned.cases) - len(asked)
    unchanged = f" ({same} IDENTICAL to the project's golden, nothing to accept)" if same else ""
    print(f"{len(asked)} case(s) to review{unchanged}; answer each with a key and Enter: {KEYS}")
    tokens = _tokenizer(asked, root)
    if tokens is not None:
        print(tokens.line)
    written: list[Case] = []
    try:
        for number, case in enumerate(asked, 1):
            print()
            print(f"[{number}/{len(asked)}] {diff.case_line(case)}")
            for line in _detail(case, tokens):
                print(line)
            answer = _ask()
            if answer == "q":
                print("quit: the rest is left in the candidates.")
                break
            if answer == "a":
                done = accept.write(planned, [case])
                if done is None:
                    return 2
                written += done
    except KeyboardInterrupt:
        print("\ninterrupted: the rest is left in the candidates.")
        accept.summarize(planned, written)
        return 130
    except EOFError:
        print("\nend of input: the rest is left in the candidates.")
    print()
    return accept.summarize(planned, written)


def _ask() -> str:
    """One of a, s, q; asked again until it is one."""
    while True:
        answer = input("accept? [a/s/q] ").strip().lower()
        if answer in {"a", "s", "q"}:
            return answer
        print(KEYS)


def _tokenizer(cases: list[Case], root: Path | None) -> tokenizer.ProjectTokenizer | None:
    """The project's tokenizer, for the ids of the cases compared that no piece spells; None where no
    case was compared."""
    compared = [side for case in cases if case.comparison is not None for side in (case.expected, case.actual)
                if side is not None]
    if not compared:
        return None
    found = project.find(root if root is not None else Path.cwd())
    recorded = {str(side.fingerprint.get("tokenizer_hash")) for side in compared}
    return tokenizer.load(found.config_file, recorded)


def _detail(case: Case, tokens: tokenizer.ProjectTokenizer | None = None) -> list[str]:
    """The failure text's body for this case (tokens, top candidates, drift, environment), without
    its headline, which the diff line already gives; the ids no piece spells decoded as the failing
    check decoded them, with the project's tokenizer where it is the one the case recorded."""
    if case.comparison is None or case.expected is None or case.actual is None:
        return []
    known = tokens.for_case(case.expected, case.actual) if tokens is not None else None
    decode = failure.decoder_for(case.expected, case.actual, known)
    text = failure.mismatch(case.key, case.file, None, case.comparison, case.expected, case.actual, decode,
                            profile="review")
    return text.splitlines()[1:]
