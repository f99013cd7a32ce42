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


def test_smollm2s_speculative_decoding_is_plain_greedy_decoding_bit_for_bit(smollm2):
    """transformers' prompt lookup (2 and 5 tokens) and SmolLM2 as its own draft: every step's token
    and hash are plain greedy decoding's at 4x64 (IDENTICAL to its golden), the model as its own draft
    accepts every draft, prompt lookup some; the first draft committed unverified is a REGRESSION."""
    from pytest_llmdeterminism.judge.compare import Verdict, compare
    from tests.helpers.speculation import first_draft_unverified, ways

    llm = LLMModel(smollm2, GenerationSettings(BatchShape.parse("4x64"), 32, 0))
    plain = llm.generate(PHASE_PROMPTS)
    accepted = {}
    for way in ways(llm):
        speculated = llm.generate(PHASE_PROMPTS, **way)
        for expected, got in zip(plain, speculated, strict=True):
            assert compare(expected, got).verdict is Verdict.IDENTICAL, (way, expected.prompt)
            assert got.step_hashes == expected.step_hashes
        accepted[next(iter(way))] = [g.speculation.acceptance_rate for g in speculated]
    assert accepted["assistant_model"] == [1.0, 1.0, 1.0]
    assert any(rate for rate in accepted["prompt_lookup_num_tokens"] if rate)
    with first_draft_unverified(llm.model) as planted:
        broken = llm.generate(PHASE_PROMPTS, prompt_lookup_num_tokens=2)
    assert planted
    verdicts = [compare(expected, got) for expected, got in zip(plain, broken, strict=True)]
    assert Verdict.REGRESSION in {found.verdict for found in verdicts}
    assert all(found.divergence.golden_margin > found.tie_margin for found in verdicts
               if found.verdict is Verdict.REGRESSION)
