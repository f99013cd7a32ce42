"""Typed records of what one test decided, carried from the test to the run's end and into reports.

Under pytest-xdist a test's :class:`TestRecords` travels to the controller on the test's report as
plain JSON types (:meth:`TestRecords.to_payload`) and is decoded back, and validated, with
:meth:`TestRecords.from_payload`: the same types on both sides, the golden entries included.
"""

from __future__ import annotations

from typing import Any

import msgspec

from pytest_llmdeterminism.store import Entry


class GoldenWrite(msgspec.Struct, array_like=True, gc=False):
    """One entry to write: a recorded golden, or a candidate for ``--llm-golden-artifacts``."""

    path: str
    key: str
    variant: str
    entry: Entry


class CheckRecord(msgspec.Struct, kw_only=True, gc=False):
    """One golden comparison, as ``--llm-report`` lists it (its JSON form is the report's schema)."""

    test: str = ""  # node id, set when the run collects the test's records
    test_duration_s: float = 0.0
    name: str  # golden key
    variant: str
    verdict: str
    passed: bool
    profile: str = ""
    first_divergence: int | None = None
    golden_margin: float | None = None  # inf where the golden had stopped; the JSON report writes null
    max_logprob_delta: float = 0.0
    tie_margin: float = 0.0  # below this golden margin a step is a near tie (the comparator's own)
    input_changes: list[str] = msgspec.field(default_factory=list)
    changed_fingerprint: dict[str, tuple[Any, Any]] = msgspec.field(default_factory=dict)
    numerics_changed: list[str] = msgspec.field(default_factory=list)  # non-empty: across environments
    # [piece, token id, margin, top-1 logprob] per step and side ("expected", "actual"), for HTML.
    steps: dict[str, list[tuple[str, int, float, float | None]]] = msgspec.field(default_factory=dict)


class TestRecords(msgspec.Struct):
    """Everything one test's golden checks decided."""

    __test__ = False  # not a pytest test class

    records: list[GoldenWrite] = msgspec.field(default_factory=list)
    counts: dict[str, int] = msgspec.field(default_factory=dict)
    notes: list[str] = msgspec.field(default_factory=list)
    audits: list[dict[str, Any]] = msgspec.field(default_factory=list)
    sequence: list[str] = msgspec.field(default_factory=list)  # each check's outcome, in call order
    checks: list[CheckRecord] = msgspec.field(default_factory=list)
    used: list[tuple[str, str]] = msgspec.field(default_factory=list)  # (golden file, key) looked up
    candidates: list[GoldenWrite] = msgspec.field(default_factory=list)

    def is_empty(self) -> bool:
        return not (self.records or self.counts or self.notes or self.audits or self.used or self.candidates)

    def to_payload(self) -> dict[str, Any]:
        """Plain JSON types: what crosses the process boundary under xdist."""
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]

    @classmethod
    def from_payload(cls, payload: Any) -> TestRecords:
        return msgspec.convert(payload, cls)
