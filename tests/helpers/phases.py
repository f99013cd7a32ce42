"""A position's logits in every phase a model computes it: one prefill, prefill in chunks over a growing
KV cache, or continuing a reused prefix's cache (tests/unit/compute/test_canonical_attention.py and
tests/real_model/test_smollm2_batch_invariance.py). Each runs the loaded model directly inside its
kernels' ``routed`` block, as the engine does, and returns float32 logits, one row per position."""

from __future__ import annotations

import copy

import torch

from pytest_llmdeterminism.engines.hf_phases import cache_argument
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


def _forward(loaded: LoadedModel, ids: list[int], cache: object | None) -> tuple[torch.Tensor, object]:
    from transformers import DynamicCache

    cache = DynamicCache() if cache is None else cache
    out = loaded.model(input_ids=torch.tensor([ids]), use_cache=True, **{cache_argument(loaded.model): cache})
    return out.logits[0].float(), cache


def logits_in_chunks(loaded: LoadedModel, ids: list[int], chunk: int) -> torch.Tensor:
    """``ids``' logits, forwarded ``chunk`` positions at a time over one growing KV cache (chunk 1: a
    prefill of one position, then decode steps)."""
    rows, cache = [], None
    with torch.inference_mode(), loaded.engine.kernels.routed(loaded.model):
        for start in range(0, len(ids), chunk):
            logits, cache = _forward(loaded, ids[start:start + chunk], cache)
            rows.append(logits)
    return torch.cat(rows)


def logits_on_a_reused_prefix(loaded: LoadedModel, prefix: list[int],
                              continuations: list[list[int]]) -> list[torch.Tensor]:
    """Each continuation's logits computed on a copy of ``prefix``'s KV cache, prefilled once (a
    prefix cache's reuse): one tensor per continuation, the prefix's rows first."""
    found = []
    with torch.inference_mode(), loaded.engine.kernels.routed(loaded.model):
        before, cache = _forward(loaded, prefix, None)
        for continuation in continuations:
            after, _ = _forward(loaded, continuation, cache=copy.deepcopy(cache))
            found.append(torch.cat([before, after]))
    return found
