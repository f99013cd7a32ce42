"""The plugins people run beside this one: pytest-randomly, pytest-rerunfailures, pytest-timeout.

Each workflow records goldens, then runs the neighbour the way its users do, and asserts on what a
user reads: outcomes, the golden summary, the golden file.
"""

from __future__ import annotations

import json

import pytest

# A test that draws from python's, numpy's and torch's generators for its prompt: under the
# marker those draws are the marker's seed's, whatever another plugin seeded.
RANDOM_DRAWS = """
import random

import numpy
import pytest
import torch
from pytest_llmdeterminism import deterministic

WORDS = ["sky", "sea", "cat", "dog", "sun", "moon", "tree", "road"]

@deterministic(max_new_tokens=2)
def test_random_prompt(llm_model, golden_tokens):
    drawn = [random.choice(WORDS), WORDS[int(numpy.random.randint(8))], WORDS[int(torch.randint(8, ()))]]
    golden_tokens.check(llm_model.generate("The " + " and the ".join(drawn)))

@deterministic(max_new_tokens=2)
@pytest.mark.parametrize("prompt", ["The sky is", "Count: one,", "Once upon a"])
def test_fixed(llm_model, golden_tokens, prompt):
    golden_tokens.check(llm_model.generate(prompt))
"""


def _goldens(project, module):
    path = project.path / "__golden__" / f"{module}.json"
    return json.loads(path.read_text())["goldens"] if path.exists() else {}


def test_goldens_stay_identical_under_pytest_randomly_orders_and_reseeding(suite):
    pytest.importorskip("pytest_randomly")
    suite.makepyfile(test_draws=RANDOM_DRAWS)
    suite.runpytest("-p", "no:randomly", "--llm-golden-update").assert_outcomes(passed=4)
    recorded = _goldens(suite, "test_draws")
    for seed in (1, 20260101):
        result = suite.runpytest("-p", "randomly", f"--randomly-seed={seed}", "-v")
        result.assert_outcomes(passed=4)
        result.stdout.fnmatch_lines([f"Using --randomly-seed={seed}", "golden checks: 4 IDENTICAL"])
    assert _goldens(suite, "test_draws") == recorded


# test_flaky generates with its model's output head negated on the attempts listed in BAD: a
# kernel that gives another result now and then, as far as the test can tell.
FLAKY = """
import os

import pytest
import torch
from pytest_llmdeterminism import deterministic

ATTEMPTS = {"flaky": 0, "other": 0}

@deterministic(max_new_tokens=4)
def test_flaky(llm_model, golden_tokens):
    ATTEMPTS["flaky"] += 1
    head = llm_model.model.lm_head.weight
    saved = head.detach().clone()
    if str(ATTEMPTS["flaky"]) in os.environ.get("BAD", "").split(","):
        with torch.no_grad():
            head.mul_(-1.0)
    try:
        golden_tokens.check(llm_model.generate("The sky is"))
    finally:
        with torch.no_grad():
            head.copy_(saved)

@deterministic(max_new_tokens=4)
def test_flaky_elsewhere(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("Count: one,"))
    ATTEMPTS["other"] += 1
    assert ATTEMPTS["other"] > int(os.environ.get("OTHER_FAILS", "0")), "a flaky assertion, not a golden"
"""


def _assert_outcomes(result, **expected):
    """``assert_outcomes`` for pytest-rerunfailures' runs, whose outcomes include ``rerun``."""
    outcomes = {name: n for name, n in result.parseoutcomes().items() if not name.startswith("warning")}
    assert outcomes == expected, result.stdout.str()


def _rerun(suite, monkeypatch, bad, *args, other_fails=0):
    monkeypatch.setenv("BAD", bad)
    monkeypatch.setenv("OTHER_FAILS", str(other_fails))
    return suite.runpytest("-p", "rerunfailures", "-p", "no:randomly", *args)


