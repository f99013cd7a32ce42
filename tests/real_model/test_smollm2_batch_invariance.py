"""Batch and phase invariance on the real SmolLM2-135M: its goldens do not depend on the batch shape,
and a position's logits are the same bits in a decode step, a one-shot prefill, a prefill in chunks
and on a reused prefix (the tiny model's, and each op's, are checked in
tests/unit/compute/test_batch_invariant.py and tests/unit/compute/test_canonical_attention.py)."""

from __future__ import annotations

import pytest
import torch

from pytest_llmdeterminism import engines
from pytest_llmdeterminism.compute.kernels import Policy
from pytest_llmdeterminism.model.llm_model import LLMModel
from pytest_llmdeterminism.shape import BatchShape, GenerationSettings
from tests.helpers.batch_invariant import identical_under_every_shape
from tests.helpers.phases import CHUNKS, PHASE_PROMPTS, logits_in_chunks, logits_on_a_reused_prefix, long_ids


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf):
    loaded = engines.load(str(smollm2_gguf), dtype="float32", device="cpu")  # the default kernels
    assert loaded.engine.kernels.policy is Policy.BATCH_INVARIANT and loaded.engine.kernels.phase_invariant
    return loaded


def test_smollm2s_goldens_do_not_depend_on_the_batch_shape(smollm2):
    """The real model with default settings: recorded alone (one call per prompt), IDENTICAL batched at
    four other shapes."""
    identical_under_every_shape(smollm2, ("1x32", "4x32", "2x48", "8x64", "3x40"), 6)


def test_smollm2s_decode_steps_are_the_score_of_their_own_tokens_bit_for_bit(smollm2):
    """Each generated step's logit hash is the teacher-forced score's at its position (3 prompts, 32
    steps each at most), and every position of 3 prompts followed by 32 more tokens has the one-shot
    prefill's logits decoded one at a time, in chunks of 2, 7 and 64, and on a reused prefix."""
    llm = LLMModel(smollm2, GenerationSettings(BatchShape.parse("4x64"), 32, 0))
    steps = 0
    for generation in llm.generate(PHASE_PROMPTS):
        score = llm.score(list(generation.prompt_token_ids), list(generation.token_ids))
        assert generation.step_hashes == score.step_hashes, generation.prompt
        steps += len(generation.step_hashes)
    assert steps >= 48
    tail = long_ids(smollm2)[:32]
    for prompt in PHASE_PROMPTS:  # every position of each prompt and 32 more, in every phase
        ids = smollm2.tokenizer(prompt)["input_ids"] + tail
        once = logits_in_chunks(smollm2, ids, len(ids))
        for chunk in CHUNKS:
            assert torch.equal(logits_in_chunks(smollm2, ids, chunk), once), (prompt, chunk)
    assert torch.equal(logits_on_a_reused_prefix(smollm2, ids[:11], [ids[11:]])[0], once)
