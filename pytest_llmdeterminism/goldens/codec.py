"""A golden file's bytes and its goldens: strict decoding that names the file and the place of any
problem, and the stable formatting every golden file is written in. Nothing is unpickled.

Long: decoding and formatting are one format read and written; the fast duplicate-key proof and the
entry-by-entry path for plugged-in kinds must agree with the one-pass decoding they stand beside.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from json.encoder import encode_basestring
from pathlib import Path
from typing import Any, cast

import msgspec

from pytest_llmdeterminism.errors import GoldenFileError
from pytest_llmdeterminism.goldens import kinds
from pytest_llmdeterminism.goldens.schema import (
    FORMAT,
    FORMAT_VERSION,
    GENERATION_FORMAT,
    LEGACY_FORMAT,
    READ_FORMATS,
    AnyEntry,
    Entry,
    Goldens,
    KindEntry,
    Position,
    Step,
    semantic_problem,
    validation_message,
)

# Format 1's header named the hashed bytes in a sentence, for the whole file. Frozen here, word for
# word: the format-1 goldens already committed must keep reading, whatever the docs say today.
LEGACY_LOGIT_HASH = (
    "xxh3_64 hex digest of the model forward's output logits at the last position of each row, "
    "before any logits processor, cast to float32, as little-endian bytes"
)
_FORMAT_ID = re.compile(r"pytest-llmdeterminism/golden/([0-9]{1,9})")
_NOT_GIVEN: Any = msgspec.UNSET  # a header field absent from the file, told apart from a null one


class _Document(msgspec.Struct, forbid_unknown_fields=True):
    schema: Any = _NOT_GIVEN  # checked by _check_header, which names a missing, older or newer format
    logit_hash: Any = _NOT_GIVEN  # format 1 only
    goldens: dict[str, dict[str, Entry]] = msgspec.field(default_factory=dict)


class _MixedDocument(msgspec.Struct, forbid_unknown_fields=True):
    """A file read while a plugged-in kind is registered: each entry decoded as its kind's, one by one."""

    schema: Any = _NOT_GIVEN
    logit_hash: Any = _NOT_GIVEN
    goldens: dict[str, dict[str, msgspec.Raw]] = msgspec.field(default_factory=dict)


class _KindOf(msgspec.Struct):
    kind: Any = "generation"  # absent: a generation (formats 1 and 2 have no "kind")


class _Header(msgspec.Struct):
    schema: Any = _NOT_GIVEN
    logit_hash: Any = _NOT_GIVEN


_DOCUMENT = msgspec.json.Decoder(_Document)
_MIXED = msgspec.json.Decoder(_MixedDocument)
_KIND = msgspec.json.Decoder(_KindOf)
_HEADER = msgspec.json.Decoder(_Header)
# An editor's or a shell's encoding, named: JSON has no byte-order mark (msgspec says "invalid
# character (byte 0)"). UTF-16 is what Windows PowerShell 5's `>` writes.
_BYTE_ORDER_MARKS = ((b"\xef\xbb\xbf", "a UTF-8 byte-order mark (EF BB BF)", "save it without BOM"),
                     (b"\xff\xfe", "a UTF-16 byte-order mark (FF FE): it is UTF-16", "save it as UTF-8"),
                     (b"\xfe\xff", "a UTF-16 byte-order mark (FE FF): it is UTF-16", "save it as UTF-8"))


def _restore_fix(path: Path) -> str:
    return (f"Restore it from version control (git checkout -- {path}), or delete it and re-record "
            "with: pytest --llm-golden-update")


def _rerecord_fix(path: Path) -> str:
    return f"To start over: delete {path}, then run: pytest --llm-golden-update"


