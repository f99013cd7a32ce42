"""The fields of a golden entry, declared once and decoded strictly: the types every kind's entry is
built of, the entry that formats 1 to 3 write (:class:`Entry`, the wire shape of the two built-in kinds:
a generation's ``steps``, a score's ``positions``), and the text limits every golden keeps. What each
kind's fields mean (encoding, decoding, validation) is its own module's in :mod:`~.kinds`; the file
format around the entries is :mod:`~.schema`'s and :mod:`~.codec`'s."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Literal, Union

import msgspec

from pytest_llmdeterminism.generation import LOGPROB_FLOOR, TEXT_ONLY_IDS

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
TEXT_ONLY_END = TEXT_ONLY_IDS + (1 << 32)
VocabularyId = Annotated[int, msgspec.Meta(ge=0, lt=VOCABULARY_IDS)]
TokenId = Annotated[int, msgspec.Meta(ge=0, lt=TEXT_ONLY_END)]  # the gap between is semantic_problem's
TOKEN_ID_RANGE = ("a token id (a vocabulary's are below 2**31, a served token's text-only id is 2**40 plus "
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


class KindEntry(msgspec.Struct, forbid_unknown_fields=True, gc=False, kw_only=True, omit_defaults=True):
    """The fields every entry of a plugged-in kind holds; its kind's entry type subclasses this with its
    own fields (a built-in kind's entry is an :class:`Entry`, the shape formats 1 to 3 gave it). Its
    ``kind`` is always written; its ``fingerprint`` names its variant and picks the tolerance that
    judges it, as a generation's does. A field left at its default is not written."""

    kind: str
    batch_shape: Annotated[str, msgspec.Meta(pattern=r"^[0-9]+x[0-9]+\Z")]
    fingerprint: dict[str, FingerprintValue]
    prompt: Text
    prompt_token_ids: tuple[VocabularyId, ...]
    generation_config: dict[str, Union[Scalar, list[Scalar]]] = msgspec.field(default_factory=dict)  # noqa: UP007
    prompt_form: Literal["text", "chat", "token_ids"] = "text"


AnyEntry = Union[Entry, KindEntry]  # noqa: UP007 - msgspec and isinstance read it at run time
Goldens = dict[str, dict[str, AnyEntry]]  # test key -> variant -> entry
# Fingerprint fields that the comparator reads as text.
TEXT_FINGERPRINT_FIELDS = ("device_class", "dtype", "cpu_numerics", "machine")


def validation_message(error: msgspec.ValidationError) -> str:
    """msgspec's ``... - at `$.goldens.test_x.cpu/float32.steps[3].margin` `` in the file's own terms."""
    message = str(error)
    for limit, ids in ((TEXT_ONLY_END, TOKEN_ID_RANGE), (VOCABULARY_IDS, "a vocabulary id (below 2**31)")):
        message = message.replace(f"Expected `int` <= {limit - 1}", f"Expected {ids}, got a larger number")
    text, _, where = message.partition(" - at `")
    if where.endswith(".kind`") and text.startswith("Invalid enum value"):
        text += (" (an entry's kind is \"generation\", \"score\" or \"eval\"; a newer "
                 "pytest-llmdeterminism may write others)")
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


def named_texts(prompt: str, text: str, pieces: Iterable[str],
                finish_reason: str) -> Iterable[tuple[str, str]]:
    yield "its prompt", prompt
    yield "its text", text
    yield "its finish_reason", finish_reason
    pieces = list(pieces)
    if sum(map(len, pieces)) > MAX_TEXT_CHARS:
        yield "its steps' pieces (together)", "".join(pieces)
    for index, piece in enumerate(pieces):
        if not piece.isascii():
            yield f"the piece of its step {index}", piece
