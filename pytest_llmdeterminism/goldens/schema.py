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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

import msgspec

from pytest_llmdeterminism.generation import (
    LOGPROB_FLOOR,
    TEXT_ONLY_IDS,
    Generation,
    HashDefinition,
    PromptForm,
    Score,
)

FORMAT_VERSION = 3
FORMAT = f"pytest-llmdeterminism/golden/{FORMAT_VERSION}"  # the newest "schema" this version reads
# Format 3 added score entries (``"kind": "score"``); a file holding none is still written in format 2,
# byte for byte as before (and readable by older versions): the header is the oldest format that holds
# the file's entries.
GENERATION_FORMAT = "pytest-llmdeterminism/golden/2"
READ_FORMATS = (GENERATION_FORMAT, FORMAT)
LEGACY_FORMAT = 1  # "schema": 1, with a "logit_hash" sentence: read, never written

# The golden schema, declared once and decoded strictly (msgspec validates while it parses, in C):
# finite floats in the ranges capture can produce, token ids in the ranges engines produce, strings
# where strings belong. A golden that does not fit is one GoldenFileError naming the file and the place.
VOCABULARY_IDS = 1 << 31  # every engine's vocabulary ids are int32
# A step's ids also include a served token's text-only id (TEXT_ONLY_IDS + an xxh32 of its text).
_TEXT_ONLY_END = TEXT_ONLY_IDS + (1 << 32)
VocabularyId = Annotated[int, msgspec.Meta(ge=0, lt=VOCABULARY_IDS)]
TokenId = Annotated[int, msgspec.Meta(ge=0, lt=_TEXT_ONLY_END)]  # the gap between is semantic_problem's
_TOKEN_IDS = ("a token id (a vocabulary's are below 2**31, a served token's text-only id is 2**40 plus "
              "a 32-bit hash)")
# A golden's prompt, its text, and its steps' pieces together: at most this many characters each. A
# million characters is ~250k tokens, beyond any test's output or prompt; an 8 MB answer would make a
# 16 MB file (the pieces repeat the text) that no review reads.
MAX_TEXT_CHARS = 1_000_000
Text = Annotated[str, msgspec.Meta(max_length=MAX_TEXT_CHARS)]
Logprob = Annotated[float, msgspec.Meta(ge=LOGPROB_FLOOR, le=0.0)]
Margin = Annotated[float, msgspec.Meta(ge=0.0, le=-LOGPROB_FLOOR)]
StepHash = Annotated[str, msgspec.Meta(min_length=16, max_length=16)]  # xxh3-64, hex
Scalar = Union[str, int, float, bool, None]  # noqa: UP007 - msgspec reads the annotation at run time
# The fingerprint is two levels deep at most (``flags`` -> ``fp32_precision`` -> knob).
FingerprintValue = Union[Scalar, dict[str, Union[Scalar, dict[str, Scalar]]]]  # noqa: UP007


