"""Golden files: JSON with a schema version, stable formatting, atomic writes. Nothing is unpickled.

One file per test module. Layout::

    {
      "goldens": {
        "test_capital": {                 # test name, plus "::name" or "#n" for extra checks
          "cpu/float32": { ...entry... }  # one variant per device class and dtype
        }
      },
      "logit_hash": "<definition of the hashed bytes>",
      "schema": 1
    }

Each entry's ``steps`` list has one line per generated token, so a review diff shows exactly the
steps that changed.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import socket
import stat
import tempfile
import time
from collections.abc import Iterable, Mapping
from contextlib import contextmanager
from json.encoder import encode_basestring
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

import msgspec

from pytest_llmdeterminism.errors import GoldenFileError
from pytest_llmdeterminism.generation import (
    LOGIT_HASH_DEFINITION,
    LOGPROB_FLOOR,
    Generation,
    HashDefinition,
    PromptForm,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

SCHEMA_VERSION = 1

# The golden schema, declared once and decoded strictly (msgspec validates while it parses, in C):
# finite floats in the ranges capture can produce, non-negative token ids, strings where strings
# belong. A golden that does not fit is one GoldenFileError naming the file and the place.
TokenId = Annotated[int, msgspec.Meta(ge=0)]
Logprob = Annotated[float, msgspec.Meta(ge=LOGPROB_FLOOR, le=0.0)]
Margin = Annotated[float, msgspec.Meta(ge=0.0, le=-LOGPROB_FLOOR)]
LogitHash = Annotated[str, msgspec.Meta(min_length=16, max_length=16)]  # xxh3-64, hex
Scalar = Union[str, int, float, bool, None]  # noqa: UP007 - msgspec reads the annotation at run time
# The fingerprint is two levels deep at most (``flags`` -> ``fp32_precision`` -> knob).
FingerprintValue = Union[Scalar, dict[str, Union[Scalar, dict[str, Scalar]]]]  # noqa: UP007


# Every field is required (the writer always writes them all): a missing field is named, and the
# fast duplicate-key proof can count keys from the types alone.
class Step(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    # Fields in sorted order: a step is written as msgspec encodes it, one compact line.
    hash: LogitHash
    margin: Margin
    piece: str
    token: TokenId
    top: tuple[tuple[TokenId, Logprob], ...]


class Entry(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """One recorded generation: one variant of one golden."""

    batch_shape: Annotated[str, msgspec.Meta(pattern=r"^[0-9]+x[0-9]+\Z")]
    finish_reason: str
    generation_config: dict[str, Union[Scalar, list[Scalar]]]  # noqa: UP007
    prompt: str
    prompt_token_ids: tuple[TokenId, ...]
    steps: list[Step]
    text: str
    fingerprint: dict[str, FingerprintValue]
    prompt_form: Literal["text", "chat", "token_ids"] = "text"  # written only when not "text"
    # What the steps' hashes hash (generation.HASH_DEFINITIONS); written only when not "logits", the
    # definition the header names. An unknown one is refused: its hashes could not be compared.
    step_hash: Literal["logits", "served-topk", "vllm-topk"] = "logits"


class _Document(msgspec.Struct, forbid_unknown_fields=True):
    schema: Any = None  # checked by _check_header, which names a missing or newer schema
    logit_hash: Any = None
    goldens: dict[str, dict[str, Entry]] = msgspec.field(default_factory=dict)


class _Header(msgspec.Struct):
    schema: Any = None
    logit_hash: Any = None


_DOCUMENT = msgspec.json.Decoder(_Document)
_HEADER = msgspec.json.Decoder(_Header)
Goldens = dict[str, dict[str, Entry]]  # test key -> variant -> entry
# Fingerprint fields that the comparator reads as text.
_TEXT_FINGERPRINT_FIELDS = ("device_class", "dtype", "cpu_numerics", "machine")


def _restore_fix(path: Path) -> str:
    return (f"Restore it from version control (git checkout -- {path}), or delete it and re-record "
            "with: pytest --llm-golden-update")


def _rerecord_fix(path: Path) -> str:
    return f"To start over: delete {path}, then run: pytest --llm-golden-update"


def to_entry(generation: Generation) -> dict[str, Any]:
    """The JSON form of ``generation`` (plain types: it travels between xdist processes)."""
    steps = [
        {"hash": h, "margin": m, "piece": p, "token": t, "top": [list(pair) for pair in top]}
        for t, p, h, m, top in zip(
            generation.token_ids, generation.pieces or [""] * len(generation.token_ids),
            generation.logit_hashes, generation.margins, generation.top_logprobs,
        )
    ]
    return {
        "batch_shape": generation.batch_shape,
        "finish_reason": generation.finish_reason,
        "fingerprint": dict(generation.fingerprint),
        "generation_config": dict(generation.generation_config),
        "prompt": generation.prompt,
        "prompt_token_ids": list(generation.prompt_token_ids),
        "steps": steps,
        "text": generation.text,
        **({"prompt_form": generation.prompt_form} if generation.prompt_form != "text" else {}),
        **({"step_hash": generation.hash_definition} if generation.hash_definition != "logits" else {}),
    }


def to_struct(entry: Entry | Mapping[str, Any]) -> Entry:
    """``entry`` as a validated :class:`Entry`; ``msgspec.ValidationError`` says what is wrong."""
    converted = entry if isinstance(entry, Entry) else msgspec.convert(entry, Entry)
    problem = _semantic_problem(converted)
    if problem:
        raise msgspec.ValidationError(problem)
    return converted


def from_entry(entry: Entry | Mapping[str, Any]) -> Generation:
    entry = to_struct(entry)
    steps = entry.steps
    return Generation(
        prompt=entry.prompt,
        prompt_token_ids=entry.prompt_token_ids,
        token_ids=tuple(s.token for s in steps),
        text=entry.text,
        logit_hashes=tuple(s.hash for s in steps),
        top_logprobs=tuple(s.top for s in steps),
        margins=tuple(s.margin for s in steps),
        finish_reason=entry.finish_reason,
        generation_config=entry.generation_config,
        batch_shape=entry.batch_shape,
        pieces=tuple(s.piece for s in steps),
        fingerprint=entry.fingerprint,
        prompt_form=PromptForm(entry.prompt_form),
        hash_definition=HashDefinition(entry.step_hash),
    )


def read(path: Path) -> Goldens:
    """The goldens in ``path`` ({} when it does not exist). Raises :class:`GoldenFileError`.

    Only a regular file is read (a symlink to one is followed): a FIFO would block, a device such as
    ``/dev/zero`` would never end. It is opened without blocking and checked on the open descriptor,
    so it cannot be swapped for something else in between.
    """
    __tracebackhide__ = True
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        return {}
    except OSError as error:
        raise GoldenFileError(path, f"cannot be read ({error.strerror})", "Check its permissions.") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise GoldenFileError(path, f"is not a regular file ({_kind(mode)})",
                                  "Give the path of a golden file (*.json).")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read()
    except OSError as error:
        raise GoldenFileError(path, f"cannot be read ({error.strerror})", "Check its permissions.") from None
    finally:
        os.close(fd)
    return parse(path, data)


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((name for is_kind, name in kinds if is_kind(mode)), "a special file")


def parse(path: Path, data: bytes) -> Goldens:
    """Decode and validate one golden file's bytes; ``path`` names it in errors."""
    __tracebackhide__ = True
    try:
        document = _DOCUMENT.decode(data)
    except msgspec.ValidationError as error:
        header = _header(data)
        if header is not None:  # a file of another schema is named as such, not as malformed
            _check_header(path, header)
        raise GoldenFileError(path, f"has a malformed golden: {_locate(data, error)}", _restore_fix(path)) from None
    except msgspec.DecodeError as error:
        raise GoldenFileError(path, f"is not valid JSON ({error})", _restore_fix(path)) from None
    except RecursionError:
        raise GoldenFileError(path, "nests JSON too deeply to be a golden", _restore_fix(path)) from None
    _check_header(path, {"schema": document.schema, "logit_hash": document.logit_hash})
    goldens = document.goldens
    for key, variants in goldens.items():
        for variant, entry in variants.items():
            problem = _semantic_problem(entry, decoded_from_json=True)
            if problem:
                raise GoldenFileError(path, f"has a malformed golden: [{key!r}][{variant!r}] {problem}",
                                      _restore_fix(path))
    if not _no_duplicate_keys(data, goldens):
        duplicate = _duplicate_key(data)
        if duplicate:
            raise GoldenFileError(path, f"has the key {duplicate!r} twice in one object (only one would count)",
                                  _restore_fix(path))
    return goldens


