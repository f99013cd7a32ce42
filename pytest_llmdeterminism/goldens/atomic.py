"""Writes that other processes never see half done: a temp file in the same folder, then
``os.replace``; the folder lock that makes read-merge-write safe between processes of one host; and
the clean-up of temp files that killed processes left behind."""

from __future__ import annotations

import os
import re
import socket
import stat
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator


def write_text_atomic(path: Path, text: str) -> None:
    """Temp file in the same folder (named with this process's id), then ``os.replace``. The file
    keeps its mode, or gets the one a new file gets under the umask; the temp file never outlives
    this call, and temp files left by killed processes are removed."""
    path = Path(os.path.realpath(path))  # a symlinked golden: write its target, keep the link
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_orphaned_temp_files(path)
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


