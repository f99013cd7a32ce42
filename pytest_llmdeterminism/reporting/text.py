"""Pieces of text every report shares: a value shortened to fit a line, a logprob change, the label
of a prompt's form, and where two texts or id lists first differ."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pytest_llmdeterminism.compare import first_token_divergence, within_drift

_MAX_IDS_SHOWN = 12


def form_label(old: str, new: str) -> str:
    """`` (chat, rendered)`` for a prompt that was a chat conversation; both forms where they differ."""
    if old != new:
        return f" ({old} -> {new})"
    return {"chat": " (chat, rendered)", "token_ids": " (token ids, decoded)"}.get(old, "")


def first_difference(old: Sequence[object], new: Sequence[object]) -> int:
    first = first_token_divergence(old, new)
    return min(len(old), len(new)) if first is None else first


def differing_window(old: str, new: str, before: int = 30, after: int = 50) -> tuple[str, str]:
    """Both texts around their first differing character (a rendered chat prompt is long; the
    change may sit anywhere in it)."""
    first = first_difference(old, new)
    start = max(0, first - before)

    def window(text: str) -> str:
        end = first + after
        return ("…" if start else "") + repr(text[start:end]) + ("…" if len(text) > end else "")

    return window(old), window(new)


def number(value: float | None) -> str:
    """A float as a report shows it, 3 significant digits; any float (``1e308``, ``inf``, ``nan``)
    renders, and None (a JSON report's null: a number that was not finite) is ``n/a``."""
    return "n/a" if value is None else f"{value:.3g}"


def delta(value: float | None) -> str:
    # Logprobs are stored to 6 decimals: a smaller change shows only in the hash.
    return "< 1e-6" if value is not None and value < 1e-6 else number(value)


def tie_text(margin: float, tie_margin: float, drift: float, *, name: str = "golden margin") -> str:
    """A changed decision's golden margin against the near-tie bound: below the tie margin, within the
    drift this run measured around it (a near tie too, DESIGN §14), or neither: ``golden margin 0.176
    >= tie margin 0.05, within this run's drift (0.61): near tie``."""
    head = f"{name} {margin:.3g}"
    if within_drift(margin, tie_margin, drift):
        return f"{head} >= tie margin {tie_margin:g}, within this run's drift ({drift:.3g}): near tie"
    if margin < tie_margin:
        return f"{head} < tie margin {tie_margin:g}: near tie"
    drift_note = f", outside this run's drift ({drift:.3g})" if drift > 0 else ""
    return f"{head} >= tie margin {tie_margin:g}{drift_note}: not a near tie"


def short(value: Any, limit: int = 100) -> str:
    if isinstance(value, (list, tuple)) and len(value) > _MAX_IDS_SHOWN:
        text = f"[{', '.join(map(str, value[:_MAX_IDS_SHOWN]))}, … ({len(value)} ids)]"
    else:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"

