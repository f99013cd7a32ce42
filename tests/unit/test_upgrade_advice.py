"""What a failing run says to run instead: after a checkpoint upgrade (the tolerance and the review
commands), and under pytest-xdist (the thread count, pinned with ``llm_threads``)."""

import re
from pathlib import Path

import pytest

from pytest_llmdeterminism.reporting.hints import across_environments, after_model_change
from pytest_llmdeterminism.reporting.records import CheckRecord

from .conftest import perturbed_tiny_copy

SUITE = """
import pytest
from pytest_llmdeterminism import deterministic

@deterministic
@pytest.mark.parametrize("prompt", ["Count: one,", "The cat sat on the", "Q: The capital of Japan? A:"])
def test_param(llm_model, golden_tokens, prompt):
    golden_tokens.check(llm_model.generate(prompt))
"""


def test_another_thread_count_names_llm_threads_not_a_re_recording():
    hint = across_environments([("torch_threads", 2, 1)], tolerance="near_tie(margin=0.05, atol=0.001)",
                               explicit=False, run_variant="cpu/float32")
    assert hint.startswith("compared across environments: torch_threads 2 → 1;")
    assert ("the golden ran on 2 thread(s), this run on 1 (under pytest-xdist each worker takes its share "
            "of the cores, cores // workers). Pin it so that serial and pytest-xdist runs compute the same "
            "bits: --llm-threads=2 (pytest.ini: llm_threads = 2; pyproject.toml: llm_threads = \"2\")"
            ) in hint
    assert "re-record" not in hint
    # with another field changed too, the thread count alone does not explain it
    both = across_environments([("torch_threads", 2, 1), ("torch", "2.12.0", "2.13.0")], tolerance="exact",
                               explicit=False, run_variant="cpu/float32")
    assert "llm_threads" not in both and "after an upgrade (torch)" in both


@pytest.mark.subprocess
def test_an_xdist_run_of_serial_goldens_names_the_llm_threads_that_make_it_exact(suite):
    from pytest_llmdeterminism.compute.threads import usable_cores

    if usable_cores() < 2:
        pytest.skip("1 usable core: two workers run on the serial run's thread count")
    suite.makepyfile(test_suite=SUITE)
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=3)
    workers = suite.runpytest_subprocess("-n", "2")
    workers.assert_outcomes(passed=3)
    pinned = re.search(r"same bits: (--llm-threads=\d+) \(pytest\.ini: llm_threads = \d+;",
                       workers.stdout.str())
    assert pinned, workers.stdout.str()[-3000:]
    # Pasted, the workers compute the serial goldens' numerics: compared exactly, not across environments.
    again = suite.runpytest_subprocess("-n", "2", pinned[1])
    again.assert_outcomes(passed=3)
    assert "compared across environments" not in again.stdout.str()
    again.stdout.fnmatch_lines(["golden checks: 3 IDENTICAL"])


def test_a_new_checkpoint_s_failing_run_names_the_tolerance_and_the_review_commands(suite, tmp_path):
    suite.makepyfile(test_suite=SUITE)
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=3)
    drifted = perturbed_tiny_copy(tmp_path / "drifted", scale=3e-3)
    failed = suite.runpytest(f"--llm-model={drifted}", "--llm-golden-artifacts=candidates")
    failed.assert_outcomes(failed=3)
    failed.stdout.fnmatch_lines([
        "the model changed (weights_hash) under 3 failing check(s) (3 LOGIT_DRIFT): a new checkpoint in the "
        "goldens' own environment is judged 'exact', so any drift fails. After a checkpoint upgrade:",
        "  to pass drift up to this run's (max |Δlogprob| *) but not a changed token: "
        "--llm-tolerance='near_tie(margin=0.05, atol=*)'",
        "  to see what moved, case by case: llm-golden diff candidates, or llm-golden review candidates",
        "  to accept only what you judged: llm-golden accept candidates --only LOGIT_DRIFT,TIE_FLIP "
        "(or -k KEY)",
    ])
    tolerance = re.search(r"--llm-tolerance='([^']+)'", failed.stdout.str())[1]
    suite.runpytest(f"--llm-model={drifted}", f"--llm-tolerance={tolerance}").assert_outcomes(passed=3)
    # An unchanged model says nothing of the kind.
    assert "the model changed" not in suite.runpytest().stdout.str()


def _check(verdict, passed, changed, drift=0.0):
    return CheckRecord(name="k", variant="cpu/float32", verdict=verdict, passed=passed,
                       changed_fingerprint=changed, max_logprob_delta=drift, tie_margin=0.05)


def test_the_upgrade_advice_needs_a_failing_check_on_another_checkpoint():
    weights = {"weights_hash": ("a", "b")}
    assert after_model_change([_check("LOGIT_DRIFT", True, weights, 0.01)], candidates=None) == []
    assert after_model_change([_check("REGRESSION", False, {"torch": ("1", "2")})], candidates=None) == []
    checks = [_check("REGRESSION", False, weights), _check("LOGIT_DRIFT", False, weights, 0.013)]
    lines = after_model_change(checks, candidates=None)
    assert lines[0].startswith("the model changed (weights_hash) under 2 failing check(s) (1 LOGIT_DRIFT, "
                               "1 REGRESSION)")
    assert "--llm-tolerance='near_tie(margin=0.05, atol=0.02)'" in lines[1]
    assert lines[2] == ("  to see what moved, case by case: llm-golden diff llm-candidates (rerun with "
                        "--llm-golden-artifacts=llm-candidates to write them), or llm-golden review "
                        "llm-candidates")


def test_the_ci_page_shows_the_advice_the_code_prints():
    page = (Path(__file__).parent.parent / "docs" / "ci" / "index.md").read_text(encoding="utf-8")
    checks = [_check("LOGIT_DRIFT", False, {"weights_hash": ("a", "b")}, 0.0439)] * 6
    advice = after_model_change(checks, candidates="llm-candidates")
    assert [line for line in advice if line not in page] == []
    threads = across_environments([("torch_threads", 2, 1)], tolerance="near_tie(margin=0.05, atol=0.001)",
                                  explicit=False, run_variant="cpu/float32")
    assert threads in page
