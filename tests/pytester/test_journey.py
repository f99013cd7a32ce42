"""A new user's first day, end to end: a model from the Hugging Face cache, goldens recorded, the
model upgraded (a new commit of the same id), the change reviewed as a pull request shows it, the
suite run in shards and merged, the change accepted with the project's own settings, green again.

Each step is what the docs tell a user to type; the assertions are the lines they read.
"""

from __future__ import annotations

import json

import pytest

from pytest_llmdeterminism import cli
from tests.helpers.models import in_hub_cache, perturbed_tiny_copy

pytest.importorskip("pytest_split")

REPO = "acme/chat-tiny"
OLD, NEW = "1" * 40, "2" * 40
TESTS = """
import pytest
from pytest_llmdeterminism import deterministic

@deterministic(max_new_tokens=6)
def test_greeting(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("Hello, my name is"))

@deterministic(max_new_tokens=6)
@pytest.mark.parametrize("prompt", ["Count: one,", "The cat sat on the", "Once upon a"])
def test_prompts(llm_model, golden_tokens, prompt):
    golden_tokens.check(llm_model.generate(prompt))
"""


def llm_golden(monkeypatch, capsys, where, *args) -> tuple[int, str]:
    monkeypatch.chdir(where)
    capsys.readouterr()
    status = cli.main([str(arg) for arg in args])
    out, err = capsys.readouterr()
    return status, out + err


def test_hub_id_record_upgrade_review_shards_accept(pytester, hub_cache, tmp_path, monkeypatch, capsys):
    # Day one: the model is in the local Hugging Face cache, the ini names it by its hub id, and the
    # project keeps its goldens in a folder of its own.
    in_hub_cache(hub_cache, REPO, OLD)
    pytester.makefile(".ini", pytest=f"[pytest]\nllm_model = {REPO}\nllm_batch_shape = 2x32\n"
                                     "llm_golden_dir = goldens\n")
    pytester.makepyfile(test_chat=TESTS)
    first = pytester.runpytest("-p", "no:cacheprovider")
    first.assert_outcomes(failed=4)
    first.stdout.fnmatch_lines([f"llm: model={REPO} *", f"llm: loaded {REPO} (commit {OLD[:12]} *",
                                "golden checks: 4 MISSING (failed)"])
    pytester.runpytest("-p", "no:cacheprovider", "--llm-golden-update").assert_outcomes(passed=4)
    golden = json.loads((pytester.path / "goldens" / "test_chat.json").read_text())
    assert {entry["fingerprint"]["model_commit"] for variants in golden["goldens"].values()
            for entry in variants.values()} == {OLD}
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=4)

    # The upgrade: a new commit of the same id (changed weights) becomes `main`.
    (hub_cache / "models--acme--chat-tiny" / "refs" / "main").unlink()
    in_hub_cache(hub_cache, REPO, NEW, source=perturbed_tiny_copy(tmp_path / "upgraded", scale=0.5))

    # CI on the pull request: it fails, the step summary shows what the model says now, and the
    # candidates are kept for review.
    summary = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    checked = pytester.runpytest("-p", "no:cacheprovider", "--llm-golden-artifacts=candidates")
    checked.assert_outcomes(failed=4)
    checked.stdout.fnmatch_lines([f"*model_commit: '{OLD}' -> '{NEW}'*"])
    markdown = summary.read_text()
    assert "What the model says (expected → got)" in markdown
    assert "  - expected: `" in markdown and "  - got: `" in markdown
    monkeypatch.delenv("GITHUB_STEP_SUMMARY")

    # The same suite in two shards, each with its report and candidates, merged into one review.
    for group in (1, 2):
        pytester.runpytest("-p", "no:cacheprovider", "--splits=2", f"--group={group}",
                           f"--llm-report=shard{group}/report.json",
                           f"--llm-golden-artifacts=shard{group}/candidates")
    status, out = llm_golden(monkeypatch, capsys, pytester.path, "merge", "shard1/report.json",
                             "shard2/report.json", "--report=review.md", "--candidates=merged")
    assert status == 1, out  # the merged run failed: its checks did
    assert "merged 2 shard(s): 4 of 4 test(s) of the suite ran" in out
    assert "What the model says (expected → got)" in (pytester.path / "review.md").read_text()
    merged = sorted(p.relative_to(pytester.path / "merged").as_posix()
                    for p in (pytester.path / "merged").rglob("*.json"))
    assert merged == ["goldens/test_chat.json"]

    # The reviewer reads the change as tokens, from the project's folder, with no --golden-dir.
    status, out = llm_golden(monkeypatch, capsys, pytester.path, "diff", "merged")
    assert status == 1 and "configuration: pytest.ini" in out and "->" in out
    assert any("'(" in line and ")' " not in line for line in out.splitlines() if "->" in line)

    # Accepted with the project's own llm_golden_dir, read from its pytest.ini.
    status, out = llm_golden(monkeypatch, capsys, pytester.path, "accept", "merged")
    assert status == 0, out
    assert "llm_golden_dir = goldens" in out
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=4)
    golden = json.loads((pytester.path / "goldens" / "test_chat.json").read_text())
    assert {entry["fingerprint"]["model_commit"] for variants in golden["goldens"].values()
            for entry in variants.values()} == {NEW}


