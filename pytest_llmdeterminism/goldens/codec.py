"""A golden file's bytes and its goldens: strict decoding that names the file and the place of any
problem, and the stable formatting every golden file is written in. Nothing is unpickled."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from json.encoder import encode_basestring
from pathlib import Path
from typing import Any

import msgspec

from pytest_llmdeterminism.errors import GoldenFileError
from pytest_llmdeterminism.generation import LOGIT_HASH_DEFINITION
from pytest_llmdeterminism.goldens.schema import (
    SCHEMA_VERSION,
    Entry,
    Goldens,
    Step,
    semantic_problem,
    validation_message,
)


class _Document(msgspec.Struct, forbid_unknown_fields=True):
    schema: Any = None  # checked by _check_header, which names a missing or newer schema
    logit_hash: Any = None
    goldens: dict[str, dict[str, Entry]] = msgspec.field(default_factory=dict)


class _Header(msgspec.Struct):
    schema: Any = None
    logit_hash: Any = None


_DOCUMENT = msgspec.json.Decoder(_Document)
_HEADER = msgspec.json.Decoder(_Header)


def _restore_fix(path: Path) -> str:
    return (f"Restore it from version control (git checkout -- {path}), or delete it and re-record "
            "with: pytest --llm-golden-update")


def _rerecord_fix(path: Path) -> str:
    return f"To start over: delete {path}, then run: pytest --llm-golden-update"


def parse(path: Path, data: bytes) -> Goldens:
    """Decode and validate one golden file's bytes; ``path`` names it in errors."""
    __tracebackhide__ = True
    try:
        document = _DOCUMENT.decode(data)
    except msgspec.ValidationError as error:
        header = _header(data)
        if header is not None:  # a file of another schema is named as such, not as malformed
            _check_header(path, header)
        raise GoldenFileError(path, f"has a malformed golden: {_locate(data, error)}",
                              _restore_fix(path)) from None
    except msgspec.DecodeError as error:
        raise GoldenFileError(path, f"is not valid JSON ({error})", _restore_fix(path)) from None
    except RecursionError:
        raise GoldenFileError(path, "nests JSON too deeply to be a golden", _restore_fix(path)) from None
    _check_header(path, {"schema": document.schema, "logit_hash": document.logit_hash})
    goldens = document.goldens
    for key, variants in goldens.items():
        for variant, entry in variants.items():
            problem = semantic_problem(entry, decoded_from_json=True)
            if problem:
                raise GoldenFileError(path, f"has a malformed golden: [{key!r}][{variant!r}] {problem}",
                                      _restore_fix(path))
    if not _no_duplicate_keys(data, goldens):
        duplicate = _duplicate_key(data)
        if duplicate:
            twice = f"has the key {duplicate!r} twice in one object (only one would count)"
            raise GoldenFileError(path, twice, _restore_fix(path))
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
    if not isinstance(value, dict):
        return 0
    return len(value) + sum(_keys(v) for v in value.values() if isinstance(v, dict))


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
            path,
            f"has schema version {schema!r}{kind}; this pytest-llmdeterminism reads version {SCHEMA_VERSION}",
            "If a newer pytest-llmdeterminism wrote it, upgrade (pip install -U pytest-llmdeterminism). "
            + _rerecord_fix(path),
        )
    if header.get("logit_hash") != LOGIT_HASH_DEFINITION:
        raise GoldenFileError(
            path, f"hashes logits as {header.get('logit_hash')!r}, not as {LOGIT_HASH_DEFINITION!r}",
            _rerecord_fix(path),
        )


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


def dumps(goldens: Mapping[str, Mapping[str, Entry | Mapping[str, Any]]]) -> str:
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
            text = _entry_text(entry) if isinstance(entry, Entry) else _format(entry, 3)
            lines.append(f"      {_key(variant)}: {text}" + ("," * (v_index < len(names) - 1)))
        if variants:
            lines.append("    }" + comma)
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

