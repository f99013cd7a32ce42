"""What the verdict does not compare in a golden, checked: its ``text`` and its steps' ``piece`` s
against what a check computes for the same ids (:func:`stored_text_problem`), and every field of a
candidate that compares IDENTICAL with the golden it would replace (:func:`unjudged_changes`). The
verdict compares token ids and logits, yet the text and pieces are what a failure, ``llm-golden
show`` and a review diff print, and the fingerprint picks the tolerance of every later check: a
golden edited there would read IDENTICAL for ever. Pure: no I/O."""

from __future__ import annotations

from typing import Any

import msgspec

from pytest_llmdeterminism.goldens import kinds, schema
from pytest_llmdeterminism.judge.compare import Recorded, first_token_divergence

# Fingerprint fields that say how ids were decoded: where one differs, the decoding itself may have
# changed (a new tokenizer, a transformers release that cleans up spaces otherwise), which the
# finding names as the likely cause.
DECODER_FIELDS = ("tokenizer_hash", "transformers", "tokenizers")


def stored_text_problem(golden: Recorded, actual: Recorded) -> str | None:
    """What in ``golden``'s text or pieces contradicts what ``actual`` (this run's output, of the same
    engine) computed for the same token ids; None where they agree, where the ids differ (the verdict
    speaks then), where the two were decoded by different engines, or where a side stores no pieces."""
    if golden.fingerprint.get("engine") != actual.fingerprint.get("engine") or \
            golden.token_ids != actual.token_ids:
        return None
    found = []
    texts = kinds.of(golden).decoded_text(golden), kinds.of(actual).decoded_text(actual)
    if texts[0] is not None and texts[1] is not None and texts[0] != texts[1]:
        found.append(f"its text is {_short(texts[0])}, but its ids decode to {_short(texts[1])}")
    if golden.pieces and actual.pieces:
        step = first_token_divergence(golden.pieces, actual.pieces)
        if step is not None:
            found.append(f"the piece of step {step} (id {golden.token_ids[step]}) is "
                         f"{golden.pieces[step]!r}, but the id decodes to {actual.pieces[step]!r}")
    if not found:
        return None
    changed = [f"{field} {golden.fingerprint.get(field)!r} -> {actual.fingerprint.get(field)!r}"
               for field in DECODER_FIELDS if golden.fingerprint.get(field) != actual.fingerprint.get(field)]
    cause = (f"the decoding changed since it was recorded ({', '.join(changed)})" if changed else
             "the same tokenizer decodes them otherwise, so the golden was edited after it was recorded")
    return f"{'; '.join(found)}: {cause}"


def unjudged_changes(base: schema.AnyEntry, candidate: schema.AnyEntry) -> tuple[tuple[str, Any, Any], ...]:
    """Where two entries of one variant that compare IDENTICAL still differ: ``(field, BASE's value,
    CAND's value)`` for each top-level field, each fingerprint field (``fingerprint.torch``), and each
    field of the steps (``steps.piece``: some step's piece; values not given; a score's ``positions``
    and any kind's list of objects alike)."""
    old, new = msgspec.to_builtins(base), msgspec.to_builtins(candidate)
    changes: list[tuple[str, Any, Any]] = []
    for field in sorted(set(old) | set(new)):
        a, b = old.get(field), new.get(field)
        if a == b:
            continue
        if field == "fingerprint" and isinstance(a, dict) and isinstance(b, dict):
            changes += [(f"{field}.{k}", a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
                        if a.get(k) != b.get(k)]
        elif _rows(a) and _rows(b) and len(a) == len(b):  # a kind's steps (or positions): by field
            names = sorted({k for s, t in zip(a, b, strict=True) for k in set(s) | set(t)
                            if s.get(k) != t.get(k)})
            changes += [(f"{field}.{k}", None, None) for k in names]
        else:
            changes.append((field, a, b))
    return tuple(changes)


def _rows(value: Any) -> bool:
    """``value`` is a list of objects (a kind's steps), compared field by field."""
    return isinstance(value, list) and bool(value) and all(isinstance(row, dict) for row in value)


def _short(text: str, limit: int = 60) -> str:
    shown = repr(text)
    return shown if len(shown) <= limit else shown[:limit - 1] + "…"
