"""Score goldens end to end (issue 42): ``golden_tokens.check(llm_model.score(...))`` recorded,
re-read IDENTICAL, at another batch shape, failing on a perturbed model, INPUT_CHANGED on a changed
continuation; and the run's reports carry the score's evidence."""

from __future__ import annotations

import json

import pytest

from tests.helpers.models import perturbed_tiny_copy
from tests.helpers.projects import read_goldens

GOLDEN = "__golden__/test_s.json"
PROMPT = "The capital of France is"


def write_suite(suite, continuation=" Paris, a city of light."):
    suite.makepyfile(test_s=f"""
from pytest_llmdeterminism import deterministic

@deterministic
def test_score(llm_model, golden_tokens):
    golden_tokens.check(llm_model.score({PROMPT!r}, {continuation!r}))

@deterministic
def test_both(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate({PROMPT!r}, max_new_tokens=4))
    golden_tokens.check(llm_model.score({PROMPT!r}, " Rome"), name="score")
""")


@pytest.fixture
def recorded(suite):
    write_suite(suite)
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=2)
    return suite


def test_score_goldens_are_recorded_and_reread_identical_at_another_batch_shape(recorded):
    goldens = read_goldens(recorded, GOLDEN)
    entry = goldens["test_score"]["cpu/float32"]
    assert entry["kind"] == "score" and entry["steps"] == [] and len(entry["positions"]) >= 5
    assert "kind" not in goldens["test_both"]["cpu/float32"] and goldens["test_both::score"]["cpu/float32"][
        "kind"] == "score"
    assert json.loads((recorded.path / GOLDEN).read_text())["schema"] == "pytest-llmdeterminism/golden/3"
    before = (recorded.path / GOLDEN).read_bytes()
    again = recorded.runpytest("--llm-report=report.json")
    again.assert_outcomes(passed=2)
    report = json.loads((recorded.path / "report.json").read_text())
    checks = [c for c in report["checks"] if c["name"] == "test_score"]
    assert [(c["kind"], c["verdict"]) for c in checks] == [("score", "IDENTICAL")]
    assert checks[0]["log_likelihood"][0] == checks[0]["log_likelihood"][1] < 0
    # another batch shape: the batch-invariant kernels give the same bits, the shape is informational
    recorded.runpytest("--llm-batch-shape=2x64").assert_outcomes(passed=2)
    assert (recorded.path / GOLDEN).read_bytes() == before


def test_a_perturbed_model_fails_a_score_golden_naming_the_positions_that_moved(recorded, tmp_path,
                                                                                monkeypatch, capsys):
    from pytest_llmdeterminism import cli

    drifted = perturbed_tiny_copy(tmp_path / "drifted", scale=3e-2)
    result = recorded.runpytest(f"--llm-model={drifted}", "-k", "test_score", "--llm-report=r.md",
                                "--llm-report=r.html", "--llm-report=shard/report.json",
                                "--llm-golden-artifacts=shard/candidates")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "E*golden mismatch in 'test_score': * (score) at position *",
        "E*log-likelihood of the continuation (* tokens): -* -> -*",
        "E*moved positions that moved most (position, token, logprob golden -> now):"])
    markdown = (recorded.path / "r.md").read_text()
    assert "### Score checks that moved (log-likelihood of the continuation, golden → now)" in markdown
    assert "  - log-likelihood -" in markdown and "  - position " in markdown
    page = (recorded.path / "r.html").read_text()
    assert "<ul class=score><li>log-likelihood -" in page and "</li><li>position " in page  # one per line
    # llm-golden merge: the shard's report and candidates into one review
    monkeypatch.chdir(recorded.path)
    assert cli.main(["merge", "shard/report.json", "--report", "merged.md", "--candidates", "merged"]) == 1
    assert "### Score checks that moved" in (recorded.path / "merged.md").read_text()
    assert read_goldens(recorded.path, "merged/__golden__/test_s.json")["test_score"]["cpu/float32"][
        "kind"] == "score"
    capsys.readouterr()


def test_a_changed_continuation_is_input_changed(recorded):
    write_suite(recorded, continuation=" Lyon, a city of lights.")
    result = recorded.runpytest("-k", "test_score")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["E*INPUT_CHANGED — continuation*",
                                 "E*continuation: ' Paris, a city of light.' -> ' Lyon, a city of lights.'"])


def test_a_jsonl_line_with_a_continuation_is_a_score_check(suite):
    lines = [{"id": "paris", "prompt": PROMPT, "continuation": " Paris"},
             {"id": "rome", "prompt": PROMPT, "continuation": " Rome, of course."},
             {"id": "chat", "messages": [{"role": "user", "content": "Hi"}], "continuation": "Hello!"},
             {"id": "generated", "prompt": PROMPT, "max_new_tokens": 3}]
    (suite.path / "test_p.llm.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n")
    suite.runpytest("--llm-golden-update").assert_outcomes(passed=4)
    goldens = read_goldens(suite, "__golden__/test_p.llm.json")
    assert {key: entry["cpu/float32"].get("kind", "generation") for key, entry in goldens.items()} == {
        "paris": "score", "rome": "score", "chat": "score", "generated": "generation"}
    assert goldens["rome"]["cpu/float32"]["text"] == " Rome, of course."
    suite.makepyfile(test_alone=f"""
import json
from pathlib import Path
from pytest_llmdeterminism import assert_tokens_match

def test_scored_alone_matches_the_suites_chunk(llm_model):
    goldens = json.loads(Path("__golden__/test_p.llm.json").read_text())["goldens"]
    assert_tokens_match(llm_model.score({PROMPT!r}, " Rome, of course."), goldens["rome"]["cpu/float32"])
""")
    suite.runpytest().assert_outcomes(passed=5)
    (suite.path / "test_p.llm.jsonl").write_text(json.dumps({**lines[0], "max_new_tokens": 3}) + "\n")
    refused = suite.runpytest("test_p.llm.jsonl")
    refused.stdout.fnmatch_lines(["*test_p.llm.jsonl:1*a line with a \"continuation\" is a score check*"])


@pytest.mark.subprocess
def test_score_goldens_recorded_serially_are_identical_under_xdist(recorded):
    """Two xdist workers read the score goldens a serial run recorded IDENTICAL (the checks' score
    evidence travels from the workers to the controller)."""
    xdist = recorded.runpytest_subprocess("-n", "2", "--llm-report=report.json")
    xdist.assert_outcomes(passed=2)
    xdist.stdout.fnmatch_lines(["*golden checks: 3 IDENTICAL*"])
    checks = json.loads((recorded.path / "report.json").read_text())["checks"]
    assert sorted((c["name"], c["kind"]) for c in checks) == [
        ("test_both", "generation"), ("test_both::score", "score"), ("test_score", "score")]
