"""A property test on the tiny model runs every one of its examples without a prompt too long."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_llmdeterminism.run.options import DEFAULT_BATCH_SHAPE
from pytest_llmdeterminism.strategies import assert_batch_invariant, batch_compositions
from tests.helpers.strategies import POOL, PROMPT

EXAMPLES = 100


@pytest.mark.slow  # 100 examples through the tiny model: 30-50 CPU seconds a case
@pytest.mark.parametrize(("shape", "with_model"),
                         [(DEFAULT_BATCH_SHAPE, False), ("4x32", False), ("4x32", True)],
                         ids=["default-pool only", "4x32-pool only", "4x32-llm_model given"])
def test_a_property_test_runs_every_example_without_a_prompt_too_long(make_llm, shape, with_model):
    llm = make_llm(shape, max_new_tokens=1)
    assert len(llm.tokenizer(POOL[-1])["input_ids"]) >= 32  # a companion 4x32 cannot take
    ran = []

    @given(data=st.data())
    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    def property_test(data):
        composition = data.draw(batch_compositions(POOL, max_companions=3,
                                                   llm_model=llm if with_model else None))
        assert_batch_invariant(llm, PROMPT, composition)
        ran.append(composition)

    property_test()  # a PromptTooLongError here would fail the test; rejected draws are filtered
    assert len(ran) >= EXAMPLES
    if with_model:  # the strategy itself drew only companions that fit
        limit = llm.settings.batch_shape.length - 1
        assert all(len(llm.encode(text)) <= limit for composition in ran for text in composition.companions)