def parse(path: Path, data: bytes) -> Goldens:
    """Decode and validate one golden file's bytes; ``path`` names it in errors."""
    __tracebackhide__ = True
    for mark, what, fix in _BYTE_ORDER_MARKS:
        if data.startswith(mark):
            raise GoldenFileError(path, f"starts with {what}, which JSON does not allow",
                                  f"In your editor, {fix} (plain UTF-8). Or: " + _restore_fix(path))
    try:
        document: _Document | _MixedDocument | None = _DOCUMENT.decode(data)
    except msgspec.ValidationError as error:
        # Built-in entries only decode at C speed in one pass; a file holding an entry of a plugged-in
        # kind (an eval's) is decoded again, entry by entry, each as its kind's. Where that fails on no
        # plugged-in entry, the one-pass error stands: it names the built-in field that is wrong.
        document = _mixed_document(path, data) if kinds.plugged_in() else None
        if document is not None:
            return _validated(path, data, document)
        header = _header(data)
        if header is not None:  # a file of another format is named as such, not as malformed
            _check_header(path, *header)
        raise GoldenFileError(path, f"has a malformed golden: {_locate(data, error)}",
                              _restore_fix(path)) from None
    except msgspec.DecodeError as error:
        raise GoldenFileError(path, f"is not valid JSON ({error})", _restore_fix(path)) from None
    except RecursionError:
        raise GoldenFileError(path, "nests JSON too deeply to be a golden", _restore_fix(path)) from None
    assert document is not None
    return _validated(path, data, document)


def _mixed_document(path: Path, data: bytes) -> _MixedDocument | None:
    """``data`` decoded entry by entry as each entry's kind's; None where that fails other than on an
    entry of a plugged-in kind (whose error is raised)."""
    __tracebackhide__ = True
    try:
        document = _MIXED.decode(data)
        goldens = _entries_of_their_kinds(path, document.goldens)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return None
    if goldens is None:
        return None
    document.goldens = goldens  # type: ignore[assignment]
    return document


def _validated(path: Path, data: bytes, document: _Document | _MixedDocument) -> Goldens:
    __tracebackhide__ = True
    _check_header(path, document.schema, document.logit_hash)
    goldens = cast(Goldens, document.goldens)
    for key, variants in goldens.items():
        for variant, entry in variants.items():
            problem = semantic_problem(entry, decoded_from_json=True)
            if problem:
                raise GoldenFileError(path, f"has a malformed golden: [{key!r}][{variant!r}] {problem}",
                                      _restore_fix(path))
    if not _no_duplicate_keys(data, goldens, header_keys=1 + (document.logit_hash is not _NOT_GIVEN)):
        duplicate = _duplicate_key(data)
        if duplicate:
            twice = f"has the key {duplicate!r} twice in one object (only one would count)"
            raise GoldenFileError(path, twice, _restore_fix(path))
    return goldens


def _entries_of_their_kinds(path: Path, raw: dict[str, dict[str, msgspec.Raw]]) -> Goldens | None:
    """Each raw entry decoded as its kind's entry type (its ``kind`` read first); None where a
    built-in entry fails (the one-pass decoding's error names it)."""
    __tracebackhide__ = True
    goldens: Goldens = {}
    for key, variants in raw.items():
        goldens[key] = {}
        for variant, entry in variants.items():
            entry_type = kinds.entry_type(_KIND.decode(entry).kind)
            try:
                goldens[key][variant] = _decoder(entry_type).decode(entry)
            except msgspec.ValidationError as error:
                if entry_type is Entry:
                    return None
                raise GoldenFileError(path, f"has a malformed golden: [{key!r}][{variant!r}] "
                                      f"{validation_message(error)}", _restore_fix(path)) from None
    return goldens


@functools.lru_cache(maxsize=16)
def _decoder(entry_type: type) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(entry_type)


_KEY_WITH_SPACE = re.compile(rb'"\s+:')
# Every JSON string, in order (a string never holds an unescaped quote, so a left-to-right scan keeps to
# the strings' own boundaries), with the colon right after it where it is a key.
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"(:)?')


def _no_duplicate_keys(data: bytes, goldens: Goldens, *, header_keys: int) -> bool:
    """A fast proof that no object in ``data`` repeats a key (False: take the exact, slow check).

    The keys are counted by one scan over the file's strings (a string followed by a colon is a key;
    a string value that starts with a colon, a tokenizer's ``":"`` piece, is not). Every key counted
    below was kept by the decoder (a required field, or an optional one with a value only the file can
    have given), so when the two counts agree, no key was dropped as a duplicate. ``header_keys``:
    the header fields present (``schema``, and format 1's ``logit_hash``).
    """
    if _KEY_WITH_SPACE.search(data) or b'"goldens":' not in data:
        return False  # a key before a space (this codec writes none), or no goldens key: the exact check
    kept = header_keys + 1 + len(goldens)  # the header, goldens (required to get here), the test keys
    for variants in goldens.values():
        kept += len(variants)
        for entry in variants.values():
            own = kinds.named(entry.kind).entry_keys(entry)  # its fields' keys, as its kind counts them
            if own is None:
                return False
            kept += own + _keys(entry.fingerprint) + len(entry.generation_config)
    return _STRINGS.findall(data).count(b":") == kept


