"""Prompt suites as data: each line of a ``test_*.llm.jsonl`` file is one golden-checked test item.

    {"id": "capital-fr", "prompt": "The capital of France is", "max_new_tokens": 8}
    {"id": "count", "prompt": "Count: one,", "tolerance": "tokens"}
    {"id": "chat", "messages": [{"role": "user", "content": "What is the capital of Peru?"}]}
    {"id": "story", "prompt": "Once upon a time", "do_sample": true, "temperature": 0.8, "seed": 3}
    {"id": "belief", "prompt": "The capital of France is", "continuation": " Paris"}

A line with a ``"continuation"`` is a score check: ``golden_tokens.check(llm_model.score(prompt,
continuation))``, the logprobs the model gives that continuation (no budget, no sampling); the
score lines of a file are scored ``B`` at a time like the generations.

Each item is a test function of its own, ``@deterministic(max_new_tokens=..., tolerance=...)`` from
its line, that takes the ``llm_model`` and ``golden_tokens`` fixtures like any test (so
``--llm-audit``, tolerances and candidates work the same). Items are generated ``B`` prompts at a
time: the selected items of a file with the same token budget and sampling settings (``do_sample``,
``temperature``, ``top_k``, ``top_p``, ``min_p``; each item its own ``seed``, by default the test's),
in file order, form fixed chunks of ``B``; whichever item of a chunk runs first generates the chunk,
whatever the test order. Results are identical to one prompt at a time, because a fixed shape makes
a row independent of its companions.
"""

from __future__ import annotations

import json
import types
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_llmdeterminism.errors import ConfigurationError, LLMDeterminismError
from pytest_llmdeterminism.judge.tolerance import parse_profile
from pytest_llmdeterminism.sampling import SamplingConfig
from pytest_llmdeterminism.shape import MARKER

if TYPE_CHECKING:
    from _pytest._code.code import TerminalRepr  # the type pytest.Item.repr_failure returns; not exported

    from pytest_llmdeterminism.generation import Generation, Score
    from pytest_llmdeterminism.model.llm_model import LLMModel
    from pytest_llmdeterminism.run.golden_tokens import GoldenTokens

SUFFIX = ".llm.jsonl"
# A sampled item's settings (llm_model.generate's names); its seed is its own, the rest group chunks.
_SAMPLING = ("do_sample", "temperature", "top_k", "top_p", "min_p")
_FIELDS = {"id", "prompt", "messages", "max_new_tokens", "tolerance", *_SAMPLING, "seed", "continuation"}


def is_suite(path: Path) -> bool:
    return path.name.startswith("test_") and path.name.endswith(SUFFIX)


def check_prompt(request: pytest.FixtureRequest, llm_model: LLMModel, golden_tokens: GoldenTokens) -> None:
    """The body of every prompt-suite item."""
    item = request.node
    assert isinstance(item, PromptItem) and isinstance(item.parent, PromptSuite)
    golden_tokens.check(item.parent.result_for(item, llm_model))


class PromptSuite(pytest.Module):
    """A ``.llm.jsonl`` file as a module of tests (so module-scoped fixtures and ``request.module``
    work for its items); its module object is an empty stand-in, nothing is imported."""

    def _getobj(self) -> types.ModuleType:
        return types.ModuleType(self.path.stem.replace(".", "_"))

    def collect(self) -> Iterator[PromptItem]:
        self._results: dict[str, Generation] = {}
        self._scores: dict[str, Score] = {}
        seen: set[str] = set()
        for number, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            case = _parse(self.path, number, line)
            if case["id"] in seen:
                raise self.CollectError(
                    f"{self.path.name}:{number}: id {case['id']!r} appears twice; ids name goldens")
            seen.add(case["id"])
            yield PromptItem.from_parent(self, name=case["id"], callobj=check_prompt, case=case, line=number)

    def result_for(self, item: PromptItem, llm_model: LLMModel) -> Generation | Score:
        """The item's generation (or score). Audited runs generate each item alone (the audit examines
        every generation of its own test); otherwise the item's whole chunk runs on first need."""
        if item.continuation is not None:
            return self._score_for(item, llm_model)
        overrides = {**({"max_new_tokens": item.budget} if item.budget is not None else {}), **item.sampling}
        seeded = "seed" in item.case or item.sampling.get("do_sample") is True
        if llm_model.audited:
            seed = {"seed": item.case.get("seed", llm_model.settings.seed)} if seeded else {}
            alone: Generation = llm_model.generate(item.prompt, **overrides, **seed)
            return alone
        if item.name not in self._results:
            peers = sorted((i for i in self.session.items
                            if isinstance(i, PromptItem) and i.parent is self and i.group == item.group),
                           key=lambda i: i.line)
            rows = llm_model.settings.batch_shape.rows
            start = peers.index(item) // rows * rows
            chunk = peers[start:start + rows]
            seeds = {"seed": [p.case.get("seed", llm_model.settings.seed) for p in chunk]} if seeded else {}
            generated_rows = llm_model.generate([p.prompt for p in chunk], **overrides, **seeds)
            for peer, generated in zip(chunk, generated_rows, strict=True):
                self._results[peer.name] = generated
        return self._results.pop(item.name)

    def _score_for(self, item: PromptItem, llm_model: LLMModel) -> Score:
        """A score line's score: its chunk of the file's score lines, scored on first need."""
        if item.name not in self._scores:
            peers = sorted((i for i in self.session.items
                            if isinstance(i, PromptItem) and i.parent is self and i.group == item.group),
                           key=lambda i: i.line)
            rows = 1 if llm_model.audited else llm_model.settings.batch_shape.rows
            start = peers.index(item) // rows * rows
            chunk = peers[start:start + rows]
            scored = llm_model.score([(p.prompt, p.continuation or "") for p in chunk])
            for peer, score in zip(chunk, scored, strict=True):
                self._scores[peer.name] = score
        return self._scores.pop(item.name)


