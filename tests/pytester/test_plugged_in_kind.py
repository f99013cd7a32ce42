"""A kind of golden is one module plus one registry line (issue 50): a throw-away kind defined in
tests/helpers/choice_kind.py and registered by a project's conftest is recorded
(``--llm-golden-update``), checked (IDENTICAL; a changed value fails with its verdict), reported
(the terminal's failure, the JSON and Markdown reports) and reviewed (``llm-golden show``, ``diff`` and
``review``, which accepts its candidate) through the plugin's normal paths, which never name it."""

from __future__ import annotations

import json

import pytest

from pytest_llmdeterminism.goldens import kinds
from tests.helpers.choice_kind import AnsweringTerminal, registered, write_choice_test
from tests.helpers.projects import read_goldens

GOLDEN = "__golden__/test_c.json"
CONFTEST = """
from pytest_llmdeterminism.goldens import kinds
from tests.helpers.choice_kind import CHOICE

def pytest_configure(config):
    kinds.register(CHOICE)

def pytest_unconfigure(config):
    kinds.unregister(CHOICE.name)
"""


@pytest.fixture
def recorded(suite):
    suite.makeconftest(CONFTEST)
    write_choice_test(suite, {"red": -0.2, "blue": -1.9, "green": -3.0})
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=1)
    assert "choice" not in kinds.KINDS  # the inner run's conftest took its kind back
    return suite


def test_a_plugged_in_kind_is_recorded_in_its_own_fields_and_rereads_identical(recorded):
    entry = read_goldens(recorded, GOLDEN)["test_colour"]["cpu/float32"]
    assert entry == {"kind": "choice", "batch_shape": "1x1",
                     "fingerprint": {"device_class": "cpu", "dtype": "float32"},
                     "logprobs": [-0.2, -1.9, -3.0], "options": ["red", "blue", "green"],
                     "prompt": "Which colour is the sky?", "prompt_token_ids": [0, 1, 2, 3, 4]}
    assert json.loads((recorded.path / GOLDEN).read_text())["schema"] == "pytest-llmdeterminism/golden/3"
    before = (recorded.path / GOLDEN).read_bytes()
    again = recorded.runpytest("--llm-report=report.json")
    again.assert_outcomes(passed=1)
    (check,) = json.loads((recorded.path / "report.json").read_text())["checks"]
    assert (check["kind"], check["verdict"], check["passed"]) == ("choice", "IDENTICAL", True)
    assert check["expected_text"] == check["actual_text"] == "red"
    assert (recorded.path / GOLDEN).read_bytes() == before


def test_a_changed_choice_fails_is_reported_and_its_candidate_is_reviewed_and_accepted(
        recorded, monkeypatch, capsys):
    from pytest_llmdeterminism import cli

    before = (recorded.path / GOLDEN).read_bytes()
    write_choice_test(recorded, {"red": -2.0, "blue": -0.3, "green": -3.0})
    result = recorded.runpytest("--llm-report=r.json", "--llm-report=r.md", "--llm-golden-artifacts=cands")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "E*golden mismatch in 'test_colour': REGRESSION at step 0 — expected 'red' (id 0), "
        "got 'blue' (id 1); golden margin 1.7 >= tie margin 0.05: not a near tie — fails under 'exact'",
        "E*expected: [[]step 0] 'red'(0)   full text: 'red'",
        "E*got:      [[]step 0] 'blue'(1)   full text: 'blue'",
        "E*Accept with: pytest *test_colour* --llm-golden-update*"])
    assert (recorded.path / GOLDEN).read_bytes() == before  # a failing check leaves its golden
    (check,) = json.loads((recorded.path / "r.json").read_text())["checks"]
    assert (check["kind"], check["verdict"], check["passed"]) == ("choice", "REGRESSION", False)
    assert (check["expected_text"], check["actual_text"], check["first_divergence"]) == ("red", "blue", 0)
    markdown = (recorded.path / "r.md").read_text()
    assert "`test_colour`: `REGRESSION`" in markdown

    monkeypatch.chdir(recorded.path)
    with registered():  # the kind's package, imported by the llm-golden tools
        assert cli.main(["show", GOLDEN]) == 0
        assert "test_colour [cpu/float32]  choice: 'red'" in capsys.readouterr().out
        assert cli.main(["diff", "cands"]) == 1  # a regression among the candidates
        shown = capsys.readouterr().out
        assert ("REGRESSION     __golden__/test_c.json ['test_colour']['cpu/float32']  step 0: 'red'(0) -> "
                "'blue'(1), golden margin 1.7 >= tie margin 0.05: not a near tie") in shown, shown
        monkeypatch.setattr("sys.stdin", AnsweringTerminal("a\n"))  # review on a terminal: accept the case
        assert cli.main(["review", "cands"]) == 0
    shown = capsys.readouterr().out
    assert "[1/1] REGRESSION     __golden__/test_c.json ['test_colour']['cpu/float32']" in shown, shown
    assert "  got:      [step 0] 'blue'(1)   full text: 'blue'" in shown, shown
    accepted = read_goldens(recorded, GOLDEN)["test_colour"]["cpu/float32"]
    assert accepted["logprobs"] == [-2.0, -0.3, -3.0]
    recorded.runpytest().assert_outcomes(passed=1)
