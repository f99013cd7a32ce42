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
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from pytest_llmdeterminism.capture import LOGIT_HASH_DEFINITION
from pytest_llmdeterminism.errors import GoldenFileError
from pytest_llmdeterminism.generation import Generation

SCHEMA_VERSION = 1
Goldens = dict[str, dict[str, dict[str, Any]]]  # test key -> variant -> entry

_RESTORE_FIX = ("Restore it from version control (git checkout -- FILE) or delete it and re-record "
                "with: pytest --llm-golden-update")


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
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    try:
        document = json.loads(data.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise GoldenFileError(path, f"is not valid JSON ({error})", _RESTORE_FIX) from None
    if not isinstance(document, dict) or "schema" not in document:
        raise GoldenFileError(path, "has no 'schema' field: it is not a pytest-llmdeterminism golden",
                              _RESTORE_FIX)
    if document["schema"] != SCHEMA_VERSION:
        raise GoldenFileError(
            path, f"has schema version {document['schema']!r}; this pytest-llmdeterminism reads "
            f"version {SCHEMA_VERSION}",
            "Use the pytest-llmdeterminism version that wrote it (pip install -U pytest-llmdeterminism), "
            "or re-record with: pytest --llm-golden-update",
        )
    if document.get("logit_hash") != LOGIT_HASH_DEFINITION:
        raise GoldenFileError(
            path, f"hashes logits as {document.get('logit_hash')!r}, not as {LOGIT_HASH_DEFINITION!r}",
            "Re-record with: pytest --llm-golden-update",
        )
    goldens = document.get("goldens")
    if not _well_formed(goldens):
        raise GoldenFileError(path, "has a malformed 'goldens' section", _RESTORE_FIX)
    return cast(Goldens, goldens)


def _well_formed(goldens: Any) -> bool:
    required = {"prompt", "prompt_token_ids", "steps", "text", "finish_reason", "generation_config",
                "batch_shape"}
    return isinstance(goldens, dict) and all(
        isinstance(variants, dict) and all(
            isinstance(entry, dict) and required <= entry.keys() and isinstance(entry["steps"], list)
            for entry in variants.values()
        )
        for variants in goldens.values()
    )


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
    path.parent.mkdir(parents=True, exist_ok=True)
    text = dumps(goldens)
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


def merge(path: Path, updates: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> None:
    """Apply ``updates`` (key -> variant -> entry) to the file as it is on disk now, then write it.

    Re-reading at write time keeps entries that another process wrote since this one started.
    Other variants of the same key are never touched.
    """
    goldens = read(path)
    for key, variants in updates.items():
        goldens.setdefault(key, {}).update({variant: dict(entry) for variant, entry in variants.items()})
    write(path, goldens)
