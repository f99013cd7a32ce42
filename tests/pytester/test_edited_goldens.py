"""A golden's text and pieces are checked against what the check decodes for the same ids: an edited
one is its own failure (before, it read IDENTICAL for ever, and `llm-golden show` printed the edit)."""

import json

from tests.helpers.projects import GOLDEN, read_goldens

CAPITAL = """
from pytest_llmdeterminism import deterministic

@deterministic(max_new_tokens=6)
def test_capital(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("Q: What is the capital of Japan? A:"))
"""


def edit(project, **fields):
    """Set ``text`` (a string) or a step's ``piece`` (``piece=(step, text)``) of test_capital's golden."""
    path = project.path / GOLDEN
    document = json.loads(path.read_text())
    entry = document["goldens"]["test_capital"]["cpu/float32"]
    if "text" in fields:
        entry["text"] = fields["text"]
    if "piece" in fields:
        step, piece = fields["piece"]
        entry["steps"][step] = entry["steps"][step].copy() | {"piece": piece}
    path.write_text(json.dumps(document, indent=2))


def test_an_edited_text_fails_its_check_until_it_is_re_recorded(suite):
    suite.makepyfile(test_suite=CAPITAL)
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=1)
    recorded = read_goldens(suite)["test_capital"]["cpu/float32"]
    edit(suite, text=" Lyon, the capital of Japan.")
    failed = suite.runpytest()
    failed.assert_outcomes(failed=1)
    failed.stdout.fnmatch_lines([
        f"*golden 'test_capital' does not describe its own token ids (FIELDS_CHANGED): its text is "
        f"' Lyon, the capital of Japan.', but its ids decode to {recorded['text']!r}: the same tokenizer "
        "decodes them otherwise, so the golden was edited after it was recorded. A check compares ids*",
        "*Re-record it with: pytest *test_suite.py::test_capital --llm-golden-update"])
    failed.stdout.fnmatch_lines(["golden checks: 1 FIELDS_CHANGED (failed)"])  # one verdict, in the summary
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=1)
    assert read_goldens(suite)["test_capital"]["cpu/float32"]["text"] == recorded["text"]
    suite.runpytest().assert_outcomes(passed=1)


def test_an_edited_piece_fails_its_check(suite):
    suite.makepyfile(test_suite=CAPITAL)
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=1)
    recorded = read_goldens(suite)["test_capital"]["cpu/float32"]["steps"][1]
    edit(suite, piece=(1, " Lyon"))
    failed = suite.runpytest()
    failed.assert_outcomes(failed=1)
    failed.stdout.fnmatch_lines([f"*the piece of step 1 (id {recorded['token']}) is ' Lyon', but the id "
                                 f"decodes to {recorded['piece']!r}*"])
