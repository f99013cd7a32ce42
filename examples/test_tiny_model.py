"""An example suite to copy: greedy goldens for a model, checked on every run.

Run it with `pytest examples`; re-record after an intended change with
`pytest examples --llm-golden-update`.
"""

import pytest

from pytest_llmdeterminism import deterministic


@deterministic(max_new_tokens=8)
def test_capital(llm_model, golden_tokens):
    result = llm_model.generate("The capital of France is")
    golden_tokens.check(result)  # judged first: a failing check waits for the test's end
    assert "Paris" in result.text


@deterministic
@pytest.mark.parametrize("country", ["Italy", "Japan", "Peru"])
def test_capitals(llm_model, golden_tokens, country):
    golden_tokens.check(llm_model.generate(f"Q: What is the capital of {country}? A:"))


@deterministic(max_new_tokens=12)
def test_batch_of_prompts(llm_model, golden_tokens):
    # One call, one fixed-shape batch: each prompt gets the result it would get alone.
    prompts = ["Count: one,", "The colour of the sky is", "def add(a, b):"]
    for prompt, result in zip(prompts, llm_model.generate(prompts), strict=True):
        golden_tokens.check(result, name=prompt)


@deterministic(seed=7)
def test_near_tie_prompt(llm_model, golden_tokens):
    # The tiny model was trained on "red" and "blue" equally often: a genuine near tie.
    result = llm_model.generate("My favourite colour is", max_new_tokens=4)
    assert result.margins[0] < 1.0
    golden_tokens.check(result)


@deterministic(max_new_tokens=4)
def test_chat(llm_model, golden_tokens):
    # A conversation is rendered with the tokenizer's chat template and tokenised once: the
    # template's own special tokens are not added a second time.
    result = llm_model.generate([{"role": "user", "content": "What is the capital of Japan?"}])
    golden_tokens.check(result)
    assert "Tokyo" in result.text