_KEY_WITH_SPACE = re.compile(rb'"\s+:')


def _no_duplicate_keys(data: bytes, goldens: Goldens) -> bool:
    """A fast proof that no object in ``data`` repeats a key (False: take the exact, slow check).

    Inside a JSON string a quote is always escaped, so ``":`` not preceded by a backslash occurs
    once per key (a key ending in an escaped backslash takes the exact path). Every field of the
    schema is required, so the decoder kept exactly as many keys as the types say: when the two
    counts agree, no key was dropped as a duplicate.
    """
    if _KEY_WITH_SPACE.search(data) or b'\\\\":' in data or b'"goldens":' not in data:
        return False  # a key ending in an escaped backslash, or no goldens key: let the exact check decide
    kept = 3 + len(goldens)  # schema, logit_hash, goldens (all required to get here); the test keys
    for variants in goldens.values():
        kept += len(variants)
        for entry in variants.values():
            kept += 8 + _keys(entry.fingerprint) + len(entry.generation_config) + 5 * len(entry.steps)
    # ``":`` preceded by a backslash is an escaped quote inside a string (JSON in a prompt), not a key.
    return data.count(b'":') - data.count(b'\\":') == kept


def _keys(value: Any) -> int:
    return len(value) + sum(_keys(v) for v in value.values() if isinstance(v, dict)) if isinstance(value, dict) else 0


