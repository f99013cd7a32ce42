"""Runs that do not visit every test never judge goldens unused, whoever deselected the tests."""

from __future__ import annotations

import json
import signal

import pytest

TWO_TESTS = """
from pytest_llmdeterminism import deterministic

@deterministic(max_new_tokens=2)
def test_a(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("The sky is"))

@deterministic(max_new_tokens=2)
def test_b(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("Count: one,"))
"""

DESELECTING_CONFTEST = """
def pytest_collection_modifyitems(config, items):
    dropped = [item for item in items if item.name == "test_b"]
    items[:] = [item for item in items if item.name != "test_b"]
    config.hook.pytest_deselected(items=dropped)
"""


SILENTLY_DROPPING_CONFTEST = """
def pytest_collection_modifyitems(items):
    items[:] = [item for item in items if item.name != "test_b"]  # no pytest_deselected call
"""


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.subprocess)])
@pytest.mark.parametrize(("conftest", "reason"), [
    (DESELECTING_CONFTEST, "1 test(s) deselected"),
    (SILENTLY_DROPPING_CONFTEST, "1 collected test(s) left out by a conftest or plugin"),
], ids=["deselected", "dropped without deselecting"])
def test_tests_a_conftest_leaves_out_keep_their_goldens_under_prune(suite, workers, conftest, reason):
    suite.makepyfile(test_two=TWO_TESTS)
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=2)
    suite.makeconftest(conftest)
    args = ["--llm-golden-prune", *(["-n", str(workers)] if workers else [])]
    result = suite.runpytest_subprocess(*args) if workers else suite.runpytest(*args)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"unused goldens not pruned: this run was partial ({reason})"])
    assert "\npruned" not in result.stdout.str()
    goldens = json.loads((suite.path / "__golden__" / "test_two.json").read_text())["goldens"]
    assert set(goldens) == {"test_a", "test_b"}


CASES_FROM_A_FILE = """
import json, pathlib
import pytest
from pytest_llmdeterminism import deterministic

CASES = pathlib.Path(__file__).with_name("cases.json")

@deterministic(max_new_tokens=2)
def test_a(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("The sky is"))

@pytest.mark.parametrize("prompt", json.loads(CASES.read_text()) if CASES.exists() else [])
@deterministic(max_new_tokens=2)
def test_case(llm_model, golden_tokens, prompt):
    golden_tokens.check(llm_model.generate(prompt))
"""


def test_a_parametrization_that_came_out_empty_keeps_its_goldens_under_prune(suite):
    suite.makepyfile(test_cases=CASES_FROM_A_FILE)
    (suite.path / "cases.json").write_text('["Count: one,", "Once upon a"]')
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=3)
    (suite.path / "cases.json").unlink()  # missing today: pytest collects one skipped case, test_case[NOTSET]
    result = suite.runpytest("--llm-golden-prune")
    result.assert_outcomes(passed=1, skipped=1)
    assert "pruned" not in result.stdout.str() and "unused golden" not in result.stdout.str()
    assert _goldens(suite, "test_cases") == {"test_a", "test_case[Count: one,]", "test_case[Once upon a]"}
    # The negative control: the list is back without one case, whose golden alone is unused (a case
    # of a parametrization: with --llm-golden-prune=cases, tests/pytester/test_prune_keeps.py).
    (suite.path / "cases.json").write_text('["Count: one,"]')
    result = suite.runpytest("--llm-golden-prune=cases")
    result.stdout.fnmatch_lines(["pruned 1 unused golden(s):",
                                 "  __golden__/test_cases.json ['test_case[Once upon a]']"])
    assert _goldens(suite, "test_cases") == {"test_a", "test_case[Count: one,]"}


def test_a_line_taken_out_of_a_prompt_suite_is_pruned_and_the_others_are_kept(suite):
    """Prompt suites are test modules too: their source is the JSONL file, each line's id a test."""
    lines = [json.dumps({"id": f"case-{n}", "prompt": prompt, "max_new_tokens": 2})
             for n, prompt in enumerate(["The sky is", "Count: one,", "Once upon a"])]
    (suite.path / "test_prompts.llm.jsonl").write_text("\n".join(lines) + "\n")
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=3)
    (suite.path / "test_prompts.llm.jsonl").write_text("\n".join(lines[:2]) + "\n")
    result = suite.runpytest("--llm-golden-prune")
    result.stdout.fnmatch_lines(["pruned 1 unused golden(s):",
                                 "  __golden__/test_prompts.llm.json ['case-2']"])
    assert _goldens(suite, "test_prompts.llm") == {"case-0", "case-1"}


