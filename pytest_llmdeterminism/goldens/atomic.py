"""Writes that other processes never see half done: a temp file in the same folder, then
``os.replace``; the folder lock that makes read-merge-write safe between processes of one host; the
clean-up of temp files that killed processes left behind; and the one rule every write of a golden
or an artifact (candidates, repro packs, reports) follows: no symbolic link leads it out of its
home (:func:`link_out`)."""

from __future__ import annotations

import os
import re
import socket
import stat
import tempfile
import time
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_llmdeterminism.errors import LLMDeterminismError

if TYPE_CHECKING:
    from collections.abc import Iterator


class LinkOutError(LLMDeterminismError, OSError):
    """A write refused because a symbolic link on its way leads out of its home (``path``: the file
    that was not written). Raised before anything is written or made."""

    def __init__(self, path: Path, message: str) -> None:
        self.path = path
        super().__init__(message)


def write_text_atomic(path: Path, text: str, *, homes: Iterable[Path] | None = None, what: str = "files",
                      mode: int | None = None) -> None:
    """Temp file in the same folder (named with this process's id), then ``os.replace``. The file
    keeps its mode, or gets the one a new file gets under the umask (``mode``: this one, whatever
    was there); the temp file never outlives this call, and temp files left by killed processes are
    removed. With ``homes``, a path that a link leads out of them is refused (:class:`LinkOutError`)
    before anything is made; ``what`` names what is written, for that message."""
    if homes is not None:
        refuse_link_out(path, homes, what=what)
    path = Path(os.path.realpath(path))  # a symlinked golden: write its target, keep the link
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_orphaned_temp_files(path)
    if mode is None:
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
        except FileNotFoundError:
            mode = new_file_mode()
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.{HOST}-{os.getpid()}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fchmod(handle.fileno(), mode) if hasattr(os, "fchmod") else None
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def output_home(folder: Path, rootdir: Path) -> Path:
    """Where writes into ``folder`` (an output folder the user named, or a named file's folder) must
    stay: the rootdir where ``folder`` lies in it as given, else ``folder`` itself. A link the user
    named is theirs to follow; a link found inside a checkout (which a pull request can add) is not."""
    given, root = Path(os.path.abspath(folder)), Path(os.path.abspath(rootdir))
    return root if inside(given, root) else given


def link_out(path: Path, homes: Iterable[Path], *, what: str = "goldens") -> str | None:
    """Why writing ``path`` would leave ``homes``: a symbolic link on the way (the file, or a folder
    such as ``__golden__``) resolves to outside every one of them; None when it stays inside."""
    homes = [Path(os.path.abspath(home)) for home in homes]
    real = Path(os.path.realpath(path))
    if any(inside(real, Path(os.path.realpath(home))) for home in homes):
        return None
    link = _first_link(Path(os.path.abspath(path)), homes)
    kind = "folder" if link != Path(os.path.abspath(path)) or os.path.isdir(link) else "file"
    return (f"{link} is a symbolic link: {path} resolves to {real}, outside {' and '.join(map(str, homes))}, "
            f"and {what} are written only inside it (a link that a checkout or a shared folder holds could "
            "aim them at any file). "
            f"Replace the link with a real {kind}, or remove it.")


def refuse_link_out(path: Path, homes: Iterable[Path], *, what: str) -> None:
    """Raises :class:`LinkOutError` where :func:`link_out` says why ``path`` may not be written."""
    problem = link_out(path, homes, what=what)
    if problem:
        raise LinkOutError(path, problem)


def _first_link(path: Path, homes: list[Path]) -> Path:
    """The first symbolic link on ``path``'s way below the home it lies in (from the top otherwise)."""
    home = next((home for home in homes if inside(path, home)), None)
    for step in [*reversed(path.parents), path]:
        if (home is None or inside(step, home)) and step.is_symlink():
            return step
    return path


def inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` is ``folder`` or lies below it (as written: no link is resolved)."""
    return path == folder or folder in path.parents


def umask() -> int:
    """This process's umask."""
    current = os.umask(0o022)  # the only portable way to read it is to set it
    os.umask(current)
    return current


def new_file_mode() -> int:
    """The mode ``open()`` gives a new file under this process's umask (0644 under 022)."""
    return 0o666 & ~umask()


# This host, as temp-file and scratch-folder names carry it (only its processes can be checked).
HOST = re.sub(r"[^A-Za-z0-9]", "", socket.gethostname())[:32] or "host"
_ORPHAN_AGE_S = 60


def _remove_orphaned_temp_files(path: Path) -> None:
    """``.NAME.HOST-PID.*.tmp`` beside ``path`` written on this host by a process that no longer
    runs (a SIGKILL mid-write), and older than a minute. Other hosts' temp files are left alone."""
    now = time.time()
    for temp in path.parent.glob(f".{path.name}.{HOST}-*.tmp"):
        pid = temp.name[len(path.name) + len(HOST) + 3:].split(".", 1)[0]
        try:
            stale = (pid.isdigit() and not process_alive(int(pid))
                     and now - temp.stat().st_mtime > _ORPHAN_AGE_S)
        except (OSError, OverflowError, ValueError):
            continue
        if stale:
            temp.unlink(missing_ok=True)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (used to find the leftovers of killed processes)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # it exists but belongs to someone else
    return True


@contextmanager
def folder_lock(path: Path) -> Iterator[None]:
    """Hold the folder's lock while reading, merging and writing ``path``: concurrent updates
    from other processes (two pytest runs, xdist controllers) wait instead of losing entries.
    POSIX: ``flock`` on the folder itself, so no lock file is left behind. The lock holds between
    processes of one host (on NFS, ``flock`` does not reach other clients)."""
    path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # Windows
        from filelock import FileLock

        with FileLock(str(path) + ".lock"):
            yield
        return
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        yield
    finally:
        os.close(folder)  # closing releases the lock


