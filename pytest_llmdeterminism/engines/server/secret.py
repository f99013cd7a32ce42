"""A credential that never shows: :class:`Secret` holds an API key whose ``repr`` and ``str`` are
``***``, so no frame that holds one prints it (``pytest -l`` shows every local of every frame, in
the terminal and in JUnit XML). The key leaves it only as the bytes of an ``Authorization`` header
(:meth:`Secret.authorization`), which again print as ``***``.

:meth:`Secret.mask` hides the key in what a server sends back: verbatim or in another case, JSON-
or URL-escaped, hex, base64 (standard or URL-safe, padded or not, alone or inside a longer value
such as ``Bearer KEY`` or ``user:KEY``), and split by spaces, line breaks or punctuation. Any run
of :data:`RUN` letters and digits of one of those forms counts as the key, so half a key is
masked too. A key with fewer than :data:`RUN` letters and digits is masked only as it is.
:meth:`Secret.holds` says whether a text holds any of those forms, and :func:`key_echoed` where a
server's answer spells the key: in its text, or in its token ids as the tokenizer decodes them. Such
an answer is refused, not masked: the ids a golden records would decode back to the key.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

MASK = "***"
RUN = 8  # consecutive letters and digits of an encoded key that count as (part of) the key


class Secret:
    __slots__ = ("_runs", "_value")

    def __init__(self, value: str) -> None:
        self._value = value
        self._runs: frozenset[str] | None = None  # of the encoded forms, worked out at the first mask

    def __repr__(self) -> str:
        return MASK

    __str__ = __repr__

    def __bool__(self) -> bool:
        return bool(self._value)

    def problem(self) -> str | None:
        """Why no HTTP header can carry the key; None where one can."""
        if not (self._value.isascii() and self._value.isprintable()) or any(c.isspace() for c in self._value):
            return "holds a space, a line break or a non-ASCII character"
        return None

    def authorization(self, scheme: str = "Bearer") -> bytes:
        """The ``Authorization`` header's value, as bytes that print as ``***``: the one place the key
        is revealed, handed straight to the connection that writes it."""
        return _MaskedBytes(f"{scheme} {self._value}".encode("latin-1"))

    def mask(self, text: str) -> str:
        """``text`` with every form of the key this module can recognise shown as ``***``."""
        return _shown(text, self._spans(text))

    def holds(self, text: str) -> bool:
        """Whether ``text`` holds a form of the key that :meth:`mask` would hide."""
        return bool(self._spans(text))

    def _spans(self, text: str) -> list[tuple[int, int]]:
        """Where ``text`` holds a form of the key: ``[first, end)`` ranges, sorted, none overlapping."""
        if not self._value:
            return []
        raw = self._value.encode(errors="surrogatepass")
        # A key shorter than a run ("EMPTY", as vLLM users write) is masked only as it is: in any case,
        # it would hide words of the message.
        short = len(_letters_and_digits(self._value)) < RUN
        spans = [(found.start(), found.end())
                 for form in {self._value, json.dumps(self._value)[1:-1], quote(raw, safe="")}
                 for found in re.finditer(re.escape(form), text, flags=0 if short else re.IGNORECASE)]
        if self._runs is None:
            encoded = () if short else (self._value, quote(raw, safe=""), raw.hex(), *_base64_cores(raw))
            forms = [_letters_and_digits(form) for form in encoded]
            self._runs = frozenset(form[i:i + RUN] for form in forms for i in range(len(form) - RUN + 1))
        merged: list[tuple[int, int]] = []
        for first, end in sorted(spans + _run_spans(text, self._runs)):
            if merged and first <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((first, end))
        return merged


KEY_ECHOED = ("A golden holds token ids, which the tokenizer decodes back to the key, so nothing was "
              "recorded, and the key is shown as *** wherever the plugin quotes the server. A server must "
              "not echo its credentials: check what it was prompted with and its log, and rotate the key if "
              "it reached the model or its output")


def key_echoed(secret: Secret, *, texts: Sequence[str], chosen: Sequence[int],
               top: Sequence[Sequence[tuple[int, float]]], tokenizer: Any, vocab_size: int) -> str | None:
    """Where an answer spells the key, in any form :meth:`Secret.holds` recognises: in the ``chosen``
    ids or in one rank of the ``top`` ids across the steps, as ``tokenizer`` decodes them (ids above
    the vocabulary, a text's hash, decode to nothing), or in one of ``texts``; None where nowhere.
    Masking the text would not do: the ids a golden records would still decode to the key."""
    def spells(ids: Sequence[int]) -> bool:
        known = [int(t) for t in ids if 0 <= t < vocab_size]
        return bool(known) and secret.holds(str(tokenizer.decode(known)))

    if tokenizer is not None and spells(chosen):
        return "its tokens' ids, as the tokenizer decodes them"
    if any(secret.holds(text) for text in texts):
        return "its text"
    ranks = max(map(len, top), default=0)
    for rank in range(ranks if tokenizer is not None else 0):
        if spells([step[rank][0] for step in top if len(step) > rank]):
            return f"the ids of rank {rank + 1} of its top-k, step after step, as the tokenizer decodes them"
    return None


class _MaskedBytes(bytes):
    """Bytes that keep the key they hold out of every repr (``http.client`` writes them as bytes)."""

    def __repr__(self) -> str:
        return f"b'{MASK}'"

    __str__ = __repr__


def _base64_cores(raw: bytes) -> list[str]:
    """What any base64 text that holds ``raw`` holds of it, whatever came before it: base64 turns 3
    bytes into 4 characters, so ``raw`` starts at one of three offsets in a group; at each, the
    characters made of ``raw``'s bits alone (the ones at either end mix in the bytes around it)."""
    cores = []
    for shift in range(3):
        encoded = base64.b64encode(bytes(shift) + raw).decode()
        first, end = -(-8 * shift // 6), 8 * (shift + len(raw)) // 6
        cores.append(encoded[first:end])
    return cores


def _letters_and_digits(text: str) -> str:
    return "".join(c for c in text.lower() if c.isascii() and c.isalnum())


def _run_spans(text: str, runs: frozenset[str]) -> list[tuple[int, int]]:
    """Each stretch of ``text`` whose letters and digits (lower-cased, whatever lies between them)
    hold one of ``runs``, as ``[first, end)``: URL-safe and standard base64, upper and lower case, a
    key split over lines or by punctuation all read the same."""
    if not runs:
        return []
    where = [i for i, c in enumerate(text) if c.isascii() and c.isalnum()]
    kept = "".join(text[i] for i in where).lower()
    spans: list[list[int]] = []  # [first, end) in ``kept``, merged as they are found
    for start in range(len(kept) - RUN + 1):
        if kept[start:start + RUN] in runs:
            if spans and start <= spans[-1][1]:
                spans[-1][1] = start + RUN
            else:
                spans.append([start, start + RUN])
    return [(where[first], where[end - 1] + 1) for first, end in spans]


def _shown(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` with each of ``spans`` (sorted, not overlapping) shown as ``***``."""
    pieces, cursor = [], 0
    for first, end in spans:
        pieces += [text[cursor:first], MASK]
        cursor = end
    return "".join([*pieces, text[cursor:]])