def test_a_run_with_a_module_that_did_not_collect_prunes_nothing_and_names_it(suite):
    suite.makepyfile(test_two=TWO_TESTS)
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=2)
    suite.makepyfile(test_broken="def test_x(:\n")  # its goldens, if any, belong to tests nobody can see
    suite.makepyfile(test_two=TWO_TESTS.replace("def test_b", "def test_b_renamed"))
    result = suite.runpytest("--llm-golden-prune", "--continue-on-collection-errors",
                             "--llm-golden-update=new")
    result.stdout.fnmatch_lines(["unused goldens not pruned: this run was partial (1 error(s) during "
                                 "collection (test_broken.py); some tests failed)"])
    assert _goldens(suite, "test_two") == {"test_a", "test_b", "test_b_renamed"}


@pytest.mark.parametrize("mode", ["--setup-only", "--setup-plan"])
def test_a_setup_only_run_and_its_shard_report_prune_nothing(suite, mode, monkeypatch, capsys):
    from pytest_llmdeterminism import cli

    suite.makepyfile(test_two=TWO_TESTS)
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=2)
    result = suite.runpytest("--llm-golden-prune", mode, "--llm-report=shard/report.json")
    assert result.ret == 0
    result.stdout.fnmatch_lines([f"unused goldens not pruned: this run was partial ({mode}: no test function "
                                 "ran; 2 of 2 collected test(s) did not run)"])
    assert _goldens(suite, "test_two") == {"test_a", "test_b"}
    report = json.loads((suite.path / "shard" / "report.json").read_text())["run"]
    assert report["outcomes"] == {} and report["stopped"] == [f"{mode}: no test function ran"]
    monkeypatch.chdir(suite.path)
    capsys.readouterr()
    status = cli.main(["merge", "shard/report.json", "--prune"])
    out = capsys.readouterr().out
    assert status == 1, out
    assert (f"unused goldens not pruned: the shards together were partial (shard/report.json: {mode}: no "
            "test function ran; 2 of 2 test(s) of the suite ran in no shard)") in out
    assert _goldens(suite, "test_two") == {"test_a", "test_b"}


# Three tests; the one named in STOP_AT ends the run its own way while it runs (a real SIGINT to this
# process, as Ctrl-C sends; a crash of its xdist worker; pytest.exit), so the tests after it never run.
THREE_TESTS = """
import os, signal
import pytest
from pytest_llmdeterminism import deterministic

STOP_AT = os.environ.get("STOP_AT", "")
HOW = os.environ.get("HOW", "")

def _maybe_stop(name):
    if name != STOP_AT:
        return
    if HOW == "sigint":
        os.kill(os.getpid(), signal.SIGINT)
    elif HOW == "sigint-controller":  # Ctrl-C reaches the xdist controller, the worker's parent
        os.kill(os.getppid(), signal.SIGINT)
    elif HOW == "crash":
        os._exit(1)
    elif HOW == "exit":
        pytest.exit("stopped by the test")
    elif HOW == "fail":
        pytest.fail("a failing test, under -x")

@deterministic(max_new_tokens=2)
def test_a(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("The sky is"))
    _maybe_stop("test_a")

@deterministic(max_new_tokens=2)
def test_b(llm_model, golden_tokens):
    _maybe_stop("test_b")
    golden_tokens.check(llm_model.generate("Count: one,"))

@deterministic(max_new_tokens=2)
def test_c(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("Once upon a"))
"""


def _goldens(suite, module="test_three"):
    path = suite.path / "__golden__" / f"{module}.json"
    return set(json.loads(path.read_text())["goldens"]) if path.exists() else set()


def _stopped_run(suite, monkeypatch, how, stop_at, *args):
    monkeypatch.setenv("HOW", how)
    monkeypatch.setenv("STOP_AT", stop_at)
    # A child inherits an ignored SIGINT, and this suite's SIGINT is ignored when it was started as a
    # background job of a non-interactive shell (`.ci/run &`): the child's Ctrl-C would then do nothing.
    # A terminal's Ctrl-C reaches a process that handles it, so the child starts with the default.
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        result = suite.runpytest_subprocess("-p", "no:randomly", *args)
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    monkeypatch.delenv("HOW")
    monkeypatch.delenv("STOP_AT")
    return result


