"""One verdict per check whatever reads it: the run's terminal and report, `llm-golden diff`,
`review` and `accept` judge a check the same way, under the tolerance the run used."""

import json
import re

from tests.helpers.models import perturbed_tiny_copy
from tests.helpers.projects import llm_golden

SUITE = """
import pytest
from pytest_llmdeterminism import deterministic

@deterministic
@pytest.mark.parametrize("prompt", ["Count: one,", "The cat sat on the"])
def test_gen(llm_model, golden_tokens, prompt):
    golden_tokens.check(llm_model.generate(prompt))

@deterministic
def test_score(llm_model, golden_tokens):
    golden_tokens.check(llm_model.score("The cat sat on the", " mat and then the dog sat on the rug"))

@deterministic(tolerance="near_tie(margin=0.3, atol=1e-6)")
def test_score_tight(llm_model, golden_tokens):
    golden_tokens.check(llm_model.score("Count: one,", " two, three, four, five, six"))
"""


def test_after_a_new_checkpoint_every_tool_reads_the_runs_verdict(suite, tmp_path):
    """Issue 49 F1: a score check was REGRESSION in the terminal and the reports but RANK_FLIP in
    `llm-golden diff`/`review`/`accept`, each judging with another tolerance."""
    suite.makepyfile(test_suite=SUITE)
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=4)
    changed = perturbed_tiny_copy(tmp_path / "changed", scale=0.05)
    failed = suite.runpytest(f"--llm-model={changed}", "--llm-golden-artifacts=shard/cands",
                             "--llm-report=shard/report.json")
    failed.assert_outcomes(failed=4)
    report = json.loads((suite.path / "shard" / "report.json").read_text(encoding="utf-8"))
    in_run = {check["name"]: check["verdict"] for check in report["checks"]}
    assert len(in_run) == 4
    # The test's own tolerance travels with its candidate (and through merge), so the tools judge
    # it with it too.
    merged = llm_golden("merge", "shard/report.json", "--candidates", "merged", cwd=suite.path)
    assert merged.returncode == 1, merged.stdout + merged.stderr  # merged; some tests failed
    for folder in ("shard/cands", "merged"):
        recorded = json.loads((suite.path / folder / "__golden__" / "test_suite.tolerances").read_text())
        assert recorded == {"test_score_tight": {"cpu/float32": "near_tie(margin=0.3, atol=1e-06)"}}
        diff = llm_golden("diff", folder, cwd=suite.path)
        assert diff.returncode in (0, 1), diff.stderr
        line = re.compile(r"^ *(\w+) +__golden__/test_suite\.json \['([^']+)'\]", re.M)
        assert {found[2]: found[1] for found in line.finditer(diff.stdout)} == in_run, diff.stdout
    # accept --only with the verdicts the run counted takes every check.
    counted = sorted(set(in_run.values()))
    accepted = llm_golden("accept", "shard/cands", "--only", ",".join(counted), cwd=suite.path)
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
