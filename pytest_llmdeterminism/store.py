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

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, cast

from pytest_llmdeterminism.capture import LOGIT_HASH_DEFINITION
from pytest_llmdeterminism.errors import GoldenFileError
from pytest_llmdeterminism.generation import Generation

SCHEMA_VERSION = 1
Goldens = dict[str, dict[str, dict[str, Any]]]  # test key -> variant -> entry

def _restore_fix(path: Path) -> str:
    return (f"Restore it from version control (git checkout -- {path}), or delete it and re-record "
            "with: pytest --llm-golden-update")


def _rerecord_fix(path: Path) -> str:
    return f"To start over: delete {path}, then run: pytest --llm-golden-update"


def to_entry(generation: Generation) -> dict[str, Any]:
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
    }


def from_entry(entry: Mapping[str, Any]) -> Generation:
    steps = entry["steps"]
    return Generation(
        prompt=entry["prompt"],
        prompt_token_ids=tuple(entry["prompt_token_ids"]),
        token_ids=tuple(s["token"] for s in steps),
        text=entry["text"],
        logit_hashes=tuple(s["hash"] for s in steps),
        top_logprobs=tuple(tuple((int(i), float(v)) for i, v in s["top"]) for s in steps),
        margins=tuple(float(s["margin"]) for s in steps),
        finish_reason=entry["finish_reason"],
        generation_config=entry["generation_config"],
        batch_shape=entry["batch_shape"],
        pieces=tuple(s.get("piece", "") for s in steps),
        fingerprint=entry.get("fingerprint", {}),
    )


def read(path: Path) -> Goldens:
    """The goldens in ``path`` ({} when it does not exist). Raises :class:`GoldenFileError`."""
    __tracebackhide__ = True
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    try:
        document = json.loads(data.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise GoldenFileError(path, f"is not valid JSON ({error})", _restore_fix(path)) from None
    if not isinstance(document, dict) or "schema" not in document:
        raise GoldenFileError(path, "has no 'schema' field: it is not a pytest-llmdeterminism golden",
                              _restore_fix(path))
    if document["schema"] != SCHEMA_VERSION:
        raise GoldenFileError(
            path, f"has schema version {document['schema']!r}; this pytest-llmdeterminism reads "
            f"version {SCHEMA_VERSION}",
            "If a newer pytest-llmdeterminism wrote it, upgrade (pip install -U pytest-llmdeterminism). "
            + _rerecord_fix(path),
        )
    if document.get("logit_hash") != LOGIT_HASH_DEFINITION:
        raise GoldenFileError(
            path, f"hashes logits as {document.get('logit_hash')!r}, not as {LOGIT_HASH_DEFINITION!r}",
            _rerecord_fix(path),
        )
    goldens = document.get("goldens")
    problem = _malformed(goldens)
    if problem:
        raise GoldenFileError(path, f"has a malformed golden: {problem}", _restore_fix(path))
    return cast(Goldens, goldens)


_ENTRY_FIELDS = {"prompt": str, "prompt_token_ids": list, "steps": list, "text": str, "finish_reason": str,
                 "generation_config": dict, "batch_shape": str}


def _malformed(goldens: Any) -> str | None:
    """What is wrong with a parsed ``goldens`` section (a hand edit, a bad merge), or None."""
    if not isinstance(goldens, dict):
        return "'goldens' is not an object"
    for key, variants in goldens.items():
        if not isinstance(variants, dict):
            return f"{key!r} is not an object of variants"
        for variant, entry in variants.items():
            where = f"[{key!r}][{variant!r}]"
            if not isinstance(entry, dict):
                return f"{where} is not an object"
            for field, kind in _ENTRY_FIELDS.items():
                if not isinstance(entry.get(field), kind):
                    return f"{where} field {field!r} is missing or not a {kind.__name__}"
            for index, step in enumerate(entry["steps"]):
                if not _step_ok(step):
                    return f"{where} step {index} needs hash (str), token (int), margin (number), top ([[int, number], ...])"
    return None


def entry_problem(entry: Any) -> str | None:
    """What keeps ``entry`` from being one golden entry, or None."""
    return _malformed({"entry": {"variant": entry}})


def _step_ok(step: Any) -> bool:
    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    return (isinstance(step, dict) and isinstance(step.get("hash"), str)
            and isinstance(step.get("token"), int) and not isinstance(step.get("token"), bool)
            and number(step.get("margin")) and isinstance(step.get("top"), list)
            and all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], int) and number(p[1])
                    for p in step["top"]))


def dumps(goldens: Goldens) -> str:
    document = {"goldens": goldens, "logit_hash": LOGIT_HASH_DEFINITION, "schema": SCHEMA_VERSION}
    return _format(document, 0) + "\n"


def _format(value: Any, depth: int) -> str:
    """Dicts one key per line; lists of dicts one item per line; everything else on one line."""
    pad, inner = "  " * depth, "  " * (depth + 1)
    if isinstance(value, dict) and value:
        items = [f"{inner}{json.dumps(k)}: {_format(value[k], depth + 1)}" for k in sorted(value)]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, list) and any(isinstance(v, dict) for v in value):
        items = [f"{inner}{_compact(v)}" for v in value]
        return "[\n" + ",\n".join(items) + f"\n{pad}]"
    return _compact(value)


def _compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(", ", ": "), ensure_ascii=False,
                      allow_nan=False)


def write(path: Path, goldens: Goldens) -> None:
    """Write atomically: a temp file in the same folder, then ``os.replace``."""
    write_text_atomic(path, dumps(goldens))


def write_text_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def remove(path: Path, keys: Iterable[str]) -> None:
    """Delete ``keys`` (all their variants) from the file as it is on disk now; delete an emptied file."""
    goldens = read(path)
    for key in keys:
        goldens.pop(key, None)
    if goldens:
        write(path, goldens)
    else:
        path.unlink(missing_ok=True)


def merge(path: Path, updates: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> None:
    """Apply ``updates`` (key -> variant -> entry) to the file as it is on disk now, then write it.

    Re-reading at write time keeps entries that another process wrote since this one started.
    Other variants of the same key are never touched.
    """
    goldens = read(path)
    for key, variants in updates.items():
        goldens.setdefault(key, {}).update({variant: dict(entry) for variant, entry in variants.items()})
    write(path, goldens)