UPGRADE_TESTS = """
from pytest_llmdeterminism import deterministic

@deterministic(max_new_tokens=6)
def test_greeting(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("Hello, my name is"))

@deterministic(max_new_tokens=6)
def test_story(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("Once upon a time", do_sample=True, temperature=0.8, seed=3))

@deterministic(max_new_tokens=6)
def test_count(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("Count: one,"))
"""


def test_hub_id_sampled_test_upgrade_selective_review_accepted_subset(pytester, hub_cache, tmp_path,
                                                                     monkeypatch, capsys):
    """The weekly loop as the docs tell it: a hub-id model and a sampled test recorded; the checkpoint
    upgraded (`llm-golden perturb`, drift only) while one prompt was edited too; the run names what
    to do; the reviewer accepts the drift alone (`accept --only`), which leaves the edited prompt's
    INPUT_CHANGED for a second look, then takes it by key (`accept -k`); green."""
    in_hub_cache(hub_cache, REPO, OLD)
    pytester.makefile(".ini", pytest=f"[pytest]\nllm_model = {REPO}\nllm_batch_shape = 2x32\n")
    pytester.makepyfile(test_chat=UPGRADE_TESTS)
    pytester.runpytest("-p", "no:cacheprovider", "--llm-golden-update").assert_outcomes(passed=3)
    golden = json.loads((pytester.path / "__golden__" / "test_chat.json").read_text())["goldens"]
    assert golden["test_story"]["cpu/float32"]["generation_config"]["top_k"] == 50  # transformers' default

    # The upgrade: the same model with its weights moved a little (drift only, as perturb's help says),
    # and, in the same pull request, one prompt edited.
    status, out = llm_golden(monkeypatch, capsys, pytester.path, "perturb", REPO, "upgraded",
                             "--scale", "3e-3")
    assert status == 0, out
    pytester.makefile(".ini", pytest="[pytest]\nllm_model = upgraded\nllm_batch_shape = 2x32\n")
    pytester.makepyfile(test_chat=UPGRADE_TESTS.replace('"Hello, my name is"', '"Hello, my name was"'))
    checked = pytester.runpytest("-p", "no:cacheprovider", "--llm-golden-artifacts=llm-candidates")
    checked.assert_outcomes(failed=3)
    checked.stdout.fnmatch_lines(["*to see what moved, case by case: llm-golden diff llm-candidates, or "
                                  "llm-golden review llm-candidates",
                                  "*to accept only the drift and near ties: llm-golden accept llm-candidates "
                                  "--only LOGIT_DRIFT (or -k KEY)"])

    status, out = llm_golden(monkeypatch, capsys, pytester.path, "diff", "llm-candidates")
    verdicts = {line.split()[0] for line in out.splitlines() if "['test_" in line}
    assert status == 1 and "INPUT_CHANGED" in verdicts, out
    drift = verdicts - {"INPUT_CHANGED"}
    assert drift and drift <= {"LOGIT_DRIFT", "TIE_FLIP", "SAMPLE_FLIP"}, out

    status, out = llm_golden(monkeypatch, capsys, pytester.path, "accept", "llm-candidates", "--only",
                             "LOGIT_DRIFT,TIE_FLIP,SAMPLE_FLIP")
    assert status == 1, out  # something was left: the edited prompt
    assert any(line.startswith("left") and "INPUT_CHANGED" in line and "test_greeting" in line
               for line in out.splitlines()), out
    again = pytester.runpytest("-p", "no:cacheprovider")
    again.assert_outcomes(passed=2, failed=1)
    again.stdout.fnmatch_lines(["*golden mismatch in 'test_greeting': INPUT_CHANGED — prompt_token_ids*",
                                "FAILED test_chat.py::test_greeting*"])

    status, out = llm_golden(monkeypatch, capsys, pytester.path, "accept", "llm-candidates", "-k",
                             "test_greeting")
    assert status == 0, out
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=3)
