"""What a failing pytest run says to run instead: after a checkpoint upgrade (the tolerance and the
review commands), and for serial goldens under pytest-xdist (the thread count, pinned with
``llm_threads``)."""

import re

import pytest

from tests.helpers.models import perturbed_tiny_copy

SUITE = """
import pytest
from pytest_llmdeterminism import deterministic

@deterministic
@pytest.mark.parametrize("prompt", ["Count: one,", "The cat sat on the", "Q: The capital of Japan? A:"])
def test_param(llm_model, golden_tokens, prompt):
    golden_tokens.check(llm_model.generate(prompt))
"""


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
        "  to accept only the drift and near ties: llm-golden accept candidates --only LOGIT_DRIFT "
        "(or -k KEY)",
    ])
    tolerance = re.search(r"--llm-tolerance='([^']+)'", failed.stdout.str())[1]
    suite.runpytest(f"--llm-model={drifted}", f"--llm-tolerance={tolerance}").assert_outcomes(passed=3)
    # An unchanged model says nothing of the kind.
    assert "the model changed" not in suite.runpytest().stdout.str()
