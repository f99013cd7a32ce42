"""``llm_model.score`` on the real SmolLM2 (issue 42): the model's own teacher-forced logprobs, those of
plain transformers' ``log_softmax(model(ids).logits)`` at the continuation's positions."""

from __future__ import annotations

import pytest
import torch

from pytest_llmdeterminism import engines
from pytest_llmdeterminism.model.llm_model import LLMModel
from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

PAIRS = [("The capital of France is", " Paris. It is known for the Eiffel Tower."),
         ([{"role": "user", "content": "What is 2 + 2?"}], "2 + 2 = 4."),
         ("def fibonacci(n):", "\n    if n < 2:\n        return n")]


def test_smollm2s_score_is_plain_transformers_log_softmax(smollm2_gguf):
    """Within 1e-5 of plain transformers on the kernels the plugin runs (one unpadded row of the whole
    sequence: another shape, another length; measured 4.6e-7, the 6-decimal rounding). On transformers'
    own kernels float32 sums in another order over 30 layers: measured 2.3e-5, as far as each float32
    path is from the float64 model (2.5e-5), so within 1e-4 there."""
    loaded = engines.load(str(smollm2_gguf), dtype="float32", device="cpu")  # the default kernels
    scores = LLMModel(loaded, GenerationSettings(BatchShape(4, 64), 8, 0)).score(PAIRS, prompt_logprobs=True)
    model = loaded.model
    for score in scores:
        prompt, tokens = list(score.prompt_token_ids), list(score.token_ids)
        ids = torch.tensor([prompt + tokens])
        with torch.inference_mode():
            own = torch.log_softmax(model(ids).logits[0].float(), -1)
            with loaded.engine.kernels.routed(model):
                same = torch.log_softmax(model(ids).logits[0].float(), -1)
        positions = torch.arange(len(prompt) - 1, len(prompt) + len(tokens) - 1)
        assert score.logprobs == pytest.approx(same[positions, torch.tensor(tokens)].tolist(), abs=1e-5)
        assert score.logprobs == pytest.approx(own[positions, torch.tensor(tokens)].tolist(), abs=1e-4)
        assert score.prompt_logprobs[1:] == pytest.approx(
            same[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])].tolist(), abs=1e-5)
        given = same[positions, torch.tensor(tokens)]
        assert list(score.ranks) == (1 + (same[positions] > given[:, None]).sum(dim=1)).tolist()
    assert scores[1].prompt_token_ids != tuple(loaded.tokenizer(PAIRS[1][0][0]["content"])["input_ids"])
