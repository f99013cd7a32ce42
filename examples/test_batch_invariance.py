"""Batch invariance as a property: Hypothesis draws companion prompts and a row, and shrinks any
batch that changes the prompt's result to a minimal one."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_llmdeterminism.strategies import assert_batch_invariant, batch_compositions


@given(data=st.data())
# llm_model is function-scoped but holds no per-example state, so reusing it across examples is safe.
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_batch_invariant(llm_model, data):
    composition = data.draw(batch_compositions(["The sky is", "Count: one,"], llm_model=llm_model))
    assert_batch_invariant(llm_model, "The capital of France is", composition)
