"""What the plugin keeps in its cache folder: file hashes, and GGUF files converted once for transformers.

The first float32 load of a ``.gguf`` file saves what transformers made of it into
``<cache>/converted/<file name>-<key>/`` (keyed by the hash of the file's bytes, read at every
load, the converting libraries' versions and the machine), written beside its final name and
renamed into place; later loads read that folder after checking its digest (``llmdet-digest.json``).
Every folder here is read only where others may not write it (``compute/private_folder.py``). Why,
and what it saves: ``docs/design/engines.md``.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_llmdeterminism.compute.private_folder import CacheFolderError, cache_root, checked_cache_folder

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

_CHUNK = 1 << 24
CONVERTED = "converted"
HASHES, HASHES_FILE = "hashes", "file-hashes.json"
DIGEST = "llmdet-digest.json"
DIGEST_FORMAT = "llmdet-converted-copy/1"


def cache_dir() -> Path:
    """Where the plugin keeps derived data: ``$LLMDET_CACHE_DIR``, else the user cache folder."""
    return cache_root()


def file_hash(path: Path) -> str:
    """xxh3-64 of a file's bytes, for fingerprints. Cached by the file's identity and times (device,
    inode, size, mtime and ctime: ``cp -p``, ``rsync -a`` and ``tar x`` set an mtime, never a ctime,
    so a file replaced in place is hashed again), in a cache folder only the user may write; where
    others may write it, the file is hashed without the cache."""
    stat = path.stat()
    identity = f"{stat.st_dev}:{stat.st_ino}|"
    key = f"{identity}{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ctime_ns}"
    try:
        folder = checked_cache_folder(HASHES, refused="the plugin keeps no file hashes in it")
    except (CacheFolderError, OSError):
        return _content_hash(path)  # the same hash, read again: a cache others could write is never read
    cache_file = folder / HASHES_FILE
    try:
        cached = json.loads(cache_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        cached = {}
    if isinstance(cached, dict) and isinstance(cached.get(key), str):
        return str(cached[key])
    result = _content_hash(path)
    # Keep one entry per file: older sizes and times of the same file are stale.
    entries = cached.items() if isinstance(cached, dict) else ()
    cached = {k: v for k, v in entries if not k.startswith(identity)}
    cached[key] = result
    try:
        temp = cache_file.with_name(f".{cache_file.name}.{os.getpid()}.tmp")
        temp.write_text(json.dumps(cached, sort_keys=True), encoding="utf-8")
        os.replace(temp, cache_file)
    except OSError:
        pass  # a read-only home only costs a re-hash next time
    return result


def _update_from_file(digest: Any, path: Path) -> None:
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)


def _content_hash(path: Path) -> str:
    import xxhash

    digest = xxhash.xxh3_64()
    _update_from_file(digest, path)
    return digest.hexdigest()


def converted_folder(gguf: Path) -> Path:
    """Where the float32 conversion of ``gguf`` is kept (it may not exist yet)."""
    from importlib.metadata import PackageNotFoundError, version

    import xxhash

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "none"

    libraries = ",".join(f"{name}={installed(name)}" for name in ("transformers", "gguf", "numpy"))
    # The file's bytes, hashed now (0.12 s per 100 MB, measured): never the hash cache, so
    # no file replaced in place with its size and mtime kept, and no stale entry, reuses another copy.
    key = xxhash.xxh3_64_hexdigest(f"{_content_hash(gguf)}|{libraries}|{platform.machine()}".encode())
    refused = ("the plugin reads no converted copy from it (a .gguf model's float32 weights would be "
               "whatever was put there)")
    return checked_cache_folder(CONVERTED, refused=refused) / f"{gguf.stem}-{key}"


@dataclass(frozen=True)
class ConvertedCopy:
    """The converted copy of a ``.gguf`` file: its ``folder``, whether a load may read it
    (``usable``), and why an earlier copy was set aside (``discarded``: "" when none was)."""

    folder: Path
    usable: bool
    discarded: str = ""


def converted_copy(gguf: Path) -> ConvertedCopy:
    """The converted copy of ``gguf``, checked against its digest. A copy that fails the check is
    moved out of the way (and deleted) so the load converts the file again and keeps a new one."""
    folder = converted_folder(gguf)
    if not folder.is_dir():
        return ConvertedCopy(folder, usable=False)
    damage = copy_damage(folder)
    if damage is None:
        return ConvertedCopy(folder, usable=True)
    aside = folder.with_name(f".{folder.name}.{os.getpid()}.discarded")
    try:
        folder.rename(aside)
    except OSError:
        pass  # another process moved it first, or the cache is read-only: this load converts anyway
    shutil.rmtree(aside, ignore_errors=True)
    return ConvertedCopy(folder, usable=False, discarded=damage)


def copy_damage(folder: Path) -> str | None:
    """None when the files of ``folder`` are the ones its digest lists (size and xxh3), else what
    differs, e.g. "model.safetensors changed"."""
    try:
        recorded = json.loads((folder / DIGEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"it has no {DIGEST}, so an older version wrote it or it was cut short"
    except (OSError, ValueError):
        return f"its {DIGEST} is unreadable"
    files = recorded.get("files") if isinstance(recorded, dict) else None
    if not isinstance(files, dict) or recorded.get("format") != DIGEST_FORMAT:
        return f"its {DIGEST} is not a {DIGEST_FORMAT} digest"
    try:
        present = {path.name: path for path in folder.iterdir() if path.name != DIGEST}
    except OSError:
        return "its folder is unreadable"
    for name in sorted(present.keys() | files.keys()):
        expected, path = files.get(name), present.get(name)
        if path is None:
            return f"{name} is missing"
        if not isinstance(expected, dict) or not path.is_file() or path.is_symlink():
            return f"{name} is not one of its files"
        try:
            if path.stat().st_size != expected.get("size") or _content_hash(path) != expected.get("xxh3_64"):
                return f"{name} changed"
        except OSError:
            return f"{name} is unreadable"
    return None


def _write_digest(folder: Path) -> None:
    """Record the size and xxh3 of every file of ``folder``: the last file written to a copy."""
    files = {path.name: {"size": path.stat().st_size, "xxh3_64": _content_hash(path)}
             for path in sorted(folder.iterdir())}
    temp = folder / f".{DIGEST}.tmp"
    temp.write_text(json.dumps({"format": DIGEST_FORMAT, "files": files}, indent=1, sort_keys=True),
                    encoding="utf-8")
    os.replace(temp, folder / DIGEST)


def keep_converted(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, folder: Path) -> bool:
    """Save what transformers made of a ``.gguf`` file (``model`` in float32, ``tokenizer``) as
    ``folder``; False where it could not be kept (a read-only or full disk: the next load converts
    again, and this one goes on). The model is left as it was."""
    partial = folder.with_name(f".{folder.name}.{os.getpid()}.partial")
    quantizer = getattr(model, "hf_quantizer", None)
    quantization = model.config.__dict__.pop("quantization_config", None)
    try:
        # Dequantised when loaded: what is saved is plain float32, not a GGUF-quantised model.
        model.hf_quantizer = None
        model.save_pretrained(partial, safe_serialization=True)
        tokenizer.save_pretrained(partial)
        _write_digest(partial)
        try:
            partial.rename(folder)
        except OSError:
            if not folder.is_dir():  # another process converted it first: its copy stands
                raise
        return True
    except Exception:  # noqa: BLE001 - a copy that cannot be kept must not fail the load it would speed up
        return False
    finally:
        model.hf_quantizer = quantizer
        if quantization is not None:
            model.config.quantization_config = quantization
        shutil.rmtree(partial, ignore_errors=True)
