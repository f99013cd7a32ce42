"""A position's logits in every phase a model computes it: one prefill, prefill in chunks over a growing
KV cache, or continuing a reused prefix's cache (tests/unit/compute/test_canonical_attention.py and
tests/real_model/test_smollm2_batch_invariance.py), through the engine's ``phase_logits`` (the audit's
own): float32 logits, one row per position."""

from __future__ import annotations

import torch

from pytest_llmdeterminism.engines.loaded import LoadedModel

PHASE_PROMPTS = ["Once upon a time", "The capital of France is", "def add(a, b):\n    return"]
CHUNKS = (1, 2, 7, 64)  # a decode step per position, odd and aligned chunks, and more than the prompt
# More than one key block (32 positions) in the tiny model's and SmolLM2's tokens.
LONG_TEXT = ("The capital of France is Paris, and the capital of Italy is Rome; the capital of Spain is "
             "Madrid, of Portugal Lisbon, of Greece Athens, of Austria Vienna and of Poland Warsaw.")


def long_ids(loaded: LoadedModel) -> list[int]:
    ids: list[int] = loaded.tokenizer(LONG_TEXT)["input_ids"]
    assert len(ids) > 33, len(ids)  # more than one key block
    return ids


def logits_in_chunks(loaded: LoadedModel, ids: list[int], chunk: int) -> torch.Tensor:
    """``ids``' logits, forwarded ``chunk`` positions at a time over one growing KV cache (chunk 1: a
    prefill of one position, then decode steps): the engine's own ``phase_logits``."""
    pieces = [min(chunk, len(ids) - start) for start in range(0, len(ids), chunk)]
    return loaded.engine.phase_logits(ids, pieces, 0)


def logits_on_a_reused_prefix(loaded: LoadedModel, prefix: list[int],
                              continuations: list[list[int]]) -> list[torch.Tensor]:
    """Each continuation's logits on ``prefix``'s KV cache cut from the prefill of the previous
    continuation's sequence (a prefix cache's reuse; the first continuation's from the last one):
    one tensor per continuation, the prefix's rows first."""
    return [loaded.engine.phase_logits(prefix + continuation, [len(prefix), len(continuation)], 0,
                                       reuse_from=prefix + continuations[index - 1])
            for index, continuation in enumerate(continuations)]
