"""Hub ids in pytest runs: a missing one explained once per run, the golden records the commit and a
moved branch shows in the diff, a local folder named like a hub id wins, and a fresh process searches
the cache the environment names."""

from __future__ import annotations

import shutil

import pytest

from pytest_llmdeterminism.engines import BUILTIN_MODELS
from pytest_llmdeterminism.engines.spec import hub_id
from tests.helpers.hub import NEW, OLD, REPO
from tests.helpers.models import in_hub_cache, perturbed_tiny_copy


def test_a_missing_hub_id_is_explained_once_per_run(pytester, hub_cache):
    pytester.makeini("[pytest]\nllm_model = Org/Missing\n")
    pytester.makepyfile(test_three="def test_a(llm_model): pass\n"
                                   "def test_b(llm_model): pass\n"
                                   "def test_c(llm_model): pass\n")
    result = pytester.runpytest()
    result.assert_outcomes(errors=3)
    result.stdout.fnmatch_lines([
        "llm: model=Org/Missing shape=*",
        "E*cannot load llm_model 'Org/Missing': no local folder or .gguf file is named 'Org/Missing', and "
        f"the Hugging Face cache holds no Org/Missing. Searched '{hub_cache}' (from HF_HUB_CACHE). The "
        "plugin never downloads; put the model in that cache once with `hf download Org/Missing`, or set "
        "llm_model to a local folder",
        "E*cannot load llm_model 'Org/Missing': see the error of test_three.py::test_a for why (shown once, "
        "at the first test that needed the model)",
        "E*cannot load llm_model 'Org/Missing': see the error of test_three.py::test_a for why*",
    ])
    assert result.stdout.str().count("hf download Org/Missing") == 1
    assert "During handling" not in result.stdout.str()  # huggingface_hub's own error is not shown


TEST_CAPITAL = """
from pytest_llmdeterminism import deterministic

@deterministic(max_new_tokens=6)
def test_capital(llm_model, golden_tokens):
    golden_tokens.check(llm_model.generate("Q: What is the capital of Japan? A:"))
"""


def test_the_golden_records_the_commit_and_a_moved_branch_shows_in_the_diff(pytester, hub_cache, tmp_path):
    in_hub_cache(hub_cache, REPO, OLD)
    pytester.makeini(f"[pytest]\nllm_model = {REPO}\nllm_batch_shape = 1x32\n")
    pytester.makepyfile(test_capital=TEST_CAPITAL)
    recorded = pytester.runpytest("--llm-golden-update")
    recorded.assert_outcomes(passed=1)
    recorded.stdout.fnmatch_lines([f"llm: loaded Org/Tiny (commit {OLD[:12]} in the Hugging Face cache) *"])
    golden = (pytester.path / "__golden__" / "test_capital.json").read_text()
    assert f'"model_commit": "{OLD}"' in golden or f'"model_commit":"{OLD}"' in golden
    pytester.runpytest().assert_outcomes(passed=1)

    in_hub_cache(hub_cache, REPO, NEW, source=perturbed_tiny_copy(tmp_path / "changed", scale=0.5))
    moved = pytester.runpytest()
    moved.assert_outcomes(failed=1)
    moved.stdout.fnmatch_lines(["E*environment changed (expected -> got):",
                                f"E*model_commit: '{OLD[:12]}*' -> '{NEW[:12]}*'"])


def test_a_local_folder_named_like_a_hub_id_wins(pytester, hub_cache, tmp_path, monkeypatch):
    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text("{}")
    in_hub_cache(hub_cache, REPO, OLD, source=no_weights)  # would fail to load: no safetensors
    local = shutil.copytree(BUILTIN_MODELS["tiny"], pytester.path / "Org" / "Tiny")
    pytester.makeini(f"[pytest]\nllm_model = {REPO}\n")
    pytester.makepyfile("def test_x(llm_model): pass")
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"llm: model={local} shape=*"])
    monkeypatch.chdir(pytester.path)
    assert hub_id(REPO) is None


@pytest.mark.subprocess
@pytest.mark.parametrize(("variable", "searched"), [("HF_HUB_CACHE", "{folder}' (from HF_HUB_CACHE)"),
                                                    ("HF_HOME", "{folder}/hub' (HF_HOME/hub)")])
def test_a_fresh_process_searches_the_cache_the_environment_names(pytester, monkeypatch, variable, searched):
    """What a user's shell does: the variable is set before pytest (and huggingface_hub) start."""
    for name in ("HF_HUB_CACHE", "HF_HOME", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    folder = pytester.mkdir("elsewhere")
    monkeypatch.setenv(variable, str(folder))
    pytester.makeini("[pytest]\nllm_model = Org/Missing@v2\n")
    pytester.makepyfile("def test_x(llm_model): pass")
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"E*Searched '{searched.format(folder=folder)}. The plugin never "
                                 "downloads; put the model in that cache once with "
                                 "`hf download Org/Missing --revision v2`*"])