def test_a_golden_check_that_passes_on_a_rerun_is_nondeterministic_and_fails(suite, monkeypatch):
    pytest.importorskip("pytest_rerunfailures")
    suite.makepyfile(test_flaky=FLAKY)
    suite.runpytest("-p", "no:randomly", "--llm-golden-update").assert_outcomes(passed=2)
    result = _rerun(suite, monkeypatch, "1", "--reruns", "2")
    _assert_outcomes(result, passed=1, failed=1, rerun=2)
    result.stdout.fnmatch_lines([
        ("E*golden check 'test_flaky' is NONDETERMINISTIC: attempt 3 of this test generated other output "
         "than attempt 1 in the same process (tokens differ from step 0: *); a rerun never passes a "
         "golden check"),
        "E*attempt 1's check was REGRESSION (failed)*",
        "E*Find what varies with: pytest test_flaky.py::test_flaky --llm-audit",
        "golden checks: 1 IDENTICAL, 1 NONDETERMINISTIC (failed)",  # the last attempt's checks, once each
        "NONDETERMINISTIC: test_flaky.py::test_flaky generated other output for 'test_flaky' on attempt 3 *",
        "FAILED test_flaky.py::test_flaky - *",
    ])
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_a_golden_check_that_fails_on_every_rerun_stays_failed_and_counts_once(suite, monkeypatch):
    pytest.importorskip("pytest_rerunfailures")
    suite.makepyfile(test_flaky=FLAKY)
    suite.runpytest("-p", "no:randomly", "--llm-golden-update").assert_outcomes(passed=2)
    golden = _goldens(suite, "test_flaky")
    result = _rerun(suite, monkeypatch, "1,2,3", "--reruns", "2", "--llm-golden-update=new")
    _assert_outcomes(result, passed=1, failed=1, rerun=2)
    result.stdout.fnmatch_lines(["golden checks: 1 IDENTICAL, 1 REGRESSION (failed)",
                                 "FAILED test_flaky.py::test_flaky - *"])
    assert "NONDETERMINISTIC" not in result.stdout.str()
    assert _goldens(suite, "test_flaky") == golden


def test_a_rerun_after_a_failure_elsewhere_keeps_identical_goldens_passing(suite, monkeypatch):
    """Not every rerun is ours: the same output on each attempt is not nondeterminism, and an update
    run records the attempt that passed."""
    pytest.importorskip("pytest_rerunfailures")
    suite.makepyfile(test_flaky=FLAKY)
    result = _rerun(suite, monkeypatch, "", "--reruns", "1", "--llm-golden-update", other_fails=1)
    _assert_outcomes(result, passed=2, rerun=1)
    result.stdout.fnmatch_lines(["golden checks: 2 recorded", "wrote __golden__/test_flaky.json (2 goldens)"])
    result = _rerun(suite, monkeypatch, "", "--reruns", "1", other_fails=1)
    _assert_outcomes(result, passed=2, rerun=1)
    result.stdout.fnmatch_lines(["golden checks: 2 IDENTICAL"])


# test_stuck generates through a forward hook that sleeps: a generation that never ends. The tests
# around it record goldens; the last one checks that the deterministic test restored torch's flags.
STUCK = """
import time

import torch
from pytest_llmdeterminism import deterministic

seen = {}

def test_0_before():
    seen["deterministic"] = torch.are_deterministic_algorithms_enabled()

@deterministic(max_new_tokens=2)
def test_1_recorded(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("The sky is"))

@deterministic(max_new_tokens=2)
def test_2_stuck(llm_model, golden_tokens):
    hook = llm_model.model.register_forward_pre_hook(lambda *args: time.sleep(60))
    try:
        golden_tokens.check(llm_model.generate("Count: one,"))
    finally:
        hook.remove()

@deterministic(max_new_tokens=2)
def test_3_recorded(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("Once upon a"))

def test_4_after():  # (after a crashed xdist worker, in a new one: nothing ran before it there)
    assert torch.are_deterministic_algorithms_enabled() == seen.get("deterministic", False)
"""


