"""The golden entry: its schema (declared once, decoded strictly), the rules its types cannot say,
and its conversion from and to a :class:`~pytest_llmdeterminism.generation.Generation`.

A golden file holds one entry per test key and variant::

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

import math
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union

import msgspec

from pytest_llmdeterminism.generation import LOGPROB_FLOOR, Generation, HashDefinition, PromptForm

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


Goldens = dict[str, dict[str, Entry]]  # test key -> variant -> entry
# Fingerprint fields that the comparator reads as text.
_TEXT_FINGERPRINT_FIELDS = ("device_class", "dtype", "cpu_numerics", "machine")


def to_entry(generation: Generation) -> dict[str, Any]:
    """The JSON form of ``generation`` (plain types: it travels between xdist processes)."""
    steps = [
        {"hash": h, "margin": m, "piece": p, "token": t, "top": [list(pair) for pair in top]}
        for t, p, h, m, top in zip(
            generation.token_ids, generation.pieces or [""] * len(generation.token_ids),
            generation.logit_hashes, generation.margins, generation.top_logprobs, strict=True,
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
    problem = semantic_problem(converted)
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


def entry_problem(entry: Any) -> str | None:
    """What keeps ``entry`` from being one golden entry, or None."""
    try:
        to_struct(entry)
    except (msgspec.ValidationError, TypeError) as error:
        return validation_message(error) if isinstance(error, msgspec.ValidationError) else str(error)
    return None


def validation_message(error: msgspec.ValidationError) -> str:
    """msgspec's ``... - at `$.goldens.test_x.cpu/float32.steps[3].margin` `` in the file's own terms."""
    message = str(error)
    text, _, where = message.partition(" - at `")
    return f"{where.rstrip('`').removeprefix('$.')}: {text}" if where else message


def semantic_problem(entry: Entry, *, decoded_from_json: bool = False) -> str | None:
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

