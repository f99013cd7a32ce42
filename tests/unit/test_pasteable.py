"""Messages you can paste, checked without a run: the README holds config blocks of both kinds,
``pasteable`` gives the flag, the ini line and the toml line, and a missing model file names the
command that fetches it (each pasted into a project: tests/pytester/test_pasteable_runs.py)."""

from __future__ import annotations

import pytest

from pytest_llmdeterminism.engines import resolve
from pytest_llmdeterminism.errors import ModelLoadError, pasteable
from tests.helpers.pasteable import README, config_blocks


def readme_config_blocks() -> list[tuple[str, str]]:
    return config_blocks(README)


def test_the_readme_has_config_blocks_of_both_kinds():
    assert {language for language, _ in readme_config_blocks()} == {"ini", "toml"}


def test_pasteable_shows_the_flag_the_ini_line_and_the_toml_line():
    assert pasteable("llm_batch_shape", "2x64") == (
        '--llm-batch-shape=2x64 (pytest.ini: llm_batch_shape = 2x64; pyproject.toml: '
        'llm_batch_shape = "2x64")')


def test_a_missing_smollm2_file_suggests_llm_golden_fetch(tmp_path):
    missing = tmp_path / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    with pytest.raises(ModelLoadError) as refused:
        resolve(str(missing))
    assert f"`llm-golden fetch smollm2 {missing.parent}`" in str(refused.value)
    assert "hf download" not in str(refused.value)
    with pytest.raises(ModelLoadError,
                       match=r"`hf download ORG/NAME --local-dir models/NAME`.*--llm-model=models/NAME"):
        resolve(str(tmp_path / "other.gguf"))
