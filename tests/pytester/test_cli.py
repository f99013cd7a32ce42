"""The `llm-golden` command and CI candidate goldens: show, diff, accept, prune."""

import json
import re

import pytest

from tests.helpers.models import perturbed_tiny_copy
from tests.helpers.projects import SUITE, golden_keys, llm_golden, suite_project

GOLDEN = "__golden__/test_suite.json"


@pytest.fixture
def project(suite):
    return suite_project(suite, recorded=True)


def test_candidates_written_in_ci_are_accepted_locally_then_pass(project, tmp_path, monkeypatch):
    changed = perturbed_tiny_copy(tmp_path / "changed", scale=0.5, seed=0)
    monkeypatch.setenv("CI", "true")
    in_ci = project.runpytest(f"--llm-model={changed}", "--llm-golden-artifacts=artifacts")
    in_ci.assert_outcomes(failed=4)
    # Every check of every test was judged: one CI run gives a candidate for each of the 6 checks.
    in_ci.stdout.fnmatch_lines(["*3 golden checks failed in this test (every check ran and has "
                                "its candidate):",
                                "wrote artifacts/__golden__/test_suite.json (6 candidate(s))"])
    candidates = json.loads((project.path / "artifacts" / GOLDEN).read_text())["goldens"]
    assert set(candidates) == set(golden_keys(project))
    assert candidates["test_capital"]["cpu/float32"]["fingerprint"]["model"] == "changed"

    monkeypatch.delenv("CI")
    accepted = llm_golden("accept", "artifacts", "--root", ".", cwd=project.path)
    assert accepted.returncode == 0, accepted.stderr
    assert "accepted __golden__/test_suite.json ['test_capital'] (cpu/float32)" in accepted.stdout
    # One round: after accepting, the changed model passes every check.
    project.runpytest(f"--llm-model={changed}").assert_outcomes(passed=4)


def test_diff_exit_codes_for_identical_sets_and_a_regression(project, tmp_path):
    same = llm_golden("diff", "__golden__", "__golden__", cwd=project.path)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "summary: 6 IDENTICAL" in same.stdout

    changed = perturbed_tiny_copy(tmp_path / "changed", scale=0.5, seed=0)
    project.runpytest(f"--llm-model={changed}", "--llm-golden-dir=after", "--llm-golden-update")
    upgraded = llm_golden("diff", "__golden__", "after", cwd=project.path)
    assert upgraded.returncode == 1
    assert "REGRESSION     test_suite.json ['test_capital']['cpu/float32']  step 0:" in upgraded.stdout
    assert upgraded.stdout.strip().splitlines()[-1].startswith("summary: ")

    drifted = perturbed_tiny_copy(tmp_path / "drifted", scale=1e-4)
    project.runpytest(f"--llm-model={drifted}", "--llm-golden-dir=drift", "--llm-golden-update")
    drift = llm_golden("diff", "__golden__", "drift", cwd=project.path)
    assert drift.returncode == 0  # logit drift alone does not fail the gate
    assert "LOGIT_DRIFT" in drift.stdout


def test_show_prints_prompt_continuation_and_margins(project):
    shown = llm_golden("show", GOLDEN, cwd=project.path)
    assert shown.returncode == 0
    assert "test_param[The cat sat on the] [cpu/float32]  shape 4x32, finish: " in shown.stdout
    assert "  prompt: 'The cat sat on the'" in shown.stdout
    # Near ties are marked by the comparator's own definition (fp32: margin < 0.05), nothing looser.
    goldens = json.loads((project.path / GOLDEN).read_text())["goldens"]
    margins = [step["margin"] for variants in goldens.values() for entry in variants.values()
               for step in entry["steps"]]
    assert shown.stdout.count("<- near tie (< 0.05)") == sum(margin < 0.05 for margin in margins)
    assert any(0.05 <= margin < 0.1 for margin in margins)  # the cat/mat coin flip (0.077) is not one
    missing = llm_golden("show", "nope.json", cwd=project.path)
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_prune_runs_the_suite_with_prune(project):
    source = (project.path / "test_suite.py").read_text().replace(
        'golden_tokens.check(llm_model.generate("def add(a, b):"), name="code")', "pass")
    project.makepyfile(test_suite=source)
    pruned = llm_golden("prune", "-p", "no:cacheprovider", cwd=project.path)
    assert pruned.returncode == 0, pruned.stdout[-2000:]
    assert "pruned 1 unused golden(s):" in pruned.stdout
    assert "test_two_checks::code" not in json.loads((project.path / GOLDEN).read_text())["goldens"]


