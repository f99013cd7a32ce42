"""`llm-golden diff` as a review gate: every case paired and listed, near-tie flips, --fail-on, help."""

import json

import pytest

from tests.helpers.cli_diff import RECORDED
from tests.helpers.models import boosted_token_copy
from tests.helpers.projects import llm_golden

CAT_SUITE = """
from pytest_llmdeterminism import deterministic

@deterministic(max_new_tokens=4)
def test_cat(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("The cat sat on the"))
"""


@pytest.fixture
def cat_flip(suite, tmp_path):
    """Goldens whose first step is a near tie (margin ~0.026 < float32's 0.05), and the candidates
    of a model that flips it: both are copies of the tiny model with " mat" nudged up."""
    suite.makepyfile(test_cat=CAT_SUITE)
    close = boosted_token_copy(tmp_path / "close", token_id=326, factor=1.005)
    suite.runpytest(f"--llm-model={close}", "--llm-golden-update").assert_outcomes(passed=1)
    margin = json.loads((suite.path / "__golden__/test_cat.json").read_text())["goldens"]["test_cat"][
        "cpu/float32"]["steps"][0]["margin"]
    assert margin < 0.05
    flipped = boosted_token_copy(tmp_path / "flipped", token_id=326, factor=1.01)
    suite.runpytest(f"--llm-model={flipped}", "--llm-golden-artifacts=artifacts").assert_outcomes(failed=1)
    return suite


def test_a_flip_at_a_near_tie_reads_tie_flip_and_fails_only_the_tie_flip_gate(cat_flip):
    default = llm_golden("diff", "__golden__", "artifacts/__golden__", cwd=cat_flip.path)
    assert default.returncode == 0, default.stdout + default.stderr
    lines = default.stdout.splitlines()
    # Tokens as the goldens store them, read without loading a model: piece(id).
    assert lines[0].startswith("TIE_FLIP       test_cat.json ['test_cat']['cpu/float32']  "
                               "step 0: ' s'(276) -> ' m'(326), golden margin 0.02"), lines
    assert lines[0].endswith(" < tie margin 0.05: near tie")
    assert lines[1] == "summary: 1 TIE_FLIP; nothing needs review (--fail-on=regression)"
    for level in ("tie_flip", "drift"):
        strict = llm_golden("diff", "__golden__", "artifacts/__golden__", f"--fail-on={level}",
                            cwd=cat_flip.path)
        assert strict.returncode == 1, strict.stdout
        assert strict.stdout.endswith(f"summary: 1 TIE_FLIP; 1 case(s) need review (--fail-on={level})\n")


def test_diff_usage_errors_exit_2_and_say_why(suite, tmp_path):
    golden = tmp_path / "test_x.json"
    golden.write_text(RECORDED.read_text())
    missing = llm_golden("diff", tmp_path, tmp_path / "llm-candidates", cwd=suite.path)
    assert missing.returncode == 2 and missing.stdout == ""
    assert "CAND '" in missing.stderr and "llm-candidates' does not exist" in missing.stderr
    mixed = llm_golden("diff", tmp_path, golden, cwd=suite.path)
    assert mixed.returncode == 2 and "is a folder but CAND" in mixed.stderr
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text("{")
    broken = llm_golden("diff", golden, corrupt, cwd=suite.path)
    assert broken.returncode == 2 and "corrupt.json" in broken.stderr
    level = llm_golden("diff", golden, golden, "--fail-on=tokens", cwd=suite.path)
    assert level.returncode == 2 and "invalid choice: 'tokens'" in level.stderr


def test_help_is_plain_text_and_diff_help_gives_arguments_and_exit_codes(suite):
    top = llm_golden("--help", cwd=suite.path)
    assert top.returncode == 0
    assert "``" not in top.stdout and ":func:" not in top.stdout
    for command in ("show FILE", "diff BASE CAND", "accept DIR", "prune", "fetch MODEL", "perturb SRC DEST",
                    "merge REPORT.json"):
        assert f"llm-golden {command}" in top.stdout
    diff = llm_golden("diff", "--help", cwd=suite.path)
    assert diff.returncode == 0 and "``" not in diff.stdout
    assert diff.stdout.startswith("usage: llm-golden diff [-h] [--fail-on LEVEL] BASE [CAND]")
    assert "  BASE  " in diff.stdout and "  CAND  " in diff.stdout
    assert "(vs cpu/float32)" in diff.stdout
    for verdict in ("NEW", "ABSENT", "IDENTICAL", "LOGIT_DRIFT", "TIE_FLIP", "REGRESSION", "INPUT_CHANGED"):
        assert f"\n  {verdict} " in diff.stdout
    exit_status = diff.stdout.split("exit status:\n")[1]
    assert exit_status.startswith("  0  nothing needs review")
    assert ("\n  1  a case needs review: REGRESSION, INPUT_CHANGED, FIELDS_CHANGED or NEW "
            "(--fail-on=regression") in exit_status
    assert "\n  2  usage error" in exit_status
    for command in ("accept", "fetch", "perturb", "merge"):
        shown = llm_golden(command, "--help", cwd=suite.path)
        assert shown.returncode == 0 and "exit status: 0" in shown.stdout and "``" not in shown.stdout