# The timeout covers the test function only: a model load in a fixture's setup is not a stuck test.
# The other test functions generate two tokens in milliseconds; the stuck one waits for the timeout.
TIMEOUT = ("-p", "timeout", "--timeout=5", "-o", "timeout_func_only=true")


@pytest.mark.subprocess
def test_a_timeout_by_signal_fails_the_stuck_test_and_keeps_the_others_goldens(suite):
    pytest.importorskip("pytest_timeout")
    suite.makepyfile(test_stuck=STUCK)
    result = suite.runpytest_subprocess(*TIMEOUT, "--timeout-method=signal",
                                        "-p", "no:randomly", "-p", "no:xdist", "--llm-golden-update")
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines([
        "E*Failed: Timeout (>5.0s) from pytest-timeout.",
        "golden checks: 2 recorded",
        "wrote __golden__/test_stuck.json (2 goldens)",
        "FAILED test_stuck.py::test_2_stuck - Failed: Timeout (>5.0s)*",
    ])
    assert set(_goldens(suite, "test_stuck")) == {"test_1_recorded", "test_3_recorded"}
    checked = suite.runpytest_subprocess("-p", "no:randomly", "-p", "no:xdist", "-k", "not test_2_stuck")
    checked.assert_outcomes(passed=4, deselected=1)
    checked.stdout.fnmatch_lines(["golden checks: 2 IDENTICAL"])


@pytest.mark.subprocess
def test_a_timeout_by_thread_kills_the_run_without_touching_goldens(suite):
    """The thread method ends the process (os._exit) from its timer: nothing after that runs, so
    nothing is written, pruned or half-written; the stack dump names the stuck test."""
    pytest.importorskip("pytest_timeout")
    suite.makepyfile(test_stuck=STUCK.replace("time.sleep(60)", "None"))
    suite.runpytest_subprocess("-p", "no:randomly", "--llm-golden-update").assert_outcomes(passed=5)
    golden = (suite.path / "__golden__" / "test_stuck.json").read_bytes()
    suite.makepyfile(test_stuck=STUCK.replace("def test_1_recorded", "def test_1_renamed"))
    result = suite.runpytest_subprocess(*TIMEOUT, "--timeout-method=thread",
                                        "-p", "no:randomly", "-p", "no:xdist", "--llm-golden-update",
                                        "--llm-golden-prune")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*Timeout*", "*test_2_stuck*"])
    assert (suite.path / "__golden__" / "test_stuck.json").read_bytes() == golden


@pytest.mark.subprocess
def test_a_timeout_by_thread_under_xdist_keeps_the_finished_tests_goldens_and_prunes_nothing(suite):
    """Under pytest-xdist the thread method kills one worker: the controller keeps what the finished
    tests recorded, and the run is partial, so no golden is judged unused."""
    pytest.importorskip("pytest_timeout")
    pytest.importorskip("xdist")
    suite.makepyfile(test_stuck=STUCK.replace("time.sleep(60)", "None"))
    suite.runpytest_subprocess("-p", "no:randomly", "--llm-golden-update").assert_outcomes(passed=5)
    suite.makepyfile(test_stuck=STUCK.replace("def test_3_recorded", "def test_3_renamed"))
    result = suite.runpytest_subprocess(*TIMEOUT, "--timeout-method=thread",
                                        "-p", "no:randomly", "-n", "1", "--llm-golden-update",
                                        "--llm-golden-prune")
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines([
        "*worker 'gw0' crashed while running 'test_stuck.py::test_2_stuck'",
        "golden checks: 1 IDENTICAL, 1 recorded",
        "wrote __golden__/test_stuck.json (1 golden)",
        "unused goldens not pruned: this run was partial (xdist worker gw0 crashed*",
    ])
    assert set(_goldens(suite, "test_stuck")) == {"test_1_recorded", "test_2_stuck", "test_3_recorded",
                                                 "test_3_renamed"}