def test_bf16_candidates_are_paired_with_the_float32_goldens_they_were_checked_against(project, tmp_path):
    """CI ran in bfloat16 against float32 goldens: each candidate is compared with the variant the
    plugin's fallback picks and says so; nothing reads NEW or ABSENT, so no change can hide there."""
    bf16 = project.runpytest("--llm-dtype=bfloat16", "--llm-golden-artifacts=artifacts")
    bf16.assert_outcomes(failed=4)
    diff = llm_golden("diff", "__golden__", "artifacts/__golden__", cwd=project.path)
    lines = diff.stdout.strip().splitlines()
    cases, summary = lines[:-1], lines[-1]
    # every check of every test ran and has its candidate, the three of test_two_checks too
    assert len(cases) == 6, diff.stdout
    assert all("['cpu/bfloat16'] (vs cpu/float32)  " in line for line in cases), diff.stdout
    assert not any(line.startswith(("NEW", "ABSENT")) for line in cases)
    assert all(line.split()[0] in {"IDENTICAL", "LOGIT_DRIFT", "TIE_FLIP"} for line in cases), diff.stdout
    assert sum(int(n) for n in re.findall(r"(\d+) [A-Z_]+", summary)) == 6
    assert summary.endswith("; nothing needs review (--fail-on=regression)"), summary
    assert diff.returncode == 0, diff.stdout + diff.stderr
    # bfloat16 noise is drift: the strictest gate asks for a review of it
    strict = llm_golden("diff", "__golden__", "artifacts/__golden__", "--fail-on=drift", cwd=project.path)
    assert strict.returncode == 1 and "case(s) need review (--fail-on=drift)" in strict.stdout


def test_diff_lists_goldens_without_any_base_variant_as_new_and_exits_1(project, tmp_path):
    """A key with no golden at all in BASE (a new test's candidate) has nothing to compare with."""
    project.runpytest("--llm-dtype=bfloat16", "--llm-golden-artifacts=artifacts").assert_outcomes(failed=4)
    only_new = tmp_path / "only-new"
    (only_new / "sub").mkdir(parents=True)
    (only_new / "sub" / "test_extra.json").write_text((project.path / "artifacts" / GOLDEN).read_text())
    empty = tmp_path / "empty"
    empty.mkdir()
    diff = llm_golden("diff", empty, only_new, cwd=project.path)
    assert diff.returncode == 1, diff.stdout + diff.stderr
    assert "summary: 6 NEW; 6 case(s) need review (--fail-on=regression)" in diff.stdout
    assert "NEW            sub/test_extra.json ['test_capital']['cpu/bfloat16']  (only in CAND" in diff.stdout
    # The other way round every golden is ABSENT: checks that passed, which never fail the gate.
    absent = llm_golden("diff", only_new, empty, "--fail-on=drift", cwd=project.path)
    assert absent.returncode == 0 and "summary: 6 ABSENT; nothing needs review" in absent.stdout


def test_goldens_kept_under_llm_golden_dir_are_accepted_with_golden_dir(suite, tmp_path):
    suite.makepyfile(test_suite=SUITE)
    suite.runpytest("--llm-golden-dir=goldens", "--llm-golden-update").assert_outcomes(passed=4)
    changed = perturbed_tiny_copy(tmp_path / "changed", scale=0.5, seed=0)
    ci = suite.runpytest(f"--llm-model={changed}", "--llm-golden-dir=goldens",
                         "--llm-golden-artifacts=artifacts")
    ci.assert_outcomes(failed=4)
    assert (suite.path / "artifacts" / "goldens" / "test_suite.json").is_file()  # mirrors the rootdir
    refused = llm_golden("accept", "artifacts", cwd=suite.path)
    assert refused.returncode == 2 and "give --golden-dir D" in refused.stderr
    accepted = llm_golden("accept", "artifacts", "--golden-dir", "goldens", cwd=suite.path)
    assert accepted.returncode == 0, accepted.stderr
    assert "accepted goldens/test_suite.json ['test_capital'] (cpu/float32)" in accepted.stdout
    suite.runpytest(f"--llm-model={changed}", "--llm-golden-dir=goldens").assert_outcomes(passed=4)
