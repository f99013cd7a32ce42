"""The ``golden_tokens`` fixture object: one check engine for missing / record / compare / fail."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_llmdeterminism import report, store
from pytest_llmdeterminism.compare import Comparison, Verdict, compare
from pytest_llmdeterminism.errors import GoldenMismatchError
from pytest_llmdeterminism.generation import Generation

if TYPE_CHECKING:
    from pytest_llmdeterminism.session import LLMSession


class GoldenTokens:
    """Compares generations with the test's stored goldens, or records them when updating."""

    def __init__(self, session: LLMSession, nodeid: str, test_path: Path,
                 decoder: Callable[[], report.Decode], *, command_target: str | None = None) -> None:
        self._session = session
        self._target = command_target or nodeid
        self._test_key = nodeid.split("::", 1)[1] if "::" in nodeid else nodeid
        self._path = session.golden_path(test_path)
        self._decoder = decoder
        self._used: set[str] = set()
        self._unnamed = 0

    def check(self, generation: Generation, name: str | None = None) -> Comparison | None:
        """Compare ``generation`` with its golden (or record it under ``--llm-golden-update``).

        Several checks in one test need distinct goldens: unnamed ones are numbered in call order
        (``test``, ``test#2``, ...), named ones are stored as ``test::name``.
        Returns the comparison, or None when a golden was recorded.
        """
        __tracebackhide__ = True
        if not isinstance(generation, Generation):
            raise TypeError(f"golden_tokens.check() takes a Generation from llm_model.generate(), "
                            f"got {type(generation).__name__}")
        key = self._key(name)
        location = f"{self._session.display_path(self._path)} [{key!r}][{generation.variant!r}]"
        stored = self._session.goldens(self._path).get(key, {}).get(generation.variant)
        update = self._session.options.update
        if stored is None:
            if update:
                self._session.record(self._path, key, generation, outcome="recorded")
                return None
            self._session.count(Verdict.MISSING.value)
            raise GoldenMismatchError(report.missing(key, location, self._target), None, key=key)
        comparison = compare(store.from_entry(stored), generation)
        if comparison.passed:
            self._session.count(comparison.verdict.value)
            return comparison
        if update == "all":
            self._session.record(self._path, key, generation, outcome="updated")
            return comparison
        self._session.count(comparison.verdict.value)
        message = report.mismatch(key, location, self._target, comparison,
                                  store.from_entry(stored), generation, self._decoder())
        raise GoldenMismatchError(message, comparison, key=key)

    def _key(self, name: str | None) -> str:
        __tracebackhide__ = True
        if name is None:
            self._unnamed += 1
            key = self._test_key if self._unnamed == 1 else f"{self._test_key}#{self._unnamed}"
        else:
            if not name or not isinstance(name, str):
                raise ValueError(f"golden_tokens.check(name=...) must be a non-empty string, got {name!r}")
            key = f"{self._test_key}::{name}"
        if key in self._used:
            raise ValueError(f"golden {key!r} is checked twice in one test; give each check its own name=")
        self._used.add(key)
        return key
