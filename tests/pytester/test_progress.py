"""Progress on a slow run: what generates and how long it took, a slow test's checks and time, each
on a line of its own that leaves pytest's progress line whole; quiet under ``-q``. (Every
generation counts as slow here: the threshold is set to 0 s.)"""

from __future__ import annotations

import re

import pytest

from pytest_llmdeterminism.reporting import progress

SUITE = """
from pytest_llmdeterminism import deterministic

@deterministic
def test_one(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("Once upon a time"), name="story")
    golden_tokens.check(llm_model.generate(["Hello there", "Good morning"])[1], name="morning")

@deterministic
def test_two(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("Hello there"))
"""


@pytest.fixture
def slow(suite, monkeypatch):
    monkeypatch.setattr(progress, "PROGRESS_AFTER_S", 0.0)
    suite.makepyfile(test_story=SUITE)
    return suite


def test_a_slow_run_says_what_generates_and_how_long_each_check_took(slow):
    run = slow.runpytest("--llm-golden-update")
    run.assert_outcomes(passed=2)
    one, two = "llm: test_story.py::test_one", "llm: test_story.py::test_two"
    shape = r"max_new_tokens 8 at 4x32, padded to 4 rows"  # a one-prompt call pads to B rows: said
    run.stdout.re_match_lines([
        r"llm: loaded builtin:tiny in \d+\.\d s on cpu",
        rf"{one}: generated 1 prompt\(s\), {shape} in \d+\.\d s",
        rf"{one}: generating 2 prompt\(s\), {shape} \.\.\.",
        rf"{one} took \d+\.\d s; its golden checks: 'test_one::story' \d+\.\d s, "
        rf"'test_one::morning' \d+\.\d s",
        rf"{two} took \d+\.\d s; its golden checks: 'test_two' \d+\.\d s",
    ])
    lines = run.stdout.lines
    # pytest's results are never appended to one of ours: each line of them is whole, from the file's
    # name to its percentage, and no blank line splits them
    glued = r"(\.\.\.|\d s)[.F]+$|%\]$"
    assert not [line for line in lines if line.startswith("llm: ") and re.search(glued, line)]
    results = [line for line in lines if line.startswith("test_story.py") and line.strip() != "test_story.py"]
    assert len(results) == 2
    assert all(re.fullmatch(r"test_story\.py \. +\[\s*\d+%\]", line) for line in results)
    assert "" not in lines[lines.index(results[0]):lines.index(results[1])]


def test_the_model_loads_before_pytests_progress_line_starts(slow):
    run = slow.runpytest("--llm-golden-update", "-v")
    run.assert_outcomes(passed=2)
    lines = run.stdout.lines
    loaded = next(i for i, line in enumerate(lines) if line.startswith("llm: loaded builtin:tiny"))
    first = next(i for i, line in enumerate(lines) if line.startswith("test_story.py::test_one"))
    assert loaded < first
    # under -v, pytest's line for a test's result is whole: its name, its result, its percentage
    results = [line for line in lines if line.startswith("test_story.py::") and "PASSED" in line]
    assert len(results) == 2 and all(re.fullmatch(r"test_story\.py::test_\w+ PASSED +\[\s*\d+%\]", line)
                                     for line in results)


def test_progress_is_quiet_under_q(slow):
    run = slow.runpytest("--llm-golden-update", "-q")
    run.assert_outcomes(passed=2)
    assert not [line for line in run.stdout.lines if "generat" in line or " took " in line]


def test_the_header_says_what_b_above_one_costs_a_one_prompt_call(suite):
    suite.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    run = suite.runpytest()
    run.assert_outcomes(passed=1)
    run.stdout.fnmatch_lines([
        "llm cpu numerics: *. B = 4: a call of fewer than 4 prompts still runs 4 rows (filler rows cost as "
        "much as real ones), so B > 1 speeds up only calls that pass several prompts as a list"])
    assert "speed setting" not in run.stdout.str()


@pytest.mark.subprocess
def test_under_xdist_the_controller_says_each_slow_tests_time_on_its_own_line(suite):
    pytest.importorskip("xdist")
    suite.makeconftest("from pytest_llmdeterminism.reporting import progress\n"
                       "progress.PROGRESS_AFTER_S = 0.0\n")
    suite.makepyfile(test_story=SUITE)
    run = suite.runpytest_subprocess("-n", "2", "--llm-golden-update")
    run.assert_outcomes(passed=2)
    run.stdout.re_match_lines_random([
        r"llm: test_story.py::test_one took \d+\.\d s; its golden checks: 'test_one::story' \d+\.\d s, "
        r"'test_one::morning' \d+\.\d s$",
        r"llm: test_story.py::test_two took \d+\.\d s; its golden checks: 'test_two' \d+\.\d s$",
    ])
