"""The golden entry: its schema (declared once, decoded strictly), the rules its types cannot say,
and its conversion from and to a :class:`~pytest_llmdeterminism.generation.Generation`.

A golden file holds one entry per test key and variant::

    {
      "goldens": {
        "test_capital": {                 # test name, plus "::name" or "#n" for extra checks
          "cpu/float32": { ...entry... }  # one variant per device class and dtype
        }
      },
      "schema": "pytest-llmdeterminism/golden/2"   # 3 where the file holds a score entry
    }

``schema`` is a short versioned id, never prose: rewording a docstring changes no golden. What the
step hashes hash differs by engine, so each entry says it (``step_hash``, an id of
:data:`~pytest_llmdeterminism.generation.HASH_DEFINITIONS`; absent means ``logits``). Files of
format 1 (``"schema": 1`` and a ``logit_hash`` sentence naming the logits definition for the whole
file) are still read; they are written in the current format the next time they are written.

Each entry's ``steps`` list has one line per generated token, so a review diff shows exactly the
steps that changed.

A golden holds text that a reviewer reads in a diff: its ``prompt``, its ``text`` and its steps'
``piece`` s together hold at most :data:`MAX_TEXT_CHARS` characters each (the pieces repeat the text,
so a file holds every output twice), and every string is valid Unicode (UTF-8, the file's encoding,
cannot hold a lone surrogate). The same limits hold when a golden is written and when it is read, so
nothing is written that a later read refuses.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import msgspec

from pytest_llmdeterminism.generation import Generation, Score
from pytest_llmdeterminism.goldens import kinds
from pytest_llmdeterminism.goldens.fields import (
    FORMAT,
    FORMAT_VERSION,
    GENERATION_FORMAT,
    LEGACY_FORMAT,
    MAX_TEXT_CHARS,
    READ_FORMATS,
    SCORED,
    TEXT_FINGERPRINT_FIELDS,
    VOCABULARY_IDS,
    AnyEntry,
    Entry,
    Goldens,
    KindEntry,
    Position,
    Step,
    TextProblem,
    text_problem,
    validation_message,
)
from pytest_llmdeterminism.goldens.kinds.score import score_settings

# The entry's fields are declared in goldens.fields, each kind's meaning of them in goldens.kinds;
# this module keeps their old import path.
__all__ = ["FORMAT", "FORMAT_VERSION", "GENERATION_FORMAT", "LEGACY_FORMAT", "MAX_TEXT_CHARS", "READ_FORMATS",
           "SCORED", "VOCABULARY_IDS", "AnyEntry", "Entry", "Goldens", "KindEntry", "Position", "Step",
           "TextProblem", "entry_problem", "from_entry", "generation_problem", "score_settings",
           "semantic_problem", "text_problem", "to_entry", "to_struct", "validation_message"]


def to_entry(generation: Generation | Score) -> dict[str, Any]:
    """The JSON form of ``generation`` (or any record of a kind), as its kind writes it."""
    return kinds.of(generation).to_entry(generation)


def to_struct(entry: AnyEntry | Mapping[str, Any]) -> AnyEntry:
    """``entry`` as a validated entry of its kind (an :class:`Entry` for the built-in kinds);
    ``msgspec.ValidationError`` says what is wrong. A struct was validated where it entered (parsed
    from a golden file, or captured from a record by this function): it is returned as it is."""
    if isinstance(entry, (Entry, KindEntry)):
        return entry
    converted: AnyEntry = msgspec.convert(entry, kinds.entry_type(entry.get("kind", kinds.GENERATION.name)))
    problem = semantic_problem(converted)
    if problem:
        raise msgspec.ValidationError(problem)
    return converted


def from_entry(entry: AnyEntry | Mapping[str, Any]) -> Generation | Score:
    """The record ``entry`` holds, as its kind (``entry.kind``) reads it."""
    entry = to_struct(entry)
    return kinds.named(entry.kind).from_entry(entry)  # type: ignore[no-any-return]


def entry_problem(entry: Any) -> str | None:
    """What keeps ``entry`` from being one golden entry, or None."""
    try:
        to_struct(entry)
    except (msgspec.ValidationError, TypeError) as error:
        return validation_message(error) if isinstance(error, msgspec.ValidationError) else str(error)
    return None


def generation_problem(generation: Generation | Score) -> TextProblem | None:
    """What keeps ``generation`` (or a score) out of a golden (see :func:`text_problem`), or None."""
    return text_problem(kinds.of(generation).stored_texts(generation))


def semantic_problem(entry: AnyEntry, *, decoded_from_json: bool = False) -> str | None:
    """What the types cannot say: one top-k per step, text where the comparator expects text, at
    most :data:`MAX_TEXT_CHARS` characters in the steps' pieces together, and (for entries built in
    Python: JSON has no NaN or infinity, nor a lone surrogate) finite numbers and valid Unicode
    everywhere."""
    kind = kinds.named(entry.kind)
    kind_problem = kind.entry_problem(entry)  # what the entry's kind requires beyond the types
    if kind_problem:
        return kind_problem
    for name in TEXT_FINGERPRINT_FIELDS:
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
    unstorable = text_problem(kind.entry_texts(entry))
    if unstorable:
        return str(unstorable).replace("its ", "", 1)
    try:
        msgspec.json.encode(entry)  # every other string (fingerprint, config, their keys): UTF-8 or not
    except UnicodeEncodeError as error:
        return (f"holds a lone surrogate {error.object[error.start]!r} in a fingerprint or generation_config "
                "string, which is not valid Unicode (UTF-8, a golden file's encoding, cannot hold it)")
    return None
