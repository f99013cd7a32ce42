"""The strategies (strategies.py) draw only batches that fit the shape in force: outside Hypothesis a
companion too long is the usual error, and prompts drawn with a model fit its shape."""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from pytest_llmdeterminism.errors import PromptTooLongError
from pytest_llmdeterminism.strategies import assert_batch_invariant, prompts
from tests.helpers.strategies import POOL, PROMPT


def test_outside_hypothesis_a_companion_too_long_is_the_usual_error(make_llm):
    llm = make_llm("4x32", max_new_tokens=1)
    with pytest.raises(PromptTooLongError, match=r"'4x32' allows 31"):
        assert_batch_invariant(llm, PROMPT, [POOL[-1]])


def test_prompts_with_a_model_fit_its_shape(make_llm):
    llm = make_llm("2x8", max_new_tokens=1)

    @given(text=prompts(llm_model=llm))
    @settings(max_examples=50, deadline=None, database=None)
    def fits(text):
        assert 0 < len(llm.encode(text)) <= 7

    fits()
