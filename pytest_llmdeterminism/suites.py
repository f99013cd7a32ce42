"""Prompt suites as data: each line of a ``test_*.llm.jsonl`` file is one golden-checked test item.

    {"id": "capital-fr", "prompt": "The capital of France is", "max_new_tokens": 8}
    {"id": "count", "prompt": "Count: one,", "tolerance": "tokens"}

Items are generated ``B`` prompts at a time in the fixed shape: the first item of a chunk runs the
whole chunk and the others take their result from it. Results are identical to one prompt at a
time, because a fixed shape makes a row independent of its companions.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_llmdeterminism.errors import ConfigurationError
from pytest_llmdeterminism.options import validate_marker_kwargs

if TYPE_CHECKING:
    from pytest_llmdeterminism.generation import Generation
    from pytest_llmdeterminism.session import LLMSession, TestOutcomes

SUFFIX = ".llm.jsonl"
_FIELDS = {"id", "prompt", "max_new_tokens", "tolerance"}


def is_suite(path: Path) -> bool:
    return path.name.startswith("test_") and path.name.endswith(SUFFIX)


class PromptSuite(pytest.File):
    def collect(self) -> Iterator[PromptItem]:
        seen: set[str] = set()
        for number, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            case = _parse(self.path, number, line)
            if case["id"] in seen:
                raise self.CollectError(f"{self.path.name}:{number}: id {case['id']!r} appears twice; ids name goldens")
            seen.add(case["id"])
            yield PromptItem.from_parent(self, name=case["id"], case=case)

    def results_for(self, item: PromptItem, generate: Any) -> Generation:
        """The item's generation, running its whole chunk (same budget, B items) on first need."""
        cache: dict[str, Generation] = self.__dict__.setdefault("_results", {})
        if item.name not in cache:
            budget = item.case.get("max_new_tokens")
            peers = [i for i in self.session.items if isinstance(i, PromptItem) and i.parent is self
                     and i.case.get("max_new_tokens") == budget and i.name not in cache]
            start = peers.index(item)
            chunk = peers[start:start + item.rows]
            for peer, result in zip(chunk, generate([p.case["prompt"] for p in chunk], budget)):
                cache[peer.name] = result
        return cache.pop(item.name)


class PromptItem(pytest.Item):
    def __init__(self, *, case: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case = case
        self.rows = 1

    def runtest(self) -> None:
        __tracebackhide__ = True
        from pytest_llmdeterminism.golden import GoldenTokens
        from pytest_llmdeterminism.model import LLMModel
        from pytest_llmdeterminism.plugin import SESSION, outcomes_of

        session: LLMSession = self.config.stash[SESSION]
        settings = session.settings_for(self)
        self.rows = settings.batch_shape.rows
        outcomes: TestOutcomes = outcomes_of(self)
        llm = LLMModel(session.loaded_model(), settings, note=outcomes.note)

        def generate(prompts: list[str], budget: int | None) -> list[Generation]:
            return llm.generate(prompts, **({} if budget is None else {"max_new_tokens": budget}))

        assert isinstance(self.parent, PromptSuite)
        result = self.parent.results_for(self, generate)
        tolerance = self.case.get("tolerance")
        profile = validate_marker_kwargs({"tolerance": tolerance}, self.nodeid)["tolerance"] if tolerance else None
        golden = GoldenTokens(session, outcomes, self.nodeid, self.path, lambda: llm.tokenizer,
                              rerun=session.rerun_arguments(self), tolerance=profile)  # type: ignore[arg-type]
        golden.check(result)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, self.name


def _parse(path: Path, number: int, line: str) -> dict[str, Any]:
    where = f"{path.name}:{number}"
    try:
        case = json.loads(line)
    except json.JSONDecodeError as error:
        raise ConfigurationError(where, line[:60], f"not valid JSON ({error})") from None
    if not isinstance(case, dict) or not isinstance(case.get("id"), str) or not isinstance(case.get("prompt"), str):
        raise ConfigurationError(where, line[:60], 'expected an object with string "id" and "prompt", e.g. '
                                 '{"id": "capital", "prompt": "The capital of France is"}')
    unknown = set(case) - _FIELDS
    if unknown:
        raise ConfigurationError(where, sorted(unknown), f"unknown field(s); accepted: {', '.join(sorted(_FIELDS))}")
    budget = case.get("max_new_tokens")
    if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 1):
        raise ConfigurationError(where, budget, "max_new_tokens must be an integer >= 1")
    return case
