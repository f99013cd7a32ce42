"""Speculative decoding in the tests (tests/unit/model/test_speculative.py and
tests/real_model/test_smollm2_speculative.py): the arguments each way of drafting takes, and a planted
verification bug."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# transformers' own arguments: prompt lookup of 2 and of 5 tokens, and the model as its own draft
# (the LLMModel itself is passed: see ways()).
LOOKUPS = ({"prompt_lookup_num_tokens": 2}, {"prompt_lookup_num_tokens": 5})


def ways(llm_model: Any) -> list[dict[str, Any]]:
    """Every way of drafting a test speculates with."""
    return [*LOOKUPS, {"assistant_model": llm_model}]


@contextmanager
def first_draft_unverified(model: Any) -> Iterator[list[int]]:
    """A verification bug, planted in the model's forward: a verify pass (a forward that keeps the
    logits of k + 1 >= 2 positions) commits its first draft token whatever the model computed, by
    raising that token's logit above the best one where it was not the best. Yields the steps (from
    the prompt's end) where it changed a token."""
    import torch

    planted: list[int] = []

    def hook(module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        logits, ids = output.logits, kwargs.get("input_ids")
        kept = logits.shape[1]
        if ids is None or kept < 2:
            return
        draft = int(ids[0, -(kept - 1)])  # the first draft: predicted by the first kept position
        first = logits[0, 0]
        if int(torch.argmax(first)) != draft:
            first[draft] = first.max() + 1.0
            planted.append(int(ids.shape[1]))

    handle = model.register_forward_hook(hook, with_kwargs=True)
    try:
        yield planted
    finally:
        handle.remove()
