"""Golden files on disk: read one safely, write one atomically, and merge into or remove from one
under the folder's lock, so that concurrent runs keep each other's entries."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pytest_llmdeterminism.errors import GoldenFileError, LLMDeterminismError
from pytest_llmdeterminism.goldens.atomic import folder_lock, write_text_atomic
from pytest_llmdeterminism.goldens.codec import dumps, parse
from pytest_llmdeterminism.goldens.schema import AnyEntry, Goldens, text_problem, to_struct


def read(path: Path) -> Goldens:
    """The goldens in ``path`` ({} when it does not exist). Raises :class:`GoldenFileError`.

    Only a regular file is read (see :func:`read_regular_file`).
    """
    __tracebackhide__ = True
    try:
        data = read_regular_file(path)
    except FileNotFoundError:
        return {}
    except UnreadableFileError as error:
        raise GoldenFileError(path, error.reason, error.fix) from None
    return parse(path, data)


class UnreadableFileError(LLMDeterminismError):
    """A file that :func:`read_regular_file` refused: ``reason`` says why, ``fix`` what to give instead."""

    def __init__(self, reason: str, fix: str) -> None:
        super().__init__(f"{reason}. {fix}")
        self.reason, self.fix = reason, fix


def read_regular_file(path: Path, *, max_bytes: int | None = None) -> bytes:
    """The bytes of ``path``, a regular file (a symlink to one is followed) of at most ``max_bytes``;
    :class:`UnreadableFileError` otherwise, and ``FileNotFoundError`` when there is none.

    A FIFO would block, a device such as ``/dev/zero`` would never end, and an oversized file would
    be read whole before its first error: all are refused before a byte is read. The file is opened
    without blocking and checked on the open descriptor, so it cannot be swapped for something else
    in between.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise
    except OSError as error:
        raise UnreadableFileError(f"cannot be read ({error.strerror})", "Check its permissions.") from None
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise UnreadableFileError(f"is not a regular file ({_kind(status.st_mode)})",
                                      "Give the path of a golden file (*.json).")
        _check_size(status.st_size, max_bytes)
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(-1 if max_bytes is None else max_bytes + 1)
        _check_size(len(data), max_bytes)  # it grew since: still never more than the limit in memory
        return data
    except OSError as error:
        raise UnreadableFileError(f"cannot be read ({error.strerror})", "Check its permissions.") from None
    finally:
        os.close(fd)


def _check_size(size: int, max_bytes: int | None) -> None:
    if max_bytes is not None and size > max_bytes:
        raise UnreadableFileError(f"has {size:,} bytes, more than the limit of {max_bytes:,} bytes "
                                  f"({max_bytes / 2**20:g} MiB)",
                                  "Give the file this tool wrote.")


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((name for is_kind, name in kinds if is_kind(mode)), "a special file")


def write(path: Path, goldens: Mapping[str, Mapping[str, AnyEntry | Mapping[str, Any]]]) -> None:
    """Write atomically: a temp file in the same folder, then ``os.replace``. A file that would not
    read back (a key that is not valid Unicode, a string UTF-8 cannot encode) is refused before
    anything is written: :class:`GoldenFileError`, and the file is left as it was."""
    __tracebackhide__ = True
    unwritable = "was not written: {}, so the file would not read back"
    fix = ("Every golden key, variant and text must be valid Unicode; golden_tokens.check() refuses "
           "names and generations that are not, so report how this one got here")
    for key, variants in goldens.items():
        for name, text in (("the key", key), *(("the variant", variant) for variant in variants)):
            problem = text_problem([(f"{name} {text!r}", text)])
            if problem and not problem.too_long:  # a long key is only unwieldy; it reads back
                raise GoldenFileError(path, unwritable.format(problem), fix)
    text = dumps(goldens)
    try:
        text.encode("utf-8")  # every other string is written as it is: UTF-8 must hold it
    except UnicodeEncodeError as error:
        where = text[max(0, error.start - 40):error.start + 1]
        raise GoldenFileError(path, unwritable.format(f"it would hold a lone surrogate, which is not valid "
                                                      f"Unicode, at …{where!r}"), fix) from None
    write_text_atomic(path, text)


def remove(path: Path, keys: Iterable[str]) -> None:
    """Delete ``keys`` (all their variants) from the file as it is on disk now; delete an emptied file."""
    with folder_lock(path):
        goldens = read(path)
        for key in keys:
            goldens.pop(key, None)
        if goldens:
            write(path, goldens)
        else:
            path.unlink(missing_ok=True)


def merge(path: Path, updates: Mapping[str, Mapping[str, AnyEntry | Mapping[str, Any]]]) -> None:
    """Apply ``updates`` (key -> variant -> entry) to the file as it is on disk now, then write it.

    Under the folder's lock, re-reading at write time keeps entries that another process wrote
    since this one started. Other variants of the same key are never touched. Every entry is
    validated against the schema before anything is written.
    """
    validated = {key: {variant: to_struct(entry) for variant, entry in variants.items()}
                 for key, variants in updates.items()}
    with folder_lock(path):
        goldens = read(path)
        for key, variants in validated.items():
            goldens.setdefault(key, {}).update(variants)
        write(path, goldens)