# Every field is required (the writer always writes them all): a missing field is named, and the
# fast duplicate-key proof can count keys from the types alone.
class Step(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    # Fields in sorted order: a step is written as msgspec encodes it, one compact line.
    hash: StepHash
    margin: Margin
    piece: str
    token: TokenId
    top: tuple[tuple[TokenId, Logprob], ...]


class Position(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """One position of a score entry: the given token, its logprob and rank (``null``: the engine did
    not say), the hash of the logits row that predicts it, the top-k, and the given token's distance
    to its nearest neighbour in rank (``null``: unknown). Fields in sorted order, one compact line."""

    hash: StepHash
    logprob: Logprob
    piece: str
    rank: Annotated[int, msgspec.Meta(ge=1, lt=VOCABULARY_IDS)] | None
    rank_margin: Margin | None
    token: TokenId
    top: tuple[tuple[TokenId, Logprob], ...]


# A score entry's ``finish_reason`` (a score is teacher-forced: nothing finished).
SCORED = "scored"


class Entry(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """One recorded generation or score (``kind``): one variant of one golden. A score entry (format
    3) holds its continuation in ``text``, one ``positions`` line per continuation token, no
    ``steps``, ``finish_reason`` ``"scored"`` and its settings in ``generation_config``."""

    batch_shape: Annotated[str, msgspec.Meta(pattern=r"^[0-9]+x[0-9]+\Z")]
    finish_reason: str
    generation_config: dict[str, Union[Scalar, list[Scalar]]]  # noqa: UP007
    prompt: Text
    prompt_token_ids: tuple[VocabularyId, ...]
    steps: list[Step]
    text: Text
    fingerprint: dict[str, FingerprintValue]
    prompt_form: Literal["text", "chat", "token_ids"] = "text"  # written only when not "text"
    # What the steps' hashes hash (generation.HASH_DEFINITIONS); written only when not "logits" (the
    # definition of the transformers and llama.cpp engines). An unknown one is refused: its hashes
    # could not be compared.
    step_hash: Literal["logits", "served-topk", "vllm-topk"] = "logits"
    # Sampled generations (do_sample=True) only: per step, the draw margin (the drawn token's perturbed
    # score minus the runner-up's). Greedy goldens never carry it.
    draw_margins: tuple[Margin, ...] | None = None
    # Format 3: "generation" (written only when not: absent in every older golden) or "score".
    kind: Literal["generation", "score"] = "generation"
    positions: list[Position] | None = None  # score entries only
    prompt_logprobs: tuple[Logprob | None, ...] | None = None  # score entries that asked for them


Goldens = dict[str, dict[str, Entry]]  # test key -> variant -> entry
# Fingerprint fields that the comparator reads as text.
_TEXT_FINGERPRINT_FIELDS = ("device_class", "dtype", "cpu_numerics", "machine")


def to_entry(generation: Generation | Score) -> dict[str, Any]:
    """The JSON form of ``generation`` (plain types: it travels between xdist processes)."""
    if isinstance(generation, Score):
        return _score_entry(generation)
    steps = [
        {"hash": h, "margin": m, "piece": p, "token": t, "top": [list(pair) for pair in top]}
        for t, p, h, m, top in zip(
            generation.token_ids, generation.pieces or [""] * len(generation.token_ids),
            generation.step_hashes, generation.margins, generation.top_logprobs, strict=True,
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
        **({"draw_margins": list(generation.draw_margins)} if generation.draw_margins else {}),
    }


def score_settings(score: Score) -> dict[str, Any]:
    """What a score entry records as its settings (``generation_config``): what changes its numbers
    beyond the prompt and the continuation."""
    return {"prompt_logprobs": bool(score.prompt_logprobs),
            "top_k": max(map(len, score.top_logprobs), default=0)}


def _score_entry(score: Score) -> dict[str, Any]:
    positions = [
        {"hash": h, "logprob": lp, "piece": p, "rank": r, "rank_margin": m, "token": t,
         "top": [list(pair) for pair in top]}
        for t, p, h, lp, r, m, top in zip(
            score.token_ids, score.pieces or [""] * len(score.token_ids), score.step_hashes, score.logprobs,
            score.ranks, score.rank_margins, score.top_logprobs, strict=True)
    ]
    return {
        "batch_shape": score.batch_shape,
        "finish_reason": SCORED,
        "fingerprint": dict(score.fingerprint),
        "generation_config": score_settings(score),
        "kind": "score",
        "positions": positions,
        "prompt": score.prompt,
        "prompt_token_ids": list(score.prompt_token_ids),
        "steps": [],
        "text": score.continuation,
        **({"prompt_form": score.prompt_form} if score.prompt_form != "text" else {}),
        **({"step_hash": score.hash_definition} if score.hash_definition != "logits" else {}),
        **({"prompt_logprobs": list(score.prompt_logprobs)} if score.prompt_logprobs else {}),
    }


def to_struct(entry: Entry | Mapping[str, Any]) -> Entry:
    """``entry`` as a validated :class:`Entry`; ``msgspec.ValidationError`` says what is wrong. An
    :class:`Entry` was validated where it entered (parsed from a golden file, or captured from a
    generation by this function): it is returned as it is."""
    if isinstance(entry, Entry):
        return entry
    converted = msgspec.convert(entry, Entry)
    problem = semantic_problem(converted)
    if problem:
        raise msgspec.ValidationError(problem)
    return converted


def from_entry(entry: Entry | Mapping[str, Any]) -> Generation | Score:
    """The record ``entry`` holds: a :class:`Generation`, or a :class:`Score` for a score entry."""
    entry = to_struct(entry)
    if entry.kind == "score":
        return _score_of(entry)
    return generation_of(entry)


def generation_of(entry: Entry) -> Generation:
    """A generation entry's :class:`Generation` (``entry`` validated, not a score)."""
    steps = entry.steps
    return Generation(
        prompt=entry.prompt,
        prompt_token_ids=entry.prompt_token_ids,
        token_ids=tuple(s.token for s in steps),
        text=entry.text,
        step_hashes=tuple(s.hash for s in steps),
        top_logprobs=tuple(s.top for s in steps),
        margins=tuple(s.margin for s in steps),
        finish_reason=entry.finish_reason,
        generation_config=entry.generation_config,
        batch_shape=entry.batch_shape,
        pieces=tuple(s.piece for s in steps),
        fingerprint=entry.fingerprint,
        prompt_form=PromptForm(entry.prompt_form),
        hash_definition=HashDefinition(entry.step_hash),
        draw_margins=entry.draw_margins or (),
    )


def _score_of(entry: Entry) -> Score:
    positions = entry.positions or []
    return Score(
        prompt=entry.prompt,
        prompt_token_ids=entry.prompt_token_ids,
        continuation=entry.text,
        token_ids=tuple(p.token for p in positions),
        logprobs=tuple(p.logprob for p in positions),
        ranks=tuple(p.rank for p in positions),
        step_hashes=tuple(p.hash for p in positions),
        top_logprobs=tuple(p.top for p in positions),
        rank_margins=tuple(p.rank_margin for p in positions),
        batch_shape=entry.batch_shape,
        pieces=tuple(p.piece for p in positions),
        fingerprint=entry.fingerprint,
        prompt_form=PromptForm(entry.prompt_form),
        hash_definition=HashDefinition(entry.step_hash),
        prompt_logprobs=entry.prompt_logprobs or (),
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
    for limit, ids in ((_TEXT_ONLY_END, _TOKEN_IDS), (VOCABULARY_IDS, "a vocabulary id (below 2**31)")):
        message = message.replace(f"Expected `int` <= {limit - 1}", f"Expected {ids}, got a larger number")
    text, _, where = message.partition(" - at `")
    if where.endswith(".kind`") and text.startswith("Invalid enum value"):
        text += (" (an entry's kind is \"generation\" or \"score\"; a newer pytest-llmdeterminism may "
                 "write others)")
    return f"{where.rstrip('`').removeprefix('$.')}: {text}" if where else message


@dataclass(frozen=True)
class TextProblem:
    """A text a golden cannot hold: ``too_long`` (else it is not valid Unicode) and what to say."""

    too_long: bool
    message: str

    def __str__(self) -> str:
        return self.message


def text_problem(fields: Iterable[tuple[str, str]]) -> TextProblem | None:
    """Which of the named texts a golden cannot hold: one of more than :data:`MAX_TEXT_CHARS`
    characters, or one with a lone surrogate (half of a UTF-16 pair, not valid Unicode), which
    UTF-8 cannot encode and a golden file therefore cannot hold."""
    for name, text in fields:
        if len(text) > MAX_TEXT_CHARS:
            return TextProblem(True, f"{name} has {len(text):,} characters, more than the {MAX_TEXT_CHARS:,} "
                                     "a golden holds")
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as error:
                return TextProblem(False, f"{name} holds a lone surrogate {text[error.start]!r} at "
                                          f"character {error.start}, which is not valid Unicode (UTF-8, a "
                                          "golden file's encoding, cannot hold it)")
    return None


def generation_problem(generation: Generation | Score) -> TextProblem | None:
    """What keeps ``generation`` (or a score) out of a golden (see :func:`text_problem`), or None."""
    if isinstance(generation, Score):
        return text_problem(_texts(generation.prompt, generation.continuation, generation.pieces, SCORED))
    return text_problem(_texts(generation.prompt, generation.text, generation.pieces,
                               generation.finish_reason))


def _texts(prompt: str, text: str, pieces: Iterable[str], finish_reason: str) -> Iterable[tuple[str, str]]:
    yield "its prompt", prompt
    yield "its text", text
    yield "its finish_reason", finish_reason
    pieces = list(pieces)
    if sum(map(len, pieces)) > MAX_TEXT_CHARS:
        yield "its steps' pieces (together)", "".join(pieces)
    for index, piece in enumerate(pieces):
        if not piece.isascii():
            yield f"the piece of its step {index}", piece


def semantic_problem(entry: Entry, *, decoded_from_json: bool = False) -> str | None:
    """What the types cannot say: one top-k per step, text where the comparator expects text, at
    most :data:`MAX_TEXT_CHARS` characters in the steps' pieces together, and (for entries built in
    Python: JSON has no NaN or infinity, nor a lone surrogate) finite numbers and valid Unicode
    everywhere."""
    kind_problem = _kind_problem(entry)
    if kind_problem:
        return kind_problem
    pieces = sum(len(step.piece) for step in entry.steps) + sum(len(p.piece) for p in entry.positions or ())
    if pieces > MAX_TEXT_CHARS:
        return (f"the steps' pieces together have {pieces:,} characters, more than the {MAX_TEXT_CHARS:,} "
                "a golden holds")
    for index, step in enumerate(entry.steps):
        if not step.top:
            return f"step {index} has an empty 'top'"
        # max() of the (id, logprob) pairs is the largest id, in C: the exact scan only past a vocabulary.
        if step.token >= VOCABULARY_IDS or max(step.top)[0] >= VOCABULARY_IDS:
            problem = _token_id_problem(index, step)
            if problem:
                return problem
    if entry.draw_margins is not None and len(entry.draw_margins) != len(entry.steps):
        return f"'draw_margins' has {len(entry.draw_margins)} values for {len(entry.steps)} steps"
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
    unstorable = text_problem(_texts(entry.prompt, entry.text,
                                     [step.piece for step in entry.steps]
                                     + [p.piece for p in entry.positions or ()], entry.finish_reason))
    if unstorable:
        return str(unstorable).replace("its ", "", 1)
    try:
        msgspec.json.encode(entry)  # every other string (fingerprint, config, their keys): UTF-8 or not
    except UnicodeEncodeError as error:
        return (f"holds a lone surrogate {error.object[error.start]!r} in a fingerprint or generation_config "
                "string, which is not valid Unicode (UTF-8, a golden file's encoding, cannot hold it)")
    return None


def _kind_problem(entry: Entry) -> str | None:
    """What a ``kind`` requires beyond the types: a score entry has its positions (at least one, each
    with its top-k) and no steps; a generation entry has no score fields."""
    if entry.kind == "generation":
        for name in ("positions", "prompt_logprobs"):
            if getattr(entry, name) is not None:
                return (f"has {name!r}, which only a score entry has: add \"kind\": \"score\" if it is one, "
                        f"else remove {name!r}")
        return None
    if not entry.positions:
        return "is a score entry (\"kind\": \"score\") without its 'positions' (one per continuation token)"
    if entry.steps or entry.draw_margins is not None or entry.finish_reason != SCORED:
        return (f"is a score entry (\"kind\": \"score\") with a generation's fields: it has no 'steps' "
                f"(they must be []), no 'draw_margins', and its finish_reason is {SCORED!r}")
    for index, position in enumerate(entry.positions):
        if not position.top:
            return f"position {index} has an empty 'top'"
        ids = [(f"positions[{index}].token", position.token)]
        ids += [(f"positions[{index}].top[{r}][0]", t) for r, (t, _) in enumerate(position.top)]
        for field, token in ids:
            if VOCABULARY_IDS <= token < TEXT_ONLY_IDS:
                return f"{field}: Expected {_TOKEN_IDS}, got {token}"
    if entry.prompt_logprobs is not None and len(entry.prompt_logprobs) != len(entry.prompt_token_ids):
        return (f"'prompt_logprobs' has {len(entry.prompt_logprobs)} values for "
                f"{len(entry.prompt_token_ids)} prompt tokens")
    return None


def _token_id_problem(index: int, step: Step) -> str | None:
    """An id of ``step`` between the vocabulary and the text-only ids: no engine produces one."""
    fields = [(f"steps[{index}].token", step.token)]
    fields += [(f"steps[{index}].top[{rank}][0]", token) for rank, (token, _) in enumerate(step.top)]
    for field, token in fields:
        if VOCABULARY_IDS <= token < TEXT_ONLY_IDS:
            return f"{field}: Expected {_TOKEN_IDS}, got {token}"
    return None
