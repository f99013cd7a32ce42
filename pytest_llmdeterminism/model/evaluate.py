"""``llm_model.evaluate(items)``: an eval run item by item on the model's own paths (multiple choice
on the scoring path, generative on greedy generation), batched in the fixed shape."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_llmdeterminism.errors import NO_VALUE, ConfigurationError
from pytest_llmdeterminism.generation import ANSWER, CHOICE, EvalItem, Evaluation, best_two, digest

if TYPE_CHECKING:
    from pytest_llmdeterminism.generation import Generation, Score

Match = Callable[[str, str], bool]
_SETTING = "llm_model.evaluate(items)"
_FORMS = ('multiple choice {"id", "prompt", "choices": [...], "label": INDEX} or generative '
          '{"id", "prompt", "answer": TEXT}')


@dataclass(frozen=True)
class _Item:
    id: str
    prompt: Any
    choices: tuple[str, ...] = ()
    label: int = 0
    answer: str = ""


def exact_after_strip(generated: str, answer: str) -> bool:
    """The default match rule of a generative item: the same text once surrounding whitespace is gone."""
    return generated.strip() == answer.strip()


def evaluate(model: Any, items: Sequence[Mapping[str, Any]], *, acc_norm: bool = False,
             match: Match | None = None, **overrides: Any) -> Evaluation:
    """Run ``items`` on ``model`` (an ``LLMModel``, which calls this below it: see its ``evaluate``)."""
    __tracebackhide__ = True
    if not isinstance(acc_norm, bool):
        raise ConfigurationError("llm_model.evaluate(acc_norm=...)", acc_norm, "expected True or False")
    if match is not None and not callable(match):
        raise ConfigurationError("llm_model.evaluate(match=...)", match,
                                 "expected a function (generated text, answer) -> bool")
    parsed = _parse(items)
    chosen = [item for item in parsed if item.choices]
    answered = [item for item in parsed if not item.choices]
    found: dict[str, EvalItem] = {}
    fingerprint: Mapping[str, Any] = {}
    if chosen:
        scores = model.score([(item.prompt, choice) for item in chosen for choice in item.choices])
        at = 0
        for item in chosen:
            found[item.id] = _choice_item(item, scores[at:at + len(item.choices)], acc_norm)
            at += len(item.choices)
        fingerprint = scores[-1].fingerprint
    if answered:
        generations = _generate(model, [item.prompt for item in answered], overrides)
        for item, generation in zip(answered, generations, strict=True):
            found[item.id] = _answer_item(item, generation, match or exact_after_strip)
        fingerprint = generations[-1].fingerprint
    elif overrides:
        raise ConfigurationError("llm_model.evaluate(...)", sorted(overrides),
                                 "generation settings apply to generative items only (an \"answer\")")
    return Evaluation(items=tuple(found[item.id] for item in parsed),
                      batch_shape=str(model.settings.batch_shape), settings={"acc_norm": acc_norm},
                      fingerprint=dict(fingerprint))


def _parse(items: Sequence[Mapping[str, Any]]) -> list[_Item]:
    __tracebackhide__ = True
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Sequence) or not items:
        raise ConfigurationError(_SETTING, type(items).__name__,
                                 f"expected a non-empty list of items, each {_FORMS}")
    parsed: list[_Item] = []
    seen: set[str] = set()
    for index, raw in enumerate(items):
        item = _item(index, raw)
        if item.id in seen:
            raise ConfigurationError(f"llm_model.evaluate(items[{index}])", item.id,
                                     "this id is an earlier item's too: give each item its own id")
        seen.add(item.id)
        parsed.append(item)
    return parsed


def _item(index: int, raw: Any) -> _Item:
    __tracebackhide__ = True
    where = f"llm_model.evaluate(items[{index}])"
    if not isinstance(raw, Mapping):
        raise ConfigurationError(where, type(raw).__name__, f"expected a mapping: {_FORMS}")
    identity = raw.get("id", index)
    if isinstance(identity, bool) or not isinstance(identity, (str, int)) or identity == "":
        raise ConfigurationError(f"{where}['id']", identity, "expected a non-empty string or an integer")
    where = f"{where} (id {identity!r})"
    if "prompt" not in raw:
        raise ConfigurationError(where, NO_VALUE, f"an item needs a prompt: {_FORMS}")
    if ("choices" in raw) == ("answer" in raw):
        raise ConfigurationError(where, sorted(raw), f"give choices and a label, or an answer: {_FORMS}")
    if "answer" in raw:
        if not isinstance(raw["answer"], str) or not raw["answer"].strip():
            raise ConfigurationError(f"{where}['answer']", raw["answer"], "expected the answer's text")
        return _Item(str(identity), raw["prompt"], answer=raw["answer"])
    choices, label = raw["choices"], raw.get("label")
    if isinstance(choices, str) or not isinstance(choices, Sequence) or len(choices) < 2 or \
            not all(isinstance(choice, str) and choice for choice in choices):
        raise ConfigurationError(f"{where}['choices']", choices,
                                 "expected two or more non-empty strings, each scored after the prompt")
    if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < len(choices):
        raise ConfigurationError(f"{where}['label']", label,
                                 f"expected the index of the right choice, 0 to {len(choices) - 1}")
    return _Item(str(identity), raw["prompt"], choices=tuple(choices), label=label)



def _choice_item(item: _Item, scores: Sequence[Score], acc_norm: bool) -> EvalItem:
    totals = tuple(score.total / len(choice) if acc_norm else score.total
                   for score, choice in zip(scores, item.choices, strict=True))
    best, margin = best_two(totals)
    return EvalItem(id=item.id, form=CHOICE, choice=best, correct=best == item.label, margin=margin,
                    input=digest(scores[0].prompt_form, scores[0].prompt_token_ids),
                    numbers=digest(*(score.step_hashes for score in scores)), scores=totals, label=item.label)


def _answer_item(item: _Item, generation: Generation, match: Match) -> EvalItem:
    correct = match(generation.text, item.answer)
    if not isinstance(correct, bool):
        raise ConfigurationError("llm_model.evaluate(match=...)", correct,
                                 f"the match rule returned this for item {item.id!r}: expected True or False")
    return EvalItem(id=item.id, form=ANSWER, choice=generation.text.strip(), correct=correct,
                    margin=_answer_margin(generation, item.answer),
                    input=digest(generation.prompt_form, generation.prompt_token_ids),
                    numbers=digest(generation.step_hashes), label=item.answer)


def _answer_margin(generation: Generation, answer: str) -> float:
    """The smallest top-1/top-2 margin of the steps that spelt the answer: those up to the one whose
    text, leading whitespace aside, is as long as the answer (every step if it never is)."""
    wanted, spelt = len(answer.strip()), ""
    steps = len(generation.margins)
    for step, piece in enumerate(generation.pieces):
        spelt += piece
        if len(spelt.lstrip()) >= wanted:
            steps = step + 1
            break
    return min(generation.margins[:steps], default=math.inf)


def _generate(model: Any, prompts: list[Any], overrides: dict[str, Any]) -> list[Generation]:
    """Greedy generations of ``prompts`` in the fixed shape: text and chat prompts in one call, token
    id prompts in another, back in the items' order."""
    ids = [index for index, prompt in enumerate(prompts)
           if isinstance(prompt, Sequence) and prompt and all(isinstance(t, int) for t in prompt)
           and not isinstance(prompt, str)]
    by_ids = set(ids)
    texts = [index for index in range(len(prompts)) if index not in by_ids]
    found: dict[int, Generation] = {}
    if texts:
        found.update(zip(texts, model.generate([prompts[i] for i in texts], **overrides), strict=True))
    if ids:
        found.update(zip(ids, model.generate(token_ids=[prompts[i] for i in ids], **overrides), strict=True))
    return [found[index] for index in range(len(prompts))]
