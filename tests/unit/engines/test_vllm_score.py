"""vLLM's scores without vLLM or a GPU (``engines/vllm.py``): the pinned arguments, the positions read
from ``prompt_logprobs``, the refusals, and a score through a stand-in ``vllm`` module."""

from __future__ import annotations

import json
import sys
import types
from importlib.machinery import ModuleSpec
from types import SimpleNamespace

import pytest
import xxhash

from pytest_llmdeterminism import engines as backends
from pytest_llmdeterminism.engines import BUILTIN_MODELS
from pytest_llmdeterminism.engines import vllm as adapter
from pytest_llmdeterminism.errors import EngineError, NonFiniteLogitsError
from pytest_llmdeterminism.shape import BatchShape, GenerationSettings

TINY = BUILTIN_MODELS["tiny"]


def logprob(value, rank):
    return SimpleNamespace(logprob=value, rank=rank, decoded_token=None)


def prompt_output(entries):
    """A RequestOutput with ``prompt_logprobs``: per position None or a dict id -> Logprob."""
    return SimpleNamespace(prompt_logprobs=entries, outputs=[SimpleNamespace(token_ids=[0], logprobs=None)])


# prompt [5, 6], continuation [7, 8]: entry t predicts token t
ENTRIES = [None,
           {6: logprob(-0.7, 2), 1: logprob(-0.6, 1)},
           {7: logprob(-0.2, 1), 9: logprob(-1.9, 2), 3: logprob(-2.5, 3)},
           {4: logprob(-0.1, 1), 3: logprob(-2.0, 2), 8: logprob(-6.5, 40)}]


def test_score_arguments_ask_the_prompts_logprobs_and_one_greedy_token():
    arguments = adapter.score_arguments(7)
    assert (arguments["prompt_logprobs"], arguments["max_tokens"], arguments["temperature"]) == (7, 1, 0.0)
    assert arguments["repetition_penalty"] == 1.0 and arguments["top_k"] == -1


def test_positions_are_read_from_prompt_logprobs_with_vllms_own_rank():
    chunk = adapter.scores_from_outputs([prompt_output(ENTRIES)], [([5, 6], [7, 8])], spec="vllm:m", top_k=2,
                                        prompt_logprobs=True, flags={"x": 1})
    row, = chunk.rows
    assert row.logprobs == [-0.2, -6.5]
    assert row.ranks == [1, 40]  # the second outside the top-2: vLLM's vocabulary rank
    assert row.rank_margins == [1.7, None]
    assert row.top == [((7, -0.2), (9, -1.9)), ((4, -0.1), (3, -2.0))]
    assert row.hashes[1] == xxhash.xxh3_64_hexdigest(
        json.dumps([8, [[4, -0.1], [3, -2.0], [8, -6.5]]], separators=(",", ":")).encode())
    assert row.prompt_logprobs == [None, -0.7] and chunk.flags == {"x": 1}


def test_missing_and_nan_prompt_logprobs_are_refused():
    with pytest.raises(EngineError, match="prompt logprobs for 0 of 4 positions of pair 0; a score needs "
                                          "prompt_logprobs=2"):
        adapter.scores_from_outputs([prompt_output(None)], [([5, 6], [7, 8])], spec="vllm:m", top_k=2,
                                    prompt_logprobs=False)
    without = [*ENTRIES[:3], {4: logprob(-0.1, 1)}]
    with pytest.raises(EngineError, match="no logprob for the continuation's token 8 at position 3"):
        adapter.scores_from_outputs([prompt_output(without)], [([5, 6], [7, 8])], spec="vllm:m", top_k=2,
                                    prompt_logprobs=False)
    nan = [*ENTRIES[:2], {7: logprob(float("nan"), 1)}, ENTRIES[3]]
    with pytest.raises(NonFiniteLogitsError):
        adapter.scores_from_outputs([prompt_output(nan)], [([5, 6], [7, 8])], spec="vllm:m", top_k=2,
                                    prompt_logprobs=False)


def test_a_score_runs_through_the_engine_as_one_prompt_of_ids(monkeypatch):
    import torch

    from pytest_llmdeterminism.model.llm_model import LLMModel

    calls = []
    module = types.ModuleType("vllm")
    module.__spec__ = ModuleSpec("vllm", None)
    module.__version__ = "0.0-fake"

    class LLM:
        def __init__(self, **kwargs):
            pass

        def generate(self, prompts, params, use_tqdm=True):
            calls.append(([p["prompt_token_ids"] for p in prompts], params))
            # every position: its own token at -0.5 and token 0 above it
            return [prompt_output([None, *({t: logprob(-0.5, 2), 0: logprob(-0.25, 1)}
                                           for t in p["prompt_token_ids"][1:])]) for p in prompts]

    module.LLM = LLM
    module.SamplingParams = lambda **kwargs: SimpleNamespace(**kwargs)
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA H200")
    for key in ("HF_HUB_OFFLINE", "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_BATCH_INVARIANT"):
        monkeypatch.delenv(key, raising=False)
    loaded = backends.load(f"vllm:{TINY}#max_model_len=512", dtype="float32", device="auto")
    llm = LLMModel(loaded, GenerationSettings(BatchShape(1, 64), 3, 7))
    score = llm.score("Hello", [20, 21, 22], prompt_logprobs=True)
    (sent,), params = calls[0]
    assert sent == [*score.prompt_token_ids, 20, 21, 22] and params.prompt_logprobs == 5
    assert score.logprobs == (-0.5, -0.5, -0.5) and score.ranks == (2, 2, 2)
    assert score.variant == "vllm:cuda/float32" and str(score.hash_definition) == "vllm-topk"
    from pytest_llmdeterminism import ConfigurationError

    with pytest.raises(ConfigurationError, match="raise max_model_len in the spec"):
        llm.score("Hello", [20] * 600)
