"""``llm_model.evaluate`` on the built-in tiny model: a multiple-choice item's decision is its best
choice by the score of each choice alone (acc: the sum of logprobs; acc_norm: per character), its
margin best minus runner-up; a generative item is the greedy generation matched against its answer;
the same items give the same bits at another batch shape; bad items are one error naming the item."""

from __future__ import annotations

import pytest

from pytest_llmdeterminism import ConfigurationError
from pytest_llmdeterminism.generation import ANSWER, CHOICE
from pytest_llmdeterminism.model.llm_model import LLMModel
from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

CHOICES = [" blue", " green and wide", " red"]
ITEMS = [{"id": f"q{i}", "prompt": f"Question {i}: which colour is the sky? Answer:", "choices": CHOICES,
          "label": i % 3} for i in range(5)]
ANSWERS = [{"id": "capital", "prompt": "The capital of France is", "answer": "Paris"},
           {"id": 7, "prompt": [{"role": "user", "content": "Say hi"}], "answer": "hi"}]


def llm_at(tiny, shape: str, max_new_tokens: int = 6) -> LLMModel:
    return LLMModel(tiny, GenerationSettings(BatchShape.parse(shape), max_new_tokens, 0))


def test_a_choice_is_decided_by_each_choices_own_score_and_its_margin_is_best_minus_runner_up(tiny):
    llm = llm_at(tiny, "4x32")
    evaluation = llm.evaluate(ITEMS)
    for raw, item in zip(ITEMS, evaluation.items, strict=True):
        totals = [llm.score(raw["prompt"], choice).total for choice in CHOICES]  # one call at a time
        assert item.form == CHOICE and item.scores == tuple(totals)
        best = max(range(3), key=lambda i: totals[i])
        assert item.choice == best and item.correct == (best == raw["label"])
        assert item.margin == pytest.approx(totals[best] - sorted(totals)[-2], abs=0)
    assert evaluation.accuracy == sum(item.correct for item in evaluation.items) / 5
    normed = llm.evaluate(ITEMS, acc_norm=True)
    assert [item.scores for item in normed.items] == [
        tuple(total / len(choice) for total, choice in zip(item.scores, CHOICES, strict=True))
        for item in evaluation.items]
    assert normed.settings == {"acc_norm": True}


def test_a_generative_item_is_the_greedy_generation_matched_against_its_answer(tiny):
    llm = llm_at(tiny, "4x32")
    evaluation = llm.evaluate(ANSWERS)
    generations = [llm.generate(ANSWERS[0]["prompt"]), llm.generate(ANSWERS[1]["prompt"])]
    for item, generation, raw in zip(evaluation.items, generations, ANSWERS, strict=True):
        assert item.form == ANSWER and item.id == str(raw["id"]) and item.choice == generation.text.strip()
        assert item.correct == (generation.text.strip() == raw["answer"])
        assert item.margin in generation.margins and item.margin >= min(generation.margins)
    # the margin is taken over the steps that spelt the answer's length, not the whole generation
    first = generations[0]
    spelt, steps = "", len(first.pieces)
    for step, piece in enumerate(first.pieces):
        spelt += piece
        if len(spelt.lstrip()) >= len("Paris"):
            steps = step + 1
            break
    assert evaluation.items[0].margin == min(first.margins[:steps])
    anything = llm.evaluate(ANSWERS, match=lambda text, answer: True)
    assert anything.accuracy == 1.0


def test_the_same_items_give_the_same_bits_at_another_batch_shape(tiny):
    items = [*ITEMS, *ANSWERS]
    at_4x32, at_1x64 = llm_at(tiny, "4x32").evaluate(items), llm_at(tiny, "1x64").evaluate(items)
    assert at_4x32.items == at_1x64.items  # decisions, margins, input and numbers hashes, scores


@pytest.mark.parametrize(("items", "problem"), [
    ([], "expected a non-empty list of items"),
    ([{**ITEMS[0], "label": 3}], r"items\[0\]\) \(id 'q0'\)\['label'\] = 3: expected the index of the right "
                                 r"choice, 0 to 2"),
    ([{**ITEMS[0], "label": True}], r"\['label'\] = True"),
    ([ITEMS[0], {**ITEMS[1], "id": "q0"}], r"items\[1\]\) = 'q0': this id is an earlier item's too"),
    ([{**ITEMS[0], "choices": []}], r"\['choices'\] = \[\]: expected two or more non-empty strings"),
    ([{**ITEMS[0], "answer": "x"}], "give choices and a label, or an answer"),
    ([{"id": "x", "choices": CHOICES, "label": 0}], r"items\[0\]\) \(id 'x'\): an item needs a prompt"),
    ([{"id": "x", "prompt": "p", "answer": "  "}], r"\['answer'\] = '  ': expected the answer's text"),
    (["just a prompt"], r"items\[0\]\) = 'str': expected a mapping"),
])
def test_a_bad_item_is_one_error_naming_it(tiny, items, problem):
    with pytest.raises(ConfigurationError, match=problem):
        llm_at(tiny, "4x32").evaluate(items)


def test_a_match_rule_that_does_not_answer_true_or_false_is_refused(tiny):
    with pytest.raises(ConfigurationError, match="the match rule returned this for item 'capital'"):
        llm_at(tiny, "4x32").evaluate(ANSWERS[:1], match=lambda text, answer: "yes")
    with pytest.raises(ConfigurationError, match="generation settings apply to generative items only"):
        llm_at(tiny, "4x32").evaluate(ITEMS, max_new_tokens=3)