def _header(data: bytes) -> dict[str, Any] | None:
    """The schema fields alone, or None when even they cannot be read (too deep to skip)."""
    try:
        header = _HEADER.decode(data)
    except msgspec.ValidationError:  # not an object at all
        return {}
    except (msgspec.DecodeError, RecursionError):
        return None
    return {"schema": header.schema, "logit_hash": header.logit_hash}


def _check_header(path: Path, header: dict[str, Any]) -> None:
    __tracebackhide__ = True
    if header.get("schema") is None:
        raise GoldenFileError(path, "has no 'schema' field: it is not a pytest-llmdeterminism golden",
                              _restore_fix(path))
    schema = header["schema"]
    if type(schema) is not int or schema != SCHEMA_VERSION:
        kind = "" if type(schema) is int else f" (a {type(schema).__name__}, not an integer)"
        raise GoldenFileError(
            path, f"has schema version {schema!r}{kind}; this pytest-llmdeterminism reads version {SCHEMA_VERSION}",
            "If a newer pytest-llmdeterminism wrote it, upgrade (pip install -U pytest-llmdeterminism). "
            + _rerecord_fix(path),
        )
    if header.get("logit_hash") != LOGIT_HASH_DEFINITION:
        raise GoldenFileError(
            path, f"hashes logits as {header.get('logit_hash')!r}, not as {LOGIT_HASH_DEFINITION!r}",
            _rerecord_fix(path),
        )


def _where(error: msgspec.ValidationError) -> str:
    """msgspec's ``... - at `$.goldens.test_x.cpu/float32.steps[3].margin` `` in the file's own terms."""
    message = str(error)
    text, _, where = message.partition(" - at `")
    return f"{where.rstrip('`').removeprefix('$.')}: {text}" if where else message


