"""Adding a verdict is one enum member and its rule (issue 50): OPTIONS_REORDERED, added for this test
only (tests/helpers/extra_verdict.py) with a rule in a throw-away kind, is carried by every tool
that reads verdicts without any of them naming it: the run's summary and failure, the JSON,
Markdown and HTML reports, ``llm-golden diff`` (its gate and its counts), ``accept --only`` and
``review``, in the verdicts' own order of risk."""

from __future__ import annotations

import json

import pytest

from pytest_llmdeterminism.judge.verdict import Verdict
from tests.helpers import ROOT, extra_verdict
from tests.helpers.choice_kind import AnsweringTerminal, write_choice_test
from tests.helpers.projects import read_goldens

GOLDEN = "__golden__/test_c.json"
KEY = "__golden__/test_c.json ['test_colour']['cpu/float32']"
CONFTEST = """
from tests.helpers import extra_verdict
from tests.helpers.choice_kind import AnsweringTerminal, write_choice_test

def pytest_configure(config):
    extra_verdict.register()

def pytest_unconfigure(config):
    extra_verdict.unregister()
"""


@pytest.fixture
def reordered(suite, monkeypatch):
    """A golden recorded, then a run whose choice is the same but whose other options swapped. The
    runs are children: a verdict must exist before the process first decodes a test's records
    (msgspec keeps the enum's values in each record type it decoded), as a plug-in's does."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the children import tests.helpers
    suite.makeconftest(CONFTEST)
    write_choice_test(suite, {"red": -0.2, "blue": -1.9, "green": -3.0})
    suite.runpytest_subprocess("--llm-golden-update").assert_outcomes(passed=1)
    write_choice_test(suite, {"red": -0.2, "blue": -3.0, "green": -1.9})
    result = suite.runpytest_subprocess("--llm-report=r.json", "--llm-report=r.md", "--llm-report=r.html",
                                        "--llm-golden-artifacts=cands")
    result.assert_outcomes(failed=1)
    return suite, result


@pytest.mark.subprocess
def test_an_added_verdict_is_reported_by_the_run(reordered):
    project, result = reordered
    result.stdout.fnmatch_lines([
        "E*golden mismatch in 'test_colour': OPTIONS_REORDERED at choice 0 — the same choice, the options "
        "ranked red > blue > green -> red > green > blue*",
        "golden checks: 1 OPTIONS_REORDERED (failed)"])
    (check,) = json.loads((project.path / "r.json").read_text())["checks"]
    assert (check["verdict"], check["passed"]) == ("OPTIONS_REORDERED", False)
    assert "`test_colour`: `OPTIONS_REORDERED`" in (project.path / "r.md").read_text()
    assert "OPTIONS_REORDERED" in (project.path / "r.html").read_text()


@pytest.mark.subprocess
def test_an_added_verdict_is_gated_counted_ordered_and_accepted_by_the_review_tools(reordered, monkeypatch,
                                                                                   capsys):
    from pytest_llmdeterminism import cli
    from pytest_llmdeterminism.goldens.review import case_risk, review_order

    project, _ = reordered
    monkeypatch.chdir(project.path)
    with extra_verdict.registered():
        assert review_order()[:3] == ("REGRESSION", "OPTIONS_REORDERED", "INPUT_CHANGED")  # by its risk
        assert case_risk("OPTIONS_REORDERED") == extra_verdict.RISK
        assert cli.main(["diff", "cands"]) == 1  # not tolerable: a reviewer is asked
        shown = capsys.readouterr().out
        assert (f"OPTIONS_REORDERED {KEY}  the same choice, the options ranked red > blue > green -> "
                "red > green > blue") in shown, shown
        assert "summary: 1 OPTIONS_REORDERED; 1 case(s) need review" in shown, shown
        monkeypatch.setattr("sys.stdin", AnsweringTerminal("s\n"))  # review on a terminal: skip it
        assert cli.main(["review", "cands"]) == 1
        assert f"[1/1] OPTIONS_REORDERED {KEY}" in capsys.readouterr().out
        assert cli.main(["accept", "cands", "--only", "REGRESSION"]) == 1  # none of that verdict
        capsys.readouterr()
        assert cli.main(["accept", "cands", "--only", "options_reordered"]) == 0
        assert f"accepted OPTIONS_REORDERED {KEY}" in capsys.readouterr().out
    assert "OPTIONS_REORDERED" not in Verdict._member_map_
    assert read_goldens(project, GOLDEN)["test_colour"]["cpu/float32"]["logprobs"] == [-0.2, -3.0, -1.9]
    project.runpytest_subprocess().assert_outcomes(passed=1)