class PromptItem(pytest.Function):
    def __init__(self, *, case: dict[str, Any], line: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case = case
        self.line = line
        self.budget: int | None = case.get("max_new_tokens")
        self.sampling: dict[str, Any] = {k: case[k] for k in _SAMPLING if k in case}
        self.continuation: str | None = case.get("continuation")  # a score line
        # items generated together: the same budget and sampling settings (each keeps its own seed);
        # score lines together
        self.group = ("score", "") if self.continuation is not None else \
            (self.budget, json.dumps(self.sampling, sort_keys=True))
        # a string or a conversation
        self.prompt: Any = case["prompt"] if "prompt" in case else case["messages"]
        self.add_marker(getattr(pytest.mark, MARKER)(**{k: case[k] for k in ("max_new_tokens", "tolerance")
                                                         if k in case}))

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, self.line - 1, self.name

    # The ignore below: pytest.Function's own repr_failure drops Node's `style` argument too.
    def repr_failure(  # type: ignore[override]
            self, excinfo: pytest.ExceptionInfo[BaseException]) -> str | TerminalRepr:
        # The plugin's own errors are complete messages; a traceback into this module adds nothing.
        if isinstance(excinfo.value, LLMDeterminismError):
            return str(excinfo.value)
        return super().repr_failure(excinfo)


def _parse(path: Path, number: int, line: str) -> dict[str, Any]:
    where = f"{path.name}:{number}"
    try:
        case = json.loads(line)
    except json.JSONDecodeError as error:
        raise ConfigurationError(where, line[:60], f"not valid JSON ({error})") from None
    if not isinstance(case, dict) or not isinstance(case.get("id"), str) or \
            ("prompt" in case) == ("messages" in case) or not isinstance(case.get("prompt", ""), str):
        raise ConfigurationError(
            where, line[:60], 'expected an object with string "id" and either a string "prompt" or chat '
            '"messages", e.g. {"id": "capital", "prompt": "The capital of France is"} or '
            '{"id": "chat", "messages": [{"role": "user", "content": "Hi"}]}')
    messages = case.get("messages")
    if messages is not None and not (isinstance(messages, list) and messages and all(
            isinstance(m, dict) and set(m) == {"role", "content"}
            and all(isinstance(v, str) for v in m.values()) for m in messages)):
        raise ConfigurationError(where, messages, 'expected "messages" as a list of '
                                 '{"role": ..., "content": ...} objects with string values')
    unknown = set(case) - _FIELDS
    if unknown:
        raise ConfigurationError(where, sorted(unknown),
                                 f"unknown field(s); accepted: {', '.join(sorted(_FIELDS))}")
    if "continuation" in case:
        generating = sorted(set(case) & {"max_new_tokens", *_SAMPLING, "seed"})
        if not isinstance(case["continuation"], str) or not case["continuation"]:
            raise ConfigurationError(where, case["continuation"], 'expected "continuation" as a non-empty '
                                     'string: the text whose logprobs the line checks')
        if generating:
            raise ConfigurationError(where, generating, 'a line with a "continuation" is a score check: '
                                     'nothing is generated, so it takes no budget or sampling settings; '
                                     'remove them, or the "continuation" for a generation check')
    budget = case.get("max_new_tokens")
    if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 1):
        raise ConfigurationError(where, budget, "max_new_tokens must be an integer >= 1")
    tolerance = case.get("tolerance")
    if tolerance is not None:
        parse_profile(str(tolerance), setting=f"{where} tolerance")
    sampling = {k: case[k] for k in (*_SAMPLING, "seed") if k in case and k != "do_sample"}
    if sampling and case.get("do_sample") is not True:
        raise ConfigurationError(where, sorted(sampling), 'sampling settings only apply to a sampled line: '
                                 'sample with "do_sample": true, or remove them')
    if case.get("do_sample") is True:
        try:
            SamplingConfig(**{k: v for k, v in sampling.items() if k != "seed"}, seed=case.get("seed", 0))
        except ConfigurationError as error:
            raise ConfigurationError(f"{where} {error.setting.removeprefix('llm_model.generate(')[:-5]}",
                                     error.value, str(error).split(": ", 1)[1]) from None
    elif "do_sample" in case and case["do_sample"] is not False:
        raise ConfigurationError(where, case["do_sample"], 'expected "do_sample": true or false')
    return case
