"""The kinds of golden, as plug-ins: what a golden records (a generation, a score, ...) is one module
here behind the small :class:`Kind` protocol, and one line of :data:`KINDS`. Outside these modules
nothing asks which kind it holds: it asks the registry (:func:`of` a record, :func:`named` for a
stored entry's ``kind``) and the kind answers.

A kind owns its entry's fields (encoding, decoding, what its types cannot say), its comparison (its
records are plugged into the pure judgement, :func:`~pytest_llmdeterminism.judge.compare.plug_in`,
which sits below and so cannot import a kind), the text a report shows of it, its steps as a report
shows them, and its lines in ``llm-golden show``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, TypeGuard, cast

from pytest_llmdeterminism.goldens.fields import Entry
from pytest_llmdeterminism.goldens.kinds.eval import EVAL
from pytest_llmdeterminism.goldens.kinds.generation import GENERATION
from pytest_llmdeterminism.goldens.kinds.score import SCORE
from pytest_llmdeterminism.judge.compare import Comparison, Recorded, comparer_of, knows, plug_in, unplug

__all__ = ["EVAL", "GENERATION", "KINDS", "SCORE", "Kind", "ReportStep", "entry_type", "is_record", "named",
           "of", "plugged_in", "register", "unregister"]

ReportStep = tuple[str, int, float, float | None]  # (piece, token id, margin, logprob), as a report shows it


class Kind(Protocol):
    """One kind of golden. ``name`` is its entries' ``kind``; ``record_type`` what
    ``golden_tokens.check()`` takes for it; ``format`` the oldest golden format that holds its entries
    (a file is written in the newest of its entries' formats)."""

    name: str
    record_type: type
    entry_type: type  # the msgspec Struct its entries decode as: fields.Entry, or a fields.KindEntry
    format: str
    shorten: str  # what a test does when its record is too long for a golden
    step_noun: str  # what one of its steps is called in a report ("step", "position")

    def to_entry(self, record: Any) -> dict[str, Any]:
        """The JSON form of ``record`` (plain types: it travels between xdist processes)."""

    def from_entry(self, entry: Any) -> Any:
        """The record a validated entry of this kind holds."""

    def entry_problem(self, entry: Any) -> str | None:
        """What this kind requires of its entry beyond the types, or None."""

    def entry_texts(self, entry: Any) -> Iterable[tuple[str, str]]:
        """The named texts its entry stores, for the limits every golden keeps (``fields.text_problem``)."""

    def entry_keys(self, entry: Any) -> int | None:
        """How many JSON keys its entry's own fields hold (the codec's fast duplicate-key proof);
        None: count nothing, let the exact check decide."""

    def stored_texts(self, record: Any) -> Iterable[tuple[str, str]]:
        """The named texts a golden of ``record`` would hold (see ``fields.text_problem``)."""

    def compare(self, expected: Any, actual: Any, *, tie_margin: float | None) -> Comparison:
        """Two records of this kind: the verdict and its evidence."""

    def sampling(self, record: Any) -> dict[str, Any]:
        """How ``record`` was drawn, where it was sampled (its settings, as a report shows them); ``{}``."""

    def decoded_text(self, record: Any) -> str | None:
        """The text ``record`` decoded from its own token ids (a golden's must agree with a rerun's of
        the same ids); None where its text was given, not decoded (a score's continuation)."""

    def text(self, record: Any) -> str:
        """What ``record`` says, as a report shows it (a generation's text, a score's continuation)."""

    def report_steps(self, record: Any) -> list[ReportStep]:
        """Its steps (or positions), as the HTML report shows them."""

    def show_lines(self, key: str, variant: str, record: Any) -> list[str]:
        """Its golden in human form (``llm-golden show``)."""


# The registry: one line per kind.
KINDS: dict[str, Kind] = {
    GENERATION.name: GENERATION,
    SCORE.name: SCORE,
    EVAL.name: EVAL,
}


def register(kind: Kind) -> None:
    """Add ``kind`` (or replace the one of its name): its records are checked, stored and reported."""
    KINDS[kind.name] = kind
    plug_in(kind.record_type, kind)  # the one table from record type to kind: the judgement's


def unregister(name: str) -> None:
    """Remove a kind :func:`register` added (a test's throw-away kind)."""
    unplug(KINDS.pop(name).record_type)


def is_record(value: object) -> TypeGuard[Recorded]:
    """``value`` is a record of a registered kind (a Generation, a Score, ...)."""
    return knows(value)


def of(record: object) -> Kind:
    """The kind of ``record``; a value of no registered kind is a TypeError."""
    if not knows(record):
        raise TypeError(f"{type(record).__name__} is no kind of golden (the kinds: "
                        f"{', '.join(sorted(KINDS))})")
    return cast(Kind, comparer_of(record))  # plugged in by register(): a Kind


def named(name: str) -> Kind:
    """The kind of a stored entry (``entry.kind``, validated against :data:`KINDS`)."""
    return KINDS[name]


def entry_type(name: object) -> type:
    """The type an entry whose ``kind`` is ``name`` decodes as: its kind's, or the built-in
    :class:`~pytest_llmdeterminism.goldens.fields.Entry` for a kind no one registered (whose decoding
    then names the kinds there are)."""
    kind = KINDS.get(name) if isinstance(name, str) else None
    return kind.entry_type if kind is not None else Entry


def plugged_in() -> bool:
    """Some registered kind's entries are not the built-in :class:`Entry` (a golden file is then
    decoded entry by entry, each as its kind's)."""
    return any(kind.entry_type is not Entry for kind in KINDS.values())


for _kind in list(KINDS.values()):  # each kind of the registry plugged into the judgement
    register(_kind)