def _keys(value: Any) -> int:
    if not isinstance(value, dict):
        return 0
    return len(value) + sum(_keys(v) for v in value.values() if isinstance(v, dict))


def declares_golden_format(data: bytes) -> bool:
    """``data`` is a JSON object whose ``schema`` names a golden format (any version, this one's,
    format 1's or a newer one): a golden file, however broken the rest; not any other JSON."""
    header = _header(data)
    if header is None:
        return False
    schema, _ = header
    if type(schema) is int:
        return schema == LEGACY_FORMAT
    return isinstance(schema, str) and _FORMAT_ID.fullmatch(schema) is not None


def _header(data: bytes) -> tuple[Any, Any] | None:
    """The header fields alone, or None when even they cannot be read (too deep to skip)."""
    try:
        header = _HEADER.decode(data)
    except msgspec.ValidationError:  # not an object at all
        return _NOT_GIVEN, _NOT_GIVEN
    except (msgspec.DecodeError, RecursionError):
        return None
    return header.schema, header.logit_hash


def _check_header(path: Path, schema: Any, logit_hash: Any) -> None:
    """The file is in a format this version reads: ``FORMAT``, or format 1 with its own sentence."""
    __tracebackhide__ = True
    reads = (f'this pytest-llmdeterminism reads "schema": {FORMAT!r} and, from older files, '
             f'{GENERATION_FORMAT!r} and "schema": 1')
    upgrade = "If a newer pytest-llmdeterminism wrote it, upgrade (pip install -U pytest-llmdeterminism). "
    if schema is _NOT_GIVEN or schema is None:
        raise GoldenFileError(path, "has no 'schema' field: it is not a pytest-llmdeterminism golden",
                              _restore_fix(path))
    if type(schema) is int and schema == LEGACY_FORMAT:
        if logit_hash is _NOT_GIVEN:
            raise GoldenFileError(path, "has \"schema\": 1 without its 'logit_hash' field",
                                  _restore_fix(path))
        if logit_hash != LEGACY_LOGIT_HASH:
            raise GoldenFileError(path, f"hashes logits as {logit_hash!r}, not as {LEGACY_LOGIT_HASH!r}",
                                  _rerecord_fix(path))
        return
    version = _FORMAT_ID.fullmatch(schema) if isinstance(schema, str) else None
    if version is not None and int(version[1]) > FORMAT_VERSION:
        raise GoldenFileError(
            path, f"is in golden format {int(version[1])} ({schema!r}), newer than this "
            f"pytest-llmdeterminism reads (format {FORMAT_VERSION}, {FORMAT!r}, and older)",
            "A newer pytest-llmdeterminism wrote it: upgrade (pip install -U pytest-llmdeterminism). "
            + _rerecord_fix(path))
    if schema not in READ_FORMATS:
        kind = "" if type(schema) is int else f" (a {type(schema).__name__})"
        raise GoldenFileError(path, f"has schema version {schema!r}{kind}, which no pytest-llmdeterminism "
                              f"wrote; {reads}", upgrade + _rerecord_fix(path))
    if logit_hash is not _NOT_GIVEN:
        raise GoldenFileError(path, f"has a 'logit_hash' field, which format {schema!r} does not have "
                              "(each entry's 'step_hash' says what its hashes hash)", _restore_fix(path))


def _locate(data: bytes, error: msgspec.ValidationError) -> str:
    """Which golden a validation error is in: ``['test_x']['cpu/float32'] steps[0].margin: ...``.

    msgspec abbreviates mapping keys in its error path, so the error path re-checks entry by entry.
    """
    try:
        document = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return validation_message(error)
    if not isinstance(document, dict) or not set(document) <= {"schema", "logit_hash", "goldens"}:
        return validation_message(error)
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
                return f"[{key!r}][{variant!r}] {validation_message(inner)}"
    return validation_message(error)


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
             float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


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


