"""Hypothesis strategies for LLM tests, and the batch-invariance assertion they feed.

    from hypothesis import HealthCheck, given, settings, strategies as st
    from pytest_llmdeterminism.strategies import batch_compositions, assert_batch_invariant

    @given(data=st.data())
    # llm_model is function-scoped but stateless between examples, so reusing it is safe.
    @settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    def test_batch_invariant(llm_model, data):
        composition = data.draw(batch_compositions(["The sky is", "Count: one,"], llm_model=llm_model))
        assert_batch_invariant(llm_model, "The capital of France is", composition)

Under ``@given`` a failing batch shrinks to a minimal one: fewest companions, shortest texts.
Only batches that fit the shape in force are tested: with ``llm_model`` the strategies draw only
companions that fit it, and without it ``assert_batch_invariant`` rejects a batch whose companion
is too long for the shape (Hypothesis counts it as filtered, not failed).
Importing this module imports hypothesis; the plugin itself never does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import currently_in_test_context, reject
from hypothesis import strategies as st

from pytest_llmdeterminism.errors import LLMDeterminismError, PromptTooLongError
from pytest_llmdeterminism.judge.compare import Verdict, compare
from pytest_llmdeterminism.reporting.failure import decoder_for, mismatch

__all__ = ["BatchComposition", "BatchInvarianceError", "assert_batch_invariant", "batch_compositions",
           "prompts"]

_WORDS = ("the", "a", "model", "capital", "of", "is", "Paris", "count", "one", "two", "sky", "blue",
          "hello", "world", "def", "return", "time", "once", "upon", "cat", "sat", "on", "?", "!", ",")


@dataclass(frozen=True)
class BatchComposition:
    """Companion prompts of a batch, and the row where the prompt under test sits."""

    companions: tuple[str, ...]
    row: int

    def batch(self, prompt: str) -> list[str]:
        return [*self.companions[: self.row], prompt, *self.companions[self.row:]]


class BatchInvarianceError(LLMDeterminismError, AssertionError):
    """A prompt's result changed with the other prompts in its batch."""

    def __init__(self, message: str, composition: BatchComposition, alone: Any, batched: Any) -> None:
        self.composition = composition
        self.alone = alone
        self.batched = batched
        super().__init__(message)


def prompts(*, min_words: int = 1, max_words: int = 12, llm_model: Any = None, tokenizer: Any = None,
            max_tokens: int | None = None) -> st.SearchStrategy[str]:
    """Prompt texts: words from a small vocabulary mixed with arbitrary printable text.

    With ``llm_model``, only texts that fit its fixed shape are drawn (at most L-1 tokens); or
    give ``tokenizer`` and ``max_tokens`` yourself.
    """
    tokenizer, max_tokens = _limits(llm_model, tokenizer, max_tokens)
    words = st.lists(st.one_of(st.sampled_from(_WORDS), st.text(st.characters(codec="ascii",
                                                                             categories=("L", "N", "P")),
                                                                min_size=1, max_size=8)),
                     min_size=min_words, max_size=max_words)
    texts = words.map(" ".join)
    if tokenizer is None or max_tokens is None:
        return texts
    return texts.filter(lambda text: _fits(tokenizer, max_tokens, text))


def _limits(llm_model: Any, tokenizer: Any, max_tokens: int | None) -> tuple[Any, int | None]:
    """The tokenizer and the most prompt tokens the shape in force holds (L-1: one position stays padding)."""
    if llm_model is not None:
        return llm_model.tokenizer, llm_model.settings.batch_shape.length - 1
    return tokenizer, max_tokens


def _fits(tokenizer: Any, max_tokens: int, text: str) -> bool:
    return 0 < len(tokenizer(text)["input_ids"]) <= max_tokens


@st.composite
def batch_compositions(draw: st.DrawFn, pool: Sequence[str] = (), *, max_companions: int = 7,
                       llm_model: Any = None, tokenizer: Any = None,
                       max_tokens: int | None = None) -> BatchComposition:
    """A batch around the prompt under test: companions from ``pool`` and generated text, of varied
    lengths, and the row where the prompt sits. Pass ``llm_model`` so that generated companions
    fit its shape. Keep ``max_companions`` below the shape's B to stay in one batch, or above it
    to cross chunks too."""
    sources = [prompts(llm_model=llm_model, tokenizer=tokenizer, max_tokens=max_tokens)]
    tokenizer, max_tokens = _limits(llm_model, tokenizer, max_tokens)
    fitting = [text for text in pool
               if tokenizer is None or max_tokens is None or _fits(tokenizer, max_tokens, text)]
    if fitting:
        sources.insert(0, st.sampled_from(fitting))
    companions = draw(st.lists(st.one_of(*sources), max_size=max_companions))
    row = draw(st.integers(min_value=0, max_value=len(companions)))
    return BatchComposition(tuple(companions), row)


def _reject_companions_too_long(llm_model: Any, companions: Sequence[str]) -> None:
    """A companion longer than the shape holds says nothing about invariance: under Hypothesis the
    example is rejected (counted as filtered); elsewhere the error says which prompt and what fits."""
    __tracebackhide__ = True
    encode = getattr(llm_model, "encode", None)
    if encode is None:  # a runner of the user's own: it decides what fits
        return
    for companion in companions:
        try:
            encode(companion)
        except PromptTooLongError:
            if currently_in_test_context():
                reject()
            raise


def assert_batch_invariant(llm_model: Any, prompt: str,
                           composition: BatchComposition | Sequence[str]) -> None:
    """Generate ``prompt`` alone and inside ``composition``; fail if tokens or logit hashes differ.

    ``composition`` is what :func:`batch_compositions` draws, or a plain list of companion prompts
    (the prompt then goes last).
    """
    __tracebackhide__ = True
    if not isinstance(composition, BatchComposition):
        composition = BatchComposition(tuple(composition), len(composition))
    _reject_companions_too_long(llm_model, composition.companions)
    alone = llm_model.generate(prompt)
    batch = composition.batch(prompt)
    batched = llm_model.generate(batch)[composition.row]
    comparison = compare(alone, batched)
    if comparison.verdict is Verdict.IDENTICAL:
        return
    decode = decoder_for(alone, batched, getattr(llm_model, "tokenizer", None))
    text = mismatch("batch invariance", f"alone vs row {composition.row} of {len(batch)} prompts", None,
                    comparison, alone, batched, decode, profile="exact")
    raise BatchInvarianceError(
        f"{prompt!r} changed when batched with {list(composition.companions)!r} at row {composition.row}:\n"
        + text.split(": ", 1)[1],
        composition, alone, batched,
    )
