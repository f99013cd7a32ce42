"""A suite run in shards (pytest-split's --splits N --group i) and merged with `llm-golden merge` gives
the unsharded run's review: the same verdict counts, candidates and unused goldens; a missing shard or
two shards that disagree are named, and nothing is judged or written on their word."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_llmdeterminism import cli
from pytest_llmdeterminism.run.prune_trust import checkout_commit
from tests.helpers.models import perturbed_tiny_copy
from tests.helpers.projects import git_checkout

pytest.importorskip("pytest_split")

ALPHA = """
from pytest_llmdeterminism import deterministic

@deterministic(max_new_tokens=4)
def test_capital(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("Q: What is the capital of Japan? A:"))

@deterministic(max_new_tokens=4)
def test_sky(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("The colour of the sky is"))

@deterministic(max_new_tokens=4)
def test_count(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("Count: one,"))
"""
BETA = """
import pytest
from pytest_llmdeterminism import deterministic

@deterministic(max_new_tokens=4)
@pytest.mark.parametrize("prompt", ["Hello, world!", "def add(a, b):", "Once upon a"])
def test_param(llm_model, golden_tokens, prompt):
    golden_tokens.check(llm_model.generate(prompt))

def test_plain():
    assert True
"""
SHARDS = 3


@pytest.fixture
def project(suite):
    """Two modules, 7 tests, every golden recorded, in a git checkout (as a CI job's project is)."""
    git_checkout(suite.path)
    suite.makepyfile(test_alpha=ALPHA, test_beta=BETA)
    suite.runpytest("--llm-golden-update", "-p", "no:cacheprovider").assert_outcomes(passed=7)
    return suite


def run_shards(project, *args, groups=range(1, SHARDS + 1)):
    """Each shard as a CI job runs it: its own report and candidates folder, one folder per shard."""
    results = []
    for group in groups:
        result = project.runpytest("-p", "no:cacheprovider", f"--splits={SHARDS}", f"--group={group}",
                                   f"--llm-report=shard{group}/report.json",
                                   f"--llm-golden-artifacts=shard{group}/candidates", *args)
        results.append(result)
    return results


def merge(project, monkeypatch, capsys, *args):
    monkeypatch.chdir(project.path)
    capsys.readouterr()  # in-process pytest runs before this one wrote there too
    status = cli.main(["merge", *map(str, args)])
    out, err = capsys.readouterr()
    return status, out, err


def reports(project, groups=range(1, SHARDS + 1)):
    return [f"shard{group}/report.json" for group in groups]


def read_json(path: Path):
    return json.loads(path.read_text())


def assert_each_shard_reports_the_whole_suite_and_the_part_it_ran(project):
    runs = [read_json(project.path / report)["run"] for report in reports(project)]
    suite = runs[0]["suite"]
    assert len(suite) == 7 and all(run["suite"] == suite for run in runs)
    ran = [nodeid for run in runs for nodeid in run["outcomes"]]
    assert sorted(ran) == suite  # each test in exactly one shard
    assert all(set(run["selected"]) == set(run["outcomes"]) for run in runs)
    assert runs[0]["golden_files"] == {"test_alpha.py": "__golden__/test_alpha.json",
                                       "test_beta.py": "__golden__/test_beta.json"}
    assert all(run["candidates"] == "candidates" for run in runs)
    assert {tuple(u) for run in runs for u in run["used"]} == {
        ("__golden__/test_alpha.json", key) for key in ("test_capital", "test_sky_renamed", "test_count")} | {
        ("__golden__/test_beta.json", f"test_param[{p}]") for p in ("Hello, world!", "def add(a, b):",
                                                                    "Once upon a time")}


def test_three_shards_merge_into_the_unsharded_runs_counts_and_unused_goldens(project, monkeypatch, capsys):
    # Rename a test in each module: their old goldens are unused, their new ones missing, so record those.
    project.makepyfile(test_alpha=ALPHA.replace("def test_sky", "def test_sky_renamed"),
                       test_beta=BETA.replace('"Once upon a"]', '"Once upon a time"]'))
    project.runpytest("--llm-golden-update=new", "-p", "no:cacheprovider").assert_outcomes(passed=7)

    whole = project.runpytest("-p", "no:cacheprovider", "--llm-report=whole.json")
    whole.assert_outcomes(passed=7)
    unused_lines = [line for line in whole.stdout.lines if line.startswith("unused golden in ")]
    assert len(unused_lines) == 1, whole.stdout.str()  # the renamed case's is kept without =cases
    whole.stdout.fnmatch_lines(["kept golden of a case this run did not collect in "
                                "__golden__/test_beta.json: 'test_param[[]Once upon a]'"])

    for result in run_shards(project):
        assert "unused golden in" not in result.stdout.str()  # a shard alone is a partial run
    assert_each_shard_reports_the_whole_suite_and_the_part_it_ran(project)
    status, out, err = merge(project, monkeypatch, capsys, *reports(project), "--report=merged.json",
                             "--report=merged.md", "--report=merged.html", "--candidates=merged")
    assert status == 0, out + err
    assert "merged 3 shard(s): 7 of 7 test(s) of the suite ran" in out
    assert [line for line in out.splitlines() if line.startswith("unused golden in ")] == unused_lines, out
    assert "kept golden of a case this run did not collect in __golden__/test_beta.json: " \
           "'test_param[Once upon a]'" in out
    assert "delete them with: llm-golden merge ... --prune" in out
    merged, unsharded = read_json(project.path / "merged.json"), read_json(project.path / "whole.json")
    assert merged["summary"] == unsharded["summary"]
    assert merged["run"]["outcomes"] == unsharded["run"]["outcomes"]
    assert merged["run"]["suite"] == unsharded["run"]["suite"]
    assert not (project.path / "merged").exists()  # a green run has no candidates
    markdown = (project.path / "merged.md").read_text()
    assert "3 shard(s) ran 7 of 7 test(s) of the suite." in markdown and "`test_sky`" in markdown
    assert (project.path / "merged.html").read_text().startswith("<!doctype html>")

    status, out, _ = merge(project, monkeypatch, capsys, *reports(project), "--prune=cases")
    assert status == 0
    assert "pruned 2 unused golden(s):" in out
    assert set(read_json(project.path / "__golden__/test_alpha.json")["goldens"]) == {
        "test_capital", "test_count", "test_sky_renamed"}
    assert "test_param[Once upon a]" not in read_json(project.path / "__golden__/test_beta.json")["goldens"]


def test_three_shards_merge_into_the_unsharded_runs_candidates(project, monkeypatch, capsys, tmp_path):
    changed = perturbed_tiny_copy(tmp_path / "changed", scale=0.5, seed=0)
    project.makepyfile(test_gamma=ALPHA.replace("def test_", "def test_new_"))  # MISSING: candidates too
    model = f"--llm-model={changed}"
    whole = project.runpytest("-p", "no:cacheprovider", model, "--llm-report=whole.json",
                              "--llm-golden-artifacts=whole")
    assert whole.ret == pytest.ExitCode.TESTS_FAILED
    run_shards(project, model)
    status, out, err = merge(project, monkeypatch, capsys, *reports(project), "--report=merged.json",
                             "--candidates=merged")
    assert status == 1, out + err  # merged, but tests failed
    # Every test ran, some failed: the shards were complete, not partial.
    assert "unused goldens not judged: the shards together ran the whole suite, but some tests failed" in out
    assert "partial" not in out
    merged, unsharded = read_json(project.path / "merged.json"), read_json(project.path / "whole.json")
    assert merged["summary"] == unsharded["summary"] and merged["summary"]["failed"] > 0
    whole, merged_folder = project.path / "whole", project.path / "merged"
    whole_files = sorted(p.relative_to(whole) for p in whole.rglob("*.json"))
    merged_files = sorted(p.relative_to(merged_folder) for p in merged_folder.rglob("*.json"))
    assert merged_files == whole_files == [Path("__golden__/test_alpha.json"),
                                           Path("__golden__/test_beta.json"),
                                           Path("__golden__/test_gamma.json")]
    for name in whole_files:
        assert (project.path / "merged" / name).read_bytes() == (project.path / "whole" / name).read_bytes()
    assert f"wrote {Path('merged/__golden__/test_gamma.json')} (3 candidate(s))" in out
    assert merged["run"]["candidates"] == "merged"


def test_a_missing_shard_names_the_tests_no_shard_ran_and_judges_nothing_unused(project, monkeypatch, capsys):
    project.makepyfile(test_alpha=ALPHA.replace("def test_sky", "def test_sky_renamed"))
    project.runpytest("--llm-golden-update=new", "-p", "no:cacheprovider").assert_outcomes(passed=7)
    run_shards(project, groups=[1, 3])  # the job of group 2 never uploaded its report
    before = (project.path / "__golden__/test_alpha.json").read_bytes()
    runs = [read_json(project.path / report)["run"] for report in reports(project, [1, 3])]
    missing = sorted(set(runs[0]["suite"]) - {nodeid for run in runs for nodeid in run["outcomes"]})
    assert missing
    status, out, _ = merge(project, monkeypatch, capsys, *reports(project, [1, 3]), "--prune")
    assert status == 1
    assert (f"unused goldens not pruned: the shards together were partial ({len(missing)} of 7 test(s) of "
            "the suite ran in no shard)") in out
    assert "unused golden in" not in out and "pruned" not in out.replace("not pruned", "")
    listed = out.split("tests that no shard ran", 1)[1].splitlines()[1:]
    assert [line.strip() for line in listed] == missing
    assert (project.path / "__golden__/test_alpha.json").read_bytes() == before


def test_two_shards_that_wrote_one_candidate_differently_are_a_conflict_and_nothing_is_written(
        project, monkeypatch, capsys, tmp_path):
    changed = perturbed_tiny_copy(tmp_path / "changed", scale=0.5, seed=0)
    other = perturbed_tiny_copy(tmp_path / "other", scale=0.5, seed=1)
    # Group 1 ran twice, on two different models (a retried job on another machine, say).
    run_shards(project, f"--llm-model={changed}", groups=[1])
    project.runpytest("-p", "no:cacheprovider", f"--splits={SHARDS}", "--group=1", f"--llm-model={other}",
                      "--llm-report=retry/report.json", "--llm-golden-artifacts=retry/candidates")
    status, out, err = merge(project, monkeypatch, capsys, "shard1/report.json", "retry/report.json",
                             "--report=merged.json", "--candidates=merged")
    assert status == 2, out + err
    assert "conflict: __golden__/" in err
    assert "differs between the candidates of shard1/report.json and of retry/report.json (" in err
    assert "fingerprint (model, weights_hash)" in err
    assert "nothing was written" in err
    assert not (project.path / "merged").exists() and not (project.path / "merged.json").exists()


def test_merge_refuses_what_it_cannot_read_and_a_used_candidates_folder(project, monkeypatch, capsys):
    run_shards(project, groups=[1])
    (project.path / "not-a-report.json").write_text('{"goldens": {}}')
    status, _, err = merge(project, monkeypatch, capsys, "shard1/report.json", "not-a-report.json")
    assert status == 2 and "not-a-report.json is not a pytest-llmdeterminism JSON report" in err
    (project.path / "old" / "x").mkdir(parents=True)
    status, _, err = merge(project, monkeypatch, capsys, "shard1/report.json", "--candidates=old")
    assert status == 2 and "--candidates 'old' exists and is not an empty folder" in err


@pytest.mark.subprocess
def test_an_xdist_shard_reports_the_same_suite_as_a_plain_one(project):
    pytest.importorskip("xdist")
    run_shards(project, groups=[2])
    plain = read_json(project.path / "shard2/report.json")["run"]
    project.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider", f"--splits={SHARDS}", "--group=2",
                                 "--llm-report=xdist/report.json")
    with_xdist = read_json(project.path / "xdist/report.json")["run"]
    for field in ("suite", "selected", "outcomes", "golden_files", "used"):
        assert with_xdist[field] == plain[field], field


def test_merge_prunes_nothing_on_the_reports_of_another_commit(project, monkeypatch, capsys):
    """Reports are believed for the commit they ran at: after a new commit, the old ones prune nothing."""
    project.makepyfile(test_alpha=ALPHA.replace("def test_sky", "def test_sky_renamed"))
    project.runpytest("--llm-golden-update=new", "-p", "no:cacheprovider").assert_outcomes(passed=7)
    run_shards(project)
    ran_at = read_json(project.path / "shard1/report.json")["run"]["commit"]
    assert ran_at == checkout_commit(project.path)  # each shard records the commit it ran at
    head = git_checkout(project.path)  # a new commit: the reports are now stale
    before = (project.path / "__golden__/test_alpha.json").read_bytes()
    status, out, err = merge(project, monkeypatch, capsys, *reports(project), "--prune")
    assert status == 2, out + err
    assert f"shard1/report.json ran at commit {ran_at!r}, but the checkout at . is at {head}" in err
    assert (project.path / "__golden__/test_alpha.json").read_bytes() == before
    status, out, _ = merge(project, monkeypatch, capsys, *reports(project))  # merging still works
    assert status == 0 and "unused golden in __golden__/test_alpha.json: 'test_sky'" in out