def _locate(data: bytes, error: msgspec.ValidationError) -> str:
    """Which golden a validation error is in: ``['test_x']['cpu/float32'] steps[0].margin: ...``.

    msgspec abbreviates mapping keys in its error path, so the error path re-checks entry by entry.
    """
    try:
        document = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return _where(error)
    if not isinstance(document, dict) or not set(document) <= {"schema", "logit_hash", "goldens"}:
        return _where(error)
    goldens = document.get("goldens")
    if not isinstance(goldens, dict):
        return f"'goldens' is {_json_type(goldens)}, not an object of tests"
    for key, variants in goldens.items():
        if not isinstance(variants, dict):
            return f"[{key!r}] is {_json_type(variants)}, not an object of variants"
        for variant, entry in variants.items():
            try:
                msgspec.convert(entry, Entry)
            except msgspec.ValidationError as inner:
                return f"[{key!r}][{variant!r}] {_where(inner)}"
    return _where(error)


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _semantic_problem(entry: Entry, *, decoded_from_json: bool = False) -> str | None:
    """What the types cannot say: one top-k per step, text where the comparator expects text, and
    (for entries built in Python: JSON has no NaN or infinity) finite numbers everywhere."""
    for index, step in enumerate(entry.steps):
        if not step.top:
            return f"step {index} has an empty 'top'"
    for name in _TEXT_FINGERPRINT_FIELDS:
        value = entry.fingerprint.get(name)
        if value is not None and not isinstance(value, str):
            return f"fingerprint field {name!r} is {value!r}, expected a string"
    if decoded_from_json:
        return None
    sections: tuple[tuple[str, Mapping[str, Any]], ...] = (
        ("generation_config", entry.generation_config), ("fingerprint", entry.fingerprint))
    for section, values in sections:
        for name, number in values.items():
            if isinstance(number, float) and not math.isfinite(number):
                return f"{section} field {name!r} is {number!r}, not a finite number"
    return None