@pytest.mark.parametrize("stop_at", ["test_a", "test_b"])
@pytest.mark.subprocess
def test_ctrl_c_during_a_prune_run_deletes_no_golden_and_says_why(suite, monkeypatch, stop_at):
    suite.makepyfile(test_three=THREE_TESTS)
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=3)
    result = _stopped_run(suite, monkeypatch, "sigint", stop_at, "--llm-golden-prune", "-p", "no:xdist")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    output = result.stdout.str()
    assert "\npruned" not in output and "unused golden in" not in output
    not_run = "3 of 3" if stop_at == "test_a" else "2 of 3"  # the interrupted test never finished either
    result.stdout.fnmatch_lines([(f"unused goldens not pruned: this run was partial (interrupted; {not_run} "
                                 "collected test(s) did not run)")])
    assert _goldens(suite) == {"test_a", "test_b", "test_c"}


@pytest.mark.subprocess
def test_ctrl_c_during_an_update_run_writes_the_finished_tests_goldens_and_judges_nothing_unused(suite,
                                                                                                 monkeypatch):
    suite.makepyfile(test_three=THREE_TESTS.replace("test_c(", "test_old(", 1))
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=3)  # test_old's golden: unused later
    suite.makepyfile(test_three=THREE_TESTS)
    golden = suite.path / "__golden__" / "test_three.json"
    goldens = json.loads(golden.read_text())
    del goldens["goldens"]["test_a"]
    golden.write_text(json.dumps(goldens))
    result = _stopped_run(suite, monkeypatch, "sigint", "test_b", "--llm-golden-update", "-p", "no:xdist")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert "unused golden in" not in result.stdout.str()
    result.stdout.fnmatch_lines(["wrote __golden__/test_three.json (1 golden)",
                                 "unused goldens not judged: this run was partial (interrupted; 2 of 3 *"])
    assert _goldens(suite) == {"test_a", "test_b", "test_old"}  # test_a recorded, nothing else touched


@pytest.mark.parametrize("how", ["sigint-controller", "crash"])
@pytest.mark.subprocess
def test_an_xdist_run_stopped_by_ctrl_c_or_a_crashed_worker_prunes_nothing(suite, monkeypatch, how):
    suite.makepyfile(test_three=THREE_TESTS)
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=3)
    result = _stopped_run(suite, monkeypatch, how, "test_b", "--llm-golden-prune", "-n", "2")
    output = result.stdout.str()
    assert result.ret != 0 and "\npruned" not in output, output
    assert "unused goldens not pruned: this run was partial (" in output
    assert "crashed" in output if how == "crash" else "interrupted" in output
    assert _goldens(suite) == {"test_a", "test_b", "test_c"}


@pytest.mark.subprocess
def test_pytest_exit_and_maxfail_make_a_partial_run(suite, monkeypatch):
    suite.makepyfile(test_three=THREE_TESTS)
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=3)
    stopped = _stopped_run(suite, monkeypatch, "exit", "test_a", "--llm-golden-prune", "-p", "no:xdist")
    stopped.stdout.fnmatch_lines(["unused goldens not pruned: this run was partial (interrupted; 3 of 3 *"])
    maxfail = _stopped_run(suite, monkeypatch, "fail", "test_a", "--llm-golden-prune", "-x", "-p", "no:xdist")
    maxfail.stdout.fnmatch_lines([("unused goldens not pruned: this run was partial (stopping after 1 "
                                  "failures; 2 of 3 collected test(s) did not run; some tests failed)")])
    suite.makeconftest("def pytest_runtest_logfinish(nodeid):\n"
                       "    if nodeid.endswith('test_a'):\n        raise RuntimeError('a plugin broke')\n")
    internal = suite.runpytest_subprocess("--llm-golden-prune", "-p", "no:xdist", "-p", "no:randomly")
    assert internal.ret == pytest.ExitCode.INTERNAL_ERROR
    assert "\npruned" not in internal.stdout.str()  # pytest prints no summary after an internal error
    assert _goldens(suite) == {"test_a", "test_b", "test_c"}


@pytest.mark.subprocess
def test_a_complete_run_still_prunes_after_the_partial_ones(suite):
    """The negative control: the same suite, run whole, does judge and prune."""
    suite.makepyfile(test_three=THREE_TESTS.replace("test_c(", "test_old(", 1))
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=3)
    suite.makepyfile(test_three=THREE_TESTS)
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=3)
    result = suite.runpytest_subprocess("--llm-golden-prune", "-p", "no:randomly")
    result.stdout.fnmatch_lines(["pruned 1 unused golden(s):", "  __golden__/test_three.json ['test_old']"])
    assert _goldens(suite) == {"test_a", "test_b", "test_c"}
