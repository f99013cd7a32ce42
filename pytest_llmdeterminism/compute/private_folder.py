"""Folders only this user may write: the one check of every folder the plugin reads cached data from.

The plugin's cache folder (``$LLMDET_CACHE_DIR``, else the user cache folder) holds what it derived
once and trusts later: the compiled kernel (code), GGUF files converted to float32 (the weights a
verdict is computed with) and file hashes. Whoever may write a folder can put anything in it, so
each of them is read only from a folder that is the user's own and that neither group nor others
may write, inside a parent that is the user's (or root's) and that neither may write either (else
the folder itself could be renamed away and replaced). One rule, one message, for all of them.
"""

from __future__ import annotations

import os
from pathlib import Path

from pytest_llmdeterminism.errors import LLMDeterminismError

__all__ = ["CacheFolderError", "cache_root", "checked_cache_folder", "private_folder", "require_private"]

CACHE_SETTING = "LLMDET_CACHE_DIR"


class CacheFolderError(LLMDeterminismError, PermissionError):
    """A cache folder (or file in it) that others may write: nothing cached is read from it.
    ``path``: what was refused. A PermissionError without an errno: the plugin's refusal, not the
    system's."""

    def __init__(self, path: Path, message: str) -> None:
        self.path = path
        super().__init__(message)


def cache_root() -> Path:
    """Where the plugin keeps derived data: ``$LLMDET_CACHE_DIR``, else the user cache folder."""
    configured = os.environ.get(CACHE_SETTING)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "pytest-llmdeterminism"


def private_folder(folder: Path) -> Path:
    """``folder``, created where missing with each missing parent 0700 (``mkdir -p`` would give the
    parents the umask's mode, which may let the group write them: then the folder is refused)."""
    for path in reversed([folder, *folder.parents]):
        if not path.exists():
            path.mkdir(mode=0o700, exist_ok=True)
    return folder


def require_private(status: os.stat_result, path: Path, *, refused: str, role: str = "", why: str = "",
                    root_too: bool = False) -> None:
    """Raises :class:`CacheFolderError` unless ``path`` (whose ``status`` was read without following a
    link) is the user's own (or, with ``root_too``, root's) and neither group nor others may write it.
    ``refused``: what the plugin does instead, e.g. "the plugin loads no code from it"."""
    owners = (os.getuid(), 0) if root_too else (os.getuid(),)
    if status.st_uid in owners and not status.st_mode & 0o022:
        return
    whose = "the user's own or root's" if root_too else "the user's own"
    mode = status.st_mode & 0o7777
    mine = status.st_uid == os.getuid()
    fix = f", or make it private: chmod go-w {path}" if mine else ""
    raise CacheFolderError(path, f"{path}{role} is not {whose} or others may write it (mode {mode:o}){why}; "
                                 f"{refused}: set {CACHE_SETTING} to a private folder{fix}")


def checked_cache_folder(name: str, *, refused: str) -> Path:
    """``<cache root>/<name>``, created private where missing, after checking it and the cache root
    as :func:`require_private` does (the folder itself not a link). Raises :class:`CacheFolderError`
    naming the first that others may write; ``refused``: what the caller does not do then."""
    root = private_folder(cache_root())
    folder = root / name
    require_private(os.stat(root), root, refused=refused, root_too=True, role=" (the plugin's cache folder)",
                    why=f": whoever may write it can put another folder in {name}'s place")
    private_folder(folder)  # only now: nothing is made in a folder that was refused
    if folder.is_symlink():
        raise CacheFolderError(folder, f"{folder} is a symbolic link; {refused}: set {CACHE_SETTING} to a "
                                       "private folder, or replace the link with a folder")
    require_private(os.lstat(folder), folder, refused=refused)
    return folder