def _duplicate_key(data: bytes) -> str | None:
    """The first key that appears twice in one JSON object, or None (the slow, exact check)."""
    found: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in items]
        if not found and len(set(keys)) != len(keys):
            found.append(next(key for key in keys if keys.count(key) > 1))
        return dict(items)

    try:
        json.loads(data, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return None  # msgspec accepted it; nothing more to learn here
    return found[0] if found else None


def entry_problem(entry: Any) -> str | None:
    """What keeps ``entry`` from being one golden entry, or None."""
    try:
        to_struct(entry)
    except (msgspec.ValidationError, TypeError) as error:
        return _where(error) if isinstance(error, msgspec.ValidationError) else str(error)
    return None


def dumps(goldens: Mapping[str, Mapping[str, Entry | Mapping[str, Any]]]) -> str:
    """The file's text: keys sorted, objects one key per line, steps one per line.

    Entries (the 10k-goldens path) are written by :func:`_entry_text`; anything else, e.g. a
    hand-made dict in a test, by the generic :func:`_format`. Both give the same text.
    """
    lines = ["{", '  "goldens": {' if goldens else '  "goldens": {},']
    keys = sorted(goldens)
    for k_index, key in enumerate(keys):
        variants = goldens[key]
        lines.append(f"    {_key(key)}: {{" if variants else f"    {_key(key)}: {{}}" + ("," * (k_index < len(keys) - 1)))
        names = sorted(variants)
        for v_index, variant in enumerate(names):
            entry = variants[variant]
            text = _entry_text(entry) if isinstance(entry, Entry) else _format(entry, 3)
            lines.append(f"      {_key(variant)}: {text}" + ("," * (v_index < len(names) - 1)))
        if variants:
            lines.append("    }" + ("," * (k_index < len(keys) - 1)))
    if goldens:
        lines.append("  },")
    lines += [f'  "logit_hash": {_compact(LOGIT_HASH_DEFINITION)},', f'  "schema": {SCHEMA_VERSION}', "}"]
    return "\n".join(lines) + "\n"


def _key(key: str) -> str:
    return json.dumps(key)


def _entry_text(entry: Entry) -> str:
    inner = " " * 8
    steps = ",\n".join(f"{inner}  {_step_text(step)}" for step in entry.steps)
    fields = [
        f'"batch_shape": {encode_basestring(entry.batch_shape)}',
        f'"fingerprint": {_format(entry.fingerprint, 4)}',
        f'"finish_reason": {encode_basestring(entry.finish_reason)}',
        f'"generation_config": {_format(entry.generation_config, 4)}',
        f'"prompt": {encode_basestring(entry.prompt)}',
        *([f'"prompt_form": {encode_basestring(entry.prompt_form)}'] if entry.prompt_form != "text" else []),
        f'"prompt_token_ids": [{", ".join(map(str, entry.prompt_token_ids))}]',
        *([f'"step_hash": {encode_basestring(entry.step_hash)}'] if entry.step_hash != "logits" else []),
        f'"steps": [\n{steps}\n{inner}]' if entry.steps else '"steps": []',
        f'"text": {encode_basestring(entry.text)}',
    ]
    return "{\n" + ",\n".join(inner + field for field in fields) + "\n" + " " * 6 + "}"


_ENCODE = msgspec.json.Encoder(order="sorted").encode


def _step_text(step: Step) -> str:
    return _ENCODE(step).decode()


def _format(value: Any, depth: int) -> str:
    """Dicts one key per line; lists of dicts (steps) one compact item per line; else one line."""
    if isinstance(value, dict) and len(value) > 1:
        # A run's fingerprints and configs repeat across entries: format each distinct one once.
        return _format_dict(_ENCODE(value), depth)
    return _format_uncached(value, depth)


@functools.lru_cache(maxsize=256)
def _format_dict(encoded: bytes, depth: int) -> str:
    return _format_uncached(msgspec.json.decode(encoded), depth)


def _format_uncached(value: Any, depth: int) -> str:
    pad, inner = "  " * depth, "  " * (depth + 1)
    if isinstance(value, dict) and value:
        items = [f"{inner}{json.dumps(k)}: {_format(value[k], depth + 1)}" for k in sorted(value)]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, list) and any(isinstance(v, dict) for v in value):
        items = [f"{inner}{_ENCODE(v).decode()}" for v in value]
        return "[\n" + ",\n".join(items) + f"\n{pad}]"
    return _compact(value)


def _compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(", ", ": "), ensure_ascii=False,
                      allow_nan=False)


def write(path: Path, goldens: Mapping[str, Mapping[str, Entry | Mapping[str, Any]]]) -> None:
    """Write atomically: a temp file in the same folder, then ``os.replace``."""
    write_text_atomic(path, dumps(goldens))


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
        mode = 0o666 & ~_umask()
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


def _umask() -> int:
    current = os.umask(0o022)  # the only portable way to read it is to set it
    os.umask(current)
    return current


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
def _locked(path: Path) -> Iterator[None]:
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


def remove(path: Path, keys: Iterable[str]) -> None:
    """Delete ``keys`` (all their variants) from the file as it is on disk now; delete an emptied file."""
    with _locked(path):
        goldens = read(path)
        for key in keys:
            goldens.pop(key, None)
        if goldens:
            write(path, goldens)
        else:
            path.unlink(missing_ok=True)


def merge(path: Path, updates: Mapping[str, Mapping[str, Entry | Mapping[str, Any]]]) -> None:
    """Apply ``updates`` (key -> variant -> entry) to the file as it is on disk now, then write it.

    Under the folder's lock, re-reading at write time keeps entries that another process wrote
    since this one started. Other variants of the same key are never touched. Every entry is
    validated against the schema before anything is written.
    """
    validated = {key: {variant: to_struct(entry) for variant, entry in variants.items()}
                 for key, variants in updates.items()}
    with _locked(path):
        goldens = read(path)
        for key, variants in validated.items():
            goldens.setdefault(key, {}).update(variants)
        write(path, goldens)