def dumps(goldens: Mapping[str, Mapping[str, AnyEntry | Mapping[str, Any]]]) -> str:
    """The file's text: keys sorted, objects one key per line, steps one per line.

    Entries (the 10k-goldens path) are written by :func:`_entry_text`; anything else, e.g. a
    hand-made dict in a test, by the generic :func:`_format`. Both give the same text.
    """
    lines = ["{", '  "goldens": {' if goldens else '  "goldens": {},']
    keys = sorted(goldens)
    for k_index, key in enumerate(keys):
        variants = goldens[key]
        comma = "," * (k_index < len(keys) - 1)
        lines.append(f"    {_key(key)}: {{" if variants else f"    {_key(key)}: {{}}" + comma)
        names = sorted(variants)
        for v_index, variant in enumerate(names):
            entry = variants[variant]
            if isinstance(entry, Entry):
                text = _entry_text(entry)
            else:  # a plugged-in kind's entry, or a hand-made dict
                text = _format(msgspec.to_builtins(entry) if isinstance(entry, KindEntry) else entry, 3)
            lines.append(f"      {_key(variant)}: {text}" + ("," * (v_index < len(names) - 1)))
        if variants:
            lines.append("    }" + comma)
    if goldens:
        lines.append("  },")
    lines += [f'  "schema": {_compact(written_format(goldens))}', "}"]
    return "\n".join(lines) + "\n"


def written_format(goldens: Mapping[str, Mapping[str, AnyEntry | Mapping[str, Any]]]) -> str:
    """The format a file of ``goldens`` is written in: the oldest that holds its entries (format 2
    unless one of its entries' kinds needs format 3, a score's), so that a file of generations keeps
    its bytes."""
    held = {entry.kind if isinstance(entry, (Entry, KindEntry)) else entry.get("kind", kinds.GENERATION.name)
            for variants in goldens.values() for entry in variants.values()}
    return FORMAT if any(kinds.named(kind).format == FORMAT for kind in held) else GENERATION_FORMAT


def _key(key: str) -> str:
    return json.dumps(key)


def _entry_text(entry: Entry) -> str:
    inner = " " * 8
    steps = ",\n".join(f"{inner}  {_step_text(step)}" for step in entry.steps)
    positions = ",\n".join(f"{inner}  {_step_text(position)}" for position in entry.positions or ())
    fields = [
        f'"batch_shape": {encode_basestring(entry.batch_shape)}',
        *([f'"draw_margins": {_compact(list(entry.draw_margins))}']
          if entry.draw_margins is not None else []),
        f'"fingerprint": {_format(entry.fingerprint, 4)}',
        f'"finish_reason": {encode_basestring(entry.finish_reason)}',
        f'"generation_config": {_format(entry.generation_config, 4)}',
        *([f'"kind": {encode_basestring(entry.kind)}'] if entry.kind != "generation" else []),
        *([f'"positions": [\n{positions}\n{inner}]'] if entry.positions is not None else []),
        f'"prompt": {encode_basestring(entry.prompt)}',
        *([f'"prompt_form": {encode_basestring(entry.prompt_form)}'] if entry.prompt_form != "text" else []),
        *([f'"prompt_logprobs": {_compact(list(entry.prompt_logprobs))}']
          if entry.prompt_logprobs is not None else []),
        f'"prompt_token_ids": [{", ".join(map(str, entry.prompt_token_ids))}]',
        *([f'"step_hash": {encode_basestring(entry.step_hash)}'] if entry.step_hash != "logits" else []),
        f'"steps": [\n{steps}\n{inner}]' if entry.steps else '"steps": []',
        f'"text": {encode_basestring(entry.text)}',
    ]
    return "{\n" + ",\n".join(inner + field for field in fields) + "\n" + " " * 6 + "}"


_ENCODE = msgspec.json.Encoder(order="sorted").encode


def _step_text(step: Step | Position) -> str:
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

