"""Whether a golden describes its own token ids: its ``text`` and its steps' ``piece`` s against what
a check computes for the same ids. Neither is compared by the verdict (token ids and logits are),
yet both are what a failure, ``llm-golden show`` and a review diff print: a golden whose text was
edited would read IDENTICAL for ever while showing words its model never produced. Pure: no I/O."""

from __future__ import annotations

from pytest_llmdeterminism.compare import Recorded, first_token_divergence
from pytest_llmdeterminism.generation import Generation

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
    if isinstance(golden, Generation) and isinstance(actual, Generation) and golden.text != actual.text:
        found.append(f"its text is {_short(golden.text)}, but its ids decode to {_short(actual.text)}")
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


def _short(text: str, limit: int = 60) -> str:
    shown = repr(text)
    return shown if len(shown) <= limit else shown[:limit - 1] + "…"
